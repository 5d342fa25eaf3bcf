// Package connectbudget gives each Connect call (connectrpc.com/connect:
// the Connect, gRPC and gRPC-Web protocols) a memory budget of its own from
// a limits.Pool, and answers a budget error with connect.CodeResourceExhausted
// (HTTP 429 in the Connect protocol, status 8 in gRPC), as the net/http
// middleware (limits.Pool.Middleware) answers it with 429.
//
// It is a module of its own (github.com/memctl/memctl/connectbudget), so
// that the memctl module does not depend on connectrpc.com/connect.
//
//	pool, _ := limits.NewPool(limits.PoolConfig{Name: "connect", CancelLargest: true})
//	budget, _ := connectbudget.HandlerOptions(pool, connectbudget.Config{Limit: 64 << 20, AfterBurst: memctl.AfterBurst})
//	path, handler := storev1connect.NewStoreHandler(srv, budget, connect.WithReadMaxBytes(64<<20)) // budget first
//
// A handler charges what it builds with limits.Grow(ctx, n) and returns the
// error as is or wrapped with %w.
//
// # Messages
//
// connect-go unmarshals a unary request before any interceptor runs.
// HandlerOptions charges each request message's size to the call's account
// before it is unmarshaled: a refused message gets resource_exhausted, is
// never unmarshaled, and the handler does not run. The message is still
// read (and decompressed) first, up to connect.WithReadMaxBytes: set it to
// the per-call budget. NewInterceptor's interceptor alone opens the account
// once the request is unmarshaled.
//
// # What the client sees
//
// The interceptor maps to connect.CodeResourceExhausted every error that
// matches limits.ErrResourceExhausted (a refused Grow, as is, wrapped or
// joined, or inside a *connect.Error of code unknown, canceled or
// resource_exhausted; a Grow's ErrClosed after the heap watch canceled the
// call), and any error the handler returns after the heap watch canceled
// the call's context (PoolConfig.CancelLargest; ctx.Err() would otherwise
// send canceled, HTTP 499). The message is the error's text, for example
// "limits: resource_exhausted in connect/req-17: requested 1073741824
// bytes, 0 in use, limit 67108864". Other errors pass unchanged.
//
// A budget error inside a *connect.Error of a code the handler chose
// (connect.NewError(connect.CodeInvalidArgument, err), or the catch-all
// CodeInternal) keeps that code: only CodeUnknown, CodeCanceled (a
// context's end) and CodeResourceExhausted become resource_exhausted.
//
// When a retry can succeed (limits.ExhaustedError.RetryAfter: the pool was
// full or under heap pressure, or the heap watch canceled the call), the
// error's metadata carry Retry-After in whole seconds (RFC 9110; a response
// header in Connect) and grpc-retry-pushback-ms in milliseconds (gRFC A6; a
// trailer in gRPC); when it cannot (the call was over its own budget, or
// asked for more than the whole pool), there is no Retry-After and
// grpc-retry-pushback-ms is -1 (NoRetryPushback), gRFC A6's "do not retry":
// the middleware's Retry-After rule.
//
// As in the middleware, a call whose account's peak, or a refused Grow,
// reached the burst threshold ends a burst (Config.AfterBurst) after the
// handler returns. When the pool is closed a call gets
// connect.CodeUnavailable without running the handler. A call whose context
// already carries an account of the same pool (behind the pool's HTTP
// middleware) is nested in it (see limits.Pool.StartWork); if the heap
// watch's cancel closed that account, the call is answered as a budget
// error without running the handler. Client-side calls pass through. What
// the interceptor and the codec cost a call: docs/benchmarks.md.
package connectbudget

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/memctl/memctl/limits"
)

// PushbackKey is the metadata key of the retry pushback in milliseconds
// (gRFC A6: "grpc-retry-pushback-ms").
const PushbackKey = "grpc-retry-pushback-ms"

// NoRetryPushback is the pushback sent when a retry cannot succeed: gRFC
// A6 says a gRPC client must not retry on a negative pushback.
const NoRetryPushback = "-1"

// Config configures NewInterceptor. Limit must be set; the other fields'
// zero values name accounts "req-N" and call no burst hook.
type Config struct {
	// Limit is each call's budget in bytes, required: 0 and negative values
	// are errors (limits.ErrInvalidSize), so that a forgotten budget is not
	// unlimited. limits.Unlimited leaves calls limited by the pool alone.
	Limit int64
	// Name returns the account name of a call given its procedure
	// ("/package.Service/Method"), as it appears in error scopes. Default:
	// nil ("req-N", N counting the pool's numbered work from 1).
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
	// under its own name; the interceptor alone ignores them. Default: nil
	// (protobuf binary, "proto", and JSON, "json" and "json;
	// charset=utf-8", as connect's defaults).
	Codecs []connect.Codec
}

// interceptor is the connect.Interceptor of NewInterceptor and HandlerOptions.
type interceptor struct {
	pool *limits.Pool
	cfg  Config
	messages
}

var _ connect.Interceptor = (*interceptor)(nil)

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
	if cfg.Limit <= 0 {
		return nil, fmt.Errorf("connectbudget: %w: Config.Limit %d: pass a limit in bytes, or limits.Unlimited for calls limited by the pool alone", limits.ErrInvalidSize, cfg.Limit)
	}
	return &interceptor{pool: pool, cfg: cfg}, nil
}

// work returns the WorkConfig of a call of procedure.
func (i *interceptor) work(procedure string) limits.WorkConfig {
	w := limits.WorkConfig{Limit: i.cfg.Limit, BurstThreshold: i.cfg.BurstThreshold, AfterBurst: i.cfg.AfterBurst}
	if i.cfg.Name != nil {
		w.Name = i.cfg.Name(procedure)
	}
	return w
}

func (i *interceptor) start(ctx context.Context, procedure string) (context.Context, *limits.Work, error) {
	ctx, work, err := i.pool.StartWork(ctx, i.work(procedure))
	if err != nil {
		if e := Error(err); e != nil {
			return ctx, nil, e // inside work of the pool that the heap watch canceled
		}
		return ctx, nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return ctx, work, nil
}

// WrapUnary budgets a unary handler call; a client call passes through.
func (i *interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		if i.charges.Load() {
			if p := i.take(req.Any()); p != nil {
				if p.err != nil || limits.FromContext(ctx) == nil {
					return i.unaryCharged(ctx, req, next, p)
				}
				// Inside other work (the pool's HTTP middleware): nest
				// in it, as without the codec, and end the codec's work.
				p.w.Account().Shrink(p.n)
				p.w.Finish(nil)
			}
		}
		wctx, w, err := i.start(ctx, req.Spec().Procedure)
		if err != nil {
			return nil, err
		}
		returned := false
		defer func() {
			if !returned {
				w.Abandon() // the handler panicked: close the account, let its panic go on
			}
		}()
		resp, err := next(wctx, req)
		returned = true
		if e := Error(w.Finish(err)); e != nil {
			return nil, e
		}
		return resp, err
	}
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
	returned := false
	defer func() {
		if !returned {
			p.abandon() // the handler panicked
		}
	}()
	resp, err := next(wctx, req)
	returned = true
	p.w.Account().Shrink(p.n)
	if e := Error(p.w.Finish(err)); e != nil {
		return nil, e
	}
	return resp, err
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
		var bc *budgetConn
		if i.charges.Load() {
			bc = &budgetConn{StreamingHandlerConn: conn, i: i, a: w.Account()}
			conn = bc
		}
		returned := false
		defer func() {
			if !returned {
				if bc != nil {
					bc.release()
				}
				w.Abandon()
			}
		}()
		err = next(wctx, conn)
		returned = true
		if bc != nil {
			bc.release()
		}
		if e := Error(w.Finish(err)); e != nil {
			return e
		}
		return err
	}
}

// Error returns the *connect.Error a budget error maps to:
// connect.CodeResourceExhausted with err.Error() as the message and the
// retry metadata of the package doc. For nil, a non-budget error and one
// wrapping a *connect.Error of the handler's own code it returns nil; a
// *connect.Error with CodeResourceExhausted is returned itself, the
// pushback added. For handlers that answer outside the interceptor. Safe
// for concurrent use.
func Error(err error) *connect.Error {
	if err == nil || !errors.Is(err, limits.ErrResourceExhausted) {
		return nil
	}
	out, ok := errors.AsType[*connect.Error](err)
	switch {
	case !ok:
		out = connect.NewError(connect.CodeResourceExhausted, err)
	case out.Code() == connect.CodeResourceExhausted:
		// The handler answered with the code itself: its error, with the pushback.
	case out.Code() == connect.CodeUnknown || out.Code() == connect.CodeCanceled:
		// A plain error's and a context's end's: not chosen.
		out = connect.NewError(connect.CodeResourceExhausted, err)
	default:
		return nil // the handler chose a code: its answer stands
	}
	e, ok := errors.AsType[*limits.ExhaustedError](err)
	switch {
	case !ok:
	case e.RetryAfter > 0:
		if out.Meta().Get("Retry-After") == "" {
			out.Meta().Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
		}
		if out.Meta().Get(PushbackKey) == "" {
			out.Meta().Set(PushbackKey, strconv.FormatInt(int64((e.RetryAfter+time.Millisecond-1)/time.Millisecond), 10))
		}
	case out.Meta().Get(PushbackKey) == "":
		out.Meta().Set(PushbackKey, NoRetryPushback)
	}
	return out
}
