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

// TestHighEACCES (attack on issue 18): a memory.high the reader may not
// read (EACCES, read on a thread with nobody's file-system UID over a
// fixture whose memory.high has mode 0000) failed the whole read, so
// memory.max was not honoured either. It is kept aside in HighErr, naming
// the file, as a malformed memory.high is, and memory.max is read.
func TestHighEACCES(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch the file-system UID of a thread")
	}
	dir := tree(t, "0::/app\n", "30 22 0:26 / {{ROOT}}/cg rw - cgroup2 cgroup2 rw\n",
		map[string]string{"cg/cgroup.controllers": "memory\n", "cg/app/memory.max": "268435456\n", "cg/app/memory.high": "134217728\n"})
	for d := dir; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755)) // nobody may walk to the files
	}
	require.NoError(t, filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	}))
	high := filepath.Join(dir, "cg/app/memory.high")
	require.NoError(t, os.Chmod(high, 0))

	type res struct {
		l   Limit
		err error
	}
	c := make(chan res, 1)
	go func() {
		// The thread is not unlocked: it ends with the goroutine, so no
		// other goroutine ever runs with its file-system UID.
		runtime.LockOSThread()
		_, _ = unix.SetfsuidRetUid(65534)
		if prev, _ := unix.SetfsuidRetUid(65534); prev != 65534 {
			c <- res{err: errors.New("setfsuid had no effect")}
			return
		}
		l, err := readTree(dir)
		c <- res{l, err}
	}()
	r := <-c
	if r.err != nil && r.err.Error() == "setfsuid had no effect" {
		t.Skip(r.err)
	}
	require.NoError(t, r.err)
	assert.Equal(t, int64(256<<20), r.l.Bytes, "memory.max is honoured")
	assert.Equal(t, int64(256<<20), r.l.Max)
	assert.Equal(t, int64(NoLimit), r.l.High)
	require.Error(t, r.l.HighErr)
	assert.ErrorIs(t, r.l.HighErr, fs.ErrPermission)
	assert.ErrorContains(t, r.l.HighErr, high)
}
