// Package connectbudget gives each Connect call (connectrpc.com/connect:
// the Connect, gRPC and gRPC-Web protocols) a memory budget of its own from
// a limits.Pool, and answers a budget error with
// connect.CodeResourceExhausted (HTTP 429 in the Connect protocol, status 8
// in gRPC), as limits.Pool.Middleware answers it with 429. It is a module
// of its own, so that the memctl module does not depend on
// connectrpc.com/connect.
//
//	pool, _ := limits.NewPool(limits.PoolConfig{Name: "connect", CancelLargest: true})
//	budget, _ := connectbudget.HandlerOptions(pool, connectbudget.Config{Limit: 64 << 20, AfterBurst: memctl.AfterBurst})
//	path, handler := storev1connect.NewStoreHandler(srv, budget, connect.WithReadMaxBytes(64<<20)) // budget first
//
// A handler charges what it builds with limits.Grow(ctx, n) and returns the
// error as is or wrapped with %w. HandlerOptions charges each request
// message before it is unmarshaled (docs/budgets.md); NewInterceptor's
// interceptor alone opens the account once the request is unmarshaled.
//
// A call gets resource_exhausted, with the error's text as the message, for
// an error matching limits.ErrResourceExhausted (unless inside a
// *connect.Error of the handler's own code other than unknown and
// canceled) and for any error after the heap watch canceled its context
// (PoolConfig.CancelLargest). When a retry can succeed
// (limits.ExhaustedError.RetryAfter), the error's metadata carry
// Retry-After in whole seconds and grpc-retry-pushback-ms in milliseconds;
// when it cannot, grpc-retry-pushback-ms is NoRetryPushback. When the pool
// is closed a call gets connect.CodeUnavailable. A call whose context
// carries an account of the same pool is nested in it
// (limits.Pool.StartWork). Client-side calls pass through.
package connectbudget

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/memctl/memctl/internal/budgetrpc"
	"github.com/memctl/memctl/limits"
)

// The retry pushback of gRFC A6: PushbackKey, "grpc-retry-pushback-ms", is
// the metadata key of the pushback in milliseconds, and NoRetryPushback,
// "-1", the pushback when a retry cannot succeed ("do not retry").
const (
	PushbackKey     = budgetrpc.PushbackKey
	NoRetryPushback = budgetrpc.NoRetryPushback
)

// Config configures NewInterceptor and HandlerOptions.
type Config struct {
	// Limit is each call's budget in bytes, required: 0 and negative values
	// are errors (limits.ErrInvalidSize). limits.Unlimited leaves calls
	// limited by the pool alone.
	Limit int64
	// Name returns the account name of a call given its procedure
	// ("/package.Service/Method"). Default: nil ("req-N").
	Name func(procedure string) string
	// BurstThreshold is the size in bytes at or above which a call ends a
	// burst, as limits.HTTPConfig.BurstThreshold (default 64 MiB, or
	// Limit/2 when smaller; negative: never).
	BurstThreshold int64
	// AfterBurst is called on the call's goroutine, once its account is
	// closed, after a call that reached BurstThreshold; pass
	// memctl.AfterBurst. Default: nil (none).
	AfterBurst func()
	// Codecs marshal and unmarshal messages under HandlerOptions, each
	// under its own name. Default: nil (connect's: "proto", "json" and
	// "json; charset=utf-8").
	Codecs []connect.Codec
}

// interceptor is the connect.Interceptor of NewInterceptor and HandlerOptions.
type interceptor struct {
	pool *limits.Pool
	work budgetrpc.Config
	messages
}

// NewInterceptor returns an interceptor, safe for concurrent use, that runs
// each handler call under an account of its own from pool
// (limits.Pool.StartWork) with cfg.Limit bytes and maps budget errors as
// the package doc says; pass it with connect.WithInterceptors. It returns
// an error matching limits.ErrInvalidSize for a cfg.Limit of 0 or less.
func NewInterceptor(pool *limits.Pool, cfg Config) (connect.Interceptor, error) {
	i, err := newInterceptor(pool, cfg)
	if err != nil {
		return nil, err
	}
	return i, nil
}

func newInterceptor(pool *limits.Pool, cfg Config) (*interceptor, error) {
	w := budgetrpc.Config{Limit: cfg.Limit, Name: cfg.Name, BurstThreshold: cfg.BurstThreshold, AfterBurst: cfg.AfterBurst}
	if err := w.Check("connectbudget"); err != nil {
		return nil, err
	}
	return &interceptor{pool: pool, work: w}, nil
}

func (i *interceptor) start(ctx context.Context, procedure string) (context.Context, *limits.Work, error) {
	ctx, work, err := i.pool.StartWork(ctx, i.work.Work(procedure))
	if err != nil {
		if e := Error(err); e != nil {
			return ctx, nil, e // inside work of the pool that the heap watch canceled
		}
		return ctx, nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return ctx, work, nil
}

// run is budgetrpc.Run with the error Finish's maps to, if any.
func run(w *limits.Work, release func(), handler func() error) (budget *connect.Error, err error) {
	err, ferr := budgetrpc.Run(w, release, handler)
	return Error(ferr), err
}

// WrapUnary budgets a unary handler call; a client call passes through.
func (i *interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		if i.charging {
			if p := i.take(req.Any()); p != nil {
				if p.err != nil || limits.FromContext(ctx) == nil {
					return i.unaryCharged(ctx, req, next, p)
				}
				// Inside other work (the pool's HTTP middleware): nest
				// in it, as without the codec, and end the codec's work.
				p.charge.Release()
				p.w.Finish(nil)
			}
		}
		wctx, w, err := i.start(ctx, req.Spec().Procedure)
		if err != nil {
			return nil, err
		}
		return unary(w, func() {}, func() (connect.AnyResponse, error) { return next(wctx, req) })
	}
}

// unary is run for a unary handler.
func unary(w *limits.Work, release func(), handler func() (connect.AnyResponse, error)) (connect.AnyResponse, error) {
	var resp connect.AnyResponse
	budget, err := run(w, release, func() (err error) {
		resp, err = handler()
		return err
	})
	if budget != nil {
		return nil, budget
	}
	return resp, err
}

// unaryCharged runs a unary call whose message the codec charged, or
// refused, under the work it opened (HandlerOptions).
func (i *interceptor) unaryCharged(ctx context.Context, req connect.AnyRequest, next connect.UnaryFunc, p *parked) (connect.AnyResponse, error) {
	if p.err != nil {
		return nil, Error(p.w.Finish(p.err)) // refused before it was unmarshaled
	}
	wctx := limits.NewContext(ctx, p.w.Account())
	if p.wctx.Done() != nil {
		// CancelLargest: the handler's context ends with the work's.
		var cancel context.CancelCauseFunc
		wctx, cancel = context.WithCancelCause(wctx)
		stop := context.AfterFunc(p.wctx, func() { cancel(context.Cause(p.wctx)) })
		defer func() {
			stop()
			cancel(context.Canceled)
		}()
	}
	return unary(p.w, p.charge.Release, func() (connect.AnyResponse, error) { return next(wctx, req) })
}

// WrapStreamingClient returns next: client streams are not budgeted.
func (i *interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler budgets a streaming handler call: the context passed
// to the handler carries the call's account.
func (i *interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		wctx, w, err := i.start(ctx, conn.Spec().Procedure)
		if err != nil {
			return err
		}
		release := func() {}
		if i.charging {
			bc := &budgetConn{StreamingHandlerConn: conn, i: i, charge: budgetrpc.Charge{A: w.Account()}}
			conn, release = bc, bc.charge.Release
		}
		budget, err := run(w, release, func() error { return next(wctx, conn) })
		if budget != nil {
			return budget
		}
		return err
	}
}

// Error returns the *connect.Error a budget error maps to, with the retry
// metadata, as the package doc says (a *connect.Error of
// CodeResourceExhausted in err is returned itself); nil for any other
// error. For handlers that answer outside the interceptor.
func Error(err error) *connect.Error {
	if err == nil || !errors.Is(err, limits.ErrResourceExhausted) {
		return nil
	}
	out, ok := errors.AsType[*connect.Error](err)
	switch {
	case ok && out.Code() == connect.CodeResourceExhausted:
		// The handler answered with the code itself: its error, with the pushback.
	case !ok || out.Code() == connect.CodeUnknown || out.Code() == connect.CodeCanceled:
		out = connect.NewError(connect.CodeResourceExhausted, err)
	default:
		return nil // the handler chose a code: its answer stands
	}
	pushback, retryAfter := budgetrpc.Pushback(err)
	if retryAfter != "" && out.Meta().Get("Retry-After") == "" {
		out.Meta().Set("Retry-After", retryAfter)
	}
	if pushback != "" && out.Meta().Get(PushbackKey) == "" {
		out.Meta().Set(PushbackKey, pushback)
	}
	return out
}
