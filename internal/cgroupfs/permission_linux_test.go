package cgroupfs

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPeerAutomemlimitPermission: automemlimit's permission_after_readable
// case (memlimit/cgroups_test.go: two mounts of one hierarchy, the first
// readable with a limit, the second's files unreadable; automemlimit
// returns the readable mount's limit). memctl failed the whole read with
// EACCES. Now the readable mount's limit is returned and the unreadable
// mount is kept in Unreadable, naming its file; in either order. When no
// readable mount sets a limit, the EACCES stands (the limit is unknown).
// Read as nobody (setfsuid) over fixtures with mode 0000 files.
func TestPeerAutomemlimitPermission(t *testing.T) {
	const mi = "30 22 0:26 / {{ROOT}}/a rw - cgroup2 cgroup2 rw\n31 22 0:26 / {{ROOT}}/b rw - cgroup2 cgroup2 rw\n"
	for _, tc := range []struct {
		name       string
		readable   string // the mount whose memory.max is readable
		limit      string // its memory.max
		wantBytes  int64
		wantDenied bool
	}{
		{"permission_after_readable", "a", "268435456\n", 256 << 20, false},
		{"permission_before_readable", "b", "268435456\n", 256 << 20, false},
		{"readable_sets_none", "a", "max\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := map[string]string{"a": "b", "b": "a"}[tc.readable]
			files := map[string]string{
				"a/cgroup.controllers": "memory\n", "b/cgroup.controllers": "memory\n",
				tc.readable + "/app/memory.max": tc.limit,
				other + "/app/memory.max":       "134217728\n",
			}
			dir, denied := unreadableTreeMI(t, "0::/app\n", mi, files, other+"/app/memory.max")
			l, err := readTreeAsNobody(t, dir)
			if tc.wantDenied {
				require.Error(t, err)
				assert.ErrorIs(t, err, fs.ErrPermission)
				assert.ErrorContains(t, err, denied)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantBytes, l.Bytes)
			assert.Equal(t, filepath.Join(dir, tc.readable, "app/memory.max"), l.File)
			require.Len(t, l.Unreadable, 1)
			assert.ErrorIs(t, l.Unreadable[0], fs.ErrPermission)
			assert.ErrorContains(t, l.Unreadable[0], denied)
		})
	}
}

// unreadableTreeMI is unreadableTree with its own cgroup and mountinfo.
func unreadableTreeMI(t *testing.T, cgroup, mountinfo string, files map[string]string, unreadable string) (dir, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch the file-system UID of a thread")
	}
	dir = tree(t, cgroup, mountinfo, files)
	for d := dir; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	require.NoError(t, filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	}))
	path = filepath.Join(dir, unreadable)
	require.NoError(t, os.Chmod(path, 0))
	return dir, path
}
