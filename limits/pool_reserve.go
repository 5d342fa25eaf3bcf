package limits

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// reserve takes want bytes from the pool, or only need when want does not
// fit, and returns how many it took; a refusal is an *ExhaustedError, or,
// not enforced, recorded in o (unless past math.MaxInt64).
func (p *Pool) reserve(want, need int64, o *observation) (int64, error) {
	if p.closed.Load() {
		return 0, fmt.Errorf("%w: pool %s", ErrClosed, p.name)
	}
	if p.pressure.Load() {
		p.refreshIfStale()
		e := &ExhaustedError{Requested: need, Used: p.heapLive.Load(), Limit: p.heapThreshold.Load(), Scope: p.heapScope, RetryAfter: defaultRetryAfter}
		if o.over(p, e) {
			return 0, e
		}
	}
	limit := p.curLimit()
	for {
		cur := p.used.Load()
		got := want
		if need > limit-cur {
			e := &ExhaustedError{Requested: need, Used: cur, Limit: limit, Scope: p.name, RetryAfter: defaultRetryAfter}
			if need > math.MaxInt64-cur || o.over(p, e) {
				return 0, e
			}
			got = need // so that the next Grow past the limit is seen too
		} else if want > limit-cur {
			got = need
		}
		if p.used.CompareAndSwap(cur, cur+got) {
			notePeak(&p.peak, cur+got)
			notePeak(&p.burstPeak, cur+got)
			return got, nil
		}
	}
}

// unreserve returns n bytes to the pool.
func (p *Pool) unreserve(n int64) { p.used.Add(-n) }

// noteRefused counts a refused Grow(n), sets its Requested and RetryAfter,
// and records refusedAt up the accounts.
func (a *Account) noteRefused(n int64, err error) {
	e, ok := err.(*ExhaustedError)
	if !ok {
		return
	}
	a.pool.refusedBy[a.pool.refusalScope(e)].Add(1)
	e.Requested = n
	if e.RetryAfter > 0 {
		// No retry when this work alone does not fit in the pool.
		u := max(a.used.Load(), 0) + a.kids.Load()
		if l := a.pool.limit.Load(); n > l-min(u, l) {
			e.RetryAfter = 0
		}
	}
	for x := a; x != nil; x = x.parent {
		u := max(x.used.Load(), 0) + x.kids.Load()
		notePeak(&x.refusedAt, u+min(n, math.MaxInt64-u))
	}
}

// The scopes a refusal is counted under (PoolStats.RefusedBy).
const (
	scopeAccount = iota
	scopePool
	scopeHeap
	scopeShed
)

// refusalScope tells which scope refused with e.
func (p *Pool) refusalScope(e *ExhaustedError) int {
	switch {
	case e.Scope == p.name:
		return scopePool
	case e.Scope == p.heapScope:
		return scopeHeap
	case strings.HasSuffix(e.Scope, " (shedding)"):
		return scopeShed
	}
	return scopeAccount
}

// noteObserved counts a Grow let through, logged in ModeObserve at most
// once per observeLogInterval.
func (p *Pool) noteObserved(e *ExhaustedError) {
	p.observed.Add(1)
	if p.mode != ModeObserve || !due(&p.observeLogAt, observeLogInterval) {
		return
	}
	p.log.Warn("limits: budget exceeded, not refused (MEMCTL_BUDGETS=observe)",
		"error", e.Error(), "observed", p.observed.Load())
}

// due reports whether every has passed since *at (UnixNano; 0: never), and
// if so sets *at to now; of concurrent callers, one gets true.
func due(at *atomic.Int64, every time.Duration) bool {
	now, last := time.Now().UnixNano(), at.Load()
	return (last == 0 || now-last >= int64(every)) && at.CompareAndSwap(last, now)
}

// noteLeak counts a leak of n bytes, logs the first, and returns the strict
// panic's message ("" when not strict).
func (p *Pool) noteLeak(scope string, n int64) string {
	p.leaked.Add(1)
	p.leakedBytes.Add(n)
	msg := "limits: " + scope + ": closed with " + strconv.FormatInt(n, 10) + " bytes grown and not shrunk"
	if p.strict {
		return msg
	}
	if p.leakLogged.CompareAndSwap(false, true) {
		p.log.Warn("limits: account leak (counted in PoolStats.Leaked; only the first is logged)", "error", msg)
	}
	return ""
}

// list adds a, with its context's cancel, to those CancelLargest may cancel.
func (p *Pool) list(a *Account, cancel context.CancelCauseFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.listed[a]; ok || a.reserved.Load() < 0 {
		return
	}
	if p.listed == nil {
		p.listed = make(map[*Account]context.CancelCauseFunc)
	}
	p.listed[a] = cancel
}

// unlist removes a from the accounts that CancelLargest may cancel.
func (p *Pool) unlist(a *Account) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.listed, a)
}

// notePeak raises peak to v if v is higher.
func notePeak(peak *atomic.Int64, v int64) {
	for {
		p := peak.Load()
		if v <= p || peak.CompareAndSwap(p, v) {
			return
		}
	}
}
