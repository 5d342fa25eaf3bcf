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

// Unlimited is the limit that asks for no limit of an account's own, by
// name: Pool.Open(name, Unlimited), Account.Open(name, Unlimited) or
// HTTPConfig{Limit: Unlimited}. The account's ancestors and the pool still
// limit it. A limit of 0 is an error, so that a forgotten limit is not
// silently unlimited.
const Unlimited int64 = math.MaxInt64

// Account is one request's (or one operator's) share of a pool: it counts
// the bytes its code reports with Grow and Shrink, refuses a Grow that would
// take it past its own limit, and reserves from its parent (the pool, or the
// account it was opened from) in chunks of PoolConfig.ChunkSize bytes, so
// that Grow and Shrink within a reserved chunk touch only the account: one
// atomic add (Grow) or compare-and-swap (Shrink) each, no lock, no
// allocation, and nothing shared between accounts used by different
// goroutines (measured against a mutex-guarded account and pool:
// docs/benchmarks.md).
//
// Accounts nest: what an account opened from a holds counts in a's Used and
// against a's limit, but not as a's own bytes: a.Shrink can only take back
// what a.Grow reported (anything more is misuse, see Shrink).
//
// An Account is safe for concurrent use (a request may fan out). Open one
// with Pool.Open or Account.Open and Close it when the work ends; the zero
// value is not usable.
type Account struct {
	// Hot fields, written by Grow and Shrink, alone on the first cache line
	// so that accounts used by different goroutines do not share one.
	//
	// used is what the account grew itself and has not shrunk (its own
	// bytes; children's are in kids). A Grow on the fast path adds first
	// and takes its bytes back when they do not fit, so used can be above
	// the granted total for a moment. Shrink never takes it below zero (it
	// checks, then swaps): a Shrink past what the account grew is misuse and
	// changes nothing. Only a misuse that counted on a Grow's passing bytes
	// can, and the Grow that takes them back puts used back at zero.
	//
	// Why Shrink does not add too: a misuse's passing negative could not be
	// told from one that counted on a Grow's passing bytes, and one of them
	// must be repaired.
	used atomic.Int64
	// reserved is what the account holds from its parent for its own bytes,
	// ≥ used once a Grow returns; -1 once closed. It changes only under mu.
	reserved  atomic.Int64
	peak      atomic.Int64 // highest used+kids
	pool      *Pool
	releaseAt int64 // Shrink returns bytes to the parent when reserved-used exceeds it
	_         [24]byte

	mu sync.Mutex // serializes reservations, releases, Open and Close
	// kids is what the accounts opened from this one hold (each one's
	// reserved plus kids), reserved on their behalf from the parent.
	// Written under mu; read without it by Used.
	kids   atomic.Int64
	limit  int64 // Unlimited: no limit of its own
	chunk  int64
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

	// The open accounts opened from this one, guarded by mu; sibPrev and
	// sibNext are guarded by the parent's mu.
	firstKid         *Account
	sibPrev, sibNext *Account
	linked           bool // guarded by the parent's mu

	// Guarded by pool.mu: the list of accounts CancelLargest may cancel.
	cancel     context.CancelCauseFunc
	prev, next *Account
	listed     bool
	canceled   bool
	// pressureCanceled is set (under pool.mu) when the heap watch canceled
	// the account's context; WithAccount's cancel then asks the pool to
	// read the heap again.
	pressureCanceled atomic.Bool
	_                [39]byte // pad to a multiple of the cache line
}

// testHookGrow, when set by a test, runs in Grow's fast path between the
// add and the check against reserved, where a concurrent release or Close
// can strike.
var testHookGrow func()

// testHookRelease, when set by a test, runs in a release after it read used
// and before it lowers reserved, where a concurrent Grow can strike.
var testHookRelease func()

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

// checkLimit returns an error for a limit that is not positive: negative
// is an error matching ErrInvalidSize, and so is 0, which must be asked for
// by name (Unlimited). what names the call; it is made only on error.
func checkLimit(limit int64, what func() string) error {
	if limit < 0 {
		return fmt.Errorf("%w: %s with limit %d", ErrInvalidSize, what(), limit)
	}
	if limit == 0 {
		return fmt.Errorf("%w: %s with limit 0: pass a limit in bytes, or limits.Unlimited for none of its own", ErrInvalidSize, what())
	}
	return nil
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

// Limit returns the account's own limit in bytes; Unlimited
// (math.MaxInt64) means it has none.
func (a *Account) Limit() int64 { return a.limit }

// Used returns the bytes in use: grown and not shrunk, plus what the
// accounts opened from it hold (their Used plus up to two chunks each). It
// is 0 after Close.
func (a *Account) Used() int64 {
	if a.reserved.Load() < 0 {
		return 0
	}
	return max(a.used.Load(), 0) + a.kids.Load()
}

// Peak returns the highest Used since Open. It is kept after Close.
func (a *Account) Peak() int64 { return a.peak.Load() }

// demand is what the account reached or asked for: the higher of its peak
// and Used plus the size of its largest refused Grow.
func (a *Account) demand() int64 { return max(a.peak.Load(), a.refusedAt.Load()) }

// Open opens an account nested in a, named name, with its own limit in bytes
// (Unlimited: none; a's limit and the pool's still apply). Its scope is a's
// scope followed by "/" and name, and what it holds counts in a's Used.
// It returns an error matching ErrInvalidSize for a limit that is negative
// or 0, and ErrClosed when a, one of its ancestors or the pool is closed
// (wrapping the cause of the context a was bound to, as Grow's). Safe for
// concurrent use.
func (a *Account) Open(name string, limit int64) (*Account, error) {
	return a.open(name, 0, limit)
}

// open is Open; seq > 0 names the account "req-<seq>" without building the
// string (StartWork's default names).
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
	c.sibNext = a.firstKid
	if a.firstKid != nil {
		a.firstKid.sibPrev = c
	}
	a.firstKid, c.linked = c, true
	return c, nil
}

// Grow reports n more bytes in use. It returns nil, or:
//   - an *ExhaustedError (matching ErrResourceExhausted) when the account,
//     one of its ancestors, or the pool has no room for n bytes, or the pool
//     is under heap pressure and n does not fit in what the account already
//     holds; nothing is counted then. Any n past a limit is refused this way,
//     however large (a size from a client, such as a Content-Length, gets
//     the same answer with 0 or 1 byte in use);
//   - an error matching ErrInvalidSize when n is negative; nothing is
//     counted then;
//   - an error matching ErrClosed when the account, one of its ancestors or
//     the pool is closed. When the account was closed because the context
//     it was bound to with WithAccount ended, the error also wraps that
//     context's cause (context.Cause): it matches ErrResourceExhausted (and
//     errors.As finds the *ExhaustedError) after the heap watch canceled it
//     (PoolConfig.CancelLargest), and context.Canceled or
//     context.DeadlineExceeded after a client went away or a deadline
//     passed.
//
// With MEMCTL_BUDGETS=observe or off (see the package doc) a Grow that
// would be refused succeeds and is counted (PoolStats.Observed); only a
// total past math.MaxInt64 is still refused.
//
// Grow(0) returns nil. Within the account's reserved chunk Grow costs one
// atomic add and allocates nothing; an error allocates.
func (a *Account) Grow(n int64) error {
	if n > 0 && n <= a.reserved.Load() {
		// Fast path: add, then check against what the account holds. A
		// release or Close lowers reserved and then re-reads used; we
		// raise used and then read reserved: one of us sees the other.
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
		// Not held (or closed, or u < n: the sum wrapped past
		// math.MaxInt64): take the bytes back and grow under the lock.
		a.undo(n)
		return a.growSlow(n)
	}
	if n > 0 {
		// Larger than all the account holds (or closed): it cannot fit,
		// and its passing bytes on the fast path could make a concurrent
		// misuse (a Shrink of up to n more than the account grew, such as
		// Shrink(math.MaxInt64) beside Grow(math.MaxInt64)) look
		// legitimate.
		return a.growSlow(n)
	}
	if n == 0 {
		return nil
	}
	return a.invalid("Grow", n)
}

// undo takes back n bytes that Grow's fast path added and could not keep.
// A Shrink that ran in between may have counted on them; if that Shrink
// was misuse (past what the account grew), used is now below zero: it is
// put back at zero, once (a compare-and-swap, so that two Grows undoing at
// once do not both repair it), and the misuse counted here.
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

// observation collects, across the scopes of one Grow, the refusal that
// MEMCTL_BUDGETS=observe or off let through.
type observation struct {
	would *ExhaustedError
}

// over reports whether e, a refusal, must be returned: true when budgets are
// enforced; otherwise it records e (the first one) and returns false.
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
		// u may include the bytes of a Grow on the fast path that will be
		// taken back (up to math.MaxInt64): saturate.
		total := u + min(k, math.MaxInt64-u)
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
		want := roundUp(need, a.chunk)
		if room := a.room(r); want > room {
			want = max(room, need)
		}
		want = a.shedCap(want, need, r+k)
		got, err := a.reserveUp(want, need, o)
		if err != nil {
			return err
		}
		a.reserved.Store(r + got)
	}
}

// room returns how many more bytes the account may hold from its parent
// under its own limit, given r reserved for itself. Called with mu held.
// In ModeObserve and ModeOff a reservation past the limit takes only the
// bytes needed, so that the next Grow past it is seen (and counted) too.
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

// reserveUp takes want bytes from the parent, or only need (≤ want) when
// want does not fit, and returns how many it took. Called with mu held;
// locks are always taken child first, then ancestors, so this cannot
// deadlock.
func (a *Account) reserveUp(want, need int64, o *observation) (int64, error) {
	if a.parent == nil {
		return a.pool.reserve(want, need, o)
	}
	return a.parent.reserveForKid(want, need, o)
}

// reserveForKid reserves want bytes, or at least need, for an account opened
// from a, passing them through from a's own parent: a child's bytes count
// against a's limit but never mix with what a grew itself.
func (a *Account) reserveForKid(want, need int64, o *observation) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.reserved.Load()
	if r < 0 || a.pool.closed.Load() {
		return 0, a.closedError("reserve for an account opened from it")
	}
	if room := a.room(r); need > room {
		// Give back the slack of a's own reservation first: a refusal at
		// the limit must count only bytes in use.
		a.trimLocked(0)
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
	if room := a.room(r); want > room {
		want = max(room, need)
	}
	want = a.shedCap(want, need, r+a.kids.Load())
	got, err := a.reserveUp(want, need, o)
	if _, ok := err.(*ExhaustedError); ok && a.reserved.Load() > max(a.used.Load(), 0) {
		// An ancestor or the pool is full: a's own slack counts there, so
		// give it back and ask once more.
		a.trimLocked(0)
		got, err = a.reserveUp(want, need, o)
	}
	if err != nil {
		return 0, err
	}
	k := a.kids.Add(got)
	u := max(a.used.Load(), 0)
	a.raisePeak(u + min(k, math.MaxInt64-u))
	return got, nil
}

// raisePeak raises the peak to t, what a read of used plus kids found. That
// read can count the passing bytes of a concurrent Grow that does not fit
// and takes them back; what is granted never passes the account's limit
// when budgets are enforced, so neither does the peak.
func (a *Account) raisePeak(t int64) {
	if a.pool.mode == ModeEnforce {
		t = min(t, a.limit)
	}
	notePeak(&a.peak, t)
}

// returnFromKid takes back n bytes that an account opened from a held, and
// passes them up. Nothing happens when a is closed: its Close gave back
// everything it and its children held.
func (a *Account) returnFromKid(n int64, unlink *Account) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if unlink != nil && unlink.linked {
		unlink.linked = false
		if unlink.sibPrev != nil {
			unlink.sibPrev.sibNext = unlink.sibNext
		} else {
			a.firstKid = unlink.sibNext
		}
		if unlink.sibNext != nil {
			unlink.sibNext.sibPrev = unlink.sibPrev
		}
		unlink.sibPrev, unlink.sibNext = nil, nil
	}
	if a.reserved.Load() < 0 || n == 0 {
		return
	}
	a.kids.Add(-n)
	a.giveBack(n, nil)
}

// giveBack returns n bytes to the parent (and unlinks a from it when unlink
// is a). Called with mu held.
func (a *Account) giveBack(n int64, unlink *Account) {
	if a.parent == nil {
		a.pool.unreserve(n)
		return
	}
	a.parent.returnFromKid(n, unlink)
}

// Shrink reports n fewer bytes in use. Taking back more than the account
// grew itself (bytes held by accounts opened from it do not count) is
// misuse, as is a negative n: nothing is changed, the pool counts it
// (PoolStats.Misuse) and logs the first one at WARN, or, in strict mode
// (PoolConfig.Strict), Shrink panics once it holds no lock. When the
// account holds more than two chunks beyond its use, Shrink returns the
// excess to the parent. Shrink after Close does nothing, but a negative n
// is still counted as misuse. Within the reserved chunk Shrink costs one
// compare-and-swap and allocates nothing.
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

// misuse counts one misuse, logs the first one, and panics in strict mode.
// It is never called with a lock held.
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

// release returns what the account holds beyond one chunk of slack to the
// parent, when that is more than releaseAt.
func (a *Account) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked()
}

// releaseLocked is release with mu held.
func (a *Account) releaseLocked() {
	if r, u := a.reserved.Load(), a.used.Load(); r >= 0 && r-u > a.releaseAt {
		a.trimLocked(a.chunk)
	}
}

// trimLocked lowers the account's own reservation to what it uses plus
// slack, and gives the rest back. Called with mu held.
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
		// A Grow on the fast path may have raised used after our load; it
		// reads reserved after raising used and backs off if it sees
		// target. If we see its raise instead, we restore the reservation
		// and look again.
		if v := a.used.Load(); v >= 0 && v <= target {
			a.giveBack(r-target, nil)
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
// opened from it hold, to its parent, closes those accounts too, and makes
// further Grow and Open calls on any of them fail with ErrClosed. An
// account closed with bytes it grew and did not shrink is a leak: the pool
// counts it (PoolStats.Leaked, LeakedBytes) and logs the first one at WARN,
// or, in strict mode, Close panics after closing everything and releasing
// every lock. An account closed because the context it was bound to ended
// (WithAccount) is not a leak: the work may still be running. Under heap
// pressure, closing an account that held at least PoolConfig.CancelShare of
// the live heap makes the pool read the heap again at once (one GC cycle on
// a goroutine that exits). Close is idempotent and safe to call concurrently
// with any method.
func (a *Account) Close() {
	leak := a.close(nil)
	a.pool.workEnded(a)
	if leak != "" && a.pool.strict {
		panic(leak)
	}
}

// close is Close without the strict panic: it returns the first leak it
// found, or "". cause, when not nil, is why the account closed (the cause of
// the context it was bound to), and the errors of later Grow and Open calls
// wrap it. The first close wins.
func (a *Account) close(cause error) (leak string) {
	kids, leak, ok := a.closeSelf(cause)
	if !ok {
		return ""
	}
	if a.pool.cancelLargest {
		a.pool.unlist(a)
	}
	for c := kids; c != nil; {
		next := c.sibNext
		if l := c.close(cause); leak == "" {
			leak = l
		}
		c = next
	}
	return leak
}

// closeSelf marks a closed, gives back what it and its children hold, and
// returns the list of its children, now unlinked, to close. ok is false when
// a was closed already.
func (a *Account) closeSelf(cause error) (kids *Account, leak string, ok bool) {
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
	// The children are unlinked here; sibNext stays so the caller can walk
	// the list, and each child's Close finds it is not linked.
	kids = a.firstKid
	a.firstKid = nil
	for c := kids; c != nil; c = c.sibNext {
		c.linked = false
	}
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
