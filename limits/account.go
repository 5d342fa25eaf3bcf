package limits

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
)

// Account is one request's (or one operator's) share of a pool: it counts
// the bytes its code reports with Grow and Shrink, refuses a Grow that would
// take it past its own limit, and reserves from its parent (the pool, or the
// account it was opened from) in chunks of PoolConfig.ChunkSize bytes, so
// that Grow and Shrink within a reserved chunk touch only the account: one
// compare-and-swap each, no lock, no allocation. A Grow+Shrink pair costs
// about 13 ns on an AMD EPYC core, against 45 ns for a mutex-guarded account
// charging a mutex-guarded pool (BenchmarkGrowShrink in this package); with
// one account per goroutine it scales with the cores.
//
// An Account is safe for concurrent use (a request may fan out). Open one
// with Pool.Open or Account.Open and Close it when the work ends; the zero
// value is not usable.
type Account struct {
	// Hot fields, written by Grow and Shrink, alone on the first cache line
	// so that accounts used by different goroutines do not share one.
	used atomic.Int64
	// reserved is what the account holds from its parent, ≥ used except
	// for a moment during a refused Grow; -1 once closed. It changes only
	// under mu.
	reserved  atomic.Int64
	peak      atomic.Int64
	releaseAt int64 // Shrink returns bytes to the parent when reserved-used exceeds it
	_         [32]byte

	mu     sync.Mutex // serializes reservations, releases and Close
	limit  int64      // 0: no limit of its own
	chunk  int64
	pool   *Pool
	parent *Account // nil for a top-level account
	name   string   // the last element of the scope; see scope
	seq    int64    // > 0: the name is "req-<seq>" (the middleware's default), made only when needed
	// closeCause is why the account was closed, when it was closed because
	// the context it was bound to ended (WithAccount): context.Cause of
	// that context. Guarded by mu; set before reserved becomes -1.
	closeCause error
	// refusedAt is the highest Used+n of a Grow(n) refused with
	// ErrResourceExhausted, for the middleware's burst rule. Written only on
	// the error path.
	refusedAt atomic.Int64

	// Guarded by pool.mu: the list of accounts CancelLargest may cancel.
	cancel     context.CancelCauseFunc
	prev, next *Account
	listed     bool
	canceled   bool
	_          [14]byte // pad to 192 bytes, a multiple of the cache line
}

// testHookGrow, when set by a test, runs in Grow's fast path between the
// check against reserved and the compare-and-swap, where a concurrent
// release or Close can strike.
var testHookGrow func()

// testHookRelease, when set by a test, runs in a release after it read used
// and before it lowers reserved, where a concurrent Grow can strike.
var testHookRelease func()

func newAccount(p *Pool, parent *Account, name string, seq, limit int64) *Account {
	a := &Account{
		releaseAt: 2 * p.chunk,
		limit:     limit,
		chunk:     p.chunk,
		pool:      p,
		parent:    parent,
		name:      name,
		seq:       seq,
	}
	return a
}

// Name returns the account's scope: its name path from the pool down, for
// example "pool/req-17/sort".
func (a *Account) Name() string { return a.scope() }

// scope builds the name path from the pool down. It is made only for errors
// and Name, so that opening an account does not build strings.
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

// Limit returns the account's own limit in bytes; 0 means it has none.
func (a *Account) Limit() int64 { return a.limit }

// Used returns the bytes in use: grown and not shrunk, plus what the
// accounts opened from it have reserved (their Used plus up to two chunks
// each). It is 0 after Close.
func (a *Account) Used() int64 {
	if a.reserved.Load() < 0 {
		return 0
	}
	return a.used.Load()
}

// Peak returns the highest Used since Open. It is kept after Close.
func (a *Account) Peak() int64 { return a.peak.Load() }

// Open opens an account nested in a, named name, with its own limit in bytes
// (0: none; a's limit and the pool's still apply). Its scope is a's scope
// followed by "/" and name, and what it holds counts in a's Used. It returns
// an error matching ErrInvalidSize for a negative limit and ErrClosed when a
// is closed (wrapping the cause of the context a was bound to, as Grow's).
func (a *Account) Open(name string, limit int64) (*Account, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: %s/%s: Open with limit %d", ErrInvalidSize, a.scope(), name, limit)
	}
	if a.reserved.Load() < 0 {
		a.mu.Lock()
		defer a.mu.Unlock()
		return nil, a.closedError(fmt.Sprintf("Open(%q)", name))
	}
	return newAccount(a.pool, a, name, 0, limit), nil
}

// Grow reports n more bytes in use. It returns nil, or:
//   - an *ExhaustedError (matching ErrResourceExhausted) when the account,
//     one of its ancestors, or the pool has no room for n bytes, or the pool
//     is under heap pressure and n does not fit in what the account already
//     holds; nothing is counted then;
//   - an error matching ErrInvalidSize when n is negative or would take the
//     total of the account, of one of its ancestors, or of a pool without a
//     limit past math.MaxInt64 (the error names n, and is not counted in
//     PoolStats.Refused); nothing is counted then;
//   - an error matching ErrClosed after Close. When the account was closed
//     because the context it was bound to with WithAccount ended, the error
//     also wraps that context's cause (context.Cause): it matches
//     ErrResourceExhausted (and errors.As finds the *ExhaustedError) after
//     the heap watch canceled it (PoolConfig.CancelLargest), and
//     context.Canceled or context.DeadlineExceeded after a client went away
//     or a deadline passed.
//
// Grow(0) returns nil. Within the account's reserved chunk Grow costs one
// compare-and-swap and allocates nothing; an error allocates.
func (a *Account) Grow(n int64) error {
	if n <= 0 {
		if n == 0 {
			return nil
		}
		return a.invalid("Grow", n)
	}
	if a.tryGrow(n) {
		return nil
	}
	err := a.growSlow(n)
	if err != nil {
		err = a.sizeError(n, err)
		a.noteRefused(n, err)
	}
	return err
}

// overflowError is the error of a reservation that would take the running
// total of scope, an account or the pool, past math.MaxInt64. It does not
// leave the package: Grow turns it into an ErrInvalidSize error that names
// the size the caller passed (sizeError), since a nested account reserves
// from its parent in sizes rounded to chunks.
type overflowError struct {
	scope string
	used  int64 // in scope, before the reservation
}

func (e *overflowError) Error() string {
	return "limits: " + e.scope + ": total overflows int64"
}

// sizeError returns err, the error of growSlow(n), with an overflowError
// turned into an error matching ErrInvalidSize that names n.
func (a *Account) sizeError(n int64, err error) error {
	var o *overflowError
	if !errors.As(err, &o) {
		return err
	}
	if o.scope == a.scope() {
		return fmt.Errorf("%w: %s: Grow(%d) with %d in use overflows int64", ErrInvalidSize, a.scope(), n, o.used)
	}
	return fmt.Errorf("%w: %s: Grow(%d) overflows int64 in %s, which has %d in use", ErrInvalidSize, a.scope(), n, o.scope, o.used)
}

// noteRefused counts a Grow(n) that failed with err when err is a refusal
// (an *ExhaustedError, not an account closed by a heap-pressure cancel), and
// records in the account and its ancestors what they would have used.
func (a *Account) noteRefused(n int64, err error) {
	var e *ExhaustedError
	if errors.Is(err, ErrClosed) || !errors.As(err, &e) {
		return
	}
	a.pool.refused.Add(1)
	for x := a; x != nil; x = x.parent {
		u := x.used.Load()
		notePeak(&x.refusedAt, u+min(n, math.MaxInt64-u))
	}
}

// tryGrow is Grow's lock-free path: it grows by n > 0 and returns true when
// n fits in what the account already holds from its parent.
func (a *Account) tryGrow(n int64) bool {
	for {
		u := a.used.Load()
		if n > a.reserved.Load()-u {
			return false
		}
		if testHookGrow != nil {
			testHookGrow()
		}
		if !a.used.CompareAndSwap(u, u+n) {
			continue // another Grow or Shrink of this account won: look again
		}
		// A release (or Close) may have lowered reserved between the load
		// and the swap; it re-reads used after lowering reserved, and we
		// re-read reserved after raising used, so one of us sees the other.
		if u+n <= a.reserved.Load() {
			if u+n > a.peak.Load() {
				notePeak(&a.peak, u+n)
			}
			return true
		}
		a.used.Add(-n)
		return false
	}
}

// growSlow grows by n under mu, reserving from the parent as needed.
func (a *Account) growSlow(n int64) error {
	a.mu.Lock()
	err := a.growLocked(n)
	// A reservation followed by concurrent Shrinks can leave more than
	// releaseAt unused; give it back now so no account keeps more.
	a.releaseLocked()
	a.mu.Unlock()
	return err
}

func (a *Account) growLocked(n int64) error {
	for {
		r := a.reserved.Load()
		if r < 0 {
			return a.closedError("Grow(" + strconv.FormatInt(n, 10) + ")")
		}
		u := a.used.Load()
		if n > math.MaxInt64-u {
			return &overflowError{scope: a.scope(), used: u}
		}
		nu := u + n
		if a.limit > 0 && nu > a.limit {
			return &ExhaustedError{Requested: n, Used: u, Limit: a.limit, Scope: a.scope()}
		}
		if nu <= r {
			// No release can run while we hold mu, so reserved stays ≥ r.
			if a.used.CompareAndSwap(u, nu) {
				notePeak(&a.peak, nu)
				return nil
			}
			continue
		}
		need := nu - r
		want := need
		if rem := need % a.chunk; rem != 0 && need <= math.MaxInt64-(a.chunk-rem) {
			want = need + a.chunk - rem
		}
		if a.limit > 0 && want > a.limit-r {
			want = a.limit - r // ≥ need, since nu ≤ limit
		}
		got, err := a.reserveUp(want, need)
		if err != nil {
			var e *ExhaustedError
			if errors.As(err, &e) {
				e.Requested = n
			}
			return err
		}
		a.reserved.Store(r + got)
	}
}

// reserveUp takes want bytes from the parent, or only need when want does
// not fit (the parent has no room for it, or its total would overflow: the
// rounding to a chunk must not refuse what the exact size gets), and
// returns how many it took.
func (a *Account) reserveUp(want, need int64) (int64, error) {
	if a.parent == nil {
		return a.pool.reserve(want, need)
	}
	err := a.parent.grow(want)
	if err == nil {
		return want, nil
	}
	var o *overflowError
	if want > need && (errors.Is(err, ErrResourceExhausted) || errors.As(err, &o)) {
		if err = a.parent.grow(need); err == nil {
			return need, nil
		}
	}
	return 0, err
}

// grow is Grow for a child's reservation: it does not count refusals.
func (a *Account) grow(n int64) error {
	if a.tryGrow(n) {
		return nil
	}
	return a.growSlow(n)
}

// giveBack returns n bytes to the parent. Called with mu held.
func (a *Account) giveBack(n int64) {
	if a.parent == nil {
		a.pool.unreserve(n)
	} else {
		a.parent.Shrink(n)
	}
}

// Shrink reports n fewer bytes in use. Shrinking below zero is misuse: the
// account clamps at zero and the pool counts it (PoolStats.Misuse), or
// panics in strict mode (PoolConfig.Strict); so is a negative n. When the
// account holds more than two chunks beyond its use, Shrink returns the
// excess to the parent. Shrink after Close does nothing. Within the
// reserved chunk Shrink costs one compare-and-swap and allocates nothing.
func (a *Account) Shrink(n int64) {
	if n <= 0 {
		if n < 0 {
			a.misuse(fmt.Sprintf("Shrink(%d): negative size", n))
		}
		return
	}
	for {
		u := a.used.Load()
		if n > u {
			a.shrinkBelowZero(n)
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

// shrinkBelowZero clamps used at zero for a Shrink(n) with n > used.
func (a *Account) shrinkBelowZero(n int64) {
	for {
		u := a.used.Load()
		if n <= u {
			a.Shrink(n)
			return
		}
		if a.used.CompareAndSwap(u, 0) {
			if a.reserved.Load() > a.releaseAt {
				a.release()
			}
			a.misuse(fmt.Sprintf("Shrink(%d) below zero with %d in use", n, u))
			return
		}
	}
}

func (a *Account) misuse(what string) {
	a.pool.misuse.Add(1)
	if a.pool.strict {
		panic("limits: " + a.scope() + ": " + what)
	}
}

// release returns what the account holds beyond one chunk of slack to the
// parent, when that is more than releaseAt.
func (a *Account) release() {
	a.mu.Lock()
	a.releaseLocked()
	a.mu.Unlock()
}

// releaseLocked is release with mu held. Locks are always taken child
// first, then ancestors (giveBack), so this cannot deadlock.
func (a *Account) releaseLocked() {
	for {
		r := a.reserved.Load()
		u := a.used.Load()
		if r < 0 || r-u <= a.releaseAt {
			return
		}
		target := u + a.chunk
		if testHookRelease != nil {
			testHookRelease()
		}
		a.reserved.Store(target)
		// A Grow on the fast path may have raised used after our load; it
		// re-reads reserved after raising used and backs off if it sees
		// target. If we see its raise instead, we restore the reservation
		// and look again.
		if a.used.Load() <= target {
			a.giveBack(r - target)
			return
		}
		a.reserved.Store(r)
	}
}

// Resize reports that a structure of oldSize bytes now takes newSize bytes:
// it grows by the difference (with Grow's errors, the ExhaustedError's
// Requested being newSize-oldSize) or shrinks by it. A negative size is an
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

// Close returns everything the account holds, including what accounts
// opened from it hold, to its parent, and makes further Grow and Open calls
// fail with ErrClosed; accounts opened from it can no longer reserve more.
// Close is idempotent and safe to call concurrently with any method.
func (a *Account) Close() { a.close(nil) }

// close is Close; cause, when not nil, is why the account closed (the
// cause of the context it was bound to), and the errors of later Grow and
// Open calls wrap it. The first close wins.
func (a *Account) close(cause error) {
	a.mu.Lock()
	r := a.reserved.Load()
	if r < 0 {
		a.mu.Unlock()
		return
	}
	a.closeCause = cause
	a.reserved.Store(-1)
	if r > 0 {
		a.giveBack(r)
	}
	a.mu.Unlock()
	if a.pool.cancelLargest {
		a.pool.unlist(a)
	}
}

// closedError is the error of op on the closed account. Called with mu held.
func (a *Account) closedError(op string) error {
	if a.closeCause != nil {
		return fmt.Errorf("%w: %s: %s after its context ended: %w", ErrClosed, a.scope(), op, a.closeCause)
	}
	return fmt.Errorf("%w: %s: %s", ErrClosed, a.scope(), op)
}

func (a *Account) invalid(op string, n int64) error {
	return fmt.Errorf("%w: %s: %s(%d): negative size", ErrInvalidSize, a.scope(), op, n)
}
