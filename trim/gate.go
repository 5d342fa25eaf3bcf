package trim

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/gcend"
)

// Origin says who asked for a trim. Every origin but OriginByName goes
// through the same gate (see Trimmer.Request): the estimate against the
// trim's cost, and the 2% CPU budget.
type Origin int

const (
	// OriginDebounced is the trim Delay after the last AfterBurst or end of
	// Begin.
	OriginDebounced Origin = iota
	// OriginPressure is a trim asked for on kernel memory pressure (package
	// pressure, through the facade).
	OriginPressure
	// OriginSpiral is a trim asked for by the GC death-spiral detector.
	OriginSpiral
	// OriginByName is TrimNow: a forced trim that a caller asked for by
	// name. It is the only origin that bypasses the gate.
	OriginByName
	// NumOrigins is the number of origins: the length of Stats.Origins.
	NumOrigins
)

// String returns "debounced", "pressure", "spiral" or "by_name" (the
// metrics' label values).
func (o Origin) String() string {
	switch o {
	case OriginDebounced:
		return "debounced"
	case OriginPressure:
		return "pressure"
	case OriginSpiral:
		return "spiral"
	case OriginByName:
		return "by_name"
	}
	return fmt.Sprintf("Origin(%d)", int(o))
}

// SkipReason says why a trim did not run.
type SkipReason int

const (
	// SkipNone: the trim ran.
	SkipNone SkipReason = iota
	// SkipMinRelease: the estimate of releasable bytes was below
	// Config.MinRelease.
	SkipMinRelease
	// SkipCost: the estimate reached MinRelease but not what the trim's
	// full GC is worth (see ReleasePerCPUSecond).
	SkipCost
	// SkipBudget: a requested trim that the 2% CPU budget does not allow
	// yet (a debounced trim waits instead; see Stats.Deferred).
	SkipBudget
	// SkipRunning: a requested trim that found another trim running; that
	// one answers it.
	SkipRunning
	// SkipClosed: the Trimmer is nil or closed. Not counted.
	SkipClosed
	// NumSkipReasons is the number of reasons: the length of
	// Stats.SkippedBy.
	NumSkipReasons
)

// String returns "none", "min_release", "cost", "budget", "running" or
// "closed" (the metrics' label values).
func (r SkipReason) String() string {
	switch r {
	case SkipNone:
		return "none"
	case SkipMinRelease:
		return "min_release"
	case SkipCost:
		return "cost"
	case SkipBudget:
		return "budget"
	case SkipRunning:
		return "running"
	case SkipClosed:
		return "closed"
	}
	return fmt.Sprintf("SkipReason(%d)", int(r))
}

// OriginStats counts the trims of one origin (see Stats.Origins).
type OriginStats struct {
	// Trims counts the trims of this origin that ran (at least one step).
	Trims int64
	// Skipped counts the trims of this origin that the gate skipped, for
	// any reason (see Stats.SkippedBy for the reasons, over all origins).
	Skipped int64
	// CPU is the CPU time charged to this origin's trims (see
	// Stats.LastCPU).
	CPU time.Duration
	// Released is the bytes this origin's trims released.
	Released int64
}

// Result is what Request decided and, when the trim ran, what it did.
type Result struct {
	// Ran is true when at least one step ran; Skip is SkipNone then, and
	// the reason otherwise.
	Ran  bool
	Skip SkipReason
	// Estimate is the releasable bytes estimated before the decision (Go
	// and C heap as far as known; -1 unknown, 0 when the decision came
	// before an estimate: SkipBudget, SkipRunning, SkipClosed).
	Estimate int64
	// Need is what the Go step had to be expected to release to run, in
	// bytes (see ReleasePerCPUSecond); Cost the CPU its full GC was
	// estimated to take.
	Need int64
	Cost time.Duration
	// Released and CPU are the trim's, as in Stats.LastReleased and
	// Stats.LastCPU (0 when it did not run).
	Released int64
	CPU      time.Duration
	// NoGC says the Go step took (or, skipped, would have taken) the path
	// without a GC (see Trimmer); Abort is why that step stopped early
	// (AbortNone when it reached its target).
	NoGC  bool
	Abort AbortReason

	cErr error // the C heap step's, for TrimNow
}

// The cost rule of the Go step. A trim's Go step is debug.FreeOSMemory: a
// whole GC cycle, which marks the entire live heap whatever it then
// releases. What that costs follows the pointers to scan, not the bytes:
// measured on this repository's test machine (Go 1.26, 2 cores, loaded;
// MEMCTL_TEST_SCAN_COST=1 go test ./trim -run TestScanCost -v), a full GC of
// 1 GiB live in 64 KiB []byte objects (nothing to scan) is charged 0.7 to
// 2.2 ms of CPU, one of 1 GiB in 16.7M nodes of two pointers and 48 bytes
// (255 MiB scannable, /gc/scan/total:bytes) 0.47 to 0.49 s: 1.8 ns per
// scannable byte. (Charged as a trim is, see Stats.LastCPU: at most the
// process's CPU. The runtime/metrics GC figure alone read 0.5 to 1.1 s
// there, and 3 to 6 s in a program beside other load: it counts GC
// workers' time off the CPU; ../shared/MEASURED.md has about 4 s for that
// heap and 170 ms for 1 GiB of 64 KiB objects beside small pointer-linked
// nodes, from that figure.) Hence:
//
//	cost = scan cost × /gc/scan/total:bytes
//	need = max(MinRelease, cost × ReleasePerCPUSecond)
//
// and the Go step runs when the estimate of releasable bytes reaches need.
// The scan cost is DefaultScanCost until a Go step runs on at least 8 MiB
// of scannable heap; from then on it is what the last such trim was
// charged per scannable byte, so the rule follows the machine it runs on,
// kept within an eighth of DefaultScanCost and 8 times it (see
// maxScanCost). A trim is charged at least 1 ms and at least minScanCost
// per scannable byte (see Stats.LastCPU), so that a CPU clock reading too
// little cannot take it out of the 2% budget.
const (
	// DefaultScanCost is the CPU per scannable byte assumed before the
	// first trim measures it: 2 ns, the 1.8 ns measured (above) rounded up.
	DefaultScanCost = 2 * time.Nanosecond

	// ReleasePerCPUSecond is the bytes a trim must be expected to release
	// per second of CPU it costs: 64 MiB. The exchange rate is a
	// judgement from two figures: cloud prices put one vCPU at about
	// 4 GiB of RAM (general-purpose instances: 4 GiB per vCPU), and a
	// trim's gain lasts about a minute (an idle Go program gets a forced
	// GC every 2 minutes and the scavenger then returns the pages on its
	// own; half of that is counted). A CPU-second is then worth
	// 4 GiB × 1 s / 60 s ≈ 68 MiB held for the minute; 64 MiB is that,
	// rounded. With it, a trim of the 1 GiB pointer-rich heap above
	// (about 0.5 s) runs only to release at least 34 MiB; one of a heap
	// with under 64 MiB scannable whenever MinRelease (8 MiB) is reached.
	ReleasePerCPUSecond int64 = 64 << 20

	// calibrateMinScan is the scannable heap from which a trim's CPU
	// replaces the assumed scan cost: below it the fixed costs of a GC
	// cycle dominate.
	calibrateMinScan = 8 << 20

	// minScanCost and maxScanCost bound the calibrated scan cost: an
	// eighth of DefaultScanCost and 8 times it (0.25 to 16 ns per
	// scannable byte, around the 1.8 ns measured). One trim's CPU reading
	// can be absurd: the process's CPU clock across a trim counts the
	// other threads of a busy service, and a clock that cannot be read
	// gives 0. Unbounded, a reading 1000 times too high made every later
	// Go step need tens of GiB, so no trim ran again to correct it; one too
	// low made every trim look worth its GC. Bounded, a trim releasing 8
	// times what the default rule asks always runs, and re-measures.
	minScanCost = float64(DefaultScanCost) / 8
	maxScanCost = float64(DefaultScanCost) * 8

	// minTrimCharge is the least CPU a trim is charged with (see
	// Stats.LastCPU): 1 ms, about the cost of a full GC of a heap with
	// nothing to scan (0.7 to 2.2 ms for 1 GiB of []byte, measured above).
	// A trim whose CPU clocks read 0 would otherwise be free for the 2%
	// budget, which would then allow the next at once.
	minTrimCharge = time.Millisecond

	metricScanTotal = "/gc/scan/total:bytes"
)

// scanBytes returns /gc/scan/total:bytes (heap, stacks and globals
// scannable at the last GC), or -1 when it cannot be read.
func scanBytes() int64 {
	s := [...]metrics.Sample{{Name: metricScanTotal}}
	metrics.Read(s[:])
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	return int64(min(s[0].Value.Uint64(), math.MaxInt64))
}

// costOf returns the estimated CPU of a full GC with scan scannable bytes
// and the release it must be expected to give (see ReleasePerCPUSecond).
// t.run must be held.
func (t *Trimmer) costOf(scan int64) (cost time.Duration, need int64) {
	need = t.minRelease
	if t.minRelease == 0 || scan <= 0 { // NeverSkip, or unknown: the floor alone
		return 0, need
	}
	perByte := t.scanCost
	f := float64(scan) * perByte
	if f > float64(math.MaxInt64/2) {
		f = float64(math.MaxInt64 / 2)
	}
	cost = time.Duration(f)
	n := cost.Seconds() * float64(ReleasePerCPUSecond)
	if n > float64(math.MaxInt64/2) {
		n = float64(math.MaxInt64 / 2)
	}
	return cost, max(need, int64(n))
}

// noGCCostOf returns the estimated CPU of the Go step without a GC that
// returns est bytes (DefaultScavengeCost per GiB) and the release it must
// be expected to give: MinRelease, or more for a cost over MinRelease's
// worth (see ReleasePerCPUSecond), which takes 4 TiB at the default.
func (t *Trimmer) noGCCostOf(est int64) (cost time.Duration, need int64) {
	need = t.minRelease
	if est <= 0 || t.minRelease == 0 {
		return 0, need
	}
	cost = time.Duration(float64(est) / (1 << 30) * float64(DefaultScavengeCost))
	return cost, max(need, int64(min(cost.Seconds()*float64(ReleasePerCPUSecond), math.MaxInt64/2)))
}

// calibrate replaces the scan cost with the measured one of a Go step run
// on scan scannable bytes that was charged cpu. t.run must be held.
func (t *Trimmer) calibrate(scan int64, cpu time.Duration) {
	if scan >= calibrateMinScan && cpu > 0 {
		t.scanCost = min(max(float64(cpu)/float64(scan), minScanCost), maxScanCost)
	}
}

// Request asks for a trim now on behalf of an automatic origin
// (OriginPressure, OriginSpiral). It goes through the same gate as a
// debounced trim: it runs in the calling goroutine only when the 2% CPU
// budget allows a trim now (see Trimmer) and the estimate of releasable
// bytes reaches what the trim's full GC is worth (see ReleasePerCPUSecond
// and Config.MinRelease), each step deciding for itself; otherwise it
// returns at once with the reason, counted in Stats.Skipped,
// Stats.SkippedBy and the origin's Stats.Origins entry. A trim that ran is
// charged to the same budget as debounced ones, so that over any window
// trims of every origin together use at most 2% of one CPU plus one trim.
//
// A request may run the pending debounced trim sooner than its delay: when
// one is pending and the request's trim runs, the pending period ends with
// it, unless AfterBurst is called during the trim or a burst is still in
// flight. It never waits for a running trim (SkipRunning: that trim
// answers it). Any other origin (OriginDebounced, OriginByName, a value
// out of range) is misuse: counted in Stats.Misuse, logged once and, under
// Config.Strict, a panic; the request is then treated as OriginPressure.
// On a nil or closed Trimmer it does nothing (SkipClosed). Safe for
// concurrent use; not from the Trimmer's logger or C heap step.
func (t *Trimmer) Request(o Origin) Result {
	if t == nil {
		return Result{Skip: SkipClosed}
	}
	if o != OriginPressure && o != OriginSpiral {
		t.reportBadOrigin(o)
		o = OriginPressure
	}
	if t.state.Load() == stateClosed {
		return Result{Skip: SkipClosed}
	}
	if !t.run.TryLock() {
		t.countSkip(o, SkipRunning, 0)
		t.notify()
		return Result{Skip: SkipRunning}
	}
	defer t.run.Unlock()
	if c := t.clock(time.Now()); c < t.nextOK {
		t.countSkip(o, SkipBudget, 0)
		if t.log != nil {
			t.log.LogAttrs(context.Background(), slog.LevelDebug, "trim: request skipped",
				slog.String("origin", o.String()), slog.String("reason", SkipBudget.String()),
				slog.Duration("budget_allows_in", time.Duration(t.nextOK-c)))
		}
		t.notify()
		return Result{Skip: SkipBudget}
	}
	return t.trimLocked(o, false, false)
}

// countSkip counts a skip of origin o for reason r, with the estimate est.
func (t *Trimmer) countSkip(o Origin, r SkipReason, est int64) {
	t.mu.Lock()
	t.stats.Skipped++
	t.stats.SkippedBy[r]++
	t.stats.Origins[o].Skipped++
	if r == SkipMinRelease || r == SkipCost {
		t.stats.LastEstimate = est
	}
	t.mu.Unlock()
}

// notify calls Config.OnTrim for a request skipped before the trim's own
// path (SkipBudget, SkipRunning), as the trim's path calls it for the rest.
func (t *Trimmer) notify() {
	if t.onTrim != nil {
		t.onTrim()
	}
}

// reportBadOrigin reports a Request with an origin that is not automatic.
func (t *Trimmer) reportBadOrigin(o Origin) {
	t.misuse.Add(1)
	if t.strict {
		panic(fmt.Sprintf("trim: Request(%v): want OriginPressure or OriginSpiral", o))
	}
	if t.log != nil && t.logOnce[onceBadOrigin].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), slog.LevelWarn,
			"trim: Request with an origin that is not automatic; treated as pressure, counted in Stats.Misuse, logged once",
			slog.String("origin", o.String()))
	}
}

// gcLive holds the live heap (/gc/heap/live:bytes) at the last two GC ends
// the Trimmer saw, read by a hook at GC end (internal/gcend: no goroutine,
// nothing while the process does not allocate; one runtime/metrics read
// per cycle). A GC that runs during a burst counts the burst's objects as
// live until the next GC, and a snapshot cannot tell them from a heap
// that grew for good: the cycle before can. An idle service whose live
// heap is the same at two GCs (the runtime forces one every 2 minutes)
// has nothing the estimate takes for garbage; a burst the last GC saw in
// flight is counted as releasable down to the GC before it. The hook costs
// 250 to 256 ns per GC cycle against 245 to 248 ns for the bare read, and
// allocates nothing (go test -run '^$' -bench GCEndHook -benchmem
// ./trim/, on this repository's test machine).
type gcLive struct {
	last, prev atomic.Int64 // bytes; -1 before the first GC end seen
	// ends counts the GC ends seen (the Go step's path, see trimLocked).
	ends atomic.Uint64
	// peak is the highest live heap at a GC end since the last trim: a
	// last GC end well below it collected a burst (see collected).
	peak atomic.Int64
	// floor is the live heap before a burst the program marks: the
	// smaller of the last two GC ends' live heap when they are within 25%
	// of each other (a steady heap, not a burst in progress: so a heap
	// built after New, seen live by two GCs, is live), taken at each GC
	// end while no trim is pending and no burst is in flight; it follows
	// a lower live heap at once, and is the live heap right after a
	// trim's GC; read at New before the first.
	floor atomic.Int64
	// sample is gcEnd's, made once so the hook allocates nothing; only
	// the runtime's cleanup goroutine uses it.
	sample []metrics.Sample
}

// watchGC starts the hook; Close stops it.
func (t *Trimmer) watchGC() {
	t.gc.last.Store(-1)
	t.gc.prev.Store(-1)
	t.gc.sample = []metrics.Sample{{Name: metricHeapLive}}
	if h, ok := readHeap(); ok {
		t.gc.floor.Store(h.live)
	}
	t.gcSub = gcend.Subscribe(t.gcEnd)
}

// gcEnd runs at each GC end, on the runtime's cleanup goroutine.
func (t *Trimmer) gcEnd() bool {
	s := t.gc.sample
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		prev := t.gc.last.Load()
		last := int64(min(s[0].Value.Uint64(), math.MaxInt64))
		t.gc.prev.Store(prev)
		t.gc.last.Store(last)
		if prev >= 0 && t.state.Load() == stateIdle && t.inFlight() == 0 {
			if last <= prev+prev/4 {
				t.gc.floor.Store(min(prev, last)) // two GCs saw the heap at this level
			} else if last < t.gc.floor.Load() {
				t.gc.floor.Store(last)
			}
		}
	}
	if last := t.gc.last.Load(); last > t.gc.peak.Load() {
		t.gc.peak.Store(last)
	}
	t.gc.ends.Add(1)
	return t.state.Load() != stateClosed
}

// collected reports whether the last GC end saw the live heap fall from
// its peak since the last decision (a trim or a skip) by a quarter and at
// least min bytes: that cycle collected a burst, whenever the program
// marked it.
func (g *gcLive) collected(min int64) bool {
	last, peak := g.last.Load(), g.peak.Load()
	return last >= 0 && peak-last >= max(min, 1) && last <= peak-peak/4
}

// previous returns the live heap at the GC end before the one that read
// live (the current /gc/heap/live:bytes), or live when unknown.
func (g *gcLive) previous(live int64) int64 {
	last, prev := g.last.Load(), g.prev.Load()
	switch {
	case last == live && prev >= 0:
		return prev
	case last >= 0 && last != live:
		return last // the hook has not run yet for the GC that read live
	}
	return live
}
