package trim

import (
	"runtime"
	"sync"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
)

// The Go step without a GC. When a GC has already collected the burst,
// debug.FreeOSMemory's GC is all cost. The allocation path (mheap.allocSpan,
// runtime/mheap.go) releases mappedReady + scav − memoryLimit bytes whenever
// mapped-ready memory is over the memory limit and the GC CPU limiter is off.
// So the step lowers GOMEMLIMIT (debug.SetMemoryLimit starts no GC and does
// not scavenge) below mapped-ready memory in steps of stepBytes, makes one
// large allocation after each, and restores the limit. The pacer's
// memory-limit goal (memoryLimitHeapGoal, runtime/mgcpacer.go) is
//
//	goal(L) = L − nonHeap − max(mappedReady − L, 0), less 3% (at least 1 MiB),
//	          never under the marked heap
//
// with nonHeap = mappedReady − heap free − heap objects, and the trigger at
// or above marked + (goal − marked)·45/64. No GC starts while the lowest goal
// stays above marked + (heapLive + margin − marked)·64/45 (floorLimit); the
// free heap left as slack is not counted by releasableNoGC.
const (
	// stepBytes is how far each step lowers GOMEMLIMIT: while the limit is
	// under mapped-ready memory every allocating goroutine releases the
	// overage inline, so steps are small (docs/benchmarks.md).
	stepBytes      int64 = 4 << 20
	noGCAllocBytes       = 40 << 10 // over 32 KiB: a large object, with a span of its own
	noGCCacheBytes       = 2 << 20  // per P, bounds the unused bytes of its mcache's spans
	noGCMaxSteps         = 1 << 20  // steps of one trim (4 TiB at 4 MiB each)
)

// noGCFigures are the runtime's figures the step reads.
type noGCFigures gcend.Sample

// read reads the figures now, into r's buffers: no allocation.
func (r *noGCReader) read() noGCFigures {
	var s gcend.Sample
	r.Read(&s)
	return noGCFigures(s)
}

// noGCReader reads noGCFigures.
type noGCReader struct{ gcend.Reader }

func (f noGCFigures) mapped() int64 { return max(f.Total-f.HeapReleased, 0) }

// limiterOn reports whether the GC CPU limiter was on since the last GC
// end (the runtime records it as the cycle in progress, numgc+1).
func (f noGCFigures) limiterOn() bool { return f.LimiterLast != 0 && f.LimiterLast > f.Cycles }

// limiterMayBeOn reports whether the GC CPU limiter was turned on in the
// cycle in progress or the last one: the runtime updates it only during a
// cycle and at its edges (runtime/mgclimit.go), so it stays on until the
// next cycle starts, and the allocation path releases nothing meanwhile.
func (f noGCFigures) limiterMayBeOn() bool { return f.LimiterLast != 0 && f.LimiterLast >= f.Cycles }

// floorLimit returns the lowest memory limit the step may set (see the top of
// this file), given the heap goal before the step (goal0): a goal at or above
// it leaves the trigger where it was. heapLive counts the heap objects and
// the mcaches' unused span bytes; margin is one step and 1/64 of the heap for
// what other goroutines allocate meanwhile.
func (f noGCFigures) floorLimit(procs int, goal0 int64) int64 {
	mapped := f.mapped()
	nonHeap := max(mapped-f.HeapFree-f.HeapObjects, 0)
	heapLive := f.HeapObjects + min(f.HeapUnused, int64(procs)*noGCCacheBytes)
	margin := stepBytes + heapLive/64
	over := max(heapLive+margin-f.Live, 0)
	need := f.Live + over/45*64 + 64
	if goal0 > f.Live {
		need = min(need, goal0)
	}
	g := max(need/97*100+1, need+1<<20) + 1<<20 // goal before the 3% (≥ 1 MiB) headroom, and 1 MiB
	return nonHeap + stepBytes + g
}

// releasableNoGC returns the bytes the step without a GC would return now.
func releasableNoGC() int64 {
	f := new(noGCReader).read()
	return max(f.mapped()-f.floorLimit(runtime.GOMAXPROCS(0), f.Goal), 0)
}

// largeAlloc makes one step's allocation on the heap: returned, it escapes
// (40 KiB could live on the stack); not inlined, so it is not dropped.
//
//go:noinline
func largeAlloc() []byte { return make([]byte, noGCAllocBytes) }

// noGCMu serializes releaseNoGC across Trimmers (two would each take the
// other's lowered GOMEMLIMIT for a foreign write); taken inside gomemlimit's hold.
var noGCMu sync.Mutex

// releaseNoGC is the Go step without a GC (see the top of this file); run it
// inside the GOMEMLIMIT owner's hold. It returns the growth of
// /memory/classes/heap/released:bytes, the steps, why it stopped early
// (abortNone: target reached or nothing to do), and whether the first step
// released nothing unexplained (a runtime that does not release this way).
func releaseNoGC() (released int64, steps int, why abortReason, broken bool) {
	noGCMu.Lock()
	defer noGCMu.Unlock()
	r := new(noGCReader)
	f0 := r.read()
	if f0.limiterOn() {
		return 0, 0, abortLimiter, false
	}
	procs := runtime.GOMAXPROCS(0)
	base := gomemlimit.Read()
	mapped := f0.mapped()
	target := f0.floorLimit(procs, f0.Goal)
	if target >= mapped || target >= base {
		return 0, 0, abortNone, false
	}
	last := base
	limit := min(mapped, base)
	var foreign bool
	for steps < noGCMaxSteps && limit > target {
		limit = max(limit-stepBytes, target)
		prev := gomemlimit.Set(limit)
		if prev != last {
			gomemlimit.Set(prev) // another writer's value stands
			foreign, why = true, abortLimitChanged
			break
		}
		last = limit
		steps++
		_ = largeAlloc()
		f := r.read()
		switch {
		case f.Cycles != f0.Cycles || f.GCPauseCPU != f0.GCPauseCPU:
			why = abortGC
		case f.limiterOn():
			why = abortLimiter
		case f.mapped() > limit+1<<20 && f.limiterMayBeOn():
			why = abortLimiter // turned on in the last cycle, not off since
		case f.mapped() > limit+1<<20:
			why = abortNoProgress
			broken = steps == 1
		}
		if why != abortNone {
			break
		}
		if t := f.floorLimit(procs, f0.Goal); t > target {
			target = t // the heap in use grew (other goroutines): stop higher
			if t >= limit {
				break
			}
		}
	}
	if !foreign && steps > 0 {
		if prev := gomemlimit.Set(base); prev != last {
			gomemlimit.Set(prev) // set by another writer since the last step
			if why == abortNone {
				why = abortLimitChanged
			}
		}
	}
	return max(r.read().HeapReleased-f0.HeapReleased, 0), steps, why, broken
}
