package limits

import (
	"math"
	"runtime/metrics"
	"sync"
	"weak"

	"github.com/memctl/memctl/internal/poolwire"
	"github.com/memctl/memctl/internal/relief"
)

// openPools are the pools that shedding and cancelLargest reach: weak, so
// that a pool dropped without Close is not kept alive by them.
var openPools struct {
	mu    sync.Mutex
	pools []weak.Pointer[Pool]
}

// registerCanceler makes cancelLargest the process's cancel of the
// largest request (internal/relief), called by the kernel pressure watcher.
var registerCanceler sync.Once

func registerPool(p *Pool) {
	registerCanceler.Do(func() { relief.SetCanceler(cancelLargest) })
	openPools.mu.Lock()
	defer openPools.mu.Unlock()
	live := openPools.pools[:0]
	for _, w := range openPools.pools {
		if w.Value() != nil {
			live = append(live, w)
		}
	}
	openPools.pools = append(live, weak.Make(p))
}

func unregisterPool(p *Pool) {
	openPools.mu.Lock()
	defer openPools.mu.Unlock()
	w := weak.Make(p)
	for i, x := range openPools.pools {
		if x == w {
			openPools.pools = append(openPools.pools[:i], openPools.pools[i+1:]...)
			return
		}
	}
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

// Load shedding (internal/relief.Shed) is on during a GC death spiral
// (package pressure): a Grow that would take an account (its own bytes and
// its children's) past its pool's PoolConfig.ShedSize is refused with an
// *ExhaustedError whose scope ends in "(shedding)" and whose RetryAfter is
// defaultRetryAfter (HTTP 429 with Retry-After): large work waits, small
// requests go on. Accounts already past ShedSize keep what they hold. While
// it is on, an account reserves from its parent no more than takes it to
// ShedSize, so that Grows on the fast path stop there too. With
// MEMCTL_BUDGETS=observe or off the refusal is counted and not applied. It
// adds one atomic load to a Grow's slow path and nothing to the fast path.

// cancelLargest cancels, in every open pool configured with CancelLargest,
// the open account (bound with WithAccount or the middleware) that uses the
// most bytes, provided it holds at least CancelShare of the Go memory: the
// larger of the live heap at the last GC cycle and what the runtime holds
// from the OS now (runtime/metrics /memory/classes/total:bytes less
// /memory/classes/heap/released:bytes), so that before the first GC cycle,
// when the live heap reads 0, a request of a few bytes is not canceled;
// the cause is an *ExhaustedError with scope "... (memory pressure)". It
// returns how many accounts it canceled. When a pool has no account that
// large it logs so at WARN, at most once a minute. The kernel
// memory-pressure watcher (package pressure) calls it through
// internal/relief: the request that holds the most is stopped before the
// OOM killer stops the process.
// With MEMCTL_BUDGETS=observe or off nothing is canceled (it is counted).
// Safe for concurrent use.
func cancelLargest() int {
	s := []metrics.Sample{{Name: liveHeapMetric}, {Name: goMemoryMetric}, {Name: releasedMetric}}
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

// goMemoryMetric is all the memory the Go runtime has mapped, and
// releasedMetric the heap memory it returned to the OS: the difference is
// what the runtime holds from the OS now, never 0, unlike the live heap
// before the first GC cycle.
const (
	goMemoryMetric = "/memory/classes/total:bytes"
	releasedMetric = "/memory/classes/heap/released:bytes"
)

// sampleBytes returns a runtime/metrics sample in bytes, 0 when the
// runtime does not have it.
func sampleBytes(s metrics.Sample) int64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(min(s.Value.Uint64(), math.MaxInt64))
}

// shedSizeFor returns PoolConfig.ShedSize's default for a pool of limit
// bytes: defaultShedSize, or a sixteenth of a smaller pool, at least one
// chunk.
func shedSizeFor(limit, chunk int64) int64 {
	return max(min(defaultShedSize, limit/16), chunk)
}

// shedLimit returns the pool's ShedSize: PoolConfig.ShedSize, or its
// default for the pool's limit now (which follows GOMEMLIMIT).
func (p *Pool) shedLimit() int64 {
	if p.shedSize > 0 {
		return p.shedSize
	}
	return shedSizeFor(p.curLimit(), p.chunk)
}

// shedError returns the refusal of a Grow of n over total while shedding,
// or nil when the Grow stays within ShedSize.
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

// shedCap returns want, the bytes a reservation rounded up to a chunk
// would take, lowered while shedding so that the account's holdings, held
// now, do not pass ShedSize by more than need: a chunk reserved past
// ShedSize would let Grows on the fast path, which does not look at Shed,
// use it.
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
