package cgroupfs_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/safefs"
)

// TestManyMounts: a mount namespace with 2500 long mounts (a mountinfo of
// 1.5 MB, as on a host running many containers, or as a process makes
// in its own namespace to hide its limit from memctl status) still gives
// the cgroup limit. The mountinfo was read whole under a 1 MiB cap, and the
// limit was an error (file larger than the cap).
func TestManyMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	if _, err := os.Stat("/proc/thread-self/mountinfo"); err != nil {
		t.Skipf("no /proc/thread-self: %v", err)
	}
	want, err := cgroupfs.Of(0)
	if err != nil {
		t.Skipf("no memory cgroup here: %v", err)
	}
	// A long name makes lines of about 600 bytes: 2500 mounts are 1.5 MB.
	dir := filepath.Join(t.TempDir(), strings.Repeat("many-mounts-", 20))
	require.NoError(t, os.Mkdir(dir, 0o755))
	type result struct {
		size int
		l    cgroupfs.Limit
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// The mounts are made in a mount namespace of this goroutine's
		// thread only, which ends with it: a goroutine that exits locked
		// ends its thread. The test's own thread stays in the host's
		// namespace, so that TempDir can be removed.
		//
		// The goroutine can run on the main thread, which the runtime
		// parks instead of ending: that would leave the process's
		// /proc/self/ns/mnt in the test's namespace and make later tests
		// in this binary see their children in "another" namespace. So the
		// thread goes back to the host's namespace (setns) before it is
		// unlocked.
		runtime.LockOSThread()
		var r result
		defer func() { ch <- r }()
		host, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if r.err = err; err != nil {
			return
		}
		cwd, err := unix.Open(".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if r.err = err; err != nil {
			unix.Close(host)
			return
		}
		defer func() {
			// setns also moves the thread's working directory to "/":
			// back to the test's before the thread serves other goroutines.
			if unix.Setns(host, unix.CLONE_NEWNS) == nil && unix.Fchdir(cwd) == nil {
				runtime.UnlockOSThread()
			}
			unix.Close(host)
			unix.Close(cwd)
		}()
		if r.err = unix.Unshare(unix.CLONE_NEWNS); r.err != nil {
			return
		}
		if r.err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); r.err != nil {
			return
		}
		for range 2500 {
			if r.err = unix.Mount(dir, dir, "", unix.MS_BIND, ""); r.err != nil {
				return
			}
		}
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		if r.size, r.err = len(b), err; err != nil {
			return
		}
		proc, err := safefs.OpenDir("/proc/thread-self", safefs.NoSymlinks)
		if r.err = err; err != nil {
			return
		}
		defer proc.Close()
		r.l, _, r.err = cgroupfs.OfProc(proc)
	}()
	r := <-ch
	require.NoError(t, r.err)
	require.Greater(t, r.size, 1<<20, "mountinfo over the old 1 MiB cap")
	got := r.l
	assert.Equal(t, want.Bytes, got.Bytes)
	assert.Equal(t, want.Version, got.Version)
	assert.Equal(t, want.Cgroup, got.Cgroup)
}
