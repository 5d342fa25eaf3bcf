package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// WorkConfig configures Pool.Do and Pool.StartWork: one unit of work (a queue's
// message, an RPC) under an account of its own. Limit must be set.
type WorkConfig struct {
	Limit int64 // the work's budget in bytes, required, as HTTPConfig.Limit
	// Name is the account's name ("jobs/msg-7f3a"). Default: "" (means
	// "req-N", N counting the pool's numbered work from 1).
	Name           string
	BurstThreshold int64 // as HTTPConfig.BurstThreshold
	// AfterBurst is called on the goroutine that ends work that reached
	// BurstThreshold, once its account is closed. Default: nil.
	AfterBurst func()
}

// burstThreshold resolves a BurstThreshold t for a budget of limit bytes.
func burstThreshold(limit, t int64) int64 {
	if t != 0 {
		return t
	}
	if limit != Unlimited {
		return max(min(defaultBurstThreshold, limit/2), 1)
	}
	return defaultBurstThreshold
}

// Work is one unit of work under an account of its own, begun with
// Pool.StartWork and ended with Finish or Abandon. Its methods are safe for
// concurrent use.
type Work struct {
	a          *Account
	ctx        context.Context
	end        func() string // WithAccount's end; nil without CancelLargest, and for nested work
	threshold  int64
	afterBurst func()
	finished   atomic.Bool
}

// StartWork opens an account for one unit of work with cfg.Limit and returns a
// copy of ctx that carries it and the Work whose Finish ends it (bound with
// WithAccount under PoolConfig.CancelLargest). It returns an error matching
// ErrInvalidSize for a cfg.Limit ≤ 0, and ErrClosed when the pool, or an
// account of p that ctx carries, is closed; ctx and a nil Work then. When ctx
// carries an account of p, the work's account is opened from it.
func (p *Pool) StartWork(ctx context.Context, cfg WorkConfig) (context.Context, *Work, error) {
	if err := checkLimit(cfg.Limit, func() string { return "WorkConfig.Limit: StartWork" }); err != nil {
		return ctx, nil, err
	}
	var seq int64
	if cfg.Name == "" {
		seq = p.seq.Add(1) // "req-N", built only if needed
	}
	var a *Account
	var err error
	outer := FromContext(ctx)
	nested := outer != nil && outer.pool == p
	if nested {
		a, err = outer.open(cfg.Name, seq, cfg.Limit)
	} else {
		a, err = p.open(cfg.Name, seq, cfg.Limit)
	}
	if err != nil {
		return ctx, nil, err
	}
	w := &Work{a: a, threshold: burstThreshold(cfg.Limit, cfg.BurstThreshold), afterBurst: cfg.AfterBurst}
	w.begin(ctx, p.cancelLargest && !nested)
	return w.ctx, w, nil
}

// begin sets the work's context: ctx carrying its account, bound with
// WithAccount when bind (which allocates more).
func (w *Work) begin(ctx context.Context, bind bool) {
	if bind {
		w.ctx, w.end = withAccount(ctx, w.a)
	} else {
		w.ctx = NewContext(ctx, w.a)
	}
}

// closeAccount closes the work's account and returns its leak.
func (w *Work) closeAccount() string {
	if w.end != nil {
		return w.end()
	}
	leak := w.a.close(nil)
	w.a.pool.workEnded(w.a)
	return leak
}

// Account returns the work's account.
func (w *Work) Account() *Account { return w.a }

// Finish ends the work: it closes the account, calls WorkConfig.AfterBurst
// when the work reached its burst threshold, and returns err, wrapping the
// cause too when the heap watch canceled the work's context and err (not nil)
// does not match ErrResourceExhausted. A leak counts as in Account.Close. Only
// the first call does anything; a later one returns err unchanged.
func (w *Work) Finish(err error) error { return w.finish(err, true) }

// Abandon ends work that panicked, from a deferred call: Finish(nil), except
// that a leak never panics.
func (w *Work) Abandon() { w.finish(nil, false) }

// finish is Finish; returned is false when the work panicked.
func (w *Work) finish(err error, returned bool) error {
	if !w.finished.CompareAndSwap(false, true) {
		return err
	}
	a, p := w.a, w.a.pool
	reached := a.demand()
	var cause *ExhaustedError
	if p.cancelLargest && err != nil && w.ctx.Err() != nil && !errors.Is(err, ErrResourceExhausted) {
		cause, _ = context.Cause(w.ctx).(*ExhaustedError)
	}
	leak := w.closeAccount()
	if w.threshold > 0 && reached >= w.threshold && w.afterBurst != nil {
		w.afterBurst()
	}
	if leak != "" && p.strict && returned {
		panic(leak)
	}
	if cause != nil {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// Do runs fn under an account of its own (see StartWork) and returns what
// Finish makes of fn's error, or StartWork's error without calling fn. A panic
// in fn closes the account and goes on.
func (p *Pool) Do(ctx context.Context, cfg WorkConfig, fn func(ctx context.Context) error) error {
	ctx, w, err := p.StartWork(ctx, cfg)
	if err != nil {
		return err
	}
	defer w.Abandon() // when fn panics; nothing once Finish ran
	return w.Finish(fn(ctx))
}

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
