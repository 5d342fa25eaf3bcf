package limits

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// WorkConfig configures Pool.Do and Pool.StartWork: one unit of work under
// an account of its own, such as a message of a queue consumer, a step of a
// batch, or an RPC (the gRPC and Connect interceptors of the modules
// github.com/memctl/memctl/grpcbudget and .../connectbudget are built on
// StartWork). Limit must be set; the other fields' zero values name the
// account "req-N" and call no burst hook.
type WorkConfig struct {
	// Limit is the work's budget in bytes, required: 0 (the zero value) and
	// negative values are errors, as HTTPConfig.Limit. Unlimited asks for
	// work limited by the pool alone.
	Limit int64
	// Name is the account's name, the element after the pool's name in
	// error scopes (for example a message ID: "jobs/msg-7f3a"). Default: ""
	// (means "req-N", N counting the pool's numbered work from 1).
	Name string
	// BurstThreshold is the size, in bytes, at or above which the work ends
	// a burst: the rule, the default (64 MiB, or Limit/2 when smaller) and
	// the meaning of a negative value are HTTPConfig.BurstThreshold's.
	BurstThreshold int64
	// AfterBurst is called, on the goroutine that ends the work, after work
	// that reached BurstThreshold, once its account is closed; pass
	// memctl.AfterBurst. Default: nil (nothing is called).
	AfterBurst func()
}

// burstThreshold returns the burst threshold for a budget of limit bytes
// and a configured threshold t (see HTTPConfig.BurstThreshold).
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
// Pool.StartWork and ended with Finish. Its methods are safe for concurrent
// use.
type Work struct {
	a          *Account
	ctx        context.Context
	end        func() string // WithAccount's end; nil without CancelLargest, and for nested work
	mapCause   bool          // CancelLargest: Finish maps the heap watch's cancel
	threshold  int64
	afterBurst func()
	finished   atomic.Bool
}

// StartWork opens an account for one unit of work with cfg.Limit and
// returns a copy of ctx that carries it (limits.Grow(ctx, n) charges it)
// and the Work whose Finish ends it. With PoolConfig.CancelLargest the
// account is bound to a cancelable context of its own (WithAccount) that
// the heap watch may cancel with an *ExhaustedError as its cause. It
// returns an error matching ErrInvalidSize for a cfg.Limit that is negative
// or 0, and ErrClosed when the pool is closed, or when ctx carries an
// account of p that is closed; ctx and a nil Work then. Safe for concurrent
// use.
//
// Work started inside other work of the same pool (ctx carries an account
// of p: a step of a job run with Do, a batch inside an RPC or an HTTP
// request) is nested: its account is opened from that account
// (Account.Open; scope "jobs/req-1/req-2"), so that what it holds counts
// against the outer work's budget as well as its own, and in the outer
// work's peak (PoolStats.Peaks, InFlight count it once, as one request).
// The heap watch cancels the outer work's context, which ends the nested
// work's too, and Finish maps that cancel as for the outer work. An account
// of another pool in ctx is not an outer account: the work is top-level in
// p.
//
// Call Finish exactly when the work ends, with the error it returned,
// or Abandon when it panics (defer): the account is open until then, and
// counts in PoolStats.InFlight.
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
	w := &Work{a: a, threshold: burstThreshold(cfg.Limit, cfg.BurstThreshold), afterBurst: cfg.AfterBurst, mapCause: p.cancelLargest}
	if p.cancelLargest && !nested {
		w.ctx, w.end = withAccount(ctx, a)
	} else {
		w.ctx = NewContext(ctx, a)
	}
	return w.ctx, w, nil
}

// Account returns the work's account.
func (w *Work) Account() *Account { return w.a }

// Finish ends the work: it closes the account (its bytes go back to the
// pool, its peak goes into PoolStats.Peaks), calls WorkConfig.AfterBurst
// when the work reached its burst threshold, and returns err, the work's
// own error, or, when the heap watch canceled the work's context
// (PoolConfig.CancelLargest) and err does not match ErrResourceExhausted
// already, an error that wraps both err and the cancel's cause: work that
// returns ctx.Err() after that cancel then returns an error matching
// ErrResourceExhausted (errors.As finds the *ExhaustedError), and still
// context.Canceled. A nil err stays nil: the work finished anyway.
//
// An account closed with bytes still grown counts as a leak, and Finish
// then panics, once all is done, when PoolConfig.Strict is set (see
// Account.Close). Only the first call does anything; a later one returns
// err unchanged.
func (w *Work) Finish(err error) error { return w.finish(err, true) }

// Abandon ends work that panicked, from a deferred call while the panic
// goes on: it does what Finish(nil) does (the account is closed, its bytes
// go back to the pool, a leak is counted and logged), except that a leak
// does not panic in strict mode, so that the work's own panic reaches the
// recovery (for example a gRPC recovery interceptor) unchanged instead of
// the leak's. Only the first call of Finish or Abandon does anything.
func (w *Work) Abandon() { w.finish(nil, false) }

// finish is Finish; returned is false when the work panicked, so that a
// strict leak panic does not replace the work's own.
func (w *Work) finish(err error, returned bool) error {
	if !w.finished.CompareAndSwap(false, true) {
		return err
	}
	a, p := w.a, w.a.pool
	reached := a.demand()
	var cause error
	if w.mapCause && err != nil && w.ctx.Err() != nil && !errors.Is(err, ErrResourceExhausted) {
		if c, ok := context.Cause(w.ctx).(*ExhaustedError); ok {
			cause = c
		}
	}
	var leak string
	if w.end != nil {
		leak = w.end()
	} else {
		leak = a.close(nil)
		p.workEnded(a)
	}
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

// Do runs fn under an account of its own, opened with cfg (see StartWork),
// and returns what Finish makes of fn's error; it returns StartWork's error
// without calling fn when the account cannot be opened. It is the form for
// a queue consumer or a batch step: one call per job, the job's code
// charges what it builds with limits.Grow(ctx, n) and its budget error
// comes back out of Do, matching ErrResourceExhausted. A panic in fn closes
// the account and goes on, unchanged. Safe for concurrent use.
func (p *Pool) Do(ctx context.Context, cfg WorkConfig, fn func(ctx context.Context) error) error {
	ctx, w, err := p.StartWork(ctx, cfg)
	if err != nil {
		return err
	}
	returned := false
	defer func() {
		if !returned {
			w.Abandon()
		}
	}()
	err = fn(ctx)
	returned = true
	return w.Finish(err)
}
