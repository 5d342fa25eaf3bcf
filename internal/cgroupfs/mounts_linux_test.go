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
	size, got, err := inPrivateMounts(func() error {
		for range 2500 {
			if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, size, 1<<20, "mountinfo over the old 1 MiB cap")
	assert.Equal(t, want.Bytes, got.Bytes)
	assert.Equal(t, want.Version, got.Version)
	assert.Equal(t, want.Cgroup, got.Cgroup)
}

// inPrivateMounts makes a mount namespace for one thread, private from the
// host's, runs mount in it, and reads the thread's cgroup limit there
// (cgroupfs.OfProc of /proc/thread-self), with the size of its mountinfo.
func inPrivateMounts(mount func() error) (size int, l cgroupfs.Limit, err error) {
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
		if r.err = mount(); r.err != nil {
			return
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
	return r.size, r.l, r.err
}

// TestNsfsBindMount (attack on issue 18): a namespace file bind-mounted
// somewhere (ip netns add, and the CNI plugins' /run/netns/cni-*, do so on
// every Kubernetes node and Docker host) is a mountinfo line whose root is
// not a path: "66 46 0:4 net:[4026531833] /run/netns/x rw - nsfs nsfs rw"
// (seen here). The line was "malformed, root and mount point must be
// absolute", and the whole read failed: no limit in any process of such a
// host's mount namespace. Only the cgroup mounts' paths must be absolute.
func TestNsfsBindMount(t *testing.T) {
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
	target := filepath.Join(t.TempDir(), "netns")
	require.NoError(t, os.WriteFile(target, nil, 0o644))
	var line string
	_, got, err := inPrivateMounts(func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", target, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, " nsfs ") {
				line = l
			}
		}
		return err
	})
	require.NoError(t, err)
	assert.Regexp(t, ` net:\[\d+\] `, line, "the nsfs line's root is not a path")
	assert.Equal(t, want.Bytes, got.Bytes)
	assert.Equal(t, want.Cgroup, got.Cgroup)
	t.Logf("nsfs line: %q; limit %d from %s", line, got.Bytes, got.File)
}
