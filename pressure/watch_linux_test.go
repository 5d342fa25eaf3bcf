//go:build linux

package pressure_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/pressure"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func waitKernel(t *testing.T, ch <-chan pressure.Event, within time.Duration) pressure.Event {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case e, ok := <-ch:
			require.True(t, ok, "channel closed before a kernel event")
			if e.Kind == pressure.KindKernel {
				return e
			}
		case <-deadline:
			t.Fatalf("no kernel pressure event within %v", within)
		}
	}
}

// TestSystemPSITrigger writes the default trigger (some 200 ms in 2 s) to
// /proc/pressure/memory and gets an event, and a trim, while a child
// thrashes a 256 MiB cgroup (system-wide PSI counts the stalls of every
// cgroup).
func TestSystemPSITrigger(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI (CONFIG_PSI): %v", err)
	}
	defer goleak.VerifyNone(t)
	var trims atomic.Int64
	m, err := pressure.StartWith(pressure.Config{Watch: "system", SpiralOff: true, Logger: discard},
		pressure.Fakes{Trim: func() { trims.Add(1) }})
	if m != nil {
		assert.Equal(t, `Config.Watch is "system"`, m.SourceNote())
	}
	if errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("PSI is disabled (psi=0): %v", err)
	}
	if errors.Is(err, os.ErrPermission) {
		t.Skipf("writing a PSI trigger needs root here: %v", err)
	}
	require.NoError(t, err)
	defer m.Close()
	assert.Equal(t, "host-wide PSI /proc/pressure/memory (some 200ms in 2s)", m.Source())
	ch, _ := m.Subscribe(16)

	g := cgrouptest.New(t, 256<<20)
	cmd := childtest.Command(t, "thrash", nil, "ANON_MIB=200", "CACHE_DIR="+t.TempDir(), "THRASH_S=60")
	g.Wrap(cmd)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	e := waitKernel(t, ch, 60*time.Second)
	assert.Equal(t, m.Source(), e.Source)
	assert.GreaterOrEqual(t, e.Signals, int64(1))
	assert.GreaterOrEqual(t, trims.Load(), int64(1))
	s := m.Stats()
	assert.GreaterOrEqual(t, s.Acted, int64(1))
	assert.GreaterOrEqual(t, s.Signals, s.Acted)
}

// TestPSITriggerWindows: a trigger window under 2 s needs CAP_SYS_RESOURCE
// (Linux 6.5 and later refuse windows that are not a multiple of 2 s to
// other processes with EINVAL), which is why the default window is 2 s.
// Root in a container often lacks the capability (this machine's root
// does): the test checks whichever applies.
func TestPSITriggerWindows(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI (CONFIG_PSI): %v", err)
	}
	defer goleak.VerifyNone(t)
	m, err := pressure.Start(pressure.Config{Watch: "system", SpiralOff: true, Logger: discard,
		Stall: 50 * time.Millisecond, StallWindow: 500 * time.Millisecond})
	if hasCap(t, unix.CAP_SYS_RESOURCE) {
		require.NoError(t, err)
		assert.Equal(t, "host-wide PSI /proc/pressure/memory (some 50ms in 500ms)", m.Source())
	} else {
		t.Log("no CAP_SYS_RESOURCE: a 500 ms window must be refused")
		require.ErrorIs(t, err, unix.EINVAL)
		assert.Contains(t, err.Error(), `"some 50000 500000\x00"`)
		assert.Contains(t, err.Error(), "needs CAP_SYS_RESOURCE", "the error says why")
		require.NotNil(t, m)
		assert.Empty(t, m.Source())
	}
	require.NoError(t, m.Close())
	// The default 2 s window is accepted either way.
	m, err = pressure.Start(pressure.Config{Watch: "system", SpiralOff: true, Logger: discard})
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// hasCap reports whether this process has capability c in its effective
// set (CapEff in /proc/self/status, proc(5)).
func hasCap(t *testing.T, c int) bool {
	t.Helper()
	f, err := procfs.ReadFile("/proc/self/status")
	require.NoError(t, err)
	v, ok := f.String("CapEff")
	require.True(t, ok)
	n, err := strconv.ParseUint(v, 16, 64)
	require.NoError(t, err)
	return n&(1<<c) != 0
}

func TestSystemdFIFO(t *testing.T) {
	defer goleak.VerifyNone(t)
	fifo := filepath.Join(t.TempDir(), "memory-pressure")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	t.Setenv("MEMORY_PRESSURE_WATCH", fifo)
	t.Setenv("MEMORY_PRESSURE_WRITE", "")
	var trims, cancels atomic.Int64
	m, err := pressure.StartWith(pressure.Config{Watch: "auto", SpiralOff: true, Logger: discard, MinInterval: 100 * time.Millisecond},
		pressure.Fakes{Trim: func() { trims.Add(1) }, Cancel: func() { cancels.Add(1) }, Makeup: pressure.AnonMakeup})
	require.NoError(t, err)
	defer m.Close()
	assert.Equal(t, "systemd "+fifo, m.Source(), "systemd's variables win over the cgroup")
	ch, _ := m.Subscribe(16)
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer w.Close()
	_, err = w.Write([]byte("x"))
	require.NoError(t, err)
	e := waitKernel(t, ch, 10*time.Second)
	assert.Equal(t, int64(1), e.Signals)
	assert.Equal(t, int64(1), trims.Load())
	assert.Equal(t, int64(1), cancels.Load())

	// Many writes within MinInterval: coalesced into one more action. A
	// loaded machine may spread the writes over more than MinInterval: one
	// more action per MinInterval they took.
	w0 := time.Now()
	for range 50 {
		_, err = w.Write([]byte("x"))
		require.NoError(t, err)
	}
	span := time.Since(w0)
	waitKernel(t, ch, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	assert.LessOrEqual(t, m.Stats().Acted, 3+int64(span/(100*time.Millisecond)), "rate-limited (the writes took %v)", span)
	require.NoError(t, m.Close())
}

func TestSystemdSocket(t *testing.T) {
	defer goleak.VerifyNone(t)
	sock := filepath.Join(t.TempDir(), "mp.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	t.Setenv("MEMORY_PRESSURE_WATCH", sock)
	t.Setenv("MEMORY_PRESSURE_WRITE", base64.StdEncoding.EncodeToString([]byte("some 150000 2000000")))
	m, err := pressure.StartWith(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard},
		pressure.Fakes{Makeup: pressure.AnonMakeup})
	require.NoError(t, err)
	defer m.Close()
	conn, err := ln.Accept()
	require.NoError(t, err)
	defer conn.Close()
	got := make([]byte, 64)
	n, err := conn.Read(got)
	require.NoError(t, err)
	assert.Equal(t, "some 150000 2000000", string(got[:n]), "the decoded $MEMORY_PRESSURE_WRITE is written first")
	ch, _ := m.Subscribe(4)
	_, err = conn.Write([]byte("pressure"))
	require.NoError(t, err)
	waitKernel(t, ch, 10*time.Second)
	require.NoError(t, conn.Close()) // the watcher sees EOF and stops
	require.NoError(t, m.Close())
}

func TestSystemdOffAndErrors(t *testing.T) {
	t.Setenv("MEMORY_PRESSURE_WATCH", "/dev/null")
	m, err := pressure.Start(pressure.Config{SpiralOff: true, Logger: discard})
	require.NoError(t, err)
	assert.Empty(t, m.Source(), "/dev/null: the service manager turned watching off")
	require.NoError(t, m.Close())

	t.Setenv("MEMORY_PRESSURE_WATCH", filepath.Join(t.TempDir(), "missing"))
	m, err = pressure.Start(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard})
	require.ErrorIs(t, err, pressure.ErrNoSource)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), "missing")
	require.NotNil(t, m, "the detector runs without a watcher")
	assert.Empty(t, m.Source())
	require.NoError(t, m.Close())
}

// TestCloseLeavesNothing: after Close no goroutine of the Monitor is left
// (goleak), the GC-end hook is gone and channels are closed.
func TestCloseLeavesNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	before := gcend.Active()
	m, err := pressure.Start(pressure.Config{Logger: discard})
	if err != nil {
		t.Logf("watcher: %v", err)
	}
	require.NotNil(t, m)
	t.Logf("source: %q", m.Source())
	assert.Equal(t, before+1, gcend.Active())
	ch, _ := m.Subscribe(1)
	// GC ends are delivered on a goroutine of their own: wait for one to
	// reach the detector (a bound on a hang) before closing.
	require.Eventually(t, func() bool { runtime.GC(); return m.Stats().GCCycles > 0 }, time.Minute, 10*time.Millisecond, "the detector ran at GC end")
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())
	_, open := <-ch
	assert.False(t, open)
	assert.Equal(t, before, gcend.Active())
}

// TestV1LevelRateLimited: the v1 pressure level "low" fires many times a
// second at a cgroup's limit; the watcher acts at most once per
// MinInterval (Config.MinInterval: "signals in between are coalesced")
// and counts the rest. The watcher listens on this process's cgroup, and a
// child cgroup's events propagate to it (the default "hierarchy" mode of
// memory.pressure_level). How often the kernel signals depends on how fast
// the thrashing child runs; the test needs more signals than the rate
// limit allows actions, or it cannot tell a rate-limited watcher from one
// that acts on each.
func TestV1LevelRateLimited(t *testing.T) {
	if testing.Short() {
		t.Skip("thrashes a cgroup for 3 s")
	}
	if l, err := cgroupfs.Of(0); err != nil || l.Version != 1 {
		t.Skipf("needs a cgroup v1 memory controller (this process: %+v, %v)", l, err)
	}
	defer goleak.VerifyNone(t)
	var trims atomic.Int64
	// The makeup is fixed as anonymous: this test is about the rate limit
	// (TestMakeup* are about the makeup).
	m, err := pressure.StartWith(pressure.Config{Watch: "cgroup", SpiralOff: true, Logger: discard, MinInterval: time.Second},
		pressure.Fakes{Trim: func() { trims.Add(1) }, Makeup: pressure.AnonMakeup})
	require.NoError(t, err)
	defer m.Close()
	g := cgrouptest.New(t, 256<<20)
	// The kernel's own count, through an eventfd of the test's own on the
	// same cgroup: what the watcher's Signals is checked against.
	l, err := cgroupfs.Of(0)
	require.NoError(t, err)
	kernel := countV1Low(t, l.Dir)
	const secs = 3
	cmd := childtest.Command(t, "thrash", nil, "ANON_MIB=200", "CACHE_DIR="+t.TempDir(), "THRASH_S="+strconv.Itoa(secs))
	g.Wrap(cmd)
	start := time.Now()
	require.NoError(t, cmd.Run())
	// The child has gone, and with it the reclaim; the watcher drains what
	// the kernel latched while it ignored the source at its next look, at
	// most MinInterval later. The deadline is a bound on a hang.
	var events int64
	if !assert.Eventually(t, func() bool { events = kernel(); return m.Stats().Signals >= events }, 30*time.Second, 50*time.Millisecond) {
		t.Fatalf("the watcher counts every kernel event, acted on or not: %d kernel events, %d signals counted", events, m.Stats().Signals)
	}
	require.NoError(t, m.Close()) // no signal handled between the two reads below
	took := time.Since(start)
	s := m.Stats()
	t.Logf("v1 low over %v: %d kernel events on the test's eventfd; the watcher: %d signals, %d actions (%d trims)", took.Round(time.Millisecond), events, s.Signals, s.Acted, trims.Load())
	require.Positive(t, s.Signals, "the child's cgroup reached its limit")
	require.Positive(t, s.Acted)
	assert.LessOrEqual(t, s.Signals, kernel(), "no more signals than the kernel sent")
	// The contract: the first action at once, then one per MinInterval
	// at most (and one more for a signal at the last instant).
	allowed := int64(took/time.Second) + 2
	assert.LessOrEqual(t, s.Acted, allowed, "at most one action per MinInterval")
	assert.Equal(t, s.Acted, trims.Load())
	if events <= allowed {
		t.Skipf("%d kernel events in %v, no more than the %d actions the rate limit allows (a loaded machine slowed the thrashing child): coalescing not shown", events, took.Round(time.Millisecond), allowed)
	}
	assert.Greater(t, s.Signals, s.Acted, "the signals in between were coalesced")
}

// countV1Low registers an eventfd of its own for the v1 pressure level
// "low" of the cgroup at dir. The returned function reads the eventfd's
// counter (the kernel adds one per event; a read takes the sum and resets
// it) and returns the events counted so far. Cleanup closes both files,
// which unregisters the event.
func countV1Low(t *testing.T, dir string) func() int64 {
	t.Helper()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(efd) })
	level, err := os.Open(filepath.Join(dir, "memory.pressure_level"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = level.Close() })
	line := strconv.Itoa(efd) + " " + strconv.Itoa(int(level.Fd())) + " low"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(line), 0), line)
	var total int64
	return func() int64 {
		var b [8]byte
		if n, err := unix.Read(efd, b[:]); err == nil && n == 8 {
			total += int64(binary.NativeEndian.Uint64(b[:]))
		}
		return total
	}
}

// TestAutoFallsBack: in "auto", a $MEMORY_PRESSURE_WATCH that cannot be
// opened is reported once (INFO) and the next source is watched.
func TestAutoFallsBack(t *testing.T) {
	defer goleak.VerifyNone(t)
	missing := filepath.Join(t.TempDir(), "missing")
	t.Setenv("MEMORY_PRESSURE_WATCH", missing)
	var buf bytes.Buffer
	m, err := pressure.Start(pressure.Config{SpiralOff: true, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Skipf("no other source here: %v", err)
	}
	defer m.Close()
	assert.NotContains(t, m.Source(), "systemd")
	assert.Contains(t, buf.String(), "memory pressure source skipped")
	assert.Contains(t, buf.String(), missing)
}

// A cgroup's signal while its memory is mostly page cache is left to the
// kernel: no trim, no cancel, no event, counted in Stats.LeftToKernel; the
// same signal with anonymous memory acts.
func TestLeftToKernel(t *testing.T) {
	defer goleak.VerifyNone(t)
	fifo := filepath.Join(t.TempDir(), "memory-pressure")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	t.Setenv("MEMORY_PRESSURE_WATCH", fifo)
	t.Setenv("MEMORY_PRESSURE_WRITE", "")
	var trims, cancels atomic.Int64
	var cache atomic.Bool
	cache.Store(true)
	makeup := func() (pressure.Makeup, error) {
		if cache.Load() {
			return pressure.Makeup{Anon: 64 << 20, Cache: 180 << 20, From: "test"}, nil
		}
		return pressure.AnonMakeup()
	}
	m, err := pressure.StartWith(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard, MinInterval: 100 * time.Millisecond},
		pressure.Fakes{Trim: func() { trims.Add(1) }, Cancel: func() { cancels.Add(1) }, Makeup: makeup})
	require.NoError(t, err)
	defer m.Close()
	ch, _ := m.Subscribe(4)
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer w.Close()
	_, err = w.Write([]byte("x"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Stats().LeftToKernel == 1 }, 5*time.Second, 10*time.Millisecond)
	s := m.Stats()
	assert.Equal(t, int64(1), s.Signals)
	assert.Zero(t, s.Acted)
	assert.Zero(t, trims.Load())
	assert.Zero(t, cancels.Load())
	select {
	case e := <-ch:
		t.Fatalf("event %+v for pressure left to the kernel", e)
	default:
	}

	cache.Store(false)
	time.Sleep(200 * time.Millisecond)
	_, err = w.Write([]byte("x"))
	require.NoError(t, err)
	e := waitKernel(t, ch, 5*time.Second)
	assert.Equal(t, int64(200<<20), e.Makeup.Anon)
	assert.Equal(t, int64(1), trims.Load())
	assert.Equal(t, int64(1), cancels.Load())
	require.NoError(t, m.Close())
}

// Input (issue 17, case 3): $MEMORY_PRESSURE_WRITE = base64 of "some
// 200000 2000000" with no NUL, on /proc/pressure/memory. Without
// CAP_SYS_RESOURCE (this machine's root) the kernel refused the write with
// EINVAL before the NUL was appended; now it is armed. (With the
// capability it was armed as "some 200000 200000": TestSystemdTriggerArmed
// runs that in a user namespace.) A value that is no trigger is a WARN
// naming the variable, and the watcher falls back.
func TestSystemdWriteWithoutNUL(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("the kernel has no PSI (CONFIG_PSI): %v", err)
	}
	defer goleak.VerifyNone(t)
	t.Setenv("MEMORY_PRESSURE_WATCH", "/proc/pressure/memory")
	t.Setenv("MEMORY_PRESSURE_WRITE", base64.StdEncoding.EncodeToString([]byte("some 200000 2000000")))
	var buf bytes.Buffer
	m, err := pressure.Start(pressure.Config{Watch: "auto", SpiralOff: true,
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if errors.Is(err, os.ErrPermission) {
		t.Skipf("writing a PSI trigger needs root here: %v", err)
	}
	require.NoError(t, err)
	assert.Equal(t, "systemd /proc/pressure/memory", m.Source())
	assert.NotContains(t, buf.String(), "level=WARN")
	require.NoError(t, m.Close())

	for _, bad := range []string{"hello", "some 200000", "some 200000 20000000"} {
		buf.Reset()
		t.Setenv("MEMORY_PRESSURE_WRITE", base64.StdEncoding.EncodeToString([]byte(bad)))
		m, err = pressure.Start(pressure.Config{Watch: "auto", SpiralOff: true,
			Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Logf("no fallback source here: %v", err)
		}
		assert.NotContains(t, m.Source(), "systemd", "%q: fell back", bad)
		assert.Contains(t, buf.String(), "level=WARN")
		assert.Contains(t, buf.String(), "$MEMORY_PRESSURE_WRITE", "the WARN names the variable")
		require.NoError(t, m.Close())
	}
	// Only systemd asked for: an error naming the variable.
	m, err = pressure.Start(pressure.Config{Watch: "systemd", SpiralOff: true, Logger: discard})
	require.ErrorIs(t, err, pressure.ErrNoSource)
	assert.Contains(t, err.Error(), "$MEMORY_PRESSURE_WRITE")
	require.NoError(t, m.Close())
}
