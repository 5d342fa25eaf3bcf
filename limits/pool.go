package limits

import (
	"context"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// DefaultPoolRatio is the share of GOMEMLIMIT that becomes a pool's limit
// when PoolConfig.Limit is 0. Accounted bytes are live heap; the other half
// is for what requests do not report (buffers, runtime, goroutine stacks) and
// for the garbage the collector needs room for between cycles: with a live
// heap at half of GOMEMLIMIT the collector still runs at its normal GOGC pace
// instead of continuously.
const DefaultPoolRatio = 0.5

// DefaultChunkSize is the size, in bytes, of the chunks in which an account
// reserves from its pool (or parent account) when PoolConfig.ChunkSize is 0.
// CockroachDB's util/mon reserves in 10 KiB chunks; 64 KiB keeps the pool's
// shared counter out of the path of all but about one in 64 allocations of
// 1 KiB, at a cost of at most two chunks per open account held but unused.
const DefaultChunkSize = 64 << 10

// DefaultHeapPressure is the share of GOMEMLIMIT above which the live Go
// heap puts a pool under heap pressure when PoolConfig.HeapPressure is 0.
// With a live heap at 90% of GOMEMLIMIT the collector runs nearly
// continuously and any further growth risks the OOM killer.
const DefaultHeapPressure = 0.9

// maxChunkSize bounds PoolConfig.ChunkSize.
const maxChunkSize = 1 << 30

// PoolConfig configures NewPool. The zero value is the default: a pool
// named "pool" limited to half of GOMEMLIMIT, 64 KiB chunks, heap pressure
// at 90% of GOMEMLIMIT.
type PoolConfig struct {
	// Name is the first element of every scope in errors. Default: "pool".
	Name string
	// Limit is the pool's budget in bytes, shared by all its accounts.
	// 0 means DefaultPoolRatio (0.5) of GOMEMLIMIT as read by NewPool
	// (debug.SetMemoryLimit(-1)); when GOMEMLIMIT is not set either, the
	// pool has no limit (it counts, and refuses only under heap pressure).
	// Set GOMEMLIMIT (for example with SetGoMemLimit) before NewPool. The
	// limit is fixed at NewPool: it does not follow a later change of
	// GOMEMLIMIT (a MemLimitConfig.Refresh after an in-place resize), while
	// the heap-pressure threshold does. A negative Limit is an error.
	// Default: 0.
	Limit int64
	// ChunkSize is the granularity, in bytes, in which accounts reserve from
	// the pool or their parent account, in [1, 1 GiB]. Grow and Shrink within
	// a reserved chunk touch only the account. Default: 0 (means
	// DefaultChunkSize, 64 KiB).
	ChunkSize int64
	// HeapPressure is the share of GOMEMLIMIT, in (0.0, 1.0], that the live
	// Go heap (runtime/metrics /gc/heap/live:bytes) may reach before the pool
	// refuses every Grow that needs more from it; it is checked at the end of
	// each GC cycle, by a hook the collector runs, not by a timer. GOMEMLIMIT
	// is read again at every cycle (debug.SetMemoryLimit(-1)), so the
	// threshold follows a refresh of GOMEMLIMIT. A negative value turns the
	// watch off. Without GOMEMLIMIT there is no pressure.
	// Default: 0 (means DefaultHeapPressure, 0.9).
	HeapPressure float64
	// CancelLargest, under heap pressure, cancels at the end of each GC
	// cycle the context of the open account (among those bound with
	// WithAccount) that uses the most bytes, with an *ExhaustedError as the
	// cause (context.Cause). Default: false.
	CancelLargest bool
	// Strict makes misuse panic instead of being counted: a Shrink below zero
	// or of a negative size. Tests turn it on. Default: false.
	Strict bool
}

// PoolStats is a snapshot of a pool's counters.
type PoolStats struct {
	// Limit is the pool's limit in bytes; 0 means no limit.
	Limit int64
	// Used is the bytes the pool's accounts hold, including up to two chunks
	// per open account that are reserved but not yet used.
	Used int64
	// Peak is the highest Used since NewPool.
	Peak int64
	// Refused counts Grow calls refused with ErrResourceExhausted by any
	// scope of the pool (account, ancestor, pool, heap pressure). A Grow on
	// an account closed by a heap-pressure cancel is not counted, though its
	// error matches ErrResourceExhausted too (see ErrClosed); the cancel is
	// counted in Canceled.
	Refused int64
	// Misuse counts Shrink calls below zero or of a negative size.
	Misuse int64
	// HeapPressure is true when the live heap was above HeapThreshold at the
	// end of the last GC cycle.
	HeapPressure bool
	// HeapLive is the live Go heap in bytes at the end of the last GC cycle
	// the watch saw; 0 before the first one or when the watch is off.
	HeapLive int64
	// HeapThreshold is PoolConfig.HeapPressure times GOMEMLIMIT at the last
	// GC cycle, in bytes; 0 when GOMEMLIMIT is not set or the watch is off.
	HeapThreshold int64
	// GCCycles counts the GC cycles the heap watch has seen.
	GCCycles int64
	// Canceled counts contexts canceled by CancelLargest.
	Canceled int64
}

// Pool is a shared memory budget in bytes from which accounts are opened.
// The pool's counter is touched only when an account crosses a chunk
// boundary. A Pool is safe for concurrent use. Create one with NewPool and
// Close it when done; the zero value is not usable.
type Pool struct {
	// used is the sum of the reservations of the pool's top-level accounts.
	used     atomic.Int64
	peak     atomic.Int64
	pressure atomic.Bool
	closed   atomic.Bool
	_        [40]byte // keep the shared counters on their own cache line

	refused       atomic.Int64
	misuse        atomic.Int64
	canceled      atomic.Int64
	heapLive      atomic.Int64
	heapThreshold atomic.Int64
	heapCycles    atomic.Int64

	name          string
	heapScope     string
	limit         int64 // math.MaxInt64 when the pool has no limit
	chunk         int64
	heapRatio     float64
	cancelLargest bool
	strict        bool
	watch         *heapWatch

	mu   sync.Mutex // guards the list of cancellable accounts
	head *Account
}

// NewPool returns a pool configured by cfg. It returns an error matching
// ErrInvalidSize for a negative Limit or a ChunkSize outside [0, 1 GiB], and
// an error for a HeapPressure above 1 or NaN. With the heap watch on (the
// default), the pool installs a hook that the garbage collector runs at the
// end of each cycle; it starts no goroutine and no timer. Call Close to
// remove it.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if cfg.Limit < 0 {
		return nil, fmt.Errorf("%w: PoolConfig.Limit %d is negative", ErrInvalidSize, cfg.Limit)
	}
	if cfg.ChunkSize < 0 || cfg.ChunkSize > maxChunkSize {
		return nil, fmt.Errorf("%w: PoolConfig.ChunkSize %d is not in [0, %d]", ErrInvalidSize, cfg.ChunkSize, maxChunkSize)
	}
	if math.IsNaN(cfg.HeapPressure) || cfg.HeapPressure > 1 {
		return nil, fmt.Errorf("limits: PoolConfig.HeapPressure %v is not in (0.0, 1.0] (0: default, negative: off)", cfg.HeapPressure)
	}
	p := &Pool{
		name:          cfg.Name,
		limit:         cfg.Limit,
		chunk:         cfg.ChunkSize,
		heapRatio:     cfg.HeapPressure,
		cancelLargest: cfg.CancelLargest,
		strict:        cfg.Strict,
	}
	if p.name == "" {
		p.name = "pool"
	}
	p.heapScope = p.name + " (heap pressure)"
	if p.chunk == 0 {
		p.chunk = DefaultChunkSize
	}
	if p.limit == 0 {
		p.limit = limitFromGOMEMLIMIT(debug.SetMemoryLimit(-1))
	}
	if p.heapRatio == 0 {
		p.heapRatio = DefaultHeapPressure
	}
	if p.heapRatio > 0 {
		p.watch = startHeapWatch(p)
	}
	return p, nil
}

// limitFromGOMEMLIMIT returns DefaultPoolRatio of gml, at least 1, or
// math.MaxInt64 (no limit) when gml is math.MaxInt64 (GOMEMLIMIT not set).
func limitFromGOMEMLIMIT(gml int64) int64 {
	if gml == math.MaxInt64 {
		return math.MaxInt64
	}
	return max(int64(float64(gml)*DefaultPoolRatio), 1)
}

// Name returns the pool's name, the first element of every scope.
func (p *Pool) Name() string { return p.name }

// Limit returns the pool's limit in bytes; 0 means no limit. It is fixed at
// NewPool (see PoolConfig.Limit): a pool derived from GOMEMLIMIT keeps the
// value GOMEMLIMIT had then.
func (p *Pool) Limit() int64 {
	if p.limit == math.MaxInt64 {
		return 0
	}
	return p.limit
}

// Used returns the bytes the pool's accounts hold, which includes up to two
// chunks per open account reserved but not yet used.
func (p *Pool) Used() int64 { return p.used.Load() }

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() PoolStats {
	return PoolStats{
		Limit:         p.Limit(),
		Used:          p.used.Load(),
		Peak:          p.peak.Load(),
		Refused:       p.refused.Load(),
		Misuse:        p.misuse.Load(),
		HeapPressure:  p.pressure.Load(),
		HeapLive:      p.heapLive.Load(),
		HeapThreshold: p.heapThreshold.Load(),
		GCCycles:      p.heapCycles.Load(),
		Canceled:      p.canceled.Load(),
	}
}

// Open opens a top-level account named name with its own limit in bytes;
// limit 0 means the account only counts and never refuses on its own (the
// pool still can). The account's scope is "<pool>/<name>". It returns an
// error matching ErrInvalidSize for a negative limit and ErrClosed after
// Close. Safe for concurrent use.
func (p *Pool) Open(name string, limit int64) (*Account, error) {
	return p.open(name, 0, limit)
}

// open is Open; seq > 0 names the account "req-<seq>" without building the
// string (the middleware's default names).
func (p *Pool) open(name string, seq, limit int64) (*Account, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: %s/%s: Open with limit %d", ErrInvalidSize, p.name, name, limit)
	}
	if p.closed.Load() {
		return nil, fmt.Errorf("%w: %s: Open(%q)", ErrClosed, p.name, name)
	}
	return newAccount(p, nil, name, seq, limit), nil
}

// Close stops the heap watch and makes the pool refuse further Open calls
// and reservations with ErrClosed. Accounts still open keep what they hold
// until they are closed. Close is idempotent and safe for concurrent use.
func (p *Pool) Close() {
	if p.closed.Swap(true) {
		return
	}
	if p.watch != nil {
		p.watch.stop()
	}
}

// reserve takes want bytes from the pool, or only need (≤ want) when want
// does not fit, and returns how many it took. When need does not fit either
// the error is an *ExhaustedError, or an *overflowError when the pool has no
// limit and its total would pass math.MaxInt64.
func (p *Pool) reserve(want, need int64) (int64, error) {
	if p.closed.Load() {
		return 0, fmt.Errorf("%w: pool %s", ErrClosed, p.name)
	}
	if p.pressure.Load() {
		return 0, &ExhaustedError{Requested: need, Used: p.heapLive.Load(), Limit: p.heapThreshold.Load(), Scope: p.heapScope}
	}
	for {
		cur := p.used.Load()
		got := want
		if got > p.limit-cur {
			got = need
			if got > p.limit-cur {
				if p.limit == math.MaxInt64 {
					return 0, &overflowError{scope: p.name, used: cur}
				}
				return 0, &ExhaustedError{Requested: need, Used: cur, Limit: p.limit, Scope: p.name}
			}
		}
		if p.used.CompareAndSwap(cur, cur+got) {
			notePeak(&p.peak, cur+got)
			return got, nil
		}
	}
}

// unreserve returns n bytes to the pool.
func (p *Pool) unreserve(n int64) { p.used.Add(-n) }

// list adds a, with the cancel function of its context, to the accounts
// that CancelLargest may cancel.
func (p *Pool) list(a *Account, cancel context.CancelCauseFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.listed || a.reserved.Load() < 0 {
		return
	}
	a.listed, a.cancel = true, cancel
	a.next = p.head
	if p.head != nil {
		p.head.prev = a
	}
	p.head = a
}

// unlist removes a from the accounts that CancelLargest may cancel.
func (p *Pool) unlist(a *Account) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !a.listed {
		return
	}
	a.listed = false
	if a.prev != nil {
		a.prev.next = a.next
	} else {
		p.head = a.next
	}
	if a.next != nil {
		a.next.prev = a.prev
	}
	a.prev, a.next, a.cancel = nil, nil, nil
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
