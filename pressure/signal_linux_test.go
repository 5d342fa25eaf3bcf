package pressure

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	w, err := openSignal(source{kind: srcSystemd, path: fifo, write: []byte("some 200000 2000000")})
	require.NoError(t, err)
	defer w.close()
	assert.Zero(t, w.drain(), "memctl's own write is not a signal")
	// A real signal still is.
	wr, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(wr)
	_, err = unix.Write(wr, []byte("x"))
	require.NoError(t, err)
	assert.Equal(t, int64(1), w.drain())
}

// The watcher reads the trigger's state's total from the file it armed
// (here a regular file standing in for the PSI file) when it arms, and
// ignores an event whose stall since then is under the threshold.
func TestWatcherChecksStallSinceArming(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory")
	write := func(some, full int64) {
		require.NoError(t, os.WriteFile(path, fmt.Appendf(nil,
			"some avg10=0.00 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=%d\n", some, full), 0o600))
	}
	for _, tc := range []struct {
		trigger    string
		some, full int64 // totals after the event
		since      int64
		ignore     bool
	}{
		{"some 150000 2000000\x00", 1_000_000, 500_000, 0, true},
		{"some 150000 2000000\x00", 1_028_604, 500_000, 28_604, true},
		{"some 150000 2000000\x00", 1_150_000, 500_000, 150_000, false},
		{"full 150000 2000000\x00", 2_000_000, 500_100, 100, true}, // full's own total, not some's
		{"full 150000 2000000\x00", 1_000_000, 650_000, 150_000, false},
	} {
		write(1_000_000, 500_000)
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		w := &signal{path: "test srcPSI", fd: fd, kind: srcPSI}
		w.armPSI([]byte(tc.trigger))
		require.Empty(t, w.noCheck)
		write(tc.some, tc.full)
		since, _, ignore := w.unexplained()
		assert.Equal(t, tc.ignore, ignore, "%q some=%d full=%d", tc.trigger, tc.some, tc.full)
		assert.Equal(t, time.Duration(tc.since)*time.Microsecond, since, "%q", tc.trigger)
		unix.Close(fd)
	}
	// A file without the total: no check, and why.
	require.NoError(t, os.WriteFile(path, []byte("garbage\n"), 0o600))
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	w := &signal{path: "test srcPSI", fd: fd, kind: srcPSI}
	w.armPSI([]byte("some 150000 2000000\x00"))
	assert.Nil(t, w.psi)
	assert.Contains(t, w.noCheck, "no some total=")
	_, _, ignore := w.unexplained()
	assert.False(t, ignore, "unchecked: delivered")
}

// hostMakeup reads RssAnon from the status file beside /proc/meminfo.
func TestHostMakeupOwn(t *testing.T) {
	dir := t.TempDir()
	status := filepath.Join(dir, "status")
	require.NoError(t, os.WriteFile(status, []byte("Name:\tx\nRssAnon:\t  1024 kB\n"), 0o600))
	mk, err := hostMakeup("testdata/meminfo", status)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), mk.Own)
	mk, err = hostMakeup("testdata/meminfo", filepath.Join(dir, "missing"))
	require.NoError(t, err, "the host's makeup stands without the process's")
	assert.Equal(t, int64(-1), mk.Own)
	mk, err = hostMakeup("/proc/meminfo", "/proc/self/status")
	require.NoError(t, err)
	assert.Positive(t, mk.Own, "this process's real RssAnon")
	assert.Less(t, mk.Own, mk.Anon+1)
}
