package trim

import (
	"sync/atomic"

	"github.com/memctl/memctl/internal/gcend"
)

// gcLive holds the live heap at the last GC ends the Trimmer saw. A GC during
// a burst counts it as live until the next GC; the cycle before tells it from
// a heap that grew for good.
type gcLive struct {
	last, prev atomic.Int64  // bytes; -1 before the first GC end seen
	ends       atomic.Uint64 // GC ends seen
	peak       atomic.Int64  // the highest live heap at a GC end since the last decision
	// floor is the live heap before a burst: the smaller of the last two GC
	// ends' when within 25% of each other, taken while idle with no burst in
	// flight; it follows a lower live heap at once, and a trim's GC sets it.
	floor atomic.Int64
}

// atGCEnd, the gcend subscriber, records one GC end's live heap.
func (t *Trimmer) atGCEnd(live int64) bool {
	prev := t.gc.last.Load()
	t.gc.prev.Store(prev)
	t.gc.last.Store(live)
	if prev >= 0 && t.state.Load() == stateIdle && t.inFlight() == 0 {
		if live <= prev+prev/4 {
			t.gc.floor.Store(min(prev, live)) // two GCs saw the heap at this level
		} else if live < t.gc.floor.Load() {
			t.gc.floor.Store(live)
		}
	}
	if live > t.gc.peak.Load() {
		t.gc.peak.Store(live)
	}
	t.gc.ends.Add(1)
	return t.state.Load() != stateClosed
}

// collected reports whether the last GC end saw the live heap fall from its
// peak by a quarter and at least min bytes: that cycle collected a burst.
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

// readSample reads the runtime's figures now (outside a GC end).
func readSample() gcend.Sample { return gcend.Sample(new(noGCReader).read()) }
