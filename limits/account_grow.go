package limits

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Grow reports n more bytes in use. It returns nil, or, counting nothing, an
// error matching ErrResourceExhausted (an *ExhaustedError) when the account,
// an ancestor or the pool has no room for n, or the pool is under heap
// pressure and n does not fit in what the account already holds;
// ErrInvalidSize when n is negative; ErrClosed when the account, an ancestor
// or the pool is closed. In ModeObserve and ModeOff a Grow that would be
// refused succeeds and is counted; only a total past math.MaxInt64 is refused.
func (a *Account) Grow(n int64) error {
	if n > 0 && n <= a.reserved.Load() {
		// Fast path: add, then check; a release lowers reserved, then re-reads used.
		u := a.used.Add(n)
		if testHookGrow != nil {
			testHookGrow()
		}
		if u >= n && u <= a.reserved.Load() && !a.pool.closed.Load() {
			if t := u + min(a.kids.Load(), math.MaxInt64-u); t > a.peak.Load() {
				a.raisePeak(t)
			}
			return nil
		}
		a.undo(n) // not held, closed, or wrapped (u < n)
		return a.growSlow(n)
	}
	if n > 0 {
		return a.growSlow(n)
	}
	if n == 0 {
		return nil
	}
	return a.invalid("Grow", n)
}

// undo takes back n bytes of Grow's fast path; used below zero (a misused
// Shrink counted on them) is put back at zero and the misuse counted.
func (a *Account) undo(n int64) {
	if v := a.used.Add(-n); v < 0 {
		for {
			cur := a.used.Load()
			if cur >= 0 {
				return
			}
			if a.used.CompareAndSwap(cur, 0) {
				a.misuse(fmt.Sprintf("Shrink below what it grew itself by %d, seen by a concurrent Grow", -cur))
				return
			}
		}
	}
}

// growSlow grows by n under mu, reserving from the parent as needed.
func (a *Account) growSlow(n int64) error {
	var o observation
	err := a.growLocked(n, &o)
	if err != nil {
		a.noteRefused(n, err)
		return err
	}
	if o.would != nil {
		o.would.Requested = n
		a.pool.noteObserved(o.would)
	}
	return nil
}

// observation holds a Grow's first refusal that ModeObserve or ModeOff let
// through.
type observation struct{ would *ExhaustedError }

// over reports whether refusal e must be returned; if not, it records e.
func (o *observation) over(p *Pool, e *ExhaustedError) bool {
	if p.mode == ModeEnforce {
		return true
	}
	if o.would == nil {
		o.would = e
	}
	return false
}

func (a *Account) growLocked(n int64, o *observation) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	defer a.releaseLocked() // a reservation followed by Shrinks can leave too much unused
	for {
		r := a.reserved.Load()
		if r < 0 || a.pool.closed.Load() {
			return a.closedError("Grow(" + strconv.FormatInt(n, 10) + ")")
		}
		u := a.used.Load()
		if u < 0 {
			runtime.Gosched() // a Grow is putting back what a misuse took
			continue
		}
		k := a.kids.Load()
		total := u + min(k, math.MaxInt64-u) // u may hold a fast-path Grow's passing bytes
		if n > a.limit-total {
			e := &ExhaustedError{Requested: n, Used: total, Limit: a.limit, Scope: a.scope()}
			if n > math.MaxInt64-total || o.over(a.pool, e) {
				return e
			}
		}
		if e := a.shedError(n, total); e != nil && o.over(a.pool, e) {
			return e
		}
		if n <= r-u {
			if a.used.CompareAndSwap(u, u+n) {
				a.raisePeak(u + n + min(k, math.MaxInt64-u-n))
				return nil
			}
			continue
		}
		need := u + n - r
		got, err := a.take(roundUp(need, a.chunk), need, r, o)
		if err != nil {
			return err
		}
		a.reserved.Store(r + got)
	}
}

// room returns how many more bytes the account may reserve under its own
// limit, given r reserved. Called with mu held.
func (a *Account) room(r int64) int64 {
	if a.limit == Unlimited {
		return math.MaxInt64 - r - a.kids.Load()
	}
	return max(a.limit-r-a.kids.Load(), 0)
}

// roundUp rounds n > 0 up to a multiple of chunk, or returns n when that
// would overflow.
func roundUp(n, chunk int64) int64 {
	if rem := n % chunk; rem != 0 && n <= math.MaxInt64-(chunk-rem) {
		return n + chunk - rem
	}
	return n
}

// take reserves want bytes, or only need, from the parent and returns how
// many it took; want is first lowered to a's room given r reserved, and
// while shedding to ShedSize. Called with mu held; locks go child first.
func (a *Account) take(want, need, r int64, o *observation) (int64, error) {
	if room := a.room(r); want > room {
		want = max(room, need)
	}
	want = a.shedCap(want, need, r+a.kids.Load())
	if a.parent == nil {
		return a.pool.reserve(want, need, o)
	}
	return a.parent.reserveForKid(want, need, o)
}

// reserveForKid reserves want bytes, or at least need, from a's parent for a
// child of a, counted against a's limit.
func (a *Account) reserveForKid(want, need int64, o *observation) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.reserved.Load()
	if r < 0 || a.pool.closed.Load() {
		return 0, a.closedError("reserve for an account opened from it")
	}
	if room := a.room(r); need > room {
		a.trimLocked(0) // a refusal counts only bytes in use
		r = a.reserved.Load()
		room = a.room(r)
		if need > room {
			total := max(a.used.Load(), 0) + a.kids.Load()
			e := &ExhaustedError{Requested: need, Used: total, Limit: a.limit, Scope: a.scope()}
			if need > math.MaxInt64-r-a.kids.Load() || o.over(a.pool, e) {
				return 0, e
			}
		}
	}
	if e := a.shedError(need, max(a.used.Load(), 0)+a.kids.Load()); e != nil && o.over(a.pool, e) {
		return 0, e
	}
	got, err := a.take(want, need, r, o)
	if _, ok := err.(*ExhaustedError); ok && a.reserved.Load() > max(a.used.Load(), 0) {
		a.trimLocked(0) // an ancestor is full: give back a's slack, ask again
		got, err = a.take(want, need, r, o)
	}
	if err != nil {
		return 0, err
	}
	k := a.kids.Add(got)
	u := max(a.used.Load(), 0)
	a.raisePeak(u + min(k, math.MaxInt64-u))
	return got, nil
}

// raisePeak raises the peak to t, capped at the limit when enforced: t may
// count a failing Grow's passing bytes.
func (a *Account) raisePeak(t int64) {
	if a.pool.mode == ModeEnforce {
		t = min(t, a.limit)
	}
	notePeak(&a.peak, t)
}

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

// notePeak raises peak to v if v is higher.
func notePeak(peak *atomic.Int64, v int64) {
	for {
		p := peak.Load()
		if v <= p || peak.CompareAndSwap(p, v) {
			return
		}
	}
}
