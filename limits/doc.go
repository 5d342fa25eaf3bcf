// Package limits keeps a Go process inside its memory limit: GOMEMLIMIT from
// the cgroup memory limit, and per-request memory budgets that refuse the
// request that would exceed its share with resource_exhausted (HTTP 429,
// gRPC code 8) instead of letting the OOM killer end the process.
//
// memctl.Start sets GOMEMLIMIT; a service adds a pool and its middleware:
//
//	pool, err := limits.NewPool(limits.PoolConfig{Name: "http"}) // half of GOMEMLIMIT
//	if err != nil { ... }
//	defer pool.Close()
//	budget, err := pool.Middleware(limits.HTTPConfig{
//		Limit:      64 << 20,          // each request may hold 64 MiB
//		AfterBurst: memctl.AfterBurst, // a request that peaked high ends a burst
//	})
//	if err != nil { ... }
//	http.Handle("/sum", budget(handler))
//
// and each handler reports what it builds, before building it:
//
//	if err := limits.Grow(r.Context(), 8*n); err != nil {
//		if !limits.WriteError(w, err) { // 429 {"code":"resource_exhausted",...}
//			http.Error(w, err.Error(), http.StatusBadRequest)
//		}
//		return
//	}
//	defer limits.Shrink(r.Context(), 8*n)
//	xs := make([]int64, n)
//
// Outside HTTP, open an account per unit of work: acct, err :=
// pool.Open("job-17", 256<<20), then acct.Grow, acct.Shrink, acct.Close.
// examples/service is the whole service, examples/server a larger one.
//
// Read on, on the types:
//
//   - SetGoMemLimit and MemLimiter: GOMEMLIMIT from cgroup v1 or v2 (ratio
//     0.9 of the tightest memory.max, with a memory.high under it as a
//     target held above 1.5x the live heap, less what the cgroup is charged
//     that the Go runtime does not hold and the kernel cannot reclaim: C
//     heap, other processes' anonymous memory, shmem, tmpfs and ramfs,
//     kernel memory, from memory.stat, page cache not subtracted; a 64 MiB
//     floor;
//     re-read at GC end at most every 10 s and when a limit file is
//     written (inotify; a timer where none); the operator's GOMEMLIMIT and
//     AUTOMEMLIMIT win), and MemLimit, what was decided and why.
//   - Pool and PoolConfig: the shared budget (by default half of
//     GOMEMLIMIT; without it, half of 90% of the cgroup limit or of the
//     physical memory, never silently unlimited) and its heap watch, which
//     refuses growth when the live heap passes 90% of GOMEMLIMIT and can
//     cancel the largest request (HeapPressure, CancelLargest).
//   - Account: one request's share, nesting, and the cost of Grow and
//     Shrink (one atomic add or compare-and-swap within a 64 KiB chunk).
//   - Pool.Middleware, HTTPConfig and WriteError: the HTTP side.
//   - ExhaustedError and ErrResourceExhausted: what a refusal carries (the
//     bytes asked for, in use and allowed, the scope); a negative size is
//     ErrInvalidSize.
//   - Mode: MEMCTL_BUDGETS=enforce|observe|off, the operator's switch;
//     observe is the safe way to roll budgets out.
//
// Misuse is counted, never a crash of the service (PoolStats.Misuse and
// Leaked, the first of each logged at WARN); PoolConfig.Strict makes it
// panic, for tests.
//
// Outside net/http: Pool.Do runs one job (a queue message, a batch step)
// under an account of its own, and Pool.StartWork with Work.Finish is the
// same in two halves, on which the gRPC and Connect interceptors are built
// (the nested modules github.com/memctl/memctl/grpcbudget and
// .../connectbudget: code 8 RESOURCE_EXHAUSTED, Connect resource_exhausted,
// with the retry pushback where a retry can succeed). Package limitstest
// gives a handler under test a budget without the middleware.
//
// # Sizing budgets
//
// Each top-level account's peak (what the request reached or asked for) is
// recorded when it closes, in every mode, in PoolStats.Peaks, a histogram
// by powers of two: run with MEMCTL_BUDGETS=observe, and
// PeakHistogram.Above(limit) says how many requests a budget of limit bytes
// would refuse. At the end of each GC cycle the pool also compares what its
// accounts hold with the live heap beyond its baseline, and says once at
// WARN (PoolStats.Undercharged counts it) when the heap is far larger: the
// charges look too small and the budgets protect nothing. How to pick the
// pool and the per-request budget from the histogram, what the default pool
// means in a small cgroup, and how far the charge check can be trusted:
// docs/sizing.md in the repository
// (https://github.com/memctl/memctl/blob/main/docs/sizing.md).
//
// # Configuration
//
// PoolConfig, HTTPConfig and MemLimitConfig are structs whose zero value is
// the default, as in the standard library (net/http.Server, tls.Config) and
// packages trim and pressure; only the facade, memctl.Start, takes
// functional options.
package limits
