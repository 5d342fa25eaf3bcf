package limits

import (
	"context"
	"fmt"
	"log/slog"
)

type accountKey struct{}

// NewContext returns a copy of ctx that carries a; Grow, Shrink and
// FromContext on it use a. It does not tie a's lifetime to ctx (see
// WithAccount).
func NewContext(ctx context.Context, a *Account) context.Context {
	return context.WithValue(ctx, accountKey{}, a)
}

// FromContext returns the account ctx carries, or nil when it carries none.
func FromContext(ctx context.Context) *Account {
	a, _ := ctx.Value(accountKey{}).(*Account)
	return a
}

// Grow charges n bytes to the account in ctx (see Account.Grow). With no
// account in ctx it counts nothing and returns nil, so that code written for
// budgets runs unchanged where none is configured; the call is counted in
// PoolStats.Unguarded, and the first one in the process is logged at WARN
// through slog.Default, so that a handler left outside the middleware shows
// up. A negative n is still an error matching ErrInvalidSize. A handler
// that charges a request body's size checks http.Request.ContentLength
// first: net/http sets it to -1 when the length is unknown (a chunked
// upload), and Grow(-1) is that error (a 500), not resource_exhausted.
func Grow(ctx context.Context, n int64) error {
	if a := FromContext(ctx); a != nil {
		return a.Grow(n)
	}
	if n < 0 {
		return fmt.Errorf("%w: Grow(%d): negative size", ErrInvalidSize, n)
	}
	if unguarded.Add(1) == 1 {
		slog.Default().Warn("limits: Grow on a context with no account: this request has no budget " +
			"(wrap the handler with Pool.Middleware, or bind an account with WithAccount); " +
			"counted in PoolStats.Unguarded, only the first is logged")
	}
	return nil
}

// Shrink returns n bytes to the account in ctx (see Account.Shrink); with no
// account in ctx it does nothing.
func Shrink(ctx context.Context, n int64) {
	if a := FromContext(ctx); a != nil {
		a.Shrink(n)
	}
}

// WithAccount returns a copy of parent that carries a, and binds a to it:
//   - a is closed when the returned context ends (parent canceled, or the
//     returned cancel called), so its bytes go back to the pool even if the
//     code that opened it forgets;
//   - with PoolConfig.CancelLargest, the pool's heap watch may cancel the
//     returned context with an *ExhaustedError as its cause
//     (context.Cause(ctx) matches ErrResourceExhausted).
//
// When a is closed because the context ended (not by cancel or Close), a
// later Grow or Open on it fails with an error that matches ErrClosed and
// also wraps context.Cause(ctx): ErrResourceExhausted after a heap-pressure
// cancel, so WriteError answers it with 429; context.Canceled when the
// parent was canceled (for a net/http request: the client went away). The
// context's end reaches a shortly after it happens (context.AfterFunc runs
// the close on its own goroutine), so a Grow in between may still succeed.
// Such a close is not a leak (see Account.Close): the work may still run.
//
// Calling cancel closes a before it returns (a leak then counts as in
// Account.Close, and panics in strict mode) and releases the context's
// resources; call it when the work ends, as with context.WithCancel. Under
// heap pressure, after a heap-pressure cancel or when the work held a large
// share of the heap (PoolConfig.CancelShare), calling it also tells the pool
// that the memory of the work is free: the pool runs a GC cycle at once (on
// a goroutine that exits) so that the pressure reading is fresh.
func WithAccount(parent context.Context, a *Account) (context.Context, context.CancelFunc) {
	ctx, end := withAccount(parent, a)
	return ctx, func() {
		if leak := end(); leak != "" && a.pool.strict {
			panic(leak)
		}
	}
}

// withAccount is WithAccount; end returns the leak a strict pool panics
// with, so that the middleware can finish its work first.
func withAccount(parent context.Context, a *Account) (context.Context, func() (leak string)) {
	ctx, cancel := context.WithCancelCause(parent)
	if a.pool.cancelLargest {
		a.pool.list(a, cancel)
	}
	stop := context.AfterFunc(ctx, func() { a.close(context.Cause(ctx)) })
	return NewContext(ctx, a), func() string {
		stop()
		var cause error
		if ctx.Err() != nil {
			cause = context.Cause(ctx) // ended before the work did
		}
		leak := a.close(cause)
		cancel(context.Canceled)
		a.pool.workEnded(a)
		return leak
	}
}
