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

	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte("hello"))
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
	require.NoError(t, unix.Ftruncate(fd, 1<<40))
	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "(1099511627776 bytes)")
	require.NoError(t, unix.Ftruncate(fd, 65))
	_, _, err = proc.ReadMemfd(name, 64)
	require.ErrorIs(t, err, ErrTooLarge)
}
