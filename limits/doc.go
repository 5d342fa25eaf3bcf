// Package limits keeps a Go process inside its memory limit.
//
// # GOMEMLIMIT from the cgroup
//
// SetGoMemLimit sets GOMEMLIMIT to a share (default 0.9) of the cgroup
// memory limit: cgroup v1 (memory.limit_in_bytes and the hierarchy's
// tightest limit) or cgroup v2 (the smallest memory.max or memory.high of
// the cgroup and its ancestors), less the memory outside the Go runtime (C
// heap), never under a floor (64 MiB), and re-reads it at the end of GC
// cycles at most every 10 s (MemLimiter). Without GOMEMLIMIT the Go
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
// half of GOMEMLIMIT); an Account is one request's share of it, opened with
// its own limit (0: it only counts), and accounts nest (a query's operators
// under the query). Account.Grow(n) returns nil or an *ExhaustedError that
// matches ErrResourceExhausted and carries the bytes asked for, in use and
// allowed, and the scope ("pool/req-17/sort"); it maps to
// resource_exhausted, HTTP 429 and gRPC code 8. Accounts reserve from the
// pool in 64 KiB chunks, so Grow and Shrink within a chunk cost one
// compare-and-swap each (about 13 ns a pair against 45 ns for a mutex-based
// account, BenchmarkGrowShrink in this package).
//
// Pool.Middleware opens an account per HTTP request, carries it in the
// request's context (limits.Grow(ctx, n)), closes it when the handler
// returns, and calls HTTPConfig.AfterBurst after a request whose peak (or a
// refused Grow) reached its burst threshold (64 MiB, or half the request's
// limit when that is smaller); WriteError answers a budget error with 429 and
// {"code":"resource_exhausted","message":...}.
//
// Accounting sees only what code reports, so the pool also watches the real
// heap: at the end of each GC cycle (a collector hook, no goroutine or
// timer), a live heap above 90% of GOMEMLIMIT makes every Grow that needs
// more from the pool fail and, with PoolConfig.CancelLargest, cancels the
// context of the largest request with ErrResourceExhausted as the cause.
package limits
