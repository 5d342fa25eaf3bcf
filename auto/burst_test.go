package auto_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/trimwire"
)

func TestMain(m *testing.M) {
	childtest.Main(m, map[string]func(){
		"burst":       burstChild,
		"steady":      steadyChild,
		"idle":        idleChild,
		"grow":        growChild,
		"deleted":     deletedChild,
		"onebuffer":   oneBufferChild,
		"startbeside": startBesideChild,
	})
}

const (
	liveBytes   = 20 << 20
	burstBytes  = 1 << 30
	afterLastGC = 3 * time.Second
)

// childEnv is what every child of this file unsets: the child runs memctl's
// defaults as the auto import starts them, with the pressure watch off
// (MEMCTL_PRESSURE=off) so that a neighbour's memory pressure on this
// shared machine cannot trim in its place.
var childEnv = []string{"MEMCTL", "MEMCTL_AUTOBURST", "MEMCTL_TRIM_DELAY", "MEMCTL_THP", "MEMCTL_PRESSURE",
	"GOGC", "GOMEMLIMIT", "AUTOMEMLIMIT", "GODEBUG"}

func rss() int64 {
	r, err := procfs.RSS(0)
	if err != nil {
		childtest.Fail("%v", err)
	}
	return r
}

// nonHeap returns the bytes the Go runtime has mapped for other than the
// heap (/memory/classes/total less the heap's classes): the span
// structures, per-arena metadata, stacks and the rest, which grow with
// the heap's peak and which no trim returns (docs/benchmarks.md, "The
// burst target: memctl against plain Go with FreeOSMemory").
func nonHeap() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"}, {Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	n := int64(s[0].Value.Uint64())
	for _, x := range s[1:] {
		n -= int64(x.Value.Uint64())
	}
	return n
}

// burstChild is a program that only imports auto: 20 MiB live, a 1 GiB
// burst held and dropped, no AfterBurst anywhere. It reports VmRSS before
// the burst and 3 s after the burst's last GC cycle.
func burstChild() {
	live := burst.Alloc(liveBytes)
	watch := watchLive(false) // no GC of its own: TestImportGOGCOff counts the GC ends
	before, nonHeapBefore := rss(), nonHeap()
	cycles0, seen0 := gcSeen()
	b := burst.Alloc(burstBytes)
	peak := rss()
	runtime.KeepAlive(b)
	b = nil
	lastGC := sayDrop()
	cyclesAtDrop, _ := gcSeen()
	time.Sleep(time.Until(lastGC.Add(afterLastGC)))
	pending := waitDueTrim(lastGC)
	after, nonHeapAfter := rss(), nonHeap()
	runtime.KeepAlive(live)
	s := memctl.CurrentStats()
	_, seen := gcSeen()
	watch.say()
	childtest.Say("GC_CYCLES_WITH", cyclesAtDrop-cycles0)
	childtest.Say("GC_ENDS_SEEN_SINCE", seen-seen0)
	childtest.Say("NONHEAP_GROWTH", nonHeapAfter-nonHeapBefore)
	childtest.Say("BEFORE", before)
	childtest.Say("PEAK", peak)
	childtest.Say("AFTER", after)
	childtest.Say("SINCE_LAST_GC", time.Since(lastGC).Round(time.Millisecond))
	childtest.Say("EARLY_STARTS", s.Trim.EarlyStarts)
	childtest.Say("PENDING", pending)
	childtest.Say("TRIMS", s.Trim.Trims)
	childtest.Say("SKIPPED", s.Trim.Skipped)
	childtest.Say("RELEASED", s.Trim.TotalReleased)
	// The Go step's path, for the log: without a GC (and why it stopped),
	// or skipped.
	childtest.Say("NOGC", s.Trim.NoGC)
	childtest.Say("LAST_ABORT", s.Trim.LastAbort)
	childtest.Say("GO_SKIPPED", s.Trim.GoSkipped)
	childtest.Say("ESTIMATE", s.Trim.LastEstimate)
	childtest.Say("BURSTS", s.AutoBurst.Bursts)
	childtest.Say("MARKS", s.AutoBurst.Marks)
	childtest.Say("GCENDS", s.AutoBurst.GCEnds) // 0 when the detector is off
}

// sayDrop reports, as a child drops its burst, what tells whether the
// burst's trim could have begun with the burst still live: the trims
// decided so far (DECIDED_BEFORE_DROP, counted when they end) and the time
// since the last GC cycle (DROP_AFTER_LAST_GC_MS): that cycle's end, seen
// by the detector after the runtime recorded it, was the burst's last
// mark, and the trim begins a delay after the last mark, never sooner. It
// returns the last GC cycle's time.
func sayDrop() time.Time {
	atDrop := memctl.CurrentStats().Trim
	var gs debug.GCStats
	debug.ReadGCStats(&gs)
	since := time.Since(gs.LastGC)
	childtest.Say("DROP_AFTER_LAST_GC", since.Round(time.Millisecond))
	childtest.Say("DROP_AFTER_LAST_GC_MS", since.Milliseconds())
	childtest.Say("DECIDED_BEFORE_DROP", atDrop.Trims+atDrop.Skipped)
	return gs.LastGC
}

// waitDueTrim waits while a trim is pending, for at most the default max
// wait and a delay more after since, and reports whether one still is:
// what the tests assert is what the due trim released, not how soon a
// loaded machine got to run it.
func waitDueTrim(since time.Time) (pending bool) {
	deadline := since.Add((10 + 1) * trimwire.DefaultDelay) // the default max wait is 10 delays
	for memctl.CurrentStats().Trim.Pending {
		if time.Now().After(deadline) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func skipLong(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("a long real-effect test: skipped in -short")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS and timing say nothing")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc: Linux only")
	}
}

func num(t *testing.T, r map[string]string, k string) int64 {
	t.Helper()
	return childtest.RequireInt(t, r, k)
}

// Issue 19: with only the auto import (20 MiB live, a 1 GiB burst, no
// AfterBurst), VmRSS 3 s after the burst's last GC (or, on a loaded
// machine, once the due trim has run) is back to the RSS
// before plus what the runtime mapped for other than the heap meanwhile
// (the metadata of a heap that reached 1 GiB, which no trim returns; see
// docs/benchmarks.md, "The burst target") and 2 MiB; the bench harness
// judges its burst against plain Go with debug.FreeOSMemory instead.
// The control is the same program with MEMCTL_AUTOBURST=off: its burst
// stays resident.
func TestImportTrimsBurstWithoutAfterBurst(t *testing.T) {
	skipLong(t)
	// One after the other: two 1 GiB bursts at once on 2 cores would delay
	// the trim by the other child's page faults.
	auto := childtest.Report(t, childtest.Command(t, "burst", childEnv, "MEMCTL_PRESSURE=off"))
	off := childtest.Report(t, childtest.Command(t, "burst", childEnv, "MEMCTL_PRESSURE=off", "MEMCTL_AUTOBURST=off"))
	for name, r := range map[string]map[string]string{"auto": auto, "MEMCTL_AUTOBURST=off": off} {
		t.Logf("%s: RSS before %d MiB, peak %d MiB, dropped %s after the burst's last GC, %s after it (at least %v, and the due trim run) %d MiB; %s trims (estimate %s, released %s bytes; %s without a GC, last abort %s; Go step skipped %s; %s early starts), %s bursts detected, %s marks",
			name, num(t, r, "BEFORE")>>20, num(t, r, "PEAK")>>20, r["DROP_AFTER_LAST_GC"], r["SINCE_LAST_GC"], afterLastGC, num(t, r, "AFTER")>>20, r["TRIMS"], r["ESTIMATE"], r["RELEASED"],
			r["NOGC"], r["LAST_ABORT"], r["GO_SKIPPED"], r["EARLY_STARTS"], r["BURSTS"], r["MARKS"])
	}
	assert.Zero(t, num(t, off, "GCENDS"), "no detector")
	assert.Greater(t, num(t, off, "AFTER"), num(t, off, "BEFORE")+burstBytes/2, "the control keeps its burst")
	assert.Zero(t, num(t, off, "TRIMS"))
	skipIfScenarioMissed(t, auto, "burst", burstBytes)
	assert.Equal(t, "false", auto["PENDING"], "the due trim ran within the max wait")
	assert.Positive(t, num(t, auto, "GCENDS"), "the detector ran")
	t.Logf("auto: the runtime's non-heap memory grew %.1f MiB; RSS %.1f MiB above before (0.5%% of the burst is %.1f MiB)",
		float64(num(t, auto, "NONHEAP_GROWTH"))/(1<<20), float64(num(t, auto, "AFTER")-num(t, auto, "BEFORE"))/(1<<20), float64(burstBytes/200)/(1<<20))
	assert.LessOrEqual(t, num(t, auto, "NONHEAP_GROWTH"), int64(burstBytes/100), "the runtime's metadata for the burst's heap")
	assert.LessOrEqual(t, num(t, auto, "AFTER"), num(t, auto, "BEFORE")+num(t, auto, "NONHEAP_GROWTH")+burstBytes/200, "RSS before + the runtime's non-heap growth + the burst target's 0.5%% of the burst: the heap is returned")
	assert.Equal(t, int64(1), num(t, auto, "TRIMS"))
	assert.Equal(t, int64(1), num(t, auto, "BURSTS"))
}

// skipIfScenarioMissed skips t, with the figures, when the child r did
// not produce the scenario under test, a burst (what) seen at a GC end
// and dropped before its trim, as a loaded machine may not:
//   - its trim was decided while it was live: the trim comes one delay
//     after the last GC end that saw the burst, and the child took longer
//     than that to finish with it. As the burst detector's rule (trim/autoburst.go) says for a burst
//     held through its trim, it then waits for the GC that collects it (an
//     idle child's next is the runtime's forced GC, minutes later);
//   - no burst was detected and no GC end the detector looked at saw the
//     burst live (LIVE_SEEN under half of size, the burst's bytes): a
//     cycle that starts before the hook is re-armed is seen with the next
//     one (internal/gcend), and the child runs none after the burst. Under
//     load the hook of the cycle before the burst can run late, during the
//     burst's cycle, so counting the hook's runs does not tell.
func skipIfScenarioMissed(t *testing.T, r map[string]string, what string, size int64) {
	t.Helper()
	skipIfTrimMayPrecedeDrop(t, r, what)
	if seen := num(t, r, "LIVE_SEEN"); num(t, r, "BURSTS") == 0 && seen < size/2 {
		t.Skipf("no burst detected: no GC end the detector looked at saw the %s live (the largest live heap seen %d MiB; %s GC cycles ran while it was live, the hook ran %s times since): the end of its cycle was to be seen with the next, which never came (RSS %d MiB after)",
			what, seen>>20, r["GC_CYCLES_WITH"], r["GC_ENDS_SEEN_SINCE"], num(t, r, "AFTER")>>20)
	}
}

// skipIfTrimMayPrecedeDrop skips t, with the figures, when the child r
// (see sayDrop) dropped its burst (what) a trim delay or more after the
// burst's last GC cycle, or after a trim was decided: the trim, due a
// delay after that cycle's end (half a delay once the trims started
// early, under a CPU quota), may have begun with the burst live, and the
// run cannot show the trim of a dropped burst. CI saw such a trim release
// 0.5 MiB of a live 1 GiB burst on a loaded machine.
func skipIfTrimMayPrecedeDrop(t *testing.T, r map[string]string, what string) {
	t.Helper()
	if n := num(t, r, "DECIDED_BEFORE_DROP"); n > 0 {
		t.Skipf("%d trim(s) had been decided before the %s was dropped (%s after its last GC cycle; RSS %d MiB after): the machine did not give the scenario of a %s dropped before its trim",
			n, what, r["DROP_AFTER_LAST_GC"], num(t, r, "AFTER")>>20, what)
	}
	delay := trimwire.DefaultDelay
	if num(t, r, "EARLY_STARTS") > 0 {
		delay /= 2
	}
	if since := time.Duration(num(t, r, "DROP_AFTER_LAST_GC_MS")) * time.Millisecond; since >= delay {
		t.Skipf("the %s was dropped %v after its last GC cycle, whose end marked it, and its trim was due %v after that mark: it may have begun with the %s live (RSS %d MiB after); the machine did not give the scenario of a %s dropped before its trim",
			what, since, delay, what, num(t, r, "AFTER")>>20, what)
	}
}

// gcSeen returns the GC cycles the process ran and the GC ends the burst
// detector looked at, so far.
func gcSeen() (cycles, seen int64) {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64()), memctl.CurrentStats().AutoBurst.GCEnds
}

// liveWatch watches the GC ends the detector's chain (internal/gcend)
// looks at: how many, and the largest live heap one saw.
type liveWatch struct {
	sub        *gcend.Subscription
	ends, most atomic.Int64
}

// watchLive starts a liveWatch. With settle it then runs a GC and waits
// (5 s at most) until the chain has seen its end: the chain is then armed
// with a sentinel the next cycle frees. Otherwise the hook of a cycle that
// ended just before a burst can run late, during the burst's own cycle,
// and the chain sees that cycle only with the next one (internal/gcend),
// which an idle child never runs: a one-allocation burst whose cycle
// follows another's is then never seen.
func watchLive(settle bool) *liveWatch {
	w := new(liveWatch)
	w.sub = gcend.Subscribe(func(g *gcend.Sample) bool {
		w.ends.Add(1)
		if g.Live > w.most.Load() {
			w.most.Store(g.Live)
		}
		return true
	})
	if !settle {
		return w
	}
	runtime.GC()
	for deadline := time.Now().Add(5 * time.Second); w.ends.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	w.most.Store(0)
	return w
}

// say stops watching and reports the largest live heap seen at a GC end
// since watchLive returned (LIVE_SEEN): whether the detector could see the
// burst live.
func (w *liveWatch) say() {
	w.sub.Stop()
	childtest.Say("LIVE_SEEN", w.most.Load())
}

const (
	steadyFor     = 60 * time.Second
	steadyRate    = 1000 // requests per second
	steadyGarbage = 64 << 10
)

// steadyChild serves 1,000 requests per second for 60 s on loopback, each
// allocating 64 KiB of garbage (every page touched), over a flat 20 MiB
// live heap. It reports the trims, the detector's counters and the live
// heap's range at GC end.
func steadyChild() {
	live := burst.Alloc(liveBytes)
	var lo, hi atomic.Int64
	lo.Store(1 << 62)
	s := [1]metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var mu sync.Mutex
	sub := gcend.Subscribe(func(*gcend.Sample) bool {
		mu.Lock()
		metrics.Read(s[:])
		v := int64(s[0].Value.Uint64())
		mu.Unlock()
		if v < lo.Load() {
			lo.Store(v)
		}
		if v > hi.Load() {
			hi.Store(v)
		}
		return true
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, steadyGarbage)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		_, _ = w.Write(b[:1024])
	}))
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 16
	reqs := make(chan struct{}, steadyRate)
	var served, failed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range reqs {
				resp, err := client.Get(srv.URL)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				served.Add(1)
			}
		})
	}
	start := time.Now()
	for i := range int64(steadyFor / time.Millisecond) {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / steadyRate)))
		select {
		case reqs <- struct{}{}:
		default:
			failed.Add(1) // the workers fell behind: not sent
		}
	}
	close(reqs)
	wg.Wait()
	sub.Stop()
	runtime.KeepAlive(live)
	st := memctl.CurrentStats()
	childtest.Say("SERVED", served.Load())
	childtest.Say("FAILED", failed.Load())
	childtest.Say("TRIMS", st.Trim.Trims)
	childtest.Say("SKIPPED", st.Trim.Skipped)
	childtest.Say("BURSTS", st.AutoBurst.Bursts)
	childtest.Say("DROPS", st.AutoBurst.Drops)
	childtest.Say("MARKS", st.AutoBurst.Marks)
	childtest.Say("GCENDS", st.AutoBurst.GCEnds)
	childtest.Say("FLOOR", st.AutoBurst.Floor)
	childtest.Say("LIVE_MIN", lo.Load())
	childtest.Say("LIVE_MAX", hi.Load())
}

// idleChild holds 20 MiB live, says READY and waits for its standard input
// to close.
func idleChild() {
	live := burst.Alloc(liveBytes)
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/scavenge/background:cpu-seconds"}}
	metrics.Read(s)
	gcs, scav := s[0].Value.Uint64(), s[1].Value.Float64()
	fmt.Println("READY")
	_, _ = io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(live)
	// What ran while idle, for the parent's log: GC cycles, the runtime's
	// background scavenger, memctl's trims.
	metrics.Read(s)
	st := memctl.CurrentStats()
	fmt.Printf("gc_cycles=%d scavenger_cpu_s=%.4f trims=%d skipped=%d pending=%v auto_bursts=%d pressure_signals=%d threads=%d\n",
		s[0].Value.Uint64()-gcs, s[1].Value.Float64()-scav, st.Trim.Trims, st.Trim.Skipped, st.Trim.Pending,
		st.AutoBurst.Bursts, st.Pressure.Signals, threads())
}

// threads returns the number of this process's threads (/proc/self/task),
// or -1.
func threads() int {
	d, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1
	}
	return len(d)
}

// Issue 19: a steady load over a flat live heap (1,000 requests per second
// of 64 KiB garbage each, 60 s) gets no automatic trim; and an idle process
// with memctl makes as many voluntary context switches as plain Go
// (MEMCTL=off), both idle at the same time.
func TestNoBurstNoTrim(t *testing.T) {
	skipLong(t)
	t.Run("steady", func(t *testing.T) {
		t.Parallel()
		r := childtest.Report(t, childtest.Command(t, "steady", childEnv, "MEMCTL_PRESSURE=off"))
		t.Logf("steady: %s served (%s failed or not sent), %s GC ends, live heap at GC end %.1f to %.1f MiB (floor %.1f MiB); %s trims, %s skipped, %s bursts, %s drops",
			r["SERVED"], r["FAILED"], r["GCENDS"], float64(num(t, r, "LIVE_MIN"))/(1<<20), float64(num(t, r, "LIVE_MAX"))/(1<<20),
			float64(num(t, r, "FLOOR"))/(1<<20), r["TRIMS"], r["SKIPPED"], r["BURSTS"], r["DROPS"])
		// The rate is the machine's to give (the sender drops what the
		// workers fell behind on): a slower load that still runs the GC
		// cycles is the steady load under test; one that does not is no
		// load at all.
		if want := int64(steadyFor / time.Millisecond * 9 / 10); num(t, r, "SERVED") <= want {
			if num(t, r, "GCENDS") <= 100 {
				t.Skipf("the machine served %s of the %d requests asked for, and the detector saw %s GC ends: not the steady load under test", r["SERVED"], steadyFor/time.Millisecond, r["GCENDS"])
			}
			t.Logf("the machine served %s of the %d requests asked for: a slower steady load", r["SERVED"], steadyFor/time.Millisecond)
		}
		assert.Greater(t, num(t, r, "GCENDS"), int64(100), "the detector saw the GC cycles")
		assert.Zero(t, num(t, r, "TRIMS"), "no automatic trim")
		assert.Zero(t, num(t, r, "SKIPPED"), "no trim even came due")
		assert.Zero(t, num(t, r, "BURSTS")+num(t, r, "DROPS"))
	})
	t.Run("idle", func(t *testing.T) {
		t.Parallel()
		sw := idleSwitches(t, steadyFor)
		t.Logf("idle %v: voluntary context switches, memctl's defaults %d, memctl with MEMCTL_PRESSURE=off %d, plain Go (MEMCTL=off) %d",
			steadyFor, sw[0], sw[1], sw[2])
		// The Go runtime itself wakes (sysmon backs off to 10 ms, the forced
		// GC every 2 minutes, the scavenger): memctl must match plain Go
		// within noise, a few dozen switches in a minute. The defaults add
		// the kernel pressure watch, which trims on every PSI event: on a
		// shared machine a neighbour's memory pressure wakes it (620
		// switches in a minute once here), which is that watch's rule to
		// decide, not idleness; the check is on memctl without it, the
		// detector, the trimmer and the GOMEMLIMIT refresh.
		assert.LessOrEqual(t, sw[1], sw[2]+max(sw[2]/4, 30), "memctl without the pressure watch")
	})
}

// idleSwitches starts three idle children at once: memctl's defaults,
// memctl with MEMCTL_PRESSURE=off, and MEMCTL=off (plain Go), and returns
// the voluntary context switches of all their threads over d, in that
// order.
func idleSwitches(t *testing.T, d time.Duration) [3]int64 {
	const idleSettle = 3 * time.Second
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	start := func(env ...string) child {
		cmd := childtest.Command(t, "idle", childEnv, env...)
		in, err := cmd.StdinPipe()
		require.NoError(t, err)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		r := bufio.NewReader(out)
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "READY\n", line)
		return child{cmd, in, r}
	}
	cs := []child{start(), start("MEMCTL_PRESSURE=off"), start("MEMCTL=off")}
	defer func() {
		for i, c := range cs {
			_ = c.stdin.Close()
			rest, _ := io.ReadAll(c.out)
			t.Logf("idle arm %d while idle: %s", i, strings.TrimSpace(string(rest)))
			assert.NoError(t, c.cmd.Wait())
		}
	}()
	// Let each child's start settle (the background scavenger returns the
	// start's garbage, memctl's first GOMEMLIMIT refresh) before counting.
	time.Sleep(idleSettle)
	var sw [3]int64
	for i, c := range cs {
		sw[i] = -voluntary(t, c.cmd.Process.Pid)
	}
	time.Sleep(d)
	for i, c := range cs {
		sw[i] += voluntary(t, c.cmd.Process.Pid)
	}
	return sw
}

// voluntary sums voluntary_ctxt_switches over the threads of pid.
func voluntary(t *testing.T, pid int) int64 {
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	require.NoError(t, err)
	var n int64
	for _, f := range dirs {
		st, err := procfs.ReadFile(f)
		if err != nil && strings.Contains(err.Error(), "no such file") {
			continue // a thread that exited
		}
		require.NoError(t, err)
		v, err := st.Int("voluntary_ctxt_switches")
		require.NoError(t, err)
		n += v
	}
	return n
}

// Attack input (issue 19): GOGC=off, the GC driven by GOMEMLIMIT alone.
// Under GOMEMLIMIT=512MiB the 1 GiB burst makes GC cycles run at the limit,
// and the runtime itself returns the burst at its memory limit (a
// MEMCTL_AUTOBURST=off arm there measured 36-51 MiB after): memctl must do
// no harm (at most one detected burst and one trim, and RSS back after its
// trim, once it has run). Whether the detector calls the burst one depends on how fast the
// live heap grows between the GC ends at the limit (a live heap that grows
// across GC ends is growth, issue 26); CI read 0 and 1. Under 1536MiB no GC
// cycle runs at all, so no GC end sees it (the limit the burst detector's doc (trim/autoburst.go)
// states: if this starts to detect, the doc is stale).
func TestImportGOGCOff(t *testing.T) {
	skipLong(t)
	at := childtest.Report(t, childtest.Command(t, "burst", childEnv, "MEMCTL_PRESSURE=off", "GOGC=off", "GOMEMLIMIT=512MiB"))
	under := childtest.Report(t, childtest.Command(t, "burst", childEnv, "MEMCTL_PRESSURE=off", "GOGC=off", "GOMEMLIMIT=1536MiB"))
	for name, r := range map[string]map[string]string{"GOMEMLIMIT=512MiB": at, "GOMEMLIMIT=1536MiB": under} {
		t.Logf("GOGC=off %s: RSS before %d MiB, peak %d MiB, after %d MiB; %s trims, %s bursts, %s GC ends",
			name, num(t, r, "BEFORE")>>20, num(t, r, "PEAK")>>20, num(t, r, "AFTER")>>20, r["TRIMS"], r["BURSTS"], r["GCENDS"])
	}
	assert.LessOrEqual(t, num(t, at, "BURSTS"), int64(1))
	assert.LessOrEqual(t, num(t, at, "TRIMS"), int64(1))
	assert.Equal(t, "false", at["PENDING"], "the due trim ran within the max wait")
	if num(t, at, "TRIMS") == 1 {
		// Within 16 MiB (1.6% of the burst), not the default's 0.5%: with
		// the GC run at the limit (400+ cycles in the burst) a few MiB more
		// stay resident after the trim (5 to 7 MiB over in 4 runs here, one
		// of them in CI's CGO_ENABLED=0 step); without the trim all 1 GiB
		// stays.
		assert.LessOrEqual(t, num(t, at, "AFTER"), num(t, at, "BEFORE")+burstBytes/64, "RSS before + 1.6% of the burst after memctl's trim")
	} else {
		// No trim: what stays resident is what the runtime returned at its
		// limit on its own, which memctl did not touch (a
		// MEMCTL_AUTOBURST=off arm leaves as much, more or less from run to
		// run): nothing of memctl's to bound.
		t.Logf("GOMEMLIMIT=512MiB: no trim (%s bursts, %s skipped): RSS after is the runtime's own return", at["BURSTS"], at["SKIPPED"])
	}
	assert.Zero(t, num(t, under, "GCENDS"), "no GC cycle under the limit")
	assert.Greater(t, num(t, under, "AFTER"), num(t, under, "BEFORE")+burstBytes/2)
}

// The deleted burst of issue 34, item 3: a request builds about 150 MiB of
// maps and strings over 3 s and drops them at its end, while the service
// makes 1 MiB/s of small garbage; no AfterBurst, no budget.
const (
	deletedRise  = 150 << 20
	deletedBuild = 3 * time.Second
	deletedAfter = 5 * time.Second
	// deletedWarm is the time the service runs before the request: the
	// trim's CPU budget saves 2% of it, and the GC that finds out whether
	// the burst died is asked only when its whole cost fits in what was
	// saved (trim/plan.go). At the default 2 ns per scannable byte, a heap
	// of 150 MiB costs at most 0.32 s, saved in 16 s.
	deletedWarm = 20 * time.Second
	// deletedKeep is the share of the rise that may still be resident
	// deletedAfter after the request (the bound).
	deletedKeep = 0.25
)

// deletedItem is one item of the request's maps; with its labels, its map
// slot and key, about deletedItemSize bytes.
type deletedItem struct {
	labels []string
	prev   *deletedItem
}

const deletedItemSize = 200

// deletedChild runs the deleted burst and reports VmRSS before the
// request, at its end and deletedAfter later, the forced GC cycles and
// memctl's trims.
func deletedChild() {
	stop := make(chan struct{})
	go burst.Garbage(1<<20, stop)
	time.Sleep(deletedWarm)
	forced := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(forced)
	forced0 := forced[0].Value.Uint64()
	cpu0 := memctl.CurrentStats().Trim.TotalCPU
	before := rss()
	// The request: maps of labelled items, as a parsed push or a query's
	// intermediate result holds them (pointer-rich: the GC marks most of
	// it), built in 30 steps.
	const steps = 30
	var store []map[string]*deletedItem
	var prev *deletedItem
	for i := range steps {
		m := make(map[string]*deletedItem)
		for j := 0; j < deletedRise/steps/deletedItemSize; j++ {
			it := &deletedItem{prev: prev, labels: make([]string, 4)}
			for k := range it.labels {
				it.labels[k] = strconv.Itoa(i*1000+k) + "/label"
			}
			m[strconv.Itoa(i)+"/"+strconv.Itoa(j)] = it
			prev = it
		}
		store = append(store, m)
		time.Sleep(deletedBuild / steps)
	}
	prev = nil
	peak := rss()
	runtime.KeepAlive(store)
	store = nil
	dropped := time.Now()
	sayDrop()
	time.Sleep(deletedAfter)
	// A loaded machine may run the due trim later (up to the max wait):
	// RSS is read once it has run.
	waitDueTrim(dropped)
	after := rss()
	childtest.Say("AFTER_MS", time.Since(dropped).Milliseconds())
	close(stop)
	metrics.Read(forced)
	s := memctl.CurrentStats()
	childtest.Say("BEFORE", before)
	childtest.Say("PEAK", peak)
	childtest.Say("AFTER", after)
	childtest.Say("FORCED", forced[0].Value.Uint64()-forced0)
	childtest.Say("TRIMS", s.Trim.Trims)
	childtest.Say("SKIPPED", s.Trim.Skipped)
	childtest.Say("RELEASED", s.Trim.TotalReleased)
	childtest.Say("TRIM_CPU_NS", int64(s.Trim.TotalCPU-cpu0))
	childtest.Say("BURSTS", s.AutoBurst.Bursts)
	childtest.Say("EARLY_STARTS", s.Trim.EarlyStarts)
}

// Issue 34, item 3: with the auto import alone, VmRSS deletedAfter after a
// request that built and dropped 150 MiB (later where a loaded machine
// postponed the due trim, within the max wait) is at most the RSS before
// it and a quarter of the rise; the same program with MEMCTL_AUTOBURST=off, run
// at the same time, keeps more than that (until a GC that its 1 MiB/s of
// garbage brings only minutes later), so the bound measures the trim.
func TestDeletedBurstIsTrimmed(t *testing.T) {
	skipLong(t)
	reps := childtest.Reports(t,
		childtest.Command(t, "deleted", childEnv, "MEMCTL_PRESSURE=off"),
		childtest.Command(t, "deleted", childEnv, "MEMCTL_PRESSURE=off", "MEMCTL_AUTOBURST=off"))
	a, o := reps[0], reps[1]
	t.Logf("auto: %v; MEMCTL_AUTOBURST=off: %v", a, o)
	for name, r := range map[string]map[string]string{"auto": a, "MEMCTL_AUTOBURST=off": o} {
		before, peak, after := num(t, r, "BEFORE"), num(t, r, "PEAK"), num(t, r, "AFTER")
		rise := peak - before
		t.Logf("%s: RSS %.1f -> %.1f MiB, %.1f MiB %d ms after the request; %d forced GCs, %d trims (%d skipped) for %v",
			name, mib(before), mib(peak), mib(after), num(t, r, "AFTER_MS"), num(t, r, "FORCED"), num(t, r, "TRIMS"), num(t, r, "SKIPPED"), time.Duration(num(t, r, "TRIM_CPU_NS")))
		if !assert.Greater(t, rise, int64(deletedRise/2), "%s: the request raised RSS", name) {
			continue
		}
		keep := before + int64(deletedKeep*float64(rise))
		if name == "auto" {
			// The trim runs a delay after the burst's last mark: on a
			// loaded machine the build's last GC end can come more than
			// a delay before the drop, and the trim then finds the data
			// live.
			skipIfTrimMayPrecedeDrop(t, r, "request's data")
			assert.LessOrEqual(t, after, keep, "auto: RSS %v after the request within a quarter of the rise", deletedAfter)
			assert.Equal(t, int64(1), num(t, r, "FORCED"), "one forced GC: the trim's")
		} else {
			assert.Greater(t, after, keep, "control: the dropped burst stays resident")
		}
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

const (
	growLive = 256 << 20
	growIdle = 10 * time.Second
)

// growNode is one object of a pointer-rich heap: 64 bytes, two pointers.
type growNode struct {
	a, b *growNode
	_    [48]byte
}

// growChild is issue 26's item 1 program: memctl started (the auto
// import), then a 256 MiB pointer-rich live heap built (a cache filled at
// start), then idle for 10 s. It reports the forced GC cycles and the
// process's CPU time over the idle time, and memctl's trims and skips.
func growChild() {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	forced0 := s[0].Value.Uint64()
	size, idle := int64(growLive), growIdle
	// The full figures by hand: MEMCTL_TEST_GROW=512MiB,30s.
	if v := os.Getenv("MEMCTL_TEST_GROW"); v == "512MiB,30s" {
		size, idle = 512<<20, 30*time.Second
	}
	nodes := make([]*growNode, size/64)
	for i := range nodes {
		nodes[i] = &growNode{a: nodes[i/2], b: nodes[i/3]}
	}
	// The build may leave a GC cycle marking the heap; its CPU is the
	// runtime's, not memctl's. Setting a negative GOGC waits for that mark
	// to finish without starting a cycle (runtime/debug.SetGCPercent), so
	// the idle window starts with none running.
	debug.SetGCPercent(debug.SetGCPercent(-1))
	g := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/scavenge/total:cpu-seconds"}}
	metrics.Read(g)
	cycles0, gcCPU0, scav0 := g[0].Value.Uint64(), g[1].Value.Float64(), g[2].Value.Float64()
	cpu0 := cpuTime()
	time.Sleep(idle)
	cpu := cpuTime() - cpu0
	metrics.Read(g)
	childtest.Say("IDLE_GC_CYCLES", g[0].Value.Uint64()-cycles0)
	childtest.Say("IDLE_GC_CPU_NS", int64((g[1].Value.Float64()-gcCPU0)*1e9))
	childtest.Say("IDLE_SCAVENGE_CPU_NS", int64((g[2].Value.Float64()-scav0)*1e9))
	metrics.Read(s)
	runtime.KeepAlive(nodes)
	st := memctl.CurrentStats()
	childtest.Say("FORCED", s[0].Value.Uint64()-forced0)
	childtest.Say("IDLE_CPU_NS", int64(cpu))
	childtest.Say("TRIMS", st.Trim.Trims)
	childtest.Say("SKIPPED", st.Trim.Skipped)
	childtest.Say("ESTIMATE", st.Trim.LastEstimate)
	childtest.Say("BURSTS", st.AutoBurst.Bursts)
}

// Issue 26 item 1: a heap that only grew is not a burst to trim. memctl
// started, a 256 MiB pointer-rich live heap built, 10 s idle (the issue's
// figure is 512 MiB and 30 s; see the report of this change for that
// run): no forced GC cycle, and the CPU over the idle time within 2% of one
// CPU of the same program with MEMCTL_AUTOBURST=off, run beside it. Each
// child waits for the build's GC mark to finish before its idle time; a
// cycle that still ends inside it is the runtime's CPU, not memctl's, and
// larger than the bound, so the pair is run once more when one did, and
// the test skips, saying so, when it did again.
func TestGrownHeapIsNotTrimmed(t *testing.T) {
	skipLong(t)
	for attempt := 1; ; attempt++ {
		r := childtest.Reports(t, childtest.Command(t, "grow", childEnv, "MEMCTL_PRESSURE=off"),
			childtest.Command(t, "grow", childEnv, "MEMCTL_PRESSURE=off", "MEMCTL_AUTOBURST=off"))
		auto, off := r[0], r[1]
		t.Logf("auto: %v; MEMCTL_AUTOBURST=off: %v", auto, off)
		assert.Zero(t, num(t, auto, "FORCED"), "no forced GC cycle")
		assert.Zero(t, num(t, auto, "TRIMS"), "no trim")
		if a, o := num(t, auto, "IDLE_GC_CYCLES"), num(t, off, "IDLE_GC_CYCLES"); a+o > 0 {
			if attempt < 2 {
				continue
			}
			t.Skipf("a GC cycle of the built heap ended in the idle time again (auto %d, control %d; CPU %v and %v): the runtime's CPU, not memctl's, so the comparison says nothing",
				a, o, time.Duration(num(t, auto, "IDLE_CPU_NS")), time.Duration(num(t, off, "IDLE_CPU_NS")))
		}
		diff := time.Duration(num(t, auto, "IDLE_CPU_NS") - num(t, off, "IDLE_CPU_NS"))
		assert.LessOrEqual(t, diff, growIdle/50, "CPU within 2%% of one CPU of the control")
		return
	}
}

const (
	oneBuffer = 150 << 20
	// trimMinRelease is trim.Config.MinRelease's default (8 MiB), which
	// the auto import runs with: the releasable bytes a trim's step
	// deems too few to act on, and so what a trim may leave resident.
	trimMinRelease = 8 << 20
)

// heapInUse returns the Go heap's bytes in use: objects (collected or
// not), the free space inside their spans, and goroutine stacks, which
// no trim returns. The heap's free pages, what a trim returns, are not
// in it.
func heapInUse() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	var n int64
	for _, x := range s {
		n += int64(x.Value.Uint64())
	}
	return n
}

// heapFree returns the Go heap's free pages not yet returned to the OS.
func heapFree() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// ensureFloor gives the burst detector a floor before a child's burst.
// With no GC end looked at since Start, the detector's floor is 0 and the
// first GC end it looks at becomes the floor (trim's rule), so a burst live
// at that GC end is its floor, not a rise: a loaded machine can delay the
// first look until the burst. A forced GC end sets the floor, so one runs
// then, and the detector is waited for (2 s at most); with the detector
// off there is nothing to wait for.
func ensureFloor() {
	if os.Getenv("MEMCTL_AUTOBURST") == "off" || memctl.CurrentStats().AutoBurst.GCEnds > 0 {
		return
	}
	runtime.GC()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if memctl.CurrentStats().AutoBurst.GCEnds > 0 {
			return
		}
	}
}

// oneBufferChild is a new user's first trial (only the auto import): one
// request holds one 150 MiB buffer with no pointers (a []int64, each page
// touched) over an 8 MiB live heap, and drops it; no GC runs after the
// drop, so the GC that saw the buffer saw it live. It reports VmRSS
// before, at the peak and 4 s after the drop (later if the due trim has
// not run by then), the Go heap in use and free at before and after, and
// the forced GC cycles.
func oneBufferChild() {
	live := burst.Alloc(8 << 20)
	time.Sleep(500 * time.Millisecond)
	ensureFloor()
	watch := watchLive(true)
	before, nonHeapBefore, inUseBefore, freeBefore := rss(), nonHeap(), heapInUse(), heapFree()
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	forced0 := s[0].Value.Uint64()
	cycles0, seen0 := gcSeen()
	buf := make([]int64, oneBuffer/8)
	for i := range buf {
		buf[i] = int64(i)
	}
	peak := rss()
	runtime.KeepAlive(buf)
	buf = nil
	lastGC := sayDrop()
	cyclesAtDrop, _ := gcSeen()
	time.Sleep(4 * time.Second)
	pending := waitDueTrim(lastGC)
	after, nonHeapAfter, inUseAfter, freeAfter := rss(), nonHeap(), heapInUse(), heapFree()
	runtime.KeepAlive(live)
	metrics.Read(s)
	st := memctl.CurrentStats()
	_, seen := gcSeen()
	watch.say()
	childtest.Say("GC_CYCLES_WITH", cyclesAtDrop-cycles0)
	childtest.Say("GC_ENDS_SEEN_SINCE", seen-seen0)
	childtest.Say("BEFORE", before)
	childtest.Say("PEAK", peak)
	childtest.Say("AFTER", after)
	childtest.Say("NONHEAP_GROWTH", nonHeapAfter-nonHeapBefore)
	childtest.Say("HEAP_INUSE_GROWTH", inUseAfter-inUseBefore)
	childtest.Say("HEAP_FREE_BEFORE", freeBefore)
	childtest.Say("HEAP_FREE_AFTER", freeAfter)
	childtest.Say("FORCED", s[0].Value.Uint64()-forced0)
	childtest.Say("TRIMS", st.Trim.Trims)
	childtest.Say("BURSTS", st.AutoBurst.Bursts)
	childtest.Say("PENDING", pending)
	childtest.Say("EARLY_STARTS", st.Trim.EarlyStarts)
}

// A burst the detector saw whose garbage no GC has collected (one large
// buffer, live at the GC that saw it) is trimmed when its GC is cheap (a
// heap with little to scan): 4 s after the drop (once the due trim has
// run, on a loaded machine), RSS is back to before plus what no trim
// returns, the runtime's non-heap growth and the growth of the Go heap in
// use (objects, their spans' free space, stacks), plus the trim's
// MinRelease (8 MiB by default: the releasable bytes a trim's step deems
// too few to act on); the buffer itself is not in the heap in use, as
// its GC collected it. The MEMCTL_AUTOBURST=off control, run after it,
// still holds more than half the buffer. The expensive case (a
// pointer-rich heap that only grew) is TestGrownHeapIsNotTrimmed: no
// forced GC there.
func TestImportTrimsOneUncollectedBuffer(t *testing.T) {
	skipLong(t)
	auto := childtest.Report(t, childtest.Command(t, "onebuffer", childEnv, "MEMCTL_PRESSURE=off"))
	off := childtest.Report(t, childtest.Command(t, "onebuffer", childEnv, "MEMCTL_PRESSURE=off", "MEMCTL_AUTOBURST=off"))
	t.Logf("auto: %v; MEMCTL_AUTOBURST=off: %v", auto, off)
	assert.Greater(t, num(t, off, "AFTER"), num(t, off, "BEFORE")+oneBuffer/2, "the control keeps its buffer")
	assert.Zero(t, num(t, off, "TRIMS"))
	skipIfScenarioMissed(t, auto, "buffer", oneBuffer)
	assert.Equal(t, "false", auto["PENDING"], "the due trim ran within the max wait")
	assert.Equal(t, int64(1), num(t, auto, "BURSTS"), "the detector saw the buffer")
	assert.Equal(t, int64(1), num(t, auto, "FORCED"), "one GC, the trim's")
	const m = 1 << 20
	t.Logf("auto: RSS %.1f MiB above before; non-heap growth %.1f MiB, heap in use growth %.1f MiB, heap free %.1f MiB before and %.1f MiB after; MinRelease %d MiB",
		float64(num(t, auto, "AFTER")-num(t, auto, "BEFORE"))/m, float64(num(t, auto, "NONHEAP_GROWTH"))/m, float64(num(t, auto, "HEAP_INUSE_GROWTH"))/m,
		float64(num(t, auto, "HEAP_FREE_BEFORE"))/m, float64(num(t, auto, "HEAP_FREE_AFTER"))/m, trimMinRelease>>20)
	// Were the buffer still in the heap in use (no GC collected it), the
	// bound below would hold whatever the trim did.
	assert.Less(t, num(t, auto, "HEAP_INUSE_GROWTH"), int64(oneBuffer/2), "the trim's GC collected the buffer")
	assert.LessOrEqual(t, num(t, auto, "AFTER"), num(t, auto, "BEFORE")+max(num(t, auto, "NONHEAP_GROWTH"), 0)+max(num(t, auto, "HEAP_INUSE_GROWTH"), 0)+trimMinRelease,
		"RSS before + the runtime's non-heap growth + the heap in use's growth + the trim's MinRelease: the buffer is returned")
}
