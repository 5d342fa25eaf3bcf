// Package limits keeps a Go process inside its memory limit: GOMEMLIMIT from
// the cgroup memory limit (SetGoMemLimit, MemLimiter), and per-request memory
// budgets that refuse the request that would exceed its share with
// resource_exhausted (HTTP 429, gRPC code 8) instead of letting the OOM killer
// end the process.
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
// Jobs and RPCs use Pool.Do or Pool.StartWork; package limitstest budgets a
// handler under test; docs/budgets.md is the guide. MEMCTL_BUDGETS=observe
// (see Mode) refuses nothing and records what budgets would refuse. Misuse is
// counted, never a crash (PoolConfig.Strict makes it panic, for tests). The
// zero value of each Config struct is its default.
package limits
