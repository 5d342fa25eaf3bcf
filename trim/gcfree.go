package trim

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// The Go step without a GC. debug.FreeOSMemory is a whole GC cycle and
// then a scavenge of every free span; when a GC cycle has already
// collected the burst's garbage, the GC is all cost (about 170 ms of CPU
// with 1 GiB live in 64 KiB objects, 0.5 to 4 s pointer-rich,
// ../shared/MEASURED.md). The runtime returns free heap without a GC on its
// allocation path: mheap.allocSpan (runtime/mheap.go) releases, forced,
// mappedReady + scav − memoryLimit bytes whenever mapped-ready memory is
// over the memory limit and the GC CPU limiter is off. So the step lowers
// GOMEMLIMIT (debug.SetMemoryLimit, which itself never starts a GC nor
// scavenges) below mapped-ready memory in steps of StepBytes, makes one
// large allocation after each (a large object always reaches allocSpan),
// and restores the limit after. The pacer's memory-limit goal
// (runtime/mgcpacer.go memoryLimitHeapGoal) is
//
//	goal(L) = L − nonHeap − max(mappedReady − L, 0), less 3% (at least 1 MiB),
//	          never under the marked heap
//
// with nonHeap = mappedReady − heap free − heap objects, and the trigger
// lies at or above marked + (goal − marked)·45/64. The step keeps the goal
// of its lowest limit (mapped-ready over it by one step) above
// marked + (heapLive + margin − marked)·64/45, where heapLive, the pacer's
// view of the heap in use, is bounded by the heap objects plus the unused
// part of in-use spans (at most noGCCacheBytes per P), and margin is one
// step plus 1/64 of the heap for what other goroutines allocate during a
// step: no GC starts. The goal need not be kept above the pacer's goal
// before the step (GOGC's, when it is the lower): the trigger then stays
// where it was. That leaves a slack of free heap of about 3% of the
// heap, a step and the margin, which the estimate of this path leaves out
// (see releasableNoGC).
const (
	// StepBytes is how far each step lowers GOMEMLIMIT: 4 MiB. While the
	// limit is under mapped-ready memory every goroutine that reaches the
	// allocation path releases the overage inline; measured on this
	// repository's test machine, requests overlapping a trim in 4 MiB
	// steps saw a p99 1.34 times that of the requests before it (max
	// 0.3 ms), against 35 times with 16 MiB steps (../shared/MEASURED.md,
	// "Returning collected heap without a GC").
	StepBytes int64 = 4 << 20

	// DefaultScavengeCost is the CPU the Go step without a GC is assumed to
	// take per GiB it returns, for the cost rule: 64 ms. Measured on this
	// repository's shared 2-core machine: 48 to 66 µs of wall time per MiB
	// returned (128 MiB collected beside 64 MiB of pointer-rich live heap),
	// against 417 to 619 µs per MiB for debug.FreeOSMemory on the same heap
	// in the same run (go test -run XXX -bench GoStep -benchmem -count 6
	// -benchtime 20x ./trim); ../shared/MEASURED.md has 69 ms of CPU for
	// 1 GiB with two goroutines allocating, and 15 ms per GiB for the
	// scavenge alone.
	DefaultScavengeCost = 64 * time.Millisecond

	// noGCAllocBytes is the allocation that makes each step release: over
	// 32 KiB, so a large object with a span of its own from mheap.allocSpan.
	noGCAllocBytes = 40 << 10

	// noGCCacheBytes bounds, per P, the unused bytes of the spans the P's
	// mcache holds, which the pacer counts as in use.
	noGCCacheBytes = 2 << 20

	// noGCMaxSteps bounds the steps of one trim (4 TiB at 4 MiB each).
	noGCMaxSteps = 1 << 20
)

// AbortReason says why the Go step without a GC stopped before its target.
type AbortReason int

const (
	// AbortNone: the step reached its target.
	AbortNone AbortReason = iota
	// AbortGC: a GC cycle started or ended during the step
	// (/gc/cycles/total:gc-cycles or /cpu/classes/gc/pause:cpu-seconds
	// moved).
	AbortGC
	// AbortNoProgress: a step released nothing (mapped-ready memory stayed
	// over the lowered limit).
	AbortNoProgress
	// AbortLimiter: the GC CPU limiter was on
	// (/gc/limiter/last-enabled:gc-cycle names the current cycle); the
	// allocation path releases nothing then.
	AbortLimiter
	// AbortLimitChanged: another writer set GOMEMLIMIT during the step (the
	// program's debug.SetMemoryLimit); its value is kept.
	AbortLimitChanged
	// NumAbortReasons is the length of Stats.Aborts.
	NumAbortReasons
)

// String returns "none", "gc", "no_progress", "gc_cpu_limiter" or
// "limit_changed" (the metrics' label values).
func (r AbortReason) String() string {
	switch r {
	case AbortNone:
		return "none"
	case AbortGC:
		return "gc"
	case AbortNoProgress:
		return "no_progress"
	case AbortLimiter:
		return "gc_cpu_limiter"
	case AbortLimitChanged:
		return "limit_changed"
	}
	return fmt.Sprintf("AbortReason(%d)", int(r))
}

// noGCFigures are the runtime/metrics figures the step reads, in bytes
// (pause in seconds).
type noGCFigures struct {
	total, released, free, objects, unused, marked, goal int64
	cycles, limiter                                      uint64
	pause                                                float64
}

// noGCReader reads noGCFigures without allocating.
type noGCReader struct{ s [10]metrics.Sample }

func newNoGCReader() *noGCReader {
	r := &noGCReader{}
	for i, n := range [...]string{
		"/memory/classes/total:bytes", metricHeapReleased, metricHeapFree, metricHeapObjects,
		"/memory/classes/heap/unused:bytes", metricHeapLive, "/gc/cycles/total:gc-cycles",
		"/gc/limiter/last-enabled:gc-cycle", "/cpu/classes/gc/pause:cpu-seconds", "/gc/heap/goal:bytes",
	} {
		r.s[i].Name = n
	}
	return r
}

func (r *noGCReader) read() (f noGCFigures, ok bool) {
	metrics.Read(r.s[:])
	var v [8]uint64
	for i := range v {
		if r.s[i].Value.Kind() != metrics.KindUint64 {
			return f, false
		}
		v[i] = r.s[i].Value.Uint64()
	}
	if r.s[8].Value.Kind() != metrics.KindFloat64 || r.s[9].Value.Kind() != metrics.KindUint64 {
		return f, false
	}
	b := func(x uint64) int64 { return int64(min(x, math.MaxInt64)) }
	return noGCFigures{total: b(v[0]), released: b(v[1]), free: b(v[2]), objects: b(v[3]), unused: b(v[4]),
		marked: b(v[5]), cycles: v[6], limiter: v[7], pause: r.s[8].Value.Float64(), goal: b(r.s[9].Value.Uint64())}, true
}

func (f noGCFigures) mapped() int64 { return max(f.total-f.released, 0) }

// limiterOn reports whether the GC CPU limiter was on since the last GC
// end (the runtime records it as the cycle in progress, numgc+1).
func (f noGCFigures) limiterOn() bool { return f.limiter != 0 && f.limiter > f.cycles }

// floorLimit returns the lowest memory limit the step may set with these
// figures (see the comment at the top of this file), given the heap goal
// before the step lowered the limit (goal0): a memory-limit goal at or
// above it leaves the pacer's goal, and so its trigger, where they were.
func (f noGCFigures) floorLimit(procs int, goal0 int64) int64 {
	mapped := f.mapped()
	nonHeap := max(mapped-f.free-f.objects, 0)
	heapLive := f.objects + min(f.unused, int64(procs)*noGCCacheBytes)
	margin := StepBytes + heapLive/64
	over := max(heapLive+margin-f.marked, 0)
	need := f.marked + over/45*64 + 64
	if goal0 > f.marked {
		need = min(need, goal0)
	}
	g := max(need/97*100+1, need+1<<20) + 1<<20 // goal before the 3% (≥ 1 MiB) headroom, and 1 MiB
	return nonHeap + StepBytes + g
}

// releasableNoGC returns the bytes the step without a GC would return now,
// or -1 when runtime/metrics cannot be read.
func releasableNoGC() int64 {
	f, ok := newNoGCReader().read()
	if !ok {
		return -1
	}
	return max(f.mapped()-f.floorLimit(runtime.GOMAXPROCS(0), f.goal), 0)
}

// largeAlloc makes the allocation of one step on the heap: returned, the
// slice escapes (a local one of 40 KiB could live on the stack), and not
// inlined, so the caller dropping it does not remove it.
//
//go:noinline
func largeAlloc() []byte { return make([]byte, noGCAllocBytes) }

// noGCMu serializes releaseNoGC across Trimmers: two steps at once (a
// program's own Trimmer beside the facade's, without the MemLimiter's
// hold) each took the other's lowered GOMEMLIMIT for a foreign write, and
// left it lowered. It is taken inside the hold (the limiter's lock first).
var noGCMu sync.Mutex

// releaseNoGC is the Go step without a GC (see the top of this file). It
// must run inside the GOMEMLIMIT owner's hold. It returns the growth of
// /memory/classes/heap/released:bytes, the number of steps, why it stopped
// early (AbortNone when it reached its target or had nothing to do), and
// whether the first step released nothing with no GC and no limiter to
// explain it (a runtime that does not release on this path). Steps run
// one at a time in the process (noGCMu), whatever their Trimmer and hold.
func releaseNoGC() (released int64, steps int, why AbortReason, broken bool) {
	noGCMu.Lock()
	defer noGCMu.Unlock()
	r := newNoGCReader()
	f0, ok := r.read()
	if !ok {
		return 0, 0, AbortNoProgress, true
	}
	if f0.limiterOn() {
		return 0, 0, AbortLimiter, false
	}
	procs := runtime.GOMAXPROCS(0)
	base := debug.SetMemoryLimit(-1)
	mapped := f0.mapped()
	target := f0.floorLimit(procs, f0.goal)
	if target >= mapped || target >= base {
		return 0, 0, AbortNone, false
	}
	last := base
	limit := min(mapped, base)
	var foreign bool
	for steps < noGCMaxSteps && limit > target {
		limit = max(limit-StepBytes, target)
		prev := debug.SetMemoryLimit(limit)
		if prev != last {
			debug.SetMemoryLimit(prev) // another writer's value stands
			foreign, why = true, AbortLimitChanged
			break
		}
		last = limit
		steps++
		_ = largeAlloc()
		f, ok := r.read()
		switch {
		case !ok:
			why = AbortNoProgress
		case f.cycles != f0.cycles || f.pause != f0.pause:
			why = AbortGC
		case f.limiterOn():
			why = AbortLimiter
		case f.mapped() > limit+1<<20:
			why = AbortNoProgress
			broken = steps == 1
		}
		if why != AbortNone {
			break
		}
		if t := f.floorLimit(procs, f0.goal); t > target {
			target = t // the heap in use grew (other goroutines): stop higher
			if t >= limit {
				break
			}
		}
	}
	if !foreign && steps > 0 {
		if prev := debug.SetMemoryLimit(base); prev != last {
			debug.SetMemoryLimit(prev) // set by another writer since the last step
			if why == AbortNone {
				why = AbortLimitChanged
			}
		}
	}
	if f1, ok := r.read(); ok {
		released = max(f1.released-f0.released, 0)
	}
	return released, steps, why, broken
}
