//go:build linux

package pressure_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/gcend"

	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/trim"
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

// syncBuf is a bytes.Buffer safe for the watcher's goroutine and the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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

// Attack input (issue 17): memory.events counters that jump by more than
// math.MaxInt64 together. Before, their growth wrapped negative, which the
// watcher reads as its source gone: it stopped watching for good.
func TestEventsGrowthSaturates(t *testing.T) {
	const big = int64(1<<63 - 1)
	a := cgroupfs.Events{Low: 0, High: 0, Max: 0, OOM: 0, OOMKill: 0, OOMGroupKill: 0}
	b := cgroupfs.Events{Low: 0, High: big, Max: big, OOM: big, OOMKill: big, OOMGroupKill: 0}
	assert.Equal(t, big, pressure.EventsGrowth(a, b))
}

func childPlain() {
	childtest.Say("READY", 1)
	time.Sleep(time.Minute)
}

func childIdle() {
	ctl, err := memctl.Start(memctl.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		childtest.Fail("start: %v", err)
	}
	childtest.Say("SOURCE", ctl.Report().Pressure)
	childtest.Say("READY", 1)
	time.Sleep(time.Minute)
}

// switches sums voluntary_ctxt_switches over every thread of pid.
func switches(t *testing.T, pid int) int64 {
	t.Helper()
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	require.NoError(t, err)
	var n int64
	for _, d := range dirs {
		f, err := procfs.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue // a thread that exited
		}
		v, err := f.Int("voluntary_ctxt_switches")
		require.NoError(t, err)
		n += v
	}
	return n
}

// idlePair returns the voluntary context switches of the processes
// withMemctl and plain over a window of about d. The reads bracket
// symmetrically (memctl, plain at the start; plain, memctl at the end), so
// memctl's window holds plain's and is never the shorter one.
func idlePair(t *testing.T, withMemctl, plain int, d time.Duration) (m, p int64) {
	t.Helper()
	m0 := switches(t, withMemctl)
	p0 := switches(t, plain)
	time.Sleep(d)
	p1 := switches(t, plain)
	m1 := switches(t, withMemctl)
	return m1 - m0, p1 - p0
}

// idleSlack is how many more voluntary context switches one idle Go
// process may make than another over a window of d, started less than
// forcegcperiod (2 min) after both, from the Go runtime's own periodic
// wakes (runtime/proc.go, sysmon):
//   - sysmon, while every P is idle, sleeps until the next timer or for
//     forcegcperiod/2 (60 s), whichever is sooner; each wake from that
//     sleep is 2 voluntary switches of its thread (the usleep of its
//     backed-off 10 ms delay, then the futex sleep again). In a window
//     of d that is at most d/60s+1 wakes, which the other process may
//     not have. The children's own timers are their own: plain Go's first
//     is a minute after READY, and memctl's count against it.
//   - the forced GC comes forcegcperiod after the last GC and never
//     before a first one, so not within 2 min of the process's start:
//     none in the window.
//   - the background scavenger works only after a GC (it is woken at the
//     sweep's end): with no GC in the window, it has no new work; what
//     the start-up left it is what the settling before the window is for.
//
// memctl_linux_test.go in the root package has the same rule for its idle
// tests.
func idleSlack(d time.Duration) int64 {
	const sysmonSleep = time.Minute // forcegcperiod/2
	return 2 * (int64(d/sysmonSleep) + 1)
}

// startReady starts cmd and waits for its READY line; it returns the
// other KEY=VALUE lines seen before it.
func startReady(t *testing.T, cmd *exec.Cmd) map[string]string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	got := map[string]string{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = v
			if k == "READY" {
				go func() { _, _ = io.Copy(io.Discard, out) }()
				return got
			}
		}
	}
	t.Fatalf("child exited before READY: %v", sc.Err())
	return nil
}

// TestIdleContextSwitches: over 5 s, a child that ran memctl.Start (with
// the kernel watcher blocked in poll) makes as many voluntary context
// switches, summed over its threads, as a plain Go program in the same run.
// The watcher's source is one that only the child's own memory can signal,
// so that other processes' pressure on this shared machine does not count:
// a FIFO named by $MEMORY_PRESSURE_WATCH that nothing writes to, and the
// v1 pressure level of a 256 MiB cgroup of its own (its eventfd).
// System-wide PSI would fire on the other tests' pressure: the watcher then
// acts, as it should, and the process is not idle.
func TestIdleContextSwitches(t *testing.T) {
	if testing.Short() {
		t.Skip("watches two children for 5 s, twice")
	}
	t.Parallel() // with the other scenarios of children: each pair is its own control
	for _, src := range []string{"systemd FIFO", "cgroup v1"} {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			var env []string
			if src == "systemd FIFO" {
				fifo := filepath.Join(t.TempDir(), "memory-pressure")
				require.NoError(t, unix.Mkfifo(fifo, 0o600))
				env = append(env, "MEMORY_PRESSURE_WATCH="+fifo)
			}
			mc := childtest.Command(t, "idle", []string{"MEMCTL", "MEMORY_PRESSURE_WATCH", "MEMORY_PRESSURE_WRITE"}, env...)
			plain := childtest.Command(t, "plain", nil)
			if src == "cgroup v1" {
				if l, err := cgroupfs.Of(0); err != nil || l.Version != 1 {
					t.Skipf("needs a cgroup v1 memory controller (this process: %+v, %v)", l, err)
				}
				cgrouptest.New(t, 256*mib).Wrap(mc)
				cgrouptest.New(t, 256*mib).Wrap(plain)
			}
			rep := startReady(t, mc)
			startReady(t, plain)
			t.Logf("memctl child watches %q", rep["SOURCE"])
			require.Contains(t, rep["SOURCE"], strings.Fields(src)[0]+" ")
			time.Sleep(time.Second)
			const window = 5 * time.Second
			m, p := idlePair(t, mc.Process.Pid, plain.Process.Pid, window)
			slack := idleSlack(window)
			t.Logf("voluntary context switches over %v: memctl %d, plain %d (slack %d: the runtime's own wakes)", window, m, p, slack)
			assert.LessOrEqual(t, m, p+slack, "memctl's idle child wakes no more than plain Go's")
		})
	}
}

// anon maps and touches n bytes of anonymous memory that the Go runtime
// does not see, so that it triggers no GC.
func anon(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		childtest.Fail("mmap: %v", err)
	}
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	return b
}

// childV1Trim runs memctl.Start in its memory cgroup, holds a 100 MiB Go
// burst and drops it (no AfterBurst, no GC), maps ANON_MIB of anonymous
// memory, then fills the page cache until memctl has trimmed on a kernel
// signal (or 60 s pass), and reports RSS before and after.
func childV1Trim() {
	// The burst detector off: its trim of the dropped burst, one delay
	// after the GC ends that saw it, came before RSS_BEFORE beside busy
	// loops (the allocation and the mapping took longer than the delay);
	// this child is about the pressure trim.
	ctl, err := memctl.Start(memctl.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
		memctl.WithAutoBurst(trim.AutoBurstConfig{Off: true}))
	if err != nil {
		childtest.Fail("start: %v", err)
	}
	childtest.Say("SOURCE", ctl.Report().Pressure)
	b := burst.Alloc(100 * mib)
	runtime.KeepAlive(b)
	b = nil
	a := anon(envInt("ANON_MIB") * mib)
	before := rss()
	childtest.Say("RSS_BEFORE", before)
	start := time.Now()
	trimmed := fillPageCache(os.Getenv("CACHE_DIR"), 1<<30, func() bool {
		return ctl.Stats().Trim.Trims > 0
	}, start.Add(60*time.Second))
	childtest.Say("TRIMMED", trimmed)
	childtest.Say("TRIM_AFTER_S", time.Since(start).Seconds())
	childtest.Say("RSS_AFTER", rss())
	s := ctl.Stats()
	childtest.Say("TRIMS", s.Trim.Trims)
	childtest.Say("SIGNALS", s.Pressure.Signals)
	childtest.Say("ACTED", s.Pressure.Acted)
	runtime.KeepAlive(a)
	_ = ctl.Close()
}

// TestV1CgroupTrimsOnPressure: a child in a 256 MiB cgroup holds a dropped
// 100 MiB Go burst; page cache and anonymous memory push the cgroup to its
// limit; memctl, told by the v1 pressure level, trims on its own and the
// child's RSS falls by most of the burst.
func TestV1CgroupTrimsOnPressure(t *testing.T) {
	if raceEnabled {
		t.Skip("RSS test: the race detector's shadow memory does not fit the 256 MiB cgroup")
	}
	if l, err := cgroupfs.Of(0); err != nil || l.Version != 1 {
		t.Skipf("needs a cgroup v1 memory controller (this process: %+v, %v)", l, err)
	}
	t.Parallel() // RSS in a cgroup of its own
	g := cgrouptest.New(t, 256*mib)
	cmd := childtest.Command(t, "v1trim", []string{"MEMCTL", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_TRIM_DELAY", "GOGC"},
		"ANON_MIB=100", "CACHE_DIR="+t.TempDir())
	g.Wrap(cmd)
	rep := childtest.Report(t, cmd)
	t.Logf("child: %v", rep)
	assert.Contains(t, rep["SOURCE"], "cgroup v1")
	assert.Contains(t, rep["SOURCE"], "memory.pressure_level low")
	require.Equal(t, "true", rep["TRIMMED"], "memctl trimmed on its own")
	before := childtest.RequireInt(t, rep, "RSS_BEFORE")
	assert.GreaterOrEqual(t, before, int64(190*mib), "the dropped burst and the mapping are resident")
	after := childtest.RequireInt(t, rep, "RSS_AFTER")
	t.Logf("RSS %d MiB -> %d MiB", before>>20, after>>20)
	assert.GreaterOrEqual(t, before-after, int64(70*mib), "RSS falls by most of the 100 MiB burst")
	kills, err := g.OOMKills()
	require.NoError(t, err)
	assert.Zero(t, kills)
}

// childThrash pushes its memory cgroup to the limit for THRASH_S seconds:
// ANON_MIB anonymous, and page cache written and re-read.
func childThrash() {
	a := anon(envInt("ANON_MIB") * mib)
	fillPageCache(os.Getenv("CACHE_DIR"), 1<<30, func() bool { return false },
		time.Now().Add(time.Duration(envInt("THRASH_S"))*time.Second))
	runtime.KeepAlive(a)
}

// The trigger of TestPSINoEventUnexplained: the lead's, "some 150000
// 2000000", whose 2 s window an unprivileged process may arm.
const (
	armStall  = 150 * time.Millisecond
	armWindow = 2 * time.Second
)

// childPSIStall runs READERS readers of FILE, each reading it over and
// over for DURATION_MS: in a memory cgroup far smaller than the file,
// reclaim stalls them (PSI memory "some"; one reader in a 32 MiB v1 cgroup
// stalled 5% of the time here, four 33%).
func childPSIStall() {
	until := time.Now().Add(time.Duration(envInt("DURATION_MS")) * time.Millisecond)
	var wg sync.WaitGroup
	for range envInt("READERS") {
		wg.Go(func() {
			buf := make([]byte, 1<<20)
			for time.Now().Before(until) {
				f, err := os.Open(os.Getenv("FILE"))
				if err != nil {
					childtest.Fail("%v", err)
				}
				for time.Now().Before(until) {
					if _, err := f.Read(buf); err == io.EOF {
						break
					} else if err != nil {
						childtest.Fail("%v", err)
					}
				}
				f.Close()
			}
		})
	}
	wg.Wait()
}

// childPSIArm arms the host-wide PSI trigger of a pressure.Monitor (as
// whoever runs it: the test runs it unprivileged) and watches its events
// for DURATION_MS, reporting for each the stall since arming as the PSI
// file shows it, read before Start and at the event.
func childPSIArm() {
	t0 := psiSomeTotal()
	m, err := pressure.Start(pressure.Config{Watch: "system", SpiralOff: true, Stall: armStall, StallWindow: armWindow,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		childtest.Fail("start: %v", err)
	}
	armed := time.Now()
	ch, _ := m.Subscribe(8)
	childtest.Say("READY", 1)
	timeout := time.After(time.Duration(envInt("DURATION_MS")) * time.Millisecond)
	n := 0
	for done := false; !done; {
		select {
		case e := <-ch:
			if e.Kind == pressure.KindKernel {
				childtest.Say("EVENT_"+strconv.Itoa(n), strconv.FormatInt(psiSomeTotal()-t0, 10)+"us@"+time.Since(armed).Round(time.Millisecond).String())
				n++
			}
		case <-timeout:
			done = true
		}
	}
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Uid:") || strings.HasPrefix(l, "CapEff:") {
			k, v, _ := strings.Cut(l, ":")
			childtest.Say(strings.ToUpper(k), strings.Join(strings.Fields(v), ","))
		}
	}
	s := m.Stats()
	childtest.Say("SOURCE", s.Source)
	childtest.Say("EVENTS", n)
	childtest.Say("UNEXPLAINED", s.Unexplained)
	childtest.Say("STALL_US", psiSomeTotal()-t0)
	_ = m.Close()
}

// TestPSINoEventUnexplained (issue 32, item 5): on this project's machine
// (kernel 6.18) a PSI trigger armed just after a memory stall fired within
// 2 s with no stall since arming (0-0.8 ms against a 150 ms threshold; 8
// of 8 tries, unprivileged and as root); the lead's case was 28.6 ms. Each
// round here stalls the host's memory for 300 ms (a reader of an uncached
// 256 MiB file in a 32 MiB cgroup), then at once starts a child as uid
// 65534 (an unprivileged trigger: no CAP_SYS_RESOURCE) that arms the
// host-wide trigger and watches for 2 s. No event may be delivered whose
// stall since arming, in the PSI file, is under the threshold; the events
// ignored are counted in Stats.Unexplained.
func TestPSINoEventUnexplained(t *testing.T) {
	if testing.Short() {
		t.Skip("two 2 s rounds and a 5 s control")
	}
	if raceEnabled {
		t.Skip("the stall's reader is OOM-killed in its 32 MiB cgroup under the race detector (its shadow memory); the watcher's goroutine is raced in the other tests")
	}
	if psiSomeTotal() < 0 {
		t.Skip("no PSI here: /proc/pressure/memory cannot be read (CONFIG_PSI off or psi=0)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: to run the child as uid 65534 and to make a memory cgroup for the stall")
	}
	g := cgrouptest.New(t, 32<<20)
	file := writeUncached(t, t.TempDir(), 256<<20)
	exe := unprivilegedCopy(t)
	stall := func(ms, readers int) {
		cmd := childtest.Command(t, "psistall", nil, "FILE="+file, "DURATION_MS="+strconv.Itoa(ms), "READERS="+strconv.Itoa(readers))
		g.Wrap(cmd)
		var serr bytes.Buffer
		cmd.Stderr = &serr
		require.NoError(t, cmd.Run(), serr.String())
	}
	arm := func(ms int) *exec.Cmd {
		cmd := childtest.Command(t, "psiarm", nil, "DURATION_MS="+strconv.Itoa(ms))
		cmd.Path, cmd.Args[0], cmd.Dir = exe, exe, filepath.Dir(exe)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		return cmd
	}
	var events, unexplained int
	check := func(round string, rep map[string]string) {
		t.Logf("%s: %v", round, rep)
		require.Contains(t, rep["SOURCE"], "/proc/pressure/memory")
		require.True(t, strings.HasPrefix(rep["UID"], "65534,"), "the child runs as uid 65534: %q", rep["UID"])
		require.Equal(t, "0000000000000000", rep["CAPEFF"], "the child has no capability")
		for k, v := range rep {
			if !strings.HasPrefix(k, "EVENT_") {
				continue
			}
			us, _, _ := strings.Cut(v, "us@")
			since, err := strconv.ParseInt(us, 10, 64)
			require.NoError(t, err, v)
			assert.GreaterOrEqual(t, since, armStall.Microseconds(),
				"%s: an event delivered with %d us of stall since arming, under the %v threshold (%s)", round, since, armStall, v)
		}
		n, _ := strconv.Atoi(rep["EVENTS"])
		u, _ := strconv.Atoi(rep["UNEXPLAINED"])
		events, unexplained = events+n, unexplained+u
	}
	// The stall just before arming.
	for round := range 2 {
		stall(300, 1)
		cmd := arm(2000) // the false events came 0.1-1.7 s after arming
		var out, aerr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &aerr
		require.NoError(t, cmd.Run(), aerr.String())
		check(fmt.Sprintf("stall before arming, round %d", round), childtest.ParseReport(out.Bytes()))
	}
	t.Logf("events delivered %d, ignored as unexplained by the stall since arming %d", events, unexplained)
	// The control: a stall after arming is still delivered when it is
	// well over the threshold (600 ms of stall over 2 s holds at least
	// 150 ms in some 2 s window), also when a false event came first: the
	// kernel then sends nothing for a window, and the event ignored is
	// looked at again a window later. The stall before arming makes that
	// false event likely; the watch lasts two windows and a second.
	stall(300, 1)
	a := startArm(t, arm(5000))
	<-a.ready
	stall(2000, 4)
	rep := a.wait(t)
	check("stall after arming", rep)
	if since, _ := strconv.ParseInt(rep["STALL_US"], 10, 64); since >= 4*armStall.Microseconds() {
		assert.NotEqual(t, "0", rep["EVENTS"], "%d us of stall since arming and no event delivered", since)
	} else {
		t.Logf("stall after arming only %d us: too little to require an event", since)
	}
}

// unprivilegedCopy copies the test binary into a directory that uid 65534
// can enter and returns its path (go test's own build directory is 0700).
func unprivilegedCopy(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "memctl-psiarm-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	exe := filepath.Join(dir, "pressure.test")
	require.NoError(t, os.WriteFile(exe, b, 0o755))
	return exe
}
