package cgroupfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// unreadableTree makes a cgroup v2 fixture of files (cgroup /app) that
// nobody may walk, with the file unreadable (relative to the fixture's
// root) at mode 0000, and returns the fixture and that file's path. It
// skips when not root (the read switches a thread's file-system UID).
func unreadableTree(t *testing.T, files map[string]string, unreadable string) (dir, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch the file-system UID of a thread")
	}
	dir = tree(t, "0::/app\n", "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n", files)
	for d := dir; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755)) // nobody may walk to the files
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

// readTreeAsNobody reads the fixture dir on one thread whose file-system
// UID is nobody's (setfsuid(2), which also drops CAP_DAC_OVERRIDE for the
// thread); it skips when setfsuid has no effect.
func readTreeAsNobody(t *testing.T, dir string) (Limit, error) {
	t.Helper()
	type res struct {
		l   Limit
		err error
	}
	errNoEffect := errors.New("setfsuid had no effect")
	c := make(chan res, 1)
	go func() {
		// The thread is not unlocked: it ends with the goroutine, so no
		// other goroutine ever runs with its file-system UID.
		runtime.LockOSThread()
		_, _ = unix.SetfsuidRetUid(65534)
		if prev, _ := unix.SetfsuidRetUid(65534); prev != 65534 {
			c <- res{err: errNoEffect}
			return
		}
		l, err := readTree(dir)
		c <- res{l, err}
	}()
	r := <-c
	if r.err == errNoEffect {
		t.Skip(r.err)
	}
	return r.l, r.err
}

// TestControllersEACCES: cgroup.controllers that the reader may not read
// (EACCES: an LSM, an unprivileged reader) is an error naming the file, not
// "no cgroup memory limit". The read runs as nobody over a fixture whose
// cgroup.controllers has mode 0000.
func TestControllersEACCES(t *testing.T) {
	dir, controllers := unreadableTree(t,
		map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app/memory.max": "268435456\n"}, "cg/cgroup.controllers")
	_, err := readTreeAsNobody(t, dir)
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrPermission)
	assert.False(t, errors.Is(err, ErrNoCgroup), "%v", err)
	assert.ErrorContains(t, err, controllers)
}
