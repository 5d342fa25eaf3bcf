package trim

import (
	"runtime"
	"sync"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
)

// The Go step without a GC. When a GC cycle has already collected the
// burst, debug.FreeOSMemory's GC is all cost. The runtime returns free
// heap without a GC on its allocation path: mheap.allocSpan
// (runtime/mheap.go) releases mappedReady + scav − memoryLimit bytes
// whenever mapped-ready memory is over the memory limit and the GC CPU
// limiter is off. So the step lowers GOMEMLIMIT (debug.SetMemoryLimit,
// which starts no GC and does not scavenge) below mapped-ready memory in
// steps of stepBytes, makes one large allocation after each, and restores
// the limit after. The pacer's memory-limit goal (runtime/mgcpacer.go
// memoryLimitHeapGoal) is
//
//	goal(L) = L − nonHeap − max(mappedReady − L, 0), less 3% (at least 1 MiB),
//	          never under the marked heap
//
// with nonHeap = mappedReady − heap free − heap objects, and the trigger
// lies at or above marked + (goal − marked)·45/64. The step keeps the goal
// of its lowest limit above marked + (heapLive + margin − marked)·64/45,
// where heapLive is bounded by the heap objects plus the unused part of
// in-use spans (at most noGCCacheBytes per P), and margin is one step plus
// 1/64 of the heap for what other goroutines allocate meanwhile: no GC
// starts. That leaves a slack of free heap (about 3% of the heap, a step
// and the margin), which releasableNoGC leaves out.
const (
	// stepBytes is how far each step lowers GOMEMLIMIT: while the limit is
	// under mapped-ready memory every goroutine that allocates releases
	// the overage inline, so steps are kept small (docs/benchmarks.md).
	stepBytes int64 = 4 << 20
	// noGCAllocBytes is over 32 KiB: a large object, with a span of its
	// own from mheap.allocSpan.
	noGCAllocBytes = 40 << 10
	// noGCCacheBytes bounds, per P, the unused bytes of the spans the P's
	// mcache holds, which the pacer counts as in use.
	noGCCacheBytes = 2 << 20
	// noGCMaxSteps bounds the steps of one trim (4 TiB at 4 MiB each).
	noGCMaxSteps = 1 << 20
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

// limiterMayBeOn reports whether the GC CPU limiter may still be on: it
// was turned on in the cycle in progress or in the last one that ended.
// The runtime updates the limiter only while a cycle runs and at its start
// and end (runtime/mgclimit.go: assists, findRunnableGCWorker, the GC
// transitions), so one turned on in a cycle stays on after that cycle's
// end until the next one starts, and the allocation path releases nothing
// meanwhile.
func (f noGCFigures) limiterMayBeOn() bool { return f.LimiterLast != 0 && f.LimiterLast >= f.Cycles }

// floorLimit returns the lowest memory limit the step may set with these
// figures (see the comment at the top of this file), given the heap goal
// before the step lowered the limit (goal0): a memory-limit goal at or
// above it leaves the pacer's goal, and so its trigger, where they were.
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

// largeAlloc makes the allocation of one step on the heap: returned, the
// slice escapes (a local one of 40 KiB could live on the stack), and not
// inlined, so the caller dropping it does not remove it.
//
//go:noinline
func largeAlloc() []byte { return make([]byte, noGCAllocBytes) }

// noGCMu serializes releaseNoGC across Trimmers: two steps at once would
// each take the other's lowered GOMEMLIMIT for a foreign write. It is
// taken inside the hold of GOMEMLIMIT's writer.
var noGCMu sync.Mutex

// releaseNoGC is the Go step without a GC (see the top of this file). It
// must run inside the GOMEMLIMIT owner's hold. It returns the growth of
// /memory/classes/heap/released:bytes, the number of steps, why it stopped
// early (abortNone when it reached its target or had nothing to do), and
// whether the first step released nothing with no GC and no limiter to
// explain it (a runtime that does not release on this path). Steps run
// one at a time in the process (noGCMu), whatever their Trimmer and hold.
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
