package limits

import (
	"context"
	"math"
	"runtime"
	"time"

	"github.com/memctl/memctl/internal/gomemlimit"
)

// liveHeapMetric is the live heap after the last GC, in bytes.
const liveHeapMetric = "/gc/heap/live:bytes"

// observeHeap decides one GC cycle's heap pressure and records it, follows
// GOMEMLIMIT, checks the charges, and cancels the largest account or ends
// the no-cancel episode. The heap watch calls it at each GC end, one at a
// time.
func (p *Pool) observeHeap(live, gomemlimit int64) {
	d := heapPressure(heapInputs{live: live, gomemlimit: gomemlimit, ratio: p.heapRatio,
		limit: p.limit.Load(), derived: p.derived, cancel: p.cancelLargest})
	p.heapLive.Store(live)
	p.heapThreshold.Store(d.threshold)
	p.lastCycle.Store(time.Now().UnixNano())
	p.pressure.Store(d.over)
	p.heapCycles.Add(1)
	if d.follow {
		p.follow(memLimitGen.Load(), gomemlimit) // a change made outside this package
	}
	p.checkCharges(live, gomemlimit)
	if !d.over {
		p.outsideLogged.Store(false)
		return
	}
	if d.cancel {
		p.cancelLargestAccount(live, d.threshold, "heap pressure", false)
	}
}

// heapThreshold returns ratio of gomemlimit, at most gomemlimit.
func heapThreshold(gomemlimit int64, ratio float64) int64 {
	f := float64(gomemlimit) * ratio
	if f >= math.MaxInt64 { // 2^63 as a float64
		return gomemlimit
	}
	return min(int64(f), gomemlimit)
}

// cancelLargestAccount cancels the context of the largest listed account if
// it holds at least CancelShare of live; else it says why at WARN, once per
// episode.
func (p *Pool) cancelLargestAccount(live, threshold int64, why string, kernel bool) (canceled bool) {
	minUsed := cancelMin(live, p.cancelShare)
	p.mu.Lock()
	var best *Account
	var most int64
	for a := range p.listed {
		if u := a.Used(); !a.canceled && u > most {
			best, most = a, u
		}
	}
	var cancel context.CancelCauseFunc
	if best != nil && most >= minUsed && p.mode == ModeEnforce {
		best.canceled = true
		best.pressureCanceled.Store(true)
		cancel = p.listed[best]
	}
	p.mu.Unlock()
	cause := func() *ExhaustedError {
		return &ExhaustedError{Requested: most, Used: live, Limit: threshold, Scope: best.scope() + " (" + why + ")", RetryAfter: defaultRetryAfter}
	}
	switch {
	case cancel != nil:
		p.canceled.Add(1)
		cancel(cause())
		return true
	case best != nil && most >= minUsed: // ModeObserve or ModeOff
		p.noteObserved(cause())
	case p.mode != ModeOff && p.mayWarnNoCancel(kernel): // off logs nothing
		accounted := p.used.Load()
		msg := "limits: " + why + " from memory outside the pool's accounts; no request canceled"
		if accounted >= live/2 {
			msg = "limits: " + why + " from the pool's accounts, none of which holds PoolConfig.CancelShare of it; no request canceled"
		}
		p.log.Warn(msg, "pool", p.name, "heap_live", live, "threshold", threshold, "accounted", accounted,
			"largest_account", most, "cancel_min", minUsed)
	}
	return false
}

// refreshIfStale runs a GC cycle (refreshHeap) when the last one seen is
// older than heapRefreshInterval.
func (p *Pool) refreshIfStale() {
	if p.sub == nil || !heapStale(time.Now().UnixNano(), p.lastCycle.Load()) {
		return
	}
	p.refreshHeap()
}

// refreshHeap runs a GC cycle on a goroutine, or one more after the running
// one, for the heap watch to read; Close waits for it.
func (p *Pool) refreshHeap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() || p.sub == nil {
		return
	}
	if p.refreshing {
		p.refreshAgain = true
		return
	}
	p.refreshing = true
	p.lastCycle.Store(time.Now().UnixNano()) // one at a time, at most one a second
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			runtime.GC()
			p.mu.Lock()
			again := p.refreshAgain && !p.closed.Load()
			p.refreshAgain = false
			if !again {
				p.refreshing = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
		}
	}()
}

// workEnded runs a GC cycle when a's work ends under heap pressure and a was
// canceled by it or held at least CancelShare.
func (p *Pool) workEnded(a *Account) {
	if p.sub == nil || !p.pressure.Load() {
		return
	}
	if a.pressureCanceled.Load() || a.Peak() >= cancelMin(p.heapLive.Load(), p.cancelShare) {
		p.refreshHeap()
	}
}

// kernelWarnInterval is the least time between two WARNs that the kernel's
// pressure canceled nothing.
const kernelWarnInterval = time.Minute

// mayWarnNoCancel reports whether the no-cancel WARN is due.
func (p *Pool) mayWarnNoCancel(kernel bool) bool {
	if !kernel {
		return p.outsideLogged.CompareAndSwap(false, true)
	}
	return due(&p.kernelWarnAt, kernelWarnInterval)
}

// checkCharges is the charge check (PoolConfig.ChargeRatio).
func (p *Pool) checkCharges(live, gml int64) {
	if p.chargeRatio < 0 {
		return
	}
	base := p.baseline.Load()
	inFlight := p.inFlight.Load()
	if base < 0 || inFlight <= 0 || live < base {
		p.baseline.Store(live) // idle, first, or lower (docs/sizing.md)
		return
	}
	beyond := live - base
	floor := int64(chargeCheckFloor)
	if gomemlimit.IsSet(gml) {
		floor = max(floor, gml/8)
	}
	held := p.used.Load()
	if beyond <= floor || float64(beyond) <= p.chargeRatio*float64(held) {
		return
	}
	p.undercharged.Add(1)
	if p.chargeLogged.CompareAndSwap(false, true) {
		p.log.Warn("limits: the live heap is far larger than what the pool's accounts hold: charges look too small, and budgets do not protect this service "+
			"(check what the handlers pass to Grow; counted in PoolStats.Undercharged, only the first is logged)",
			"pool", p.name, "heap_live", live, "heap_baseline", base, "beyond_baseline", beyond,
			"accounted", held, "in_flight", inFlight, "ratio", p.chargeRatio, "gomemlimit", gml)
	}
}

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
