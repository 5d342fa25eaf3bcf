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
// account in ctx it returns nil, counting the call in PoolStats.Unguarded and
// logging the first at WARN; a negative n is still an error.
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

// WithAccount returns a copy of parent that carries a, and binds a to it: a is
// closed (not a leak) shortly after the returned context ends, and, with
// PoolConfig.CancelLargest, the heap watch may cancel the context with an
// *ExhaustedError as its cause. Grow and Open on a then fail with ErrClosed
// wrapping context.Cause(ctx). Call cancel when the work ends: it closes a (a
// leak counts as in Account.Close).
func WithAccount(parent context.Context, a *Account) (context.Context, context.CancelFunc) {
	ctx, end := withAccount(parent, a)
	return ctx, func() {
		if leak := end(); leak != "" && a.pool.strict {
			panic(leak)
		}
	}
}

// withAccount is WithAccount; end returns the leak a strict pool panics with.
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
