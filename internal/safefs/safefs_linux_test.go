package safefs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// tree makes a directory standing for another process's root: a regular
// file, a decoy /etc/shadow, symlinks out of it (absolute, relative, to
// /dev/zero), a FIFO and a file larger than the cap, and a secret file
// outside it.
func tree(t *testing.T) (root, secret string) {
	t.Helper()
	top := t.TempDir()
	secret = filepath.Join(top, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("SECRET-MARKER"), 0o600))
	root = filepath.Join(top, "root")
	for _, d := range []string{"etc", "sys/fs/cgroup/memory"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	cg := filepath.Join(root, "sys/fs/cgroup/memory")
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/shadow"), []byte("decoy"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(cg, "ok"), []byte("12345\n"), 0o644))
	require.NoError(t, os.Symlink(secret, filepath.Join(cg, "abs")))
	require.NoError(t, os.Symlink("../../../../../secret", filepath.Join(cg, "rel")))
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(cg, "shadow")))
	require.NoError(t, os.Symlink("/dev/zero", filepath.Join(cg, "zero")))
	require.NoError(t, os.Symlink("/proc/self/root"+secret, filepath.Join(cg, "magic")))
	require.NoError(t, os.Symlink(top, filepath.Join(root, "sys/fs/out")))
	require.NoError(t, unix.Mkfifo(filepath.Join(cg, "fifo"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(cg, "huge"), make([]byte, 100<<10), 0o644))
	return root, secret
}

func openDir(t *testing.T, path string, mode Mode) *Dir {
	t.Helper()
	d, err := OpenDir(path, mode)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

func bothWays(t *testing.T, f func(t *testing.T, fallback bool)) {
	t.Run("openat2", func(t *testing.T) { f(t, false) })
	t.Run("fallback", func(t *testing.T) {
		useOpenat2 = false
		defer func() { useOpenat2 = true }()
		f(t, true)
	})
}

func TestReadFileHostile(t *testing.T) {
	defer goleak.VerifyNone(t)
	root, _ := tree(t)
	bothWays(t, func(t *testing.T, fallback bool) {
		for _, mode := range []Mode{InRoot | NoSymlinks, InRoot, NoSymlinks} {
			d := openDir(t, root, mode)
			d.Timeout = 5 * time.Second
			b, err := d.ReadFile("/sys/fs/cgroup/memory/ok", MaxCgroupFile)
			require.NoError(t, err)
			assert.Equal(t, "12345\n", string(b))

			for _, name := range []string{"abs", "rel", "zero", "magic", "shadow", "fifo", "huge", "../../../../secret"} {
				b, err := d.ReadFile("sys/fs/cgroup/memory/"+name, MaxCgroupFile)
				if name == "shadow" && mode == InRoot && !fallback {
					// An absolute symlink resolves in the root: the decoy,
					// which the process could read itself anyway.
					require.NoError(t, err)
					assert.Equal(t, "decoy", string(b))
					continue
				}
				require.Error(t, err, "%v %s", mode, name)
				assert.Nil(t, b)
				assert.NotContains(t, err.Error(), "SECRET")
				var pe *PathError
				require.ErrorAs(t, err, &pe)
				switch name {
				case "fifo":
					assert.ErrorIs(t, err, ErrNotRegular)
					assert.Contains(t, err.Error(), "a FIFO")
				case "huge":
					assert.ErrorIs(t, err, ErrTooLarge)
				case "zero":
					if mode&NoSymlinks != 0 || fallback {
						assert.ErrorIs(t, err, ErrSymlink)
					} else {
						// In the root, /dev/zero does not exist.
						assert.ErrorIs(t, err, fs.ErrNotExist)
					}
				case "magic":
					if mode&NoSymlinks != 0 || fallback {
						assert.ErrorIs(t, err, ErrSymlink)
					} else {
						assert.ErrorIs(t, err, fs.ErrNotExist, "no /proc in the root")
					}
				}
			}
			// A symlinked directory on the way.
			_, err = d.ReadFile("sys/fs/out/secret", MaxCgroupFile)
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "SECRET-MARKER")
		}
	})
}

func TestMagicLinkRefused(t *testing.T) {
	bothWays(t, func(t *testing.T, fallback bool) {
		d := openDir(t, "/proc/self", 0)
		_, err := d.ReadFile("status", MaxProcFile)
		require.NoError(t, err)
		_, err = d.ReadFile("root/etc/hostname", MaxProcFile)
		assert.ErrorIs(t, err, ErrSymlink, "/proc/self/root is a magic link")
		_, err = d.ReadFile("fd/0", MaxProcFile)
		assert.ErrorIs(t, err, ErrSymlink)
		_, err = d.ReadFile("../self/status", MaxProcFile)
		assert.Error(t, err, "beneath: .. refused")
	})
}

func TestSubFollowsRoot(t *testing.T) {
	d := openDir(t, "/proc/self", 0)
	r, err := d.Sub("root", InRoot|NoSymlinks)
	require.NoError(t, err)
	defer r.Close()
	assert.Equal(t, "/proc/self/root", r.Name())
	want, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	got, err := r.ReadFile("/proc/"+strconv.Itoa(os.Getpid())+"/mountinfo", MaxMountinfo)
	require.NoError(t, err)
	_, err = r.ReadFile("/proc/self/mountinfo", MaxMountinfo)
	assert.ErrorIs(t, err, ErrSymlink, "/proc/self is a symlink")
	assert.Equal(t, len(strings.Split(string(want), "\n")), len(strings.Split(string(got), "\n")))
	assert.NoError(t, r.Stat("/proc"))
	assert.ErrorIs(t, r.Stat("/proc/nope"), fs.ErrNotExist)
}

func TestCap(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("12345"), 0o644))
	d := openDir(t, dir, InRoot)
	b, err := d.ReadFile("f", 5)
	require.NoError(t, err)
	assert.Equal(t, "12345", string(b))
	_, err = d.ReadFile("f", 4)
	assert.ErrorIs(t, err, ErrTooLarge)
	b, err = d.ReadFile("f", 0)
	assert.ErrorIs(t, err, ErrTooLarge)
	assert.Nil(t, b)
	_, err = d.ReadFile(".", 10)
	assert.ErrorIs(t, err, ErrNotRegular)
	assert.Contains(t, err.Error(), "a directory")
}

// TestTimeout blocks a read (as a FUSE file would) and checks that the call
// returns, and that the blocked goroutine ends when the read is let go.
func TestTimeout(t *testing.T) {
	defer goleak.VerifyNone(t)
	d := openDir(t, t.TempDir(), InRoot)
	d.Timeout = 50 * time.Millisecond
	release := make(chan struct{})
	seen := make(chan int, 1)
	dirfd := d.fd
	_, err := do(d, "read", "x\x1b", func(fd int) ([]byte, error) {
		seen <- fd
		<-release
		return nil, nil
	})
	assert.ErrorIs(t, err, ErrTimeout)
	assert.Contains(t, err.Error(), `x\x1b`)
	require.NoError(t, d.Close(), "closing the Dir while the read is blocked")
	fdSeen := <-seen
	assert.NotEqual(t, dirfd, fdSeen, "the goroutine works on its own duplicate")
	close(release)
	// It closes the duplicate when the read is let go.
	assert.Eventually(t, func() bool {
		return errors.Is(unix.FcntlFlock(uintptr(fdSeen), unix.F_GETLK, &unix.Flock_t{}), syscall.EBADF)
	}, 5*time.Second, time.Millisecond)
}

// TestFSTypes: a Dir limited to cgroup file systems reads a real cgroup
// file and refuses any other file, such as one bind-mounted over a cgroup
// file.
func TestFSTypes(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("1\n"), 0o644))
	d := openDir(t, dir, InRoot|NoSymlinks)
	d.FSTypes = []int64{CgroupMagic, Cgroup2Magic}
	_, err := d.ReadFile("f", 10)
	assert.ErrorIs(t, err, ErrFileSystem)
	assert.Contains(t, err.Error(), "not cgroup (0x27e0eb) or cgroup2 (0x63677270)")
	assert.ErrorIs(t, d.Stat("/"), ErrFileSystem)

	var cg string
	for _, p := range []string{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/cgroup.controllers"} {
		if _, err := os.Stat(p); err == nil {
			cg = p
			break
		}
	}
	if cg == "" {
		t.Skip("no cgroup file at /sys/fs/cgroup here")
	}
	root := openDir(t, "/", InRoot|NoSymlinks)
	root.FSTypes = []int64{CgroupMagic, Cgroup2Magic}
	_, err = root.ReadFile(cg, MaxCgroupFile)
	require.NoError(t, err)
	require.NoError(t, root.Stat(filepath.Dir(cg)))
	sub, err := root.Sub("sys", InRoot)
	require.NoError(t, err)
	defer sub.Close()
	assert.Equal(t, root.FSTypes, sub.FSTypes, "Sub keeps FSTypes")
}

// TestNotRegularNeverOpened: a FIFO and a device node (which a hostile
// process bind-mounts over its own cgroup files) are refused
// without being opened for reading: inotify sees no IN_OPEN. Opening a
// device runs its driver's open, as root, on a device the other process
// chose (opening /dev/watchdog arms it; a serial port raises DTR), and
// opening a FIFO releases a writer blocked in open(2). Checked by fstat on
// an O_PATH descriptor before the file is opened.
func TestNotRegularNeverOpened(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o644))
	files := []string{"fifo"}
	// A device node of its own (1:3, as /dev/null, whose open is
	// harmless), so that no other process's open of /dev/null is seen.
	if err := unix.Mknod(filepath.Join(dir, "dev"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))); err == nil {
		files = append(files, "dev")
	} else {
		t.Logf("mknod: %v (not root?): the device node case is skipped", err)
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(in)
	for _, f := range files {
		_, err := unix.InotifyAddWatch(in, filepath.Join(dir, f), unix.IN_OPEN)
		require.NoError(t, err)
	}
	for _, fallback := range []bool{false, true} {
		useOpenat2 = !fallback
		d := openDir(t, dir, InRoot|NoSymlinks)
		for _, f := range files {
			_, err := d.ReadFile(f, MaxCgroupFile)
			require.ErrorIs(t, err, ErrNotRegular, "%s (fallback %v)", f, fallback)
		}
		buf := make([]byte, 4096)
		n, err := unix.Read(in, buf)
		assert.True(t, errors.Is(err, unix.EAGAIN), "IN_OPEN seen (%d bytes of events, fallback %v): a file was opened", n, fallback)
	}
	useOpenat2 = true
}

// TestScanLines: lines in order without their newline, each's error as it
// is, the cap and the regular-file rule of ReadFile.
func TestScanLines(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("a\n\nccc\nlast"), 0o644))
	require.NoError(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	d := openDir(t, dir, InRoot|NoSymlinks)
	var got []string
	require.NoError(t, d.ScanLines("f", 100, func(l []byte) error { got = append(got, string(l)); return nil }))
	assert.Equal(t, []string{"a", "", "ccc", "last"}, got)
	stop := errors.New("stop")
	n := 0
	err := d.ScanLines("f", 100, func([]byte) error { n++; return stop })
	assert.Same(t, stop, err)
	assert.Equal(t, 1, n)
	err = d.ScanLines("f", 5, func([]byte) error { return nil })
	assert.ErrorIs(t, err, ErrTooLarge)
	require.NoError(t, d.ScanLines("f", 12, func([]byte) error { return nil }), "exactly the cap")
	err = d.ScanLines("fifo", 100, func([]byte) error { return nil })
	assert.ErrorIs(t, err, ErrNotRegular)
	d.Timeout = time.Minute
	got = nil
	require.NoError(t, d.ScanLines("f", 100, func(l []byte) error { got = append(got, string(l)); return nil }))
	assert.Len(t, got, 4)
}
