package limits

import (
	"fmt"
	"math"
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
