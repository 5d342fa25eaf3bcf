// Package limits keeps a Go process inside its memory limit.
//
// # GOMEMLIMIT from the cgroup
//
// SetGoMemLimit sets GOMEMLIMIT to a share (default 0.9) of the cgroup
// memory limit: cgroup v1 (memory.limit_in_bytes and the hierarchy's
// tightest limit) or cgroup v2 (the smallest memory.max of the cgroup and
// its ancestors, with a memory.high under it as a target held above 1.5 x
// the live heap), less what the cgroup is charged that the Go runtime does
// not hold and the kernel cannot reclaim (C heap, other processes'
// anonymous memory, shmem and tmpfs, kernel memory, from memory.stat; the
// page cache is not subtracted), never under a floor (64 MiB), and re-reads
// it at the end of GC cycles at most every 10 s (MemLimiter). Without GOMEMLIMIT the Go
// garbage collector does not know the container's limit, lets the heap grow to
// twice the live heap (GOGC=100) and a burst ends in an OOM kill; with it, the
// collector works harder as the heap nears the limit. The operator wins: a
// GOMEMLIMIT in the environment, or AUTOMEMLIMIT=off, is never overridden,
// and a numeric AUTOMEMLIMIT is the ratio. It returns a MemLimit that says
// what was decided and why.
//
// # Per-request budgets
//
// Go cannot measure one goroutine's memory, so code that builds large
// structures reports them. A Pool is a shared budget in bytes (by default
// half of GOMEMLIMIT; without GOMEMLIMIT, half of 90% of the cgroup memory
// limit or of the physical memory, said in one INFO line: never silently
// unlimited); an Account is one request's share of it, opened with its own
// limit (Unlimited, by name, for none: a limit of 0 is an error), and
// accounts nest (a query's operators under the query). Account.Grow(n)
// returns nil or an *ExhaustedError that matches ErrResourceExhausted and
// carries the bytes asked for, in use and allowed, and the scope
// ("pool/req-17/sort"); it maps to resource_exhausted, HTTP 429 and gRPC code
// 8. Any size past a limit is refused that way, however large; only a
// negative size is ErrInvalidSize. Accounts reserve from the pool in 64 KiB
// chunks, so Grow and Shrink within a chunk cost one atomic add and one
// compare-and-swap (BenchmarkGrowShrink in this package measures them
// against a mutex-based account in the same run).
//
// Misuse is counted, never a crash of the service: a Shrink of more than an
// account grew itself (its children's bytes are theirs) changes nothing and
// counts in PoolStats.Misuse; an account closed with bytes it did not shrink
// counts in PoolStats.Leaked; the first of each is logged at WARN. With
// PoolConfig.Strict (for tests) both panic, once every lock is released.
// Closing an account closes the accounts opened from it; closing the pool
// makes every account refuse. A limits.Grow whose context carries no account
// counts in PoolStats.Unguarded.
//
// Pool.Middleware opens an account per HTTP request, carries it in the
// request's context (limits.Grow(ctx, n)), closes it when the handler
// returns, and calls HTTPConfig.AfterBurst after a request whose peak (or a
// refused Grow) reached its burst threshold (64 MiB, or half the request's
// limit when that is smaller); WriteError answers a budget error with 429,
// {"code":"resource_exhausted","message":...}, and Retry-After when a retry
// can succeed (a full pool, heap pressure) but not when it cannot (a request
// over its own budget).
//
// Accounting sees only what code reports, so the pool also watches the real
// heap: at the end of each GC cycle (a collector hook, no goroutine or
// timer), a live heap above 90% of GOMEMLIMIT makes every Grow that needs
// more from the pool fail and, with PoolConfig.CancelLargest, cancels the
// context of the largest request, if it holds at least 5% of the live heap,
// with ErrResourceExhausted as the cause; pressure from memory outside the
// accounts is logged once at WARN instead. When the canceled request ends,
// the pool runs one GC cycle at once, so that small requests are served
// again within milliseconds instead of waiting for a GC that refused
// requests do not cause.
//
// # Configuration
//
// PoolConfig, HTTPConfig and MemLimitConfig are structs whose zero value is
// the default, as in the standard library (net/http.Server, tls.Config) and
// packages trim and pressure; only the facade, memctl.Start, takes
// functional options.
//
// # Environment
//
// The operator switches budgets with MEMCTL_BUDGETS, read by NewPool (spaces
// trimmed, any case):
//
//   - enforce (also on, yes, true, 1, t; the default when unset): refuse;
//   - observe: account, count (PoolStats.Observed) and log, at most once per
//     ObserveLogInterval, what would have been refused, without refusing:
//     the safe way to roll budgets out;
//   - off (also no, false, 0, f): refuse nothing, run no heap watch.
//
// MEMCTL=off turns budgets off too. Any other value is logged at WARN and
// budgets are enforced, where memctl's other switches turn their part off:
// a budget is a limit, and a typo must not lift it.
package limits
