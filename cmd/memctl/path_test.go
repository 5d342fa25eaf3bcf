package main

import (
	"io/fs"
	"os"
	"strings"
	"syscall"
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
		if p == "/denied/p" {
			return nil, &fs.PathError{Op: "stat", Path: p, Err: syscall.EACCES}
		}
		if p == "/l/../bin/p" || p == "/bin//p" {
			p = "/bin/p"
		}
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
		// As execvp(3): an empty name is not searched (ENOENT), a name
		// over NAME_MAX is ENAMETOOLONG, an entry is not cleaned ("/l"
		// may be a symlink), and a candidate stat cannot see (EACCES)
		// is left to execve(2).
		{"", "/bin", true, nil, errNotFound},
		{strings.Repeat("x", 256), "/bin", true, nil, errNameTooLong},
		{"p", "/l/../bin:/bin/", true, []string{"/l/../bin/p", "/bin//p"}, nil},
		{"p", "/denied:/bin", true, []string{"/denied/p", "/bin/p"}, nil},
	} {
		got, err := lookPath(tc.file, tc.path, tc.set, stat)
		assert.Equal(t, tc.want, got, "%q in PATH=%q (set %v)", tc.file, tc.path, tc.set)
		assert.ErrorIs(t, err, tc.err)
		if tc.err == nil {
			assert.NoError(t, err)
		}
	}
}
