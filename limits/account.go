package limits

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
)

// Unlimited is the limit that asks for no limit of an account's own (Pool.Open,
// Account.Open, HTTPConfig.Limit); its ancestors and the pool still limit it. A
// limit of 0 is an error, not unlimited.
const Unlimited int64 = math.MaxInt64

// Account is one request's share of a pool: it counts the bytes its code
// reports with Grow and Shrink, refuses a Grow past its limit, and reserves
// from its parent (the pool, or the account it was opened from) in chunks of
// PoolConfig.ChunkSize, so that Grow and Shrink within a chunk take no lock
// (docs/benchmarks.md). What an account opened from a holds counts in a's Used
// and limit, but a.Shrink takes back only what a.Grow reported.
//
// An Account is safe for concurrent use. Open one with Pool.Open or
// Account.Open and Close it when the work ends; the zero value is not usable.
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

// Name returns the account's scope, its name path from the pool down:
// "pool/req-17/sort".
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

// Used returns the bytes in use: grown and not shrunk, plus what the accounts
// opened from it hold (with up to two reserved chunks each); 0 after Close.
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

// Open opens an account nested in a with its own limit in bytes (Unlimited:
// none; a's and the pool's still apply), scope a's followed by "/" and name. It
// returns an error matching ErrInvalidSize for a limit that is negative or 0,
// and ErrClosed as Grow does.
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
