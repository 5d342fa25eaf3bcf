package limits

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"weak"
)

// liveHeapMetric is the live Go heap after the last GC cycle, in bytes:
// the heap objects marked reachable by the last mark phase.
const liveHeapMetric = "/gc/heap/live:bytes"

// armedWatches counts heap watches with a GC hook pending; tests check that
// Pool.Close brings it back down.
var armedWatches atomic.Int64

// heapWatch runs at the end of every GC cycle, for as long as its pool is
// open and reachable, with no goroutine or timer of its own: each cycle it
// allocates a sentinel object, unreachable at once, with a cleanup
// (runtime.AddCleanup); the next GC cycle finds it dead and the runtime runs
// the cleanup, which reads the live heap and arms the next sentinel.
type heapWatch struct {
	pool weak.Pointer[Pool] // weak: a pool dropped without Close stops its watch

	mu      sync.Mutex // serializes cycle and stop
	stopped bool
	pending runtime.Cleanup
	sample  [1]metrics.Sample

	// read returns the live heap and GOMEMLIMIT; tests replace it.
	read func(w *heapWatch) (live, limit int64)
}

// gcSentinel is the object whose death marks the end of a GC cycle. It holds
// a pointer so that it is not combined with others by the tiny allocator.
type gcSentinel struct {
	_ *byte
	_ int64
}

func startHeapWatch(p *Pool) *heapWatch {
	w := &heapWatch{pool: weak.Make(p), read: readHeap}
	w.sample[0].Name = liveHeapMetric
	armedWatches.Add(1)
	w.mu.Lock()
	w.arm()
	w.mu.Unlock()
	return w
}

// arm installs the hook for the next GC cycle. Called with mu held.
func (w *heapWatch) arm() {
	w.pending = runtime.AddCleanup(new(gcSentinel), (*heapWatch).cycle, w)
}

// cycle runs on the runtime's cleanup goroutine after a GC cycle.
func (w *heapWatch) cycle() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	p := w.pool.Value()
	if p == nil {
		w.stopped = true
		armedWatches.Add(-1)
		return
	}
	live, limit := w.read(w)
	p.observeHeap(live, limit)
	w.arm()
}

// stop removes the pending hook; no cycle runs after it returns.
func (w *heapWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.stopped = true
	w.pending.Stop()
	armedWatches.Add(-1)
}

// readHeap reads the live heap from runtime/metrics and GOMEMLIMIT from
// debug.SetMemoryLimit(-1). Called with mu held.
func readHeap(w *heapWatch) (live, limit int64) {
	metrics.Read(w.sample[:])
	if w.sample[0].Value.Kind() == metrics.KindUint64 {
		live = int64(min(w.sample[0].Value.Uint64(), math.MaxInt64))
	}
	return live, debug.SetMemoryLimit(-1)
}

// observeHeap records one GC cycle's live heap and GOMEMLIMIT and sets or
// clears heap pressure; under pressure with CancelLargest it cancels the
// context of the largest open account.
func (p *Pool) observeHeap(live, gomemlimit int64) {
	threshold := int64(0)
	if gomemlimit > 0 && gomemlimit != math.MaxInt64 {
		threshold = heapThreshold(gomemlimit, p.heapRatio)
	}
	p.heapLive.Store(live)
	p.heapThreshold.Store(threshold)
	over := threshold > 0 && live > threshold
	p.pressure.Store(over)
	p.heapCycles.Add(1)
	if over && p.cancelLargest {
		p.cancelLargestAccount(live, threshold)
	}
}

// heapThreshold returns ratio (in (0, 1]) of gomemlimit (> 0) in bytes,
// at most gomemlimit: the float64 product of a GOMEMLIMIT within 512 bytes
// of math.MaxInt64 rounds up to 2^63, which does not convert to an int64.
func heapThreshold(gomemlimit int64, ratio float64) int64 {
	f := float64(gomemlimit) * ratio
	if f >= math.MaxInt64 { // 2^63 as a float64
		return gomemlimit
	}
	return min(int64(f), gomemlimit)
}

// cancelLargestAccount cancels the context of the listed account, not yet
// canceled, that uses the most bytes (more than zero).
func (p *Pool) cancelLargestAccount(live, threshold int64) {
	p.mu.Lock()
	var best *Account
	var most int64
	for a := p.head; a != nil; a = a.next {
		if u := a.Used(); !a.canceled && u > most {
			best, most = a, u
		}
	}
	var cancel context.CancelCauseFunc
	if best != nil {
		best.canceled = true
		cancel = best.cancel
	}
	p.mu.Unlock()
	if cancel == nil {
		return
	}
	p.canceled.Add(1)
	cancel(&ExhaustedError{Requested: most, Used: live, Limit: threshold, Scope: best.scope() + " (heap pressure)"})
}
