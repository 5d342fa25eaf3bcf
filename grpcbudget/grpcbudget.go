// Package grpcbudget gives each gRPC call a memory budget of its own from a
// limits.Pool, and answers a budget error with RESOURCE_EXHAUSTED (code 8),
// as the net/http middleware (limits.Pool.Middleware) answers it with 429.
//
// It is a module of its own (github.com/memctl/memctl/grpcbudget), so that
// the memctl module does not depend on google.golang.org/grpc; only a
// program that imports this package does.
//
//	pool, _ := limits.NewPool(limits.PoolConfig{Name: "grpc", CancelLargest: true})
//	opts, _ := grpcbudget.ServerOptions(pool, grpcbudget.Config{Limit: 64 << 20, AfterBurst: memctl.AfterBurst})
//	srv := grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(64<<20))...) // first: before other interceptors
//
// A handler charges what it builds to the call's account with
// limits.Grow(ctx, n) and returns the error, as is or wrapped with %w:
//
//	if err := limits.Grow(ctx, 8*int64(n)); err != nil {
//		return nil, fmt.Errorf("sort: %w", err)
//	}
//	defer limits.Shrink(ctx, 8*int64(n))
//
// # Messages
//
// In grpc-go a request is received and unmarshaled before any interceptor
// runs, so a large message costs its wire bytes and its decoded form
// before an interceptor could refuse it. ServerOptions charges each
// message's size to the call's account before it is unmarshaled: a
// refused message gets code 8 and is never unmarshaled, and the handler
// does not run. The wire bytes are still read first, up to
// grpc.MaxRecvMsgSize per message: set it to the per-call budget.
// UnaryServerInterceptor and StreamServerInterceptor alone open each call's
// account once the request is unmarshaled.
//
// # What the client sees
//
// The interceptors map every error that matches limits.ErrResourceExhausted
// (a refused Grow, as is or wrapped; the ErrClosed error of a Grow after the
// heap watch canceled the call), and any error the handler returns after
// the heap watch canceled the call's context (PoolConfig.CancelLargest; a
// handler that returns ctx.Err() then would otherwise send CANCELLED, which
// reads as "the caller gave up"), to status code 8 RESOURCE_EXHAUSTED with
// the error's text as the message: the scope and the sizes, for example
// "limits: resource_exhausted in grpc/req-17: requested 1073741824 bytes, 0
// in use, limit 67108864". Other errors pass unchanged.
//
// A handler that wraps the budget error in a status of its own with another
// code (an error chain holding both, such as fmt.Errorf("%w: %w",
// status.Error(codes.InvalidArgument, ...), err)) keeps its code: only
// UNKNOWN (a plain error), CANCELLED (a context's end, as
// status.FromContextError makes it) and RESOURCE_EXHAUSTED itself become
// code 8. A budget error only written into a status's text
// (status.Errorf(codes.Internal, "%v", err)) is no longer an error value
// and passes unchanged.
//
// When a retry can succeed (limits.ExhaustedError.RetryAfter: the pool was
// full or under heap pressure, or the heap watch canceled the call), the
// status carries the trailer grpc-retry-pushback-ms (gRFC A6) with that
// wait in milliseconds (1000); when it cannot (the call was over its own
// budget, or asked for more than the whole pool) the trailer is -1
// (NoRetryPushback), which gRFC A6 defines as "do not retry": the same rule
// as the middleware's Retry-After, which is sent only where a retry can
// succeed. A pushback a streaming handler set itself (ServerStream.SetTrailer) stands
// and the interceptor adds none: grpc-go retries nothing on a trailer with
// two values. A unary handler that returns a budget error must leave the
// pushback to the interceptor, which cannot see its grpc.SetTrailer.
//
// A call whose account's peak, or a refused Grow, reached the burst
// threshold ends a burst (Config.AfterBurst) after the handler returns, as
// in the middleware. When the pool is closed, a call is answered with
// UNAVAILABLE without running the handler. A call whose context already
// carries an account of the same pool (a gRPC server behind the pool's
// HTTP middleware) is nested in it (see limits.Pool.StartWork); when that
// account was closed by the heap watch's cancel, the call is answered as a
// budget error, without running the handler.
//
// What the interceptors and ServerOptions cost a call (allocations, and
// the time of a 1 KiB call): docs/benchmarks.md.
package grpcbudget

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/memctl/memctl/limits"
)

// PushbackKey is the trailer that carries the server's retry pushback, in
// milliseconds (gRFC A6: "grpc-retry-pushback-ms").
const PushbackKey = "grpc-retry-pushback-ms"

// NoRetryPushback is the pushback sent when a retry cannot succeed: gRFC
// A6 says a client must not retry on a negative pushback.
const NoRetryPushback = "-1"

// Config configures the interceptors. Limit must be set; the other fields'
// zero values name accounts "req-N" and call no burst hook.
type Config struct {
	// Limit is each call's budget in bytes, required: 0 (the zero value)
	// and negative values are errors (limits.ErrInvalidSize), so that a
	// forgotten budget is not silently unlimited. limits.Unlimited asks for
	// calls limited by the pool alone.
	Limit int64
	// Name returns the account name for a call, given its full method
	// ("/package.Service/Method"): the element after the pool's name in
	// error scopes. Default: nil (means "req-N", N counting the pool's
	// numbered work from 1).
	Name func(fullMethod string) string
	// BurstThreshold is the size, in bytes, at or above which a call ends
	// a burst; see limits.HTTPConfig.BurstThreshold (default 64 MiB, or
	// Limit/2 when smaller; negative: never).
	BurstThreshold int64
	// AfterBurst is called, on the call's goroutine, after a call that
	// reached BurstThreshold, once its account is closed; pass
	// memctl.AfterBurst. Default: nil (nothing is called).
	AfterBurst func()
	// Codec unmarshals and marshals messages when ServerOptions charges
	// them before they are unmarshaled; the interceptors alone ignore it.
	// Default: nil (grpc-go's protobuf codec, encoding.GetCodecV2("proto")).
	Codec encoding.CodecV2
}

func (c Config) check() error {
	if c.Limit <= 0 {
		return fmt.Errorf("grpcbudget: %w: Config.Limit %d: pass a limit in bytes, or limits.Unlimited for calls limited by the pool alone", limits.ErrInvalidSize, c.Limit)
	}
	return nil
}

func (c Config) work(method string) limits.WorkConfig {
	w := limits.WorkConfig{Limit: c.Limit, BurstThreshold: c.BurstThreshold, AfterBurst: c.AfterBurst}
	if c.Name != nil {
		w.Name = c.Name(method)
	}
	return w
}

// UnaryServerInterceptor returns a unary server interceptor that runs each
// call under an account of its own from pool (limits.Pool.StartWork), with
// cfg.Limit bytes, and maps budget errors as the package doc says. Alone,
// it opens the account once the request message is unmarshaled; for
// messages charged before that, use ServerOptions instead. It returns an
// error matching limits.ErrInvalidSize for a cfg.Limit that is 0 or
// negative. The interceptor is safe for concurrent use.
func UnaryServerInterceptor(pool *limits.Pool, cfg Config) (grpc.UnaryServerInterceptor, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return newBudget(pool, cfg).unary, nil
}

func (b *budget) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	setTrailer := func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }
	c := callFrom(ctx, b)
	var w *limits.Work
	wctx := ctx
	switch {
	case c != nil && c.startErr != nil:
		return nil, startError(c.startErr, setTrailer)
	case c != nil:
		w = c.w // the stats handler opened it: ctx carries it
		if err := c.settle(); err != nil {
			// The request was refused before it was unmarshaled, or
			// could not be: the handler does not run.
			c.release()
			return nil, b.answer(w.Finish(err), err, setTrailer)
		}
	default:
		if wctx, w, err = b.pool.StartWork(ctx, b.cfg.work(info.FullMethod)); err != nil {
			return nil, startError(err, setTrailer)
		}
	}
	returned := false
	defer func() {
		if !returned {
			if c != nil {
				c.release()
			}
			w.Abandon() // the handler panicked: close the account, let its panic go on
		}
	}()
	resp, err = handler(wctx, req)
	returned = true
	if c != nil {
		c.release()
	}
	if err = w.Finish(err); isBudget(err) {
		return nil, b.answer(err, err, setTrailer)
	}
	return resp, err
}

// answer returns the status of a call's error: budgetStatus's for a budget
// error, with the pushback trailer set unless set is nil; otherwise orig,
// the error as the handler returned it.
func (b *budget) answer(err, orig error, setTrailer func(metadata.MD)) error {
	st, pushback := budgetStatus(err)
	if st == nil {
		return orig
	}
	if pushback != "" && setTrailer != nil {
		setTrailer(metadata.Pairs(PushbackKey, pushback))
	}
	return st.Err()
}

// isBudget reports whether budgetStatus maps err.
func isBudget(err error) bool { st, _ := budgetStatus(err); return st != nil }

// StreamServerInterceptor returns a stream server interceptor that runs
// each streaming call under an account of its own from pool, whose context
// (ServerStream.Context) carries the account, and maps budget errors as
// UnaryServerInterceptor does. With ServerOptions, RecvMsg returns the
// error of a message the budget refused before it was unmarshaled (it
// matches limits.ErrResourceExhausted and carries code 8). It returns an
// error matching limits.ErrInvalidSize for a cfg.Limit that is 0 or
// negative. The interceptor is safe for concurrent use.
func StreamServerInterceptor(pool *limits.Pool, cfg Config) (grpc.StreamServerInterceptor, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return newBudget(pool, cfg).stream, nil
}

func (b *budget) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	c := callFrom(ss.Context(), b)
	var w *limits.Work
	wctx := ss.Context()
	switch {
	case c != nil && c.startErr != nil:
		return startError(c.startErr, ss.SetTrailer)
	case c != nil:
		w = c.w
	default:
		if wctx, w, err = b.pool.StartWork(ss.Context(), b.cfg.work(info.FullMethod)); err != nil {
			return startError(err, ss.SetTrailer)
		}
	}
	returned := false
	defer func() {
		if !returned {
			if c != nil {
				c.release()
			}
			w.Abandon()
		}
	}()
	wrapped := &stream{ServerStream: ss, ctx: wctx, c: c}
	err = handler(srv, wrapped)
	returned = true
	if c != nil {
		c.release()
	}
	ferr := w.Finish(err)
	if !isBudget(ferr) {
		return err
	}
	if wrapped.set.Load() {
		return b.answer(ferr, err, nil) // the handler's pushback stands
	}
	return b.answer(ferr, err, ss.SetTrailer)
}

// startError is the status of a call whose account could not be opened:
// UNAVAILABLE when the pool is closed; the budget error's status when the
// call runs inside work of the same pool whose context the heap watch
// canceled (ErrClosed wrapping the cancel's cause).
func startError(err error, setTrailer func(metadata.MD)) error {
	if st, pushback := budgetStatus(err); st != nil {
		if pushback != "" {
			setTrailer(metadata.Pairs(PushbackKey, pushback))
		}
		return st.Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

// stream is a ServerStream whose context carries the call's account and
// which records whether the handler set the pushback trailer itself: its
// value then stands, and the interceptor adds none (grpc-go does not retry
// on a trailer with two values, whatever they are).
type stream struct {
	grpc.ServerStream
	ctx context.Context
	c   *call // with ServerOptions: the messages' refusals
	set atomic.Bool
}

func (s *stream) Context() context.Context { return s.ctx }

// RecvMsg receives a message, and returns the error of one the budget
// refused or that could not be unmarshaled (ServerOptions).
func (s *stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil || s.c == nil {
		return err
	}
	if err := s.c.settle(); err != nil {
		if isBudget(err) {
			return refusal{err}
		}
		return err
	}
	return nil
}

func (s *stream) SetTrailer(md metadata.MD) {
	if len(md.Get(PushbackKey)) > 0 {
		s.set.Store(true)
	}
	s.ServerStream.SetTrailer(md)
}

// Status returns the status a budget error maps to, RESOURCE_EXHAUSTED with
// err.Error() as the message, and the value of the retry pushback trailer
// in milliseconds: the wait when a retry can succeed, "-1" when it cannot
// (gRFC A6: a negative pushback means do not retry), "" when err carries no
// *limits.ExhaustedError to tell. For nil, an error that does not match
// limits.ErrResourceExhausted, and an error that carries a gRPC status the
// handler built with a code of its own (other than UNKNOWN, CANCELLED and
// RESOURCE_EXHAUSTED), it returns nil and "": that error is the answer.
// For handlers that answer outside the interceptors. Safe for concurrent
// use.
func Status(err error) (st *status.Status, pushback string) { return budgetStatus(err) }

// grpcStatus is what status.FromError looks for in an error's chain.
type grpcStatus interface {
	error
	GRPCStatus() *status.Status
}

func budgetStatus(err error) (*status.Status, string) {
	if err == nil || !errors.Is(err, limits.ErrResourceExhausted) {
		return nil, ""
	}
	if s, ok := errors.AsType[grpcStatus](err); ok {
		switch s.GRPCStatus().Code() {
		case codes.Unknown, codes.Canceled, codes.ResourceExhausted:
			// UNKNOWN and CANCELLED are what a plain error and a context's
			// end become (status.FromContextError, after the heap watch's
			// cancel): not a code chosen for the budget error.
		default:
			return nil, "" // the handler chose a code: its answer stands
		}
	}
	e, ok := errors.AsType[*limits.ExhaustedError](err)
	var pushback string
	switch {
	case !ok:
	case e.RetryAfter > 0:
		pushback = strconv.FormatInt(int64((e.RetryAfter+time.Millisecond-1)/time.Millisecond), 10)
	default:
		pushback = NoRetryPushback
	}
	return status.New(codes.ResourceExhausted, err.Error()), pushback
}
