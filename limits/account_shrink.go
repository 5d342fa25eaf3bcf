package limits

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
)

// returnFromKid passes up n bytes a child of a held, and unlinks unlink.
func (a *Account) returnFromKid(n int64, unlink *Account) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.openKids, unlink)
	if a.reserved.Load() < 0 || n == 0 {
		return
	}
	a.kids.Add(-n)
	a.giveBack(n, nil)
}

// giveBack returns n bytes to the parent, unlinking unlink. Called with mu held.
func (a *Account) giveBack(n int64, unlink *Account) {
	if a.parent == nil {
		a.pool.unreserve(n)
		return
	}
	a.parent.returnFromKid(n, unlink)
}

// Shrink reports n fewer bytes in use. Taking back more than the account grew
// itself, or a negative n, is misuse: nothing changes, the pool counts it
// (PoolStats.Misuse) and logs the first at WARN, or, with PoolConfig.Strict,
// Shrink panics. After Close it does nothing but count a negative n.
func (a *Account) Shrink(n int64) {
	if n <= 0 {
		if n < 0 {
			a.misuse(fmt.Sprintf("Shrink(%d): negative size", n))
		}
		return
	}
	for {
		u := a.used.Load()
		if u < 0 {
			runtime.Gosched() // a Grow is putting back what a misuse took
			continue
		}
		if n > u {
			if a.reserved.Load() >= 0 {
				a.misuse(fmt.Sprintf("Shrink(%d) below what it grew itself, %d", n, u))
			}
			return
		}
		if a.used.CompareAndSwap(u, u-n) {
			if a.reserved.Load()-(u-n) > a.releaseAt {
				a.release()
			}
			return
		}
	}
}

// misuse counts one misuse, logs the first, and panics when strict; called
// without locks.
func (a *Account) misuse(what string) {
	p := a.pool
	p.misuse.Add(1)
	msg := "limits: " + a.scope() + ": " + what
	if p.strict {
		panic(msg)
	}
	if p.misuseLogged.CompareAndSwap(false, true) {
		p.log.Warn("limits: misuse of an account (counted in PoolStats.Misuse; only the first is logged)", "error", msg)
	}
}

// release returns all but one chunk of slack when slack passes releaseAt.
func (a *Account) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked()
}

func (a *Account) releaseLocked() {
	if r, u := a.reserved.Load(), a.used.Load(); r >= 0 && r-u > a.releaseAt {
		a.trimLocked(a.chunk)
	}
}

// trimLocked gives back all of the reservation beyond used plus slack.
// Called with mu held.
func (a *Account) trimLocked(slack int64) {
	for {
		r := a.reserved.Load()
		u := a.used.Load()
		if r < 0 || u < 0 || r-u <= slack {
			return
		}
		target := u + slack
		if testHookRelease != nil {
			testHookRelease()
		}
		a.reserved.Store(target)
		// A fast-path Grow that raised used meanwhile: restore, look again.
		if v := a.used.Load(); v >= 0 && v <= target {
			a.giveBack(r-target, nil)
			return
		}
		a.reserved.Store(r)
	}
}

// Resize reports that a structure of oldSize bytes now takes newSize: it grows
// (with Grow's errors) or shrinks by the difference. A negative size is an
// error matching ErrInvalidSize and changes nothing.
func (a *Account) Resize(oldSize, newSize int64) error {
	if oldSize < 0 || newSize < 0 {
		return fmt.Errorf("%w: %s: Resize(%d, %d): negative size", ErrInvalidSize, a.scope(), oldSize, newSize)
	}
	if newSize > oldSize {
		return a.Grow(newSize - oldSize)
	}
	a.Shrink(oldSize - newSize)
	return nil
}

// Close returns what the account and the accounts opened from it hold to its
// parent, closes them all, and makes later Grow and Open on them fail with
// ErrClosed. Closing with bytes grown and not shrunk is a leak, unless the
// WithAccount context's end closed it: counted (PoolStats.Leaked) and the
// first logged at WARN, or, with PoolConfig.Strict, a panic. Under heap
// pressure, closing an account that held PoolConfig.CancelShare of the live
// heap runs a GC cycle. Idempotent.
func (a *Account) Close() {
	leak := a.close(nil)
	a.pool.workEnded(a)
	if leak != "" && a.pool.strict {
		panic(leak)
	}
}

// close is Close without the strict panic: it returns the first leak, or
// "". Later errors wrap cause.
func (a *Account) close(cause error) (leak string) {
	kids, leak, ok := a.closeSelf(cause)
	if !ok {
		return ""
	}
	if a.pool.cancelLargest {
		a.pool.unlist(a)
	}
	for c := range kids {
		if l := c.close(cause); leak == "" {
			leak = l
		}
	}
	return leak
}

// closeSelf closes a alone, gives back all it holds, and returns its
// unlinked children; ok is false when a was closed already.
func (a *Account) closeSelf(cause error) (kids map[*Account]struct{}, leak string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.reserved.Load()
	if r < 0 {
		return nil, "", false
	}
	a.closeCause = cause
	a.reserved.Store(-1)
	hold := r + a.kids.Load()
	a.kids.Store(0)
	a.giveBack(hold, a) // also unlinks a from its parent
	kids, a.openKids = a.openKids, nil
	if u := a.used.Load(); u > 0 && cause == nil {
		leak = a.pool.noteLeak(a.scope(), u)
	}
	if a.parent == nil {
		a.pool.inFlight.Add(-1)
		a.pool.peaks.record(a.demand())
	}
	return kids, leak, true
}

// closedError is the error of op on the closed account. Called with mu held.
func (a *Account) closedError(op string) error {
	if a.reserved.Load() >= 0 && a.pool.closed.Load() {
		return fmt.Errorf("%w: %s: %s: pool %s is closed", ErrClosed, a.scope(), op, a.pool.name)
	}
	if a.closeCause != nil {
		return fmt.Errorf("%w: %s: %s after its context ended: %w", ErrClosed, a.scope(), op, a.closeCause)
	}
	return fmt.Errorf("%w: %s: %s", ErrClosed, a.scope(), op)
}

func (a *Account) invalid(op string, n int64) error {
	return fmt.Errorf("%w: %s: %s(%d): negative size", ErrInvalidSize, a.scope(), op, n)
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
