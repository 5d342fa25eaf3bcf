package limits

import (
	"context"
	"fmt"
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
// budgets runs unchanged where none is configured; a negative n is still an
// error matching ErrInvalidSize.
func Grow(ctx context.Context, n int64) error {
	if a := FromContext(ctx); a != nil {
		return a.Grow(n)
	}
	if n < 0 {
		return fmt.Errorf("%w: Grow(%d): negative size", ErrInvalidSize, n)
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
// Calling cancel closes a before it returns and releases the context's
// resources; call it when the work ends, as with context.WithCancel.
func WithAccount(parent context.Context, a *Account) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	if a.pool.cancelLargest {
		a.pool.list(a, cancel)
	}
	stop := context.AfterFunc(ctx, a.Close)
	return NewContext(ctx, a), func() {
		stop()
		a.Close()
		cancel(context.Canceled)
	}
}
