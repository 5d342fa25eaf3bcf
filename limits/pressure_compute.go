package limits

import "github.com/memctl/memctl/internal/gomemlimit"

// heapInputs is everything heapPressure decides from.
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
	threshold int64 // bytes: ratio of GOMEMLIMIT; 0: no pressure
	over      bool  // live > threshold > 0
	follow    bool  // a derived pool's limit misses a GOMEMLIMIT changed elsewhere
	cancel    bool  // over, with CancelLargest
}

// heapPressure is the pool's heap-pressure decision at a GC end; it is pure.
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

// heapStale reports whether last is heapRefreshInterval before now (UnixNano).
func heapStale(now, last int64) bool { return now-last >= int64(heapRefreshInterval) }

// cancelMin returns share of live, at least 1: the least an account holds to
// count as a cause of the pressure.
func cancelMin(live int64, share float64) int64 { return max(int64(float64(live)*share), 1) }
