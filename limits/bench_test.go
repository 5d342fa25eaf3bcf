package limits

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
)

// The benchmarks measure one Grow+Shrink pair of 1 KiB within a reserved
// chunk, the hot path of a request that reports its allocations, against
// two baselines in the same run:
//   - mutex: the simple account, a mutex-guarded counter with a limit that
//     charges a mutex-guarded pool on every call (no chunks);
//   - semaphore: golang.org/x/sync/semaphore.Weighted as the pool, with
//     TryAcquire/Release (no per-request account at all).
//
// Parallel variants run one account per goroutine, all sharing one pool.
// Compare them with
//
//	go test -run '^$' -bench GrowShrink -benchmem -count 10 ./limits/ > g.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl g.txt
//
// The serial variants also report cpu-ns/op, the CPU time of the
// benchmark's thread per operation (CLOCK_THREAD_CPUTIME_ID, Linux): on a
// machine shared with other work, ns/op counts the time the thread waited
// for a core, cpu-ns/op does not, so the ratio of two implementations is
// stable in cpu-ns/op when ns/op is noise.

const benchSize = 1 << 10

// mutexPool and mutexAccount are the baseline: what an account looks like
// without chunked reservation or atomics.
type mutexPool struct {
	mu          sync.Mutex
	used, limit int64
}

type mutexAccount struct {
	mu          sync.Mutex
	used, limit int64
	pool        *mutexPool
}

var errBaseline = errors.New("baseline: exhausted")

func (a *mutexAccount) Grow(n int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.limit > 0 && a.used+n > a.limit {
		return errBaseline
	}
	a.pool.mu.Lock()
	if a.pool.used+n > a.pool.limit {
		a.pool.mu.Unlock()
		return errBaseline
	}
	a.pool.used += n
	a.pool.mu.Unlock()
	a.used += n
	return nil
}

func (a *mutexAccount) Shrink(n int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used -= n
	a.pool.mu.Lock()
	a.pool.used -= n
	a.pool.mu.Unlock()
}

func benchPool(b *testing.B) *Pool {
	// A discard logger: NewPool's INFO line would split the benchmark output.
	p, err := NewPool(PoolConfig{Limit: 1 << 40, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// threadCPU locks the benchmark to its thread and returns a func that
// reports the thread's CPU time per operation as cpu-ns/op.
func threadCPU(b *testing.B) func() {
	runtime.LockOSThread()
	start := threadCPUNanos()
	return func() {
		if end := threadCPUNanos(); start >= 0 && end >= start && b.N > 0 {
			b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
		}
		runtime.UnlockOSThread()
	}
}

func BenchmarkGrowShrink(b *testing.B) {
	b.Run("impl=memctl", func(b *testing.B) {
		a, _ := benchPool(b).Open("a", 1<<30)
		b.ReportAllocs()
		defer threadCPU(b)()
		for b.Loop() {
			if err := a.Grow(benchSize); err != nil {
				b.Fatal(err)
			}
			a.Shrink(benchSize)
		}
	})
	b.Run("impl=mutex", func(b *testing.B) {
		a := &mutexAccount{limit: 1 << 30, pool: &mutexPool{limit: 1 << 40}}
		b.ReportAllocs()
		defer threadCPU(b)()
		for b.Loop() {
			if err := a.Grow(benchSize); err != nil {
				b.Fatal(err)
			}
			a.Shrink(benchSize)
		}
	})
	b.Run("impl=semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1 << 40)
		b.ReportAllocs()
		defer threadCPU(b)()
		for b.Loop() {
			if !s.TryAcquire(benchSize) {
				b.Fatal("TryAcquire failed")
			}
			s.Release(benchSize)
		}
	})
}

func BenchmarkGrowShrinkParallel(b *testing.B) {
	b.Run("impl=memctl", func(b *testing.B) {
		p := benchPool(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			a, _ := p.Open("a", 1<<30)
			defer a.Close()
			for pb.Next() {
				if err := a.Grow(benchSize); err != nil {
					b.Error(err)
					return
				}
				a.Shrink(benchSize)
			}
		})
	})
	b.Run("impl=mutex", func(b *testing.B) {
		p := &mutexPool{limit: 1 << 40}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			a := &mutexAccount{limit: 1 << 30, pool: p}
			for pb.Next() {
				if err := a.Grow(benchSize); err != nil {
					b.Error(err)
					return
				}
				a.Shrink(benchSize)
			}
		})
	})
	b.Run("impl=semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1 << 40)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !s.TryAcquire(benchSize) {
					b.Error("TryAcquire failed")
					return
				}
				s.Release(benchSize)
			}
		})
	})
}

// BenchmarkGrowShrinkContext is the same pair through limits.Grow and
// limits.Shrink with the account in a context, as handlers call it.
func BenchmarkGrowShrinkContext(b *testing.B) {
	a, _ := benchPool(b).Open("a", 1<<30)
	ctx := NewContext(context.Background(), a)
	b.ReportAllocs()
	for b.Loop() {
		if err := Grow(ctx, benchSize); err != nil {
			b.Fatal(err)
		}
		Shrink(ctx, benchSize)
	}
}

// BenchmarkStartWork is one unit of work begun and finished with
// StartWork and Finish (what the gRPC and Connect interceptors do per
// call) on a context eight values deep, as a gRPC server's is; part=lookup
// is the look for an outer account of the pool (FromContext) alone, the
// part nesting added.
func BenchmarkStartWork(b *testing.B) {
	type key int
	ctx := context.Background()
	for i := range 8 {
		ctx = context.WithValue(ctx, key(i), i)
	}
	p := benchPool(b)
	b.Run("part=whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, w, err := p.StartWork(ctx, WorkConfig{Limit: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			_ = w.Finish(nil)
		}
	})
	b.Run("part=lookup", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if FromContext(ctx) != nil {
				b.Fatal("an account")
			}
		}
	})
}

// nopWriter is a ResponseWriter that discards what it is given.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkMiddleware is one request without a body (a GET) through
// Pool.Middleware, whose handler charges and returns 1 KiB, against the
// middleware as it was before bodies were charged (middlewareBefore), in
// the same run; cancel=on is a pool with CancelLargest. Compare with
//
//	go test -run '^$' -bench Middleware -benchmem -count 10 ./limits/ > m.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl m.txt
func BenchmarkMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Grow(r.Context(), benchSize); err != nil {
			b.Error(err)
			return
		}
		Shrink(r.Context(), benchSize)
	})
	for _, cancel := range []bool{false, true} {
		name := map[bool]string{false: "cancel=off", true: "cancel=on"}[cancel]
		for _, impl := range []string{"before", "now"} {
			b.Run(name+"/impl="+impl, func(b *testing.B) {
				p, err := NewPool(PoolConfig{Limit: 1 << 40, HeapPressure: -1, CancelLargest: cancel, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(p.Close)
				mw := p.Middleware
				if impl == "before" {
					mw = p.middlewareBefore
				}
				m, err := mw(HTTPConfig{Limit: 1 << 20, AfterBurst: func() {}})
				if err != nil {
					b.Fatal(err)
				}
				h := m(handler)
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				w := &nopWriter{h: http.Header{}}
				b.ReportAllocs()
				defer threadCPU(b)()
				for b.Loop() {
					h.ServeHTTP(w, r)
				}
			})
		}
	}
}

// BenchmarkMiddlewareRatio is BenchmarkMiddleware's request without a body
// (cancel=off) as a ratio that the shared machine's drift cancels: each
// iteration serves a block of 64 requests through the middleware before
// bodies were charged and one through Pool.Middleware (alternating which
// goes first), timing each block, and reports the ratio of the sums
// (now/before).
func BenchmarkMiddlewareRatio(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Grow(r.Context(), benchSize); err != nil {
			b.Error(err)
			return
		}
		Shrink(r.Context(), benchSize)
	})
	p, err := NewPool(PoolConfig{Limit: 1 << 40, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	cfg := HTTPConfig{Limit: 1 << 20, AfterBurst: func() {}}
	before, err := p.middlewareBefore(cfg)
	if err != nil {
		b.Fatal(err)
	}
	now, err := p.Middleware(cfg)
	if err != nil {
		b.Fatal(err)
	}
	hBefore, hNow := before(handler), now(handler)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := &nopWriter{h: http.Header{}}
	const block = 64
	timed := func(h http.Handler) time.Duration {
		start := time.Now()
		for range block {
			h.ServeHTTP(w, r)
		}
		return time.Since(start)
	}
	var tBefore, tNow time.Duration
	i := 0
	for b.Loop() {
		if i++; i%2 == 0 {
			tBefore += timed(hBefore)
			tNow += timed(hNow)
		} else {
			tNow += timed(hNow)
			tBefore += timed(hBefore)
		}
	}
	b.ReportMetric(float64(tNow)/float64(tBefore), "now/before")
}
