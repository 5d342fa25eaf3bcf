package safefs

import (
	"io/fs"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// ReadMemfd finds a memfd by its name among this process's descriptors,
// reads it within the cap, refuses a longer one without reading it, and
// says ErrNotExist when there is none.
func TestReadMemfd(t *testing.T) {
	proc, err := OpenDir("/proc/self", NoSymlinks)
	require.NoError(t, err)
	defer proc.Close()
	name := "safefs-test-" + strconv.Itoa(unix.Getpid())

	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, fs.ErrNotExist)

	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte("hello"))
	require.NoError(t, err)

	// Not sealed: it could change while read; refused.
	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, ErrNotSealed)
	assert.Contains(t, err.Error(), "seals 0x0, want 0xe")
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK)
	require.NoError(t, err)
	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, ErrNotSealed, "growth not sealed")
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_GROW)
	require.NoError(t, err)

	path, b, err := proc.ReadMemfd(name, 64)
	require.NoError(t, err)
	assert.Equal(t, "/proc/self/fd/"+strconv.Itoa(fd), path)
	assert.Equal(t, "hello", string(b))

	// Another memfd whose name only starts the same is not it.
	other, err := unix.MemfdCreate(name+"x", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(other)
	path, _, err = proc.ReadMemfd(name, 64)
	require.NoError(t, err)
	assert.Equal(t, "/proc/self/fd/"+strconv.Itoa(fd), path)

	// Over the cap: refused from its size, before a byte is read.
	big := func(size int64) {
		require.NoError(t, unix.Close(fd))
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		require.NoError(t, err)
		require.NoError(t, unix.Ftruncate(fd, size))
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
		require.NoError(t, err)
	}
	big(1 << 40)
	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "(1099511627776 bytes)")
	big(65)
	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, ErrTooLarge)
}

// ReadMemfd looks at most maxFDs descriptors: a process holding more before
// its memfd gets an error matching ErrTooLarge, not a scan of a million
// readlinks; one holding fewer has its memfd found after all of them.
func TestReadMemfdManyFDs(t *testing.T) {
	proc, err := OpenDir("/proc/self", NoSymlinks)
	require.NoError(t, err)
	defer proc.Close()
	defer func(n int) { maxFDs = n }(maxFDs)
	maxFDs = 300
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for range 400 {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		fds = append(fds, fd)
	}
	name := "safefs-many-" + strconv.Itoa(unix.Getpid())
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	fds = append(fds, fd)
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	require.NoError(t, err)
	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "more than 300 descriptors")
	maxFDs = 1000
	path, _, err := proc.ReadMemfd(name, 64)
	require.NoError(t, err)
	assert.Equal(t, "/proc/self/fd/"+strconv.Itoa(fd), path)
}
