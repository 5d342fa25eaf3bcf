package limits

import (
	"context"
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"time"
	"weak"

	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/poolwire"
	"github.com/memctl/memctl/internal/relief"
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
	if p.sub != nil && heapStale(time.Now().UnixNano(), p.lastCycle.Load()) {
		p.refreshHeap()
	}
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

// openPools are the pools shedding and cancelLargest reach, held weakly.
var openPools struct {
	mu    sync.Mutex
	pools []weak.Pointer[Pool]
}

var registerCanceler sync.Once // relief.SetCanceler(cancelLargest), once

func registerPool(p *Pool) {
	registerCanceler.Do(func() { relief.SetCanceler(cancelLargest) })
	openPools.mu.Lock()
	defer openPools.mu.Unlock()
	gone := func(w weak.Pointer[Pool]) bool { return w.Value() == nil }
	openPools.pools = append(slices.DeleteFunc(openPools.pools, gone), weak.Make(p))
}

func unregisterPool(p *Pool) {
	openPools.mu.Lock()
	defer openPools.mu.Unlock()
	wp := weak.Make(p)
	openPools.pools = slices.DeleteFunc(openPools.pools, func(w weak.Pointer[Pool]) bool { return w == wp })
}

func eachPool(f func(*Pool)) {
	openPools.mu.Lock()
	ps := make([]*Pool, 0, len(openPools.pools))
	for _, w := range openPools.pools {
		if p := w.Value(); p != nil {
			ps = append(ps, p)
		}
	}
	openPools.mu.Unlock()
	for _, p := range ps {
		f(p)
	}
}

// openPool returns the oldest open, not closed pool for which match is true,
// or nil.
func openPool(match func(*Pool) bool) *Pool {
	var found *Pool
	eachPool(func(q *Pool) {
		if found == nil && !q.closed.Load() && match(q) {
			found = q
		}
	})
	return found
}

// cancelLargest is the kernel pressure watcher's cancel (internal/relief):
// in each pool with CancelLargest, it cancels the largest account holding
// at least CancelShare of the Go memory, and returns how many it canceled.
func cancelLargest() int {
	s := []metrics.Sample{{Name: liveHeapMetric}, {Name: goMappedMetrics[0]}, {Name: goMappedMetrics[1]}}
	metrics.Read(s)
	base := max(sampleBytes(s[0]), sampleBytes(s[1])-sampleBytes(s[2]))
	n := 0
	eachPool(func(p *Pool) {
		if p.cancelLargest && !p.closed.Load() && p.cancelLargestAccount(base, base, "memory pressure", true) {
			n++
		}
	})
	return n
}

// sampleBytes returns s in bytes, 0 when the runtime lacks it.
func sampleBytes(s metrics.Sample) int64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(min(s.Value.Uint64(), math.MaxInt64))
}

// shedSizeFor returns PoolConfig.ShedSize's default for a pool of limit bytes.
func shedSizeFor(limit, chunk int64) int64 {
	return max(min(defaultShedSize, limit/16), chunk)
}

// shedLimit returns the pool's ShedSize, the default following the limit.
func (p *Pool) shedLimit() int64 {
	if p.shedSize > 0 {
		return p.shedSize
	}
	return shedSizeFor(p.curLimit(), p.chunk)
}

// shedError returns the refusal of a Grow of n over total while shedding
// (relief.Shedding, during a GC death spiral).
func (a *Account) shedError(n, total int64) *ExhaustedError {
	if !relief.Shedding() {
		return nil
	}
	s := a.pool.shedLimit()
	if n <= s-total {
		return nil
	}
	return &ExhaustedError{Requested: n, Used: total, Limit: s, Scope: a.scope() + " (shedding)", RetryAfter: defaultRetryAfter}
}

// shedCap lowers want while shedding so that held plus the reservation
// passes ShedSize by no more than need.
func (a *Account) shedCap(want, need, held int64) int64 {
	if !relief.Shedding() {
		return want
	}
	if room := a.pool.shedLimit() - held; want > room {
		return max(room, need)
	}
	return want
}

func init() {
	poolwire.Pools = func() []any {
		var ps []any
		eachPool(func(p *Pool) { ps = append(ps, p) })
		return ps
	}
}
