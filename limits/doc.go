// Package limits keeps a Go process inside its memory limit: GOMEMLIMIT from
// the cgroup memory limit, and per-request memory budgets that refuse the
// request that would exceed its share with resource_exhausted (HTTP 429,
// gRPC code 8) instead of letting the OOM killer end the process.
//
// memctl.Start sets GOMEMLIMIT; a service adds a pool and its middleware:
//
//	pool, err := limits.NewPool(limits.PoolConfig{Name: "http"}) // half of GOMEMLIMIT, following it
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
//   - SetGoMemLimit and MemLimiter: GOMEMLIMIT from the cgroup limit,
//     followed as it changes (at GC end, and at once when a limit file is
//     written: inotify, or a timer where inotify is unavailable); MemLimit: what was decided and why.
//   - Pool and PoolConfig: the shared budget (by default half of
//     GOMEMLIMIT, following it) and its heap watch (HeapPressure,
//     CancelLargest).
//   - Account: one request's share, nesting, and the cost of Grow and
//     Shrink.
//   - Pool.Middleware, HTTPConfig and WriteError: the HTTP side; Pool.Do,
//     Pool.StartWork and WorkConfig: a queue's job or an RPC (the
//     grpcbudget and connectbudget modules are built on StartWork);
//     package limitstest: a handler under test.
//   - ExhaustedError and ErrResourceExhausted: what a refusal carries.
//   - Mode: MEMCTL_BUDGETS=enforce|observe|off, the operator's switch;
//     observe is the safe way to roll budgets out.
//
// Misuse is counted, never a crash of the service (PoolStats.Misuse and
// Leaked, the first of each logged at WARN); PoolConfig.Strict makes it
// panic, for tests.
//
// # Sizing budgets
//
// Run with MEMCTL_BUDGETS=observe: PoolStats.Peaks records each request's
// peak, and PeakHistogram.Above(limit) says how many a budget of limit
// bytes would refuse; PoolConfig.ChargeRatio says when the charges look
// too small. How to pick the pool and the budgets: docs/sizing.md
// (https://github.com/memctl/memctl/blob/main/docs/sizing.md).
//
// # Configuration
//
// PoolConfig, HTTPConfig and MemLimitConfig are structs whose zero value is
// the default, as in the standard library (net/http.Server, tls.Config) and
// packages trim and pressure; only the facade, memctl.Start, takes
// functional options.
package limits
