package limits

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
)

// Unlimited is the limit that asks for no limit of an account's own; its
// ancestors and the pool still limit it. A limit of 0 is an error.
const Unlimited int64 = math.MaxInt64

// Account is one request's share of a pool: it counts the bytes its code
// reports with Grow and Shrink, refuses a Grow past its limit, and reserves
// from its parent (the pool, or the account it was opened from) in chunks of
// PoolConfig.ChunkSize, so that Grow and Shrink within a chunk take no lock.
// What an account opened from a holds counts in a's Used and limit, but
// a.Shrink takes back only what a.Grow reported. An Account is safe for
// concurrent use; Close it when the work ends. The zero value is not usable.
type Account struct {
	// used is what the account grew itself and has not shrunk. A fast-path
	// Grow adds first and takes its bytes back when they do not fit, so used
	// can pass the granted total for a moment; a Shrink that counted on such
	// bytes takes it below zero until that Grow repairs it (undo).
	used atomic.Int64
	// reserved is what the account holds from its parent for its own bytes,
	// ≥ used once a Grow returns; -1 once closed. Written under mu.
	reserved         atomic.Int64
	peak             atomic.Int64 // highest used+kids
	pool             *Pool
	releaseAt        int64        // Shrink returns bytes to the parent when reserved-used exceeds it
	_                [24]byte     // the hot fields above alone on a cache line
	mu               sync.Mutex   // serializes reservations, releases, Open and Close
	kids             atomic.Int64 // what the accounts opened from it hold; written under mu
	limit            int64        // Unlimited: no limit of its own
	chunk            int64
	parent           *Account              // nil for a top-level account
	name             string                // the last element of the scope; see scope
	seq              int64                 // > 0: the name is "req-<seq>" (the middleware's default), made only when needed
	closeCause       error                 // the cause of the WithAccount context that closed it; under mu
	refusedAt        atomic.Int64          // the highest Used+n of a refused Grow(n)
	openKids         map[*Account]struct{} // the open accounts opened from it; under mu
	canceled         bool                  // CancelLargest canceled it; under pool.mu
	pressureCanceled atomic.Bool           // the heap watch canceled its context
	_                [23]byte              // pad to a multiple of the cache line
}

// Test hooks at Grow's fast path and a release's two racing points.
var testHookGrow, testHookRelease func()

func newAccount(p *Pool, parent *Account, name string, seq, limit int64) *Account {
	return &Account{
		releaseAt: 2 * p.chunk,
		limit:     limit,
		chunk:     p.chunk,
		pool:      p,
		parent:    parent,
		name:      name,
		seq:       seq,
	}
}

// checkLimit returns an ErrInvalidSize error for a limit ≤ 0; what names
// the call.
func checkLimit(limit int64, what func() string) error {
	if limit < 0 {
		return fmt.Errorf("%w: %s with limit %d", ErrInvalidSize, what(), limit)
	}
	if limit == 0 {
		return fmt.Errorf("%w: %s with limit 0: pass a limit in bytes, or limits.Unlimited for none of its own", ErrInvalidSize, what())
	}
	return nil
}

// Name returns the account's scope, its name path from the pool down:
// "pool/req-17/sort".
func (a *Account) Name() string { return a.scope() }

func (a *Account) scope() string {
	name := a.name
	if a.seq > 0 {
		name = "req-" + strconv.FormatInt(a.seq, 10)
	}
	if a.parent != nil {
		return a.parent.scope() + "/" + name
	}
	return a.pool.name + "/" + name
}

// Limit returns the account's own limit in bytes; Unlimited means none.
func (a *Account) Limit() int64 { return a.limit }

// Used returns the bytes in use: grown and not shrunk, plus what the accounts
// opened from it hold; 0 after Close.
func (a *Account) Used() int64 {
	if a.reserved.Load() < 0 {
		return 0
	}
	return max(a.used.Load(), 0) + a.kids.Load()
}

// Peak returns the highest Used since Open. It is kept after Close.
func (a *Account) Peak() int64 { return a.peak.Load() }

// demand is the higher of the peak and the largest refused Used+n.
func (a *Account) demand() int64 { return max(a.peak.Load(), a.refusedAt.Load()) }

// Open opens an account nested in a, scope a's followed by "/" and name, with
// its own limit in bytes (Unlimited: none). It returns an error matching
// ErrInvalidSize for a limit ≤ 0, and ErrClosed as Grow does.
func (a *Account) Open(name string, limit int64) (*Account, error) {
	return a.open(name, 0, limit)
}

// open is Open; seq > 0 names the account "req-<seq>", built only if needed.
func (a *Account) open(name string, seq, limit int64) (*Account, error) {
	if err := checkLimit(limit, func() string { return a.scope() + "/" + name + ": Open" }); err != nil {
		return nil, err
	}
	c := newAccount(a.pool, a, name, seq, limit)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reserved.Load() < 0 || a.pool.closed.Load() {
		if seq > 0 {
			name = "req-" + strconv.FormatInt(seq, 10)
		}
		return nil, a.closedError(fmt.Sprintf("Open(%q)", name))
	}
	if a.openKids == nil {
		a.openKids = make(map[*Account]struct{})
	}
	a.openKids[c] = struct{}{}
	return c, nil
}

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
