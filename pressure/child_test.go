//go:build linux

package pressure_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/trim"
)

const mib = 1 << 20

// liveRatio is the default Config.LiveRatio.
const liveRatio = 0.9

func TestMain(m *testing.M) {
	childtest.Main(m, map[string]func(){
		"spiral": childSpiral,
		"idle":   childIdle,
		"plain":  childPlain,
		"v1trim": childV1Trim,
		"thrash": childThrash,
		// relief_test.go (issue 17)
		"pointerheap": childPointerHeap,
		"reader":      childReader,
		"streamer":    childStreamer,
		"owngarbage":  childOwnGarbage,
		"armed":       childArmed,
		"rocgroup":    childReadOnlyCgroup,
		// psiarm_linux_test.go (issue 32, item 5)
		"psistall": childPSIStall,
		"psiarm":   childPSIArm,
	})
}

func envInt(key string) int {
	n, err := strconv.Atoi(os.Getenv(key))
	if err != nil {
		childtest.Fail("%s: %v", key, err)
	}
	return n
}

// obj is a live-heap object with pointers to scan: a death spiral is
// costly because each cycle marks the whole live heap again. 1 KiB.
type obj struct {
	_ [16]*obj
	_ [1024 - 16*8]byte
}

var (
	keep []*obj
	ring [64][]byte
)

// childSpiral holds LIVE_MIB of pointer-holding objects under the
// GOMEMLIMIT its environment sets, then churns 4 KiB objects for CHURN_S
// seconds, and reports when the first KindSpiral event came and what the
// detector saw. The WARN goes to stdout as a text log line.
func childSpiral() {
	live, churn := envInt("LIVE_MIB"), envInt("CHURN_S")
	cfg := pressure.Config{Watch: "off", Window: spiralWindow, GCShare: spiralShare, Logger: slog.New(slog.NewTextHandler(os.Stdout, nil))}
	if os.Getenv("LIFT") != "" {
		// GOMEMLIMIT is not the operator's here: set by the program's
		// owner of GOMEMLIMIT, as the limiter sets it from the cgroup,
		// with the cgroup limit as the ceiling of a lift.
		debug.SetMemoryLimit(200 * mib)
		defer gomemlimit.SetOwner(&liftOwner{ceiling: int64(envInt("LIFT")) * mib, base: 200 * mib})()
		cfg.LiftFor = 2 * time.Second
	}
	m, err := pressure.Start(cfg)
	if err != nil {
		childtest.Fail("start: %v", err)
	}
	ch, _ := m.Subscribe(8)
	for range live << 10 {
		keep = append(keep, &obj{})
	}
	start := time.Now()
	first := -1.0
	var maxShare float64
	var maxLive, sumLive, nLive, lifted int64
	// With a lift, churn on until the lift has ended (LiftFor after it
	// began), however late a loaded machine let the spiral start, for at
	// most 30 s more.
	liftMode, liftEnded := os.Getenv("LIFT") != "", false
	churning := func() bool {
		d := time.Since(start)
		return d < time.Duration(churn)*time.Second || liftMode && !liftEnded && d < time.Duration(churn+30)*time.Second
	}
	// The GC's share of the CPU from the second second on, read here from
	// runtime/metrics, apart from the detector's own figures: the premise
	// the spiral tests skip on.
	cpu := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"}}
	var gc0, total0 float64
	for i := 0; churning(); i++ {
		b := make([]byte, 4096)
		b[0] = 1
		ring[i%len(ring)] = b
		if i%1024 == 0 {
			select {
			case e := <-ch:
				if e.Kind == pressure.KindSpiral && first < 0 {
					first = time.Since(start).Seconds()
					childtest.Say("SPIRAL_LIVE", e.LiveHeap)
					childtest.Say("SPIRAL_GOAL", e.HeapGoal)
				}
			default:
			}
			if l := debug.SetMemoryLimit(-1); l != 200*mib && l != lifted && liftMode {
				childtest.Say("LIFTED_TO", l)
				lifted = l
			} else if l == 200*mib && lifted != 0 {
				liftEnded = true
			}
			s := m.Stats()
			maxShare, maxLive = max(maxShare, s.GCShare), max(maxLive, s.LiveHeap)
			if time.Since(start) > time.Second {
				sumLive, nLive = sumLive+s.LiveHeap, nLive+1
				if total0 == 0 {
					metrics.Read(cpu)
					gc0, total0 = cpu[0].Value.Float64(), cpu[1].Value.Float64()
				}
			}
		}
	}
	metrics.Read(cpu)
	ownShare := -1.0 // the churn ended within its first second
	if d := cpu[1].Value.Float64() - total0; total0 > 0 && d > 0 {
		ownShare = (cpu[0].Value.Float64() - gc0) / d
	}
	childtest.Say("OWN_GC_SHARE", ownShare)
	s := m.Stats()
	childtest.Say("SPIRAL_AFTER_S", first)
	childtest.Say("SPIRALS", s.Spirals)
	childtest.Say("GC_SHARE", s.GCShare)
	childtest.Say("MAX_GC_SHARE", maxShare)
	childtest.Say("LIVE", s.LiveHeap)
	childtest.Say("MAX_LIVE", maxLive)
	childtest.Say("MEAN_LIVE", sumLive/max(nLive, 1))
	childtest.Say("LIFTS", s.Lifts)
	childtest.Say("GOMEMLIMIT_END", debug.SetMemoryLimit(-1))
	runtime.KeepAlive(keep)
	_ = m.Close()
}

// liftOwner is GOMEMLIMIT's owner in the spiral's child, as the limiter:
// a lift sets base plus extra, at most ceiling; its end restores base.
type liftOwner struct{ ceiling, base int64 }

func (o *liftOwner) Ceiling() int64 { return o.ceiling }

func (o *liftOwner) Lift(extra int64) (from, to int64, ok bool) {
	to = min(o.base+extra, o.ceiling)
	gomemlimit.Do(func() { from = gomemlimit.Set(to) })
	return from, to, true
}

// The spiral children hold spiralLiveMiB of objects under GOMEMLIMIT
// 200 MiB (read as 171-190 MiB of live heap: /gc/heap/live counts what is
// allocated during the mark) and churn for churnSecs. Their detector's
// Config.Window is spiralWindow (an episode can begin after a quarter of
// it) and its Config.GCShare spiralShare: with one goroutine churning on
// two Ps the GC's share hovers about the default 0.5 (0.38-0.61 seen here,
// 0.468 in a CI run), the default sits at the GC CPU limiter's cap, so
// the tests set a threshold the workload clears and check the mechanism.
const (
	spiralLiveMiB = 148
	spiralWindow  = 4 * time.Second
	spiralShare   = 0.3
	churnSecs     = 3
)

// requireSpiralPremise skips when no spiral came and the child's GC share
// from its second second on, read by the child from runtime/metrics apart
// from the detector, stayed under spiralShare: the detector was right not
// to report one, and the test cannot judge it.
func requireSpiralPremise(t *testing.T, rep map[string]string) {
	t.Helper()
	own := childtest.RequireFloat(t, rep, "OWN_GC_SHARE")
	if rep["SPIRAL_AFTER_S"] == "-1" && own < spiralShare {
		t.Skipf("the child's GC share stayed under %.2f (%.3f from runtime/metrics; the detector's max %s): no spiral to report on this machine", spiralShare, own, rep["MAX_GC_SHARE"])
	}
}

func runSpiral(t *testing.T, liveMiB int, env ...string) (map[string]string, string) {
	t.Helper()
	cmd := childtest.Command(t, "spiral", []string{"GOGC", "GOMAXPROCS", "GOMEMLIMIT"},
		append([]string{"LIVE_MIB=" + strconv.Itoa(liveMiB), "CHURN_S=" + strconv.Itoa(churnSecs)}, env...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), errb.String())
	return childtest.ParseReport(out.Bytes()), out.String()
}

// TestDeathSpiralChild: a child holding 148 MiB of pointer-rich objects
// under GOMEMLIMIT 200 MiB, churning for churnSecs, gets one WARN while it
// churns, with the live heap near the limit by the rule (LiveRatio of it,
// or the limit setting the heap goal with little runway); the 20 MiB-live
// control gets none. GOMEMLIMIT is the operator's here, so no lift.
func TestDeathSpiralChild(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two children for 3 s each")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory and slowdown change the GC figures")
	}
	const limit = 200 * mib
	rep, out := runSpiral(t, spiralLiveMiB, "GOMEMLIMIT=200MiB")
	t.Logf("spiral: %v", rep)
	requireSpiralPremise(t, rep)
	after := childtest.RequireFloat(t, rep, "SPIRAL_AFTER_S")
	require.Positive(t, after, "a KindSpiral event came while the child churned (GC share %s, max %s; mean live heap %s)",
		rep["GC_SHARE"], rep["MAX_GC_SHARE"], rep["MEAN_LIVE"])
	live := childtest.RequireInt(t, rep, "SPIRAL_LIVE")
	goal := childtest.RequireInt(t, rep, "SPIRAL_GOAL")
	near := float64(live) >= liveRatio*limit ||
		goal < limit && float64(goal-live) <= (1-liveRatio)*limit
	assert.True(t, near, "live heap %d near GOMEMLIMIT by the rule (heap goal %d)", live, goal)
	assert.GreaterOrEqual(t, childtest.RequireInt(t, rep, "MEAN_LIVE"), int64(spiralLiveMiB*mib), "the objects held are live")
	assert.Less(t, after, float64(churnSecs), "while the child churned")
	assert.Equal(t, "1", rep["SPIRALS"], "one episode")
	assert.Equal(t, 1, strings.Count(out, "level=WARN"), "one WARN per episode:\n%s", out)
	assert.Contains(t, out, "gc_cpu_share=")
	assert.Contains(t, out, `lift="off: GOMEMLIMIT set by the operator"`)
	assert.Equal(t, "0", rep["LIFTS"])

	rep, out = runSpiral(t, 20, "GOMEMLIMIT=200MiB")
	t.Logf("control: %v", rep)
	assert.Equal(t, "-1", rep["SPIRAL_AFTER_S"])
	assert.Equal(t, "0", rep["SPIRALS"])
	assert.NotContains(t, out, "level=WARN")
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
// idle_linux_test.go in the root package has the same rule for its idle
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

// fillPageCache writes a file of up to max bytes in 4 MiB chunks under
// dir, over and over, until stop returns true, reading each chunk back
// (a refault stalls when the cgroup reclaimed it). It returns whether stop
// returned true.
func fillPageCache(dir string, max int64, stop func() bool, until time.Time) bool {
	f, err := os.CreateTemp(dir, "memctl-i12-cache-")
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4*mib)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := int64(0); time.Now().Before(until); off = (off + int64(len(buf))) % max {
		if _, err := f.WriteAt(buf, off); err != nil {
			childtest.Fail("%v", err)
		}
		if _, err := f.ReadAt(buf, (off*7)%max); err != nil && err != io.EOF {
			childtest.Fail("%v", err)
		}
		if stop() {
			return true
		}
	}
	return false
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

func rss() int64 {
	n, err := procfs.RSS(0)
	if err != nil {
		childtest.Fail("%v", err)
	}
	return n
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

// TestDeathSpiralLift: with GOMEMLIMIT set by its owner (not the
// operator) up to a 215 MiB ceiling, the episode lifts GOMEMLIMIT by 10%
// of 200 MiB, capped at the ceiling, for 2 s, and restores it.
func TestDeathSpiralLift(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child for 3 s or more")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory and slowdown change the GC figures")
	}
	rep, out := runSpiral(t, spiralLiveMiB, "LIFT=215")
	t.Logf("lift: %v", rep)
	requireSpiralPremise(t, rep)
	assert.Positive(t, childtest.RequireFloat(t, rep, "SPIRAL_AFTER_S"), "the spiral was reported")
	assert.Equal(t, strconv.Itoa(215*mib), rep["LIFTED_TO"], "+10% capped at the ceiling")
	assert.Contains(t, out, "gomemlimit_lifted_to=225443840")
	assert.Contains(t, out, "GOMEMLIMIT lift ended")
	assert.Equal(t, strconv.Itoa(200*mib), rep["GOMEMLIMIT_END"], "restored after LiftFor")
	assert.Equal(t, "1", rep["LIFTS"], "one lift: none again within LiftFor of the last")
}
