package trim

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
)

func TestEstimateCountsUncollectedBurst(t *testing.T) {
	tr, err := New(Config{NoCHeap: true})
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.TrimNow() // sets the live floor
	require.NoError(t, err)
	tr.run.Lock()
	before, _ := tr.estimateGo(true)
	tr.run.Unlock()

	// A burst that a GC sees live, then dropped: /gc/heap/live still counts
	// it, the estimate must not. No GC runs while it is built: two GC ends
	// within 25% of each other during the build (a large heap left by the
	// tests before, on a loaded machine: CI read 3 MiB) would make it the
	// floor, as a heap that grew is (TestRequestEstimateFloor).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	burst := make([][]byte, 0, 1024)
	for range 1024 {
		burst = append(burst, make([]byte, 64<<10))
	}
	runtime.GC()
	h := readSample()
	require.GreaterOrEqual(t, h.Live, int64(64<<20), "the GC saw the burst live")
	runtime.KeepAlive(burst) // dropped from here on
	tr.run.Lock()
	after, _ := tr.estimateGo(true)
	grown, _ := tr.estimateGo(false)
	tr.run.Unlock()
	t.Logf("estimate before burst %d MiB, after %d MiB; without the floor %d MiB", before>>20, after>>20, grown>>20)
	assert.GreaterOrEqual(t, after-before, int64(60<<20))

	assert.Less(t, grown, int64(16<<20), "unmarked: what the last GC saw live is not garbage")
}

// Issue 26 item 4: the estimate never counts live heap as garbage. A heap
// that the last GC saw live is not garbage to a Request; one that two GCs
// saw live while no burst was pending (built after New) becomes the floor,
// so a burst the program marks later does not count it either.
func TestRequestEstimateFloor(t *testing.T) {
	tr, err := New(Config{NoCHeap: true, Delay: time.Hour})
	require.NoError(t, err)
	defer tr.Close()
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // only the GCs of the test
	debug.FreeOSMemory()                             // no free spans left by earlier tests
	waitHook := func() {
		t.Helper()
		require.Eventually(t, func() bool { return tr.gc.last.Load() == readSample().Live }, 10*time.Second, time.Millisecond) // a bound on a hang
	}
	waitHook()
	grown := make([][]byte, 0, 1024)
	for range 1024 {
		grown = append(grown, make([]byte, 64<<10))
	}
	runtime.GC() // sees the 64 MiB live; the GC before saw none of it
	waitHook()
	tr.run.Lock()
	unmarked, _ := tr.estimateGo(false)
	tr.run.Unlock()
	assert.Less(t, unmarked, int64(16<<20), "the last GC saw it live")

	runtime.GC() // a second GC sees it live: grown for good, the floor
	waitHook()
	assert.GreaterOrEqual(t, tr.gc.floor.Load(), int64(64<<20), "the floor follows a heap built after New")
	r := tr.request(originPressure)
	assert.False(t, r.ran, "%+v", r)
	assert.Less(t, r.est, int64(16<<20), "the grown 64 MiB is live")
	tr.AfterBurst()
	tr.run.Lock()
	marked, _ := tr.estimateGo(true)
	tr.run.Unlock()
	assert.Less(t, marked, int64(16<<20), "a burst marked after it: still live")
	runtime.KeepAlive(grown)
}

// Input 1, the charge itself: under a CPU quota the runtime's GC figures
// are inflated (worker time while throttled), so the charge is at most the
// process's real CPU time; without a quota, the process's CPU time counts
// the rest of the program, so the charge is at most the GC figures plus the
// thread's CPU.
func TestChargeTakesTheSmaller(t *testing.T) {
	ms := time.Millisecond
	base := cpuMark{gc: 10 * ms, thread: 5 * ms, process: 100 * ms}
	for _, tc := range []struct {
		name string
		now  cpuMark
		want time.Duration
	}{
		{"throttled: GC figure inflated", cpuMark{gc: 1110 * ms, thread: 25 * ms, process: 190 * ms}, 90 * ms},
		{"busy program: process counts other work", cpuMark{gc: 70 * ms, thread: 45 * ms, process: 400 * ms}, 100 * ms},
		{"process clock unknown", cpuMark{gc: 70 * ms, thread: 45 * ms, process: -1}, 100 * ms},
		{"clocks went back", cpuMark{gc: 0, thread: 0, process: 0}, 0},
	} {
		assert.Equal(t, tc.want, base.charge(tc.now), tc.name)
	}
	unknown := cpuMark{gc: 10 * ms, thread: 5 * ms, process: -1}
	assert.Equal(t, 100*ms, unknown.charge(cpuMark{gc: 70 * ms, thread: 45 * ms, process: 400 * ms}))
}

// The real clocks move with CPU burnt on the locked thread, and the
// process clock's window holds the thread clock's.
func TestReadCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	m0 := readCPU(true)
	// Busy until the kernel's own count of this thread's time on a CPU
	// (/proc/thread-self/schedstat, nanoseconds) grew by 30 ms: a loop
	// timed by the wall clock gets less CPU than that on a loaded machine.
	s0, ok := schedstatCPU()
	for t0 := time.Now(); time.Since(t0) < 30*time.Millisecond || ok && schedstatDelta(s0) < 30*time.Millisecond; {
		if time.Since(t0) > 20*time.Second {
			t.Fatal("30 ms of CPU not scheduled in 20 s")
		}
	}
	m1 := readCPU(false)
	if !linux {
		assert.Equal(t, time.Duration(-1), m1.process)
		return
	}
	if !ok {
		t.Skip("no /proc/thread-self/schedstat to measure the busy loop's CPU against")
	}
	assert.GreaterOrEqual(t, m1.thread-m0.thread, 25*time.Millisecond, "thread CPU (30 ms by schedstat)")
	assert.GreaterOrEqual(t, m1.process-m0.process, m1.thread-m0.thread, "process CPU holds the thread's")
	assert.GreaterOrEqual(t, m0.charge(m1), 10*time.Millisecond)
}

// schedstatCPU returns the calling thread's time on a CPU from
// /proc/thread-self/schedstat (its first field, nanoseconds; kernel
// Documentation/scheduler/sched-stats.rst), and false when it cannot be read.
func schedstatCPU() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(n), err == nil
}

func schedstatDelta(s0 time.Duration) time.Duration {
	s, _ := schedstatCPU()
	return s - s0
}

func TestLazyFrom(t *testing.T) {
	for _, tc := range []struct {
		env, build string
		lazy       bool
	}{
		{"", "", false},
		{"madvdontneed=0", "", true},
		{"madvdontneed=1", "", false},
		{"gctrace=1,madvdontneed=0", "", true},
		{"madvdontneed=0,madvdontneed=1", "", false}, // the last wins
		{"madvdontneed=1,madvdontneed=0", "", true},
		{"madvdontneed=x", "", false}, // not an integer: ignored by the runtime
		{"", "madvdontneed=0", true},  // //go:debug madvdontneed=0
		{"madvdontneed=1", "madvdontneed=0", false},
		{"madvdontneed=0", "madvdontneed=1", true},
		{" madvdontneed=0", "", false}, // the runtime trims no space
		{"madvdontneed=+0", "", true},
		{"madvdontneed=4294967296", "", false}, // not an int32: ignored
		{"xmadvdontneed=0", "", false},
	} {
		lazy, why := lazyFrom(tc.env, tc.build)
		if !linux {
			assert.False(t, lazy)
			continue
		}
		assert.Equal(t, tc.lazy, lazy, "GODEBUG=%q default %q", tc.env, tc.build)
		if lazy {
			assert.Contains(t, why, "madvdontneed=0")
		}
	}
}

// Input 6: under lazy release the bytes that stay in RSS as LazyFree are
// counted apart, and the setting is said at New.
func TestLazyReleaseCounted(t *testing.T) {
	logs, logger := newLog()
	var lazyFree atomic.Int64
	f := &fakeStep{}
	step := func() int64 {
		lazyFree.Add(900 << 10) // 0.9 MiB of the 1 MiB released stays as LazyFree
		return f.run()
	}
	tr, err := newT(withLazy(testConfig{Config: Config{NoCHeap: true, Logger: logger}, hooks: hooks{goStep: step, cpuClock: f.clock}},
		true, func() int64 { return lazyFree.Load() }))
	require.NoError(t, err)
	defer tr.Close()
	assert.Equal(t, 1, logs.count("INFO", "RSS falls only under memory pressure"), logs.String())
	_, err = tr.TrimNow()
	require.NoError(t, err)
	s := tr.Stats()
	assert.True(t, s.Lazy)
	assert.Equal(t, int64(1<<20), s.LastReleased)
	assert.Equal(t, int64(900<<10), s.LastLazy)
	assert.Equal(t, int64(900<<10), s.TotalLazy)

	// Eager release does not read LazyFree.
	eager, err := newT(withLazy(testConfig{Config: Config{NoCHeap: true}, hooks: hooks{goStep: f.run}}, false, func() int64 { panic("read") }))
	require.NoError(t, err)
	defer eager.Close()
	_, err = eager.TrimNow()
	require.NoError(t, err)
	assert.Zero(t, eager.Stats().LastLazy)
}

// lazyChild drops a 256 MiB burst, runs TrimNow and reports what the
// Trimmer says and what VmRSS and LazyFree say.
func lazyChild() {
	tr, err := New(Config{NoCHeap: true})
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer tr.Close()
	before := childRSS()
	b := burst.Alloc(burstBytes)
	runtime.KeepAlive(b)
	b = nil
	if _, err := tr.TrimNow(); err != nil {
		childtest.Fail("%v", err)
	}
	s := tr.Stats()
	childtest.Say("BEFORE", before)
	childtest.Say("AFTER", childRSS())
	childtest.Say("LAZYFREE", lazyFreeBytes())
	childtest.Say("LAZY", s.Lazy)
	childtest.Say("WHY", s.LazyReason)
	childtest.Say("RELEASED", s.LastReleased)
	childtest.Say("LAZY_RELEASED", s.LastLazy)
}

// Issue 13 input 6: under GODEBUG=madvdontneed=0 the trim releases with
// MADV_FREE, RSS stays up, and the Trimmer says so: Stats.Lazy, and the
// bytes released lazily counted apart. With the default, nothing is lazy.
func TestLazyReleaseRSS(t *testing.T) {
	t.Parallel() // child processes only
	if runtime.GOOS != "linux" {
		t.Skip("reads VmRSS and LazyFree from /proc: Linux only")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS say nothing")
	}
	if _, err := os.Stat("/proc/self/smaps_rollup"); err != nil {
		t.Skipf("needs /proc/self/smaps_rollup (Linux 4.14): %v", err)
	}
	num := func(r map[string]string, k string) int64 {
		t.Helper()
		return childtest.RequireInt(t, r, k)
	}
	unset := []string{"GOGC", "GOMEMLIMIT", "GODEBUG"}
	reps := reportsAtOnce(t, childtest.Command(t, "lazy", unset, "GODEBUG=madvdontneed=0"), childtest.Command(t, "lazy", unset))
	lazy, eager := reps[0], reps[1]
	for name, r := range map[string]map[string]string{"madvdontneed=0": lazy, "default": eager} {
		t.Logf("%s: RSS before %.1f MiB, after the trim %.1f MiB, LazyFree %.1f MiB; Stats: lazy %s (%s), released %.1f MiB, of which lazily %.1f MiB",
			name, mib(num(r, "BEFORE")), mib(num(r, "AFTER")), mib(num(r, "LAZYFREE")), r["LAZY"], r["WHY"],
			mib(num(r, "RELEASED")), mib(num(r, "LAZY_RELEASED")))
	}
	assert.Equal(t, "true", lazy["LAZY"])
	assert.Equal(t, "GODEBUG=madvdontneed=0", lazy["WHY"])
	assert.Greater(t, num(lazy, "AFTER"), num(lazy, "BEFORE")+200<<20, "RSS stays up without memory pressure")
	assert.Greater(t, num(lazy, "LAZY_RELEASED"), int64(200<<20), "the burst counted as released lazily")
	assert.LessOrEqual(t, num(lazy, "LAZY_RELEASED"), num(lazy, "RELEASED"))

	assert.Equal(t, "false", eager["LAZY"])
	assert.Zero(t, num(eager, "LAZY_RELEASED"))
	assert.Less(t, num(eager, "AFTER"), num(eager, "BEFORE")+32<<20, "the default returns the burst at once")
}

// costNode is a small pointer-linked node of the live set: the part of a
// live heap the GC must trace.
type costNode struct {
	next *costNode
	_    [7]int64 // 64 bytes in all
}

// TestTrimCost measures, with 1 GiB live (960 MiB of 64 KiB buffers and
// 64 MiB of 64-byte pointer-linked nodes) and a 512 MiB burst dropped, what
// each way of returning the burst costs against a natural GC cycle: wall
// time, the CPU a trim is charged with (trimCPU: GC and scavenger CPU from
// runtime/metrics plus the calling thread's CPU), GC cycles run and RSS
// after. It needs about 2.5 GiB and a minute, so it runs only with
// MEMCTL_TEST_TRIM_COST=1:
//
//	MEMCTL_TEST_TRIM_COST=1 go test ./trim/ -run TestTrimCost -v -count 1
func TestTrimCost(t *testing.T) {
	if os.Getenv("MEMCTL_TEST_TRIM_COST") != "1" {
		t.Skip("set MEMCTL_TEST_TRIM_COST=1 to measure (about 2.5 GiB, a minute)")
	}
	if raceEnabled {
		t.Skip("the race detector distorts CPU and RSS")
	}
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	live := burst.Alloc(960 << 20)
	var head *costNode
	for range (64 << 20) / 64 {
		head = &costNode{next: head}
	}
	runtime.GC()
	debug.FreeOSMemory()

	type method struct {
		name string
		pre  func()         // after the burst is dropped, not measured
		run  func() float64 // measured; returns extra GC cycles it saw fit to report, or NaN
	}
	limitTrick := func() float64 {
		// The burst was collected by the pre GC: its pages are free and
		// resident. Lower the memory limit so that the background
		// scavenger's goal (95% of the limit) lies below what is held
		// now, while the heap goal the limit implies stays above the live
		// heap (so that no GC is triggered), halving the excess at each
		// step, then restore the limit.
		defer debug.SetMemoryLimit(prevLimit)
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			h := readSample()
			if h.HeapFree < 8<<20 {
				break
			}
			// goal = 2L − ready − nonheap (runtime/mgcpacer.go
			// memoryLimitHeapGoal), less 3% headroom: with L = ready −
			// free/2 + objects/20 it is about 1.07 × the heap in use.
			l := readyBytes() - h.HeapFree/2 + h.HeapObjects/20
			debug.SetMemoryLimit(l)
			time.Sleep(100 * time.Millisecond)
		}
		return math.NaN()
	}
	methods := []method{
		{"runtime.GC() (a natural GC cycle)", nil, func() float64 { runtime.GC(); return math.NaN() }},
		{"debug.FreeOSMemory() as the trim", nil, func() float64 { debug.FreeOSMemory(); return math.NaN() }},
		{"debug.FreeOSMemory() right after a GC", runtime.GC, func() float64 { debug.FreeOSMemory(); return math.NaN() }},
		{"lower memory limit after a GC, then restore", runtime.GC, limitTrick},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "| method | wall | CPU charged | GC cycles | RSS before | RSS after |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, m := range methods {
		for rep := range 3 {
			b := burst.Alloc(512 << 20)
			runtime.KeepAlive(b)
			b = nil
			if m.pre != nil {
				m.pre()
			}
			rss0, err := procfs.RSS(0)
			require.NoError(t, err)
			gc0 := numGC()
			runtime.LockOSThread()
			c0 := readCPU(true)
			t0 := time.Now()
			m.run()
			wall := time.Since(t0)
			cpu := c0.charge(readCPU(false))
			runtime.UnlockOSThread()
			gcs := numGC() - gc0
			rss1, err := procfs.RSS(0)
			require.NoError(t, err)
			fmt.Fprintf(&table, "| %s (%d) | %v | %v | %d | %d MiB | %d MiB |\n", m.name, rep+1,
				wall.Round(time.Millisecond), cpu.Round(100*time.Microsecond), gcs, rss0>>20, rss1>>20)
			debug.FreeOSMemory() // the same start for the next
		}
	}
	t.Log("\n" + table.String())
	runtime.KeepAlive(live)
	runtime.KeepAlive(head)
}

func numGC() int64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// readyBytes is the memory the Go runtime holds and has not released:
// /memory/classes/total:bytes − /memory/classes/heap/released:bytes.
func readyBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}
