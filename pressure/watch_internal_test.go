//go:build linux

package pressure

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Attack input (issue 17): $MEMORY_PRESSURE_WATCH a FIFO and
// $MEMORY_PRESSURE_WRITE set. The FIFO is opened read-write, so the bytes
// written into it were read back as the service manager's first signal:
// a trim (and a cancel) at start-up with no pressure at all. Now they are
// drained when written.
func TestSystemdFIFOOwnWriteIsNoSignal(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "memory-pressure")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	w, err := openSource(source{kind: srcSystemd, path: fifo, write: []byte("some 200000 2000000")})
	require.NoError(t, err)
	defer w.closeFDs()
	assert.Zero(t, w.drain(), "memctl's own write is not a signal")
	// A real signal still is.
	wr, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(wr)
	_, err = unix.Write(wr, []byte("x"))
	require.NoError(t, err)
	assert.Equal(t, int64(1), w.drain())
}
