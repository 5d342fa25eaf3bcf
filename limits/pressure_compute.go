package limits

import "github.com/memctl/memctl/internal/gomemlimit"

// heapInputs is everything the pool's heap-pressure decision at the end of
// a GC cycle depends on, as observeHeap read it: the reading and the
// pool's configuration and limit.
type heapInputs struct {
	live       int64   // the live heap at the cycle's end, in bytes
	gomemlimit int64   // GOMEMLIMIT then, in bytes; ≤ 0 or math.MaxInt64: not set
	ratio      float64 // PoolConfig.HeapPressure, in (0, 1]
	limit      int64   // the pool's limit now, in bytes
	derived    bool    // the pool's limit follows GOMEMLIMIT (PoolConfig.Limit 0)
	cancel     bool    // PoolConfig.CancelLargest
}

// heapDecision is heapPressure's answer, for observeHeap to apply.
type heapDecision struct {
	// threshold is the live heap above which the pool is under heap
	// pressure, in bytes: ratio of GOMEMLIMIT; 0 when GOMEMLIMIT is not
	// set or the share rounds down to 0 (no pressure then).
	threshold int64
	// over: the pool is under heap pressure (live > threshold > 0).
	over bool
	// follow: a derived pool's limit is not defaultPoolRatio of a set
	// GOMEMLIMIT, which was changed outside this package; the pool
	// follows it.
	follow bool
	// cancel: under pressure with CancelLargest, cancel the largest
	// open account (cancelLargestAccount).
	cancel bool
}

// heapPressure is the pool's heap-pressure decision at the end of a GC
// cycle. It reads nothing else and writes nothing.
func heapPressure(in heapInputs) heapDecision {
	var d heapDecision
	if gomemlimit.IsSet(in.gomemlimit) {
		d.threshold = heapThreshold(in.gomemlimit, in.ratio)
		d.follow = in.derived && heapThreshold(in.gomemlimit, defaultPoolRatio) != in.limit
	}
	d.over = d.threshold > 0 && in.live > d.threshold
	d.cancel = d.over && in.cancel
	return d
}

// heapStale reports whether a pool under heap pressure runs a GC cycle
// itself: the last cycle it saw (or started), at last, is at least
// heapRefreshInterval before now; both are time.Time.UnixNano values.
func heapStale(now, last int64) bool { return now-last >= int64(heapRefreshInterval) }

// cancelMin returns the fewest bytes an account must hold to count as a
// cause of pressure on live bytes (CancelLargest cancels it; its end makes
// the pool read the heap again): share (PoolConfig.CancelShare, in (0, 1])
// of live, rounded down, and at least 1.
func cancelMin(live int64, share float64) int64 { return max(int64(float64(live)*share), 1) }
