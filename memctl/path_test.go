package main

import (
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

type fakeInfo struct{ dir bool }

func (f fakeInfo) Name() string       { return "" }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return 0o755 }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.dir }
func (f fakeInfo) Sys() any           { return nil }

func TestLookPath(t *testing.T) {
	files := map[string]bool{"/bin/p": false, "./p": false, "/usr/bin/p": false, "/d/p": true, "sub/p": false}
	stat := func(p string) (fs.FileInfo, error) {
		if dir, ok := files[p]; ok {
			return fakeInfo{dir}, nil
		}
		return nil, os.ErrNotExist
	}
	for _, tc := range []struct {
		file, path string
		set        bool
		want       []string
		err        error
	}{
		{"p", "/bin:/usr/bin", true, []string{"/bin/p", "/usr/bin/p"}, nil},
		{"p", ".", true, []string{"./p"}, nil},
		{"p", "", true, []string{"./p"}, nil},
		{"p", "/x::/bin", true, []string{"./p", "/bin/p"}, nil},
		{"p", "/bin:", true, []string{"/bin/p", "./p"}, nil},
		{"p", "", false, []string{"/bin/p", "/usr/bin/p"}, nil},
		{"p", "/d", true, nil, fs.ErrPermission},
		{"p", "/x", true, nil, errNotFound},
		{"sub/p", "/x", true, []string{"sub/p"}, nil},
		{"/abs/q", "", true, []string{"/abs/q"}, nil},
	} {
		got, err := lookPath(tc.file, tc.path, tc.set, stat)
		assert.Equal(t, tc.want, got, "%q in PATH=%q (set %v)", tc.file, tc.path, tc.set)
		assert.ErrorIs(t, err, tc.err)
		if tc.err == nil {
			assert.NoError(t, err)
		}
	}
}
