package limits

import (
	"math"
	"runtime/metrics"
	"slices"
	"sync"
	"weak"

	"github.com/memctl/memctl/internal/poolwire"
	"github.com/memctl/memctl/internal/relief"
)

// openPools are the pools shedding and cancelLargest reach, held weakly.
var openPools struct {
	mu    sync.Mutex
	pools []weak.Pointer[Pool]
}

var registerCanceler sync.Once // relief.SetCanceler(cancelLargest), once

func registerPool(p *Pool) {
	registerCanceler.Do(func() { relief.SetCanceler(cancelLargest) })
	openPools.mu.Lock()
	defer openPools.mu.Unlock()
	gone := func(w weak.Pointer[Pool]) bool { return w.Value() == nil }
	openPools.pools = append(slices.DeleteFunc(openPools.pools, gone), weak.Make(p))
}

func unregisterPool(p *Pool) {
	openPools.mu.Lock()
	defer openPools.mu.Unlock()
	wp := weak.Make(p)
	openPools.pools = slices.DeleteFunc(openPools.pools, func(w weak.Pointer[Pool]) bool { return w == wp })
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

// openPool returns the oldest open, not closed pool for which match is true,
// or nil.
func openPool(match func(*Pool) bool) *Pool {
	var found *Pool
	eachPool(func(q *Pool) {
		if found == nil && !q.closed.Load() && match(q) {
			found = q
		}
	})
	return found
}

// cancelLargest is the kernel pressure watcher's cancel (internal/relief):
// in each pool with CancelLargest, it cancels the largest account holding
// at least CancelShare of the Go memory, and returns how many it canceled.
func cancelLargest() int {
	s := []metrics.Sample{{Name: liveHeapMetric}, {Name: goMappedMetrics[0]}, {Name: goMappedMetrics[1]}}
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

// sampleBytes returns s in bytes, 0 when the runtime lacks it.
func sampleBytes(s metrics.Sample) int64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(min(s.Value.Uint64(), math.MaxInt64))
}

// shedSizeFor returns PoolConfig.ShedSize's default for a pool of limit bytes.
func shedSizeFor(limit, chunk int64) int64 {
	return max(min(defaultShedSize, limit/16), chunk)
}

// shedLimit returns the pool's ShedSize, the default following the limit.
func (p *Pool) shedLimit() int64 {
	if p.shedSize > 0 {
		return p.shedSize
	}
	return shedSizeFor(p.curLimit(), p.chunk)
}

// shedError returns the refusal of a Grow of n over total while shedding
// (relief.Shedding, during a GC death spiral).
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

// shedCap lowers want while shedding so that held plus the reservation
// passes ShedSize by no more than need.
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
