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

// TestControllersEACCES: cgroup.controllers that the reader may not read
// (EACCES: an LSM, an unprivileged reader) is an error naming the file, not
// "no cgroup memory limit". The read runs on one thread whose file-system
// UID is nobody's (setfsuid(2), which also drops CAP_DAC_OVERRIDE for the
// thread), over a fixture whose cgroup.controllers has mode 0000.
func TestControllersEACCES(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch the file-system UID of a thread")
	}
	dir := tree(t, "0::/app\n", "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n",
		map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app/memory.max": "268435456\n"})
	for d := dir; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755)) // nobody may walk to the files
	}
	require.NoError(t, filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	}))
	controllers := filepath.Join(dir, "cg/cgroup.controllers")
	require.NoError(t, os.Chmod(controllers, 0))

	errc := make(chan error, 1)
	go func() {
		// The thread is not unlocked: it ends with the goroutine, so no
		// other goroutine ever runs with its file-system UID.
		runtime.LockOSThread()
		_, _ = unix.SetfsuidRetUid(65534)
		if prev, _ := unix.SetfsuidRetUid(65534); prev != 65534 {
			errc <- errors.New("setfsuid had no effect")
			return
		}
		_, err := readTree(dir)
		errc <- err
	}()
	err := <-errc
	require.Error(t, err)
	if err.Error() == "setfsuid had no effect" {
		t.Skip(err)
	}
	assert.ErrorIs(t, err, fs.ErrPermission)
	assert.False(t, errors.Is(err, ErrNoCgroup), "%v", err)
	assert.ErrorContains(t, err, controllers)
}
