//go:build linux

package pressure

import (
	"os"
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

// Attack input (issue 17): host-wide PSI while the host is short of a
// neighbour's anonymous memory (AnonPages far above the page cache, this
// process holding little of it). Before, every such signal also cancelled
// this service's largest request, which gives the neighbour nothing back.
// Now the cancel needs this process to hold at least half of the host's
// anonymous memory; the trim is asked for either way (its gate decides).
func TestHostWideCancelNeedsOwnAnon(t *testing.T) {
	var trims, cancels int
	m := &Monitor{cfg: Config{Trim: func() { trims++ }, CancelLargest: func() { cancels++ }}}
	m.subs.Store(new([]*subscriber))
	host := &watcher{name: "host-wide PSI test", hostWide: true}
	const gib = 1 << 30
	for _, tc := range []struct {
		name   string
		mk     Makeup
		cancel bool
	}{
		{"a neighbour's anonymous memory", Makeup{Anon: 20 * gib, Cache: 2 * gib, Own: 1 * gib}, false},
		{"this process's anonymous memory", Makeup{Anon: 20 * gib, Cache: 2 * gib, Own: 12 * gib}, true},
		{"half of it", Makeup{Anon: 20 * gib, Cache: 2 * gib, Own: 10 * gib}, true},
		{"own unknown", Makeup{Anon: 20 * gib, Cache: 2 * gib, Own: -1}, false},
		{"mostly page cache", Makeup{Anon: 2 * gib, Cache: 20 * gib, Own: 2 * gib}, false},
		{"unknown", Makeup{Anon: -1, Cache: -1, Own: -1}, false},
	} {
		trims, cancels = 0, 0
		held := m.held.Load()
		assert.True(t, m.act(host, 1, tc.mk), tc.name)
		assert.Equal(t, 1, trims, "%s: the trim is asked for", tc.name)
		want := 0
		if tc.cancel {
			want = 1
		}
		assert.Equal(t, want, cancels, tc.name)
		assert.Equal(t, int64(1-want), m.held.Load()-held, "%s: counted as held", tc.name)
	}
	// A cgroup's own signal: its memory is the cgroup's, Own is not needed.
	trims, cancels = 0, 0
	assert.True(t, m.act(&watcher{name: "cgroup"}, 1, Makeup{Anon: 200 << 20, Cache: 10 << 20, Own: -1}))
	assert.Equal(t, 1, cancels)
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
