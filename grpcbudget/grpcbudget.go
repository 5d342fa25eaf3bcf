// Package grpcbudget gives each gRPC call a memory budget of its own from a
// limits.Pool, and answers a budget error with RESOURCE_EXHAUSTED (code 8),
// as the net/http middleware (limits.Pool.Middleware) answers it with 429.
//
// It is a module of its own (github.com/memctl/memctl/grpcbudget), so that
// the memctl module does not depend on google.golang.org/grpc.
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
// grpc-go unmarshals a request before any interceptor runs. ServerOptions
// charges each message's size to the call's account before it is
// unmarshaled: a refused message gets code 8, is never unmarshaled, and the
// handler does not run. The wire bytes are still read first, up to
// grpc.MaxRecvMsgSize: set it to the per-call budget.
// UnaryServerInterceptor and StreamServerInterceptor alone open the account
// once the request is unmarshaled.
//
// # What the client sees
//
// The interceptors map to code 8 RESOURCE_EXHAUSTED every error that
// matches limits.ErrResourceExhausted (a refused Grow, as is or wrapped; a
// Grow's ErrClosed after the heap watch canceled the call), and any error
// the handler returns after the heap watch canceled the call's context
// (PoolConfig.CancelLargest; ctx.Err() would otherwise send CANCELLED,
// "the caller gave up"). The message is the error's text, for example
// "limits: resource_exhausted in grpc/req-17: requested 1073741824 bytes, 0
// in use, limit 67108864". Other errors pass unchanged.
//
// A budget error inside a status of the handler's own code (an error chain
// holding both, such as fmt.Errorf("%w: %w", status.Error(codes.InvalidArgument,
// ...), err)) keeps that code: only UNKNOWN (a plain error), CANCELLED (a
// context's end) and RESOURCE_EXHAUSTED become code 8. A budget error only
// formatted into a status's text is no longer an error value and passes
// unchanged.
//
// When a retry can succeed (limits.ExhaustedError.RetryAfter: the pool was
// full or under heap pressure, or the heap watch canceled the call), the
// status carries the trailer grpc-retry-pushback-ms (gRFC A6) with that
// wait in milliseconds; when it cannot (the call was over its own budget,
// or asked for more than the whole pool) the trailer is -1
// (NoRetryPushback), gRFC A6's "do not retry": the middleware's
// Retry-After rule. A pushback a streaming handler set itself
// (ServerStream.SetTrailer) stands, since grpc-go retries nothing on a
// trailer with two values; a unary handler returning a budget error must
// leave the pushback to the interceptor, which cannot see its
// grpc.SetTrailer.
//
// As in the middleware, a call whose account's peak, or a refused Grow,
// reached the burst threshold ends a burst (Config.AfterBurst) after the
// handler returns. When the pool is closed a call gets UNAVAILABLE without
// running the handler. A call whose context already carries an account of
// the same pool (behind the pool's HTTP middleware) is nested in it (see
// limits.Pool.StartWork); if the heap watch's cancel closed that account,
// the call is answered as a budget error without running the handler.
//
// What the interceptors and ServerOptions cost a call: docs/benchmarks.md.
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
	// Limit is each call's budget in bytes, required: 0 and negative values
	// are errors (limits.ErrInvalidSize), so that a forgotten budget is not
	// unlimited. limits.Unlimited leaves calls limited by the pool alone.
	Limit int64
	// Name returns the account name of a call given its full method
	// ("/package.Service/Method"), as it appears in error scopes. Default:
	// nil ("req-N", N counting the pool's numbered work from 1).
	Name func(fullMethod string) string
	// BurstThreshold is the size in bytes at or above which a call ends a
	// burst, as limits.HTTPConfig.BurstThreshold (default 64 MiB, or
	// Limit/2 when smaller; negative: never).
	BurstThreshold int64
	// AfterBurst is called on the call's goroutine, once its account is
	// closed, after a call that reached BurstThreshold; pass
	// memctl.AfterBurst. Default: nil (none).
	AfterBurst func()
	// Codec marshals and unmarshals messages under ServerOptions; the
	// interceptors alone ignore it. Default: nil (grpc-go's protobuf codec,
	// encoding.GetCodecV2("proto")).
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
// call under an account of its own from pool (limits.Pool.StartWork) with
// cfg.Limit bytes, opened once the request is unmarshaled (ServerOptions
// charges it before), and maps budget errors as the package doc says. It
// returns an error matching limits.ErrInvalidSize for a cfg.Limit of 0 or
// less. The interceptor is safe for concurrent use.
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
			// Refused before it was unmarshaled, or not unmarshaled.
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
			c.release()
			w.Abandon() // the handler panicked: close the account, let its panic go on
		}
	}()
	resp, err = handler(wctx, req)
	returned = true
	c.release()
	if err = w.Finish(err); isBudget(err) {
		return nil, b.answer(err, err, setTrailer)
	}
	return resp, err
}

// answer returns budgetStatus's status for a budget error, setting the
// pushback trailer unless setTrailer is nil; otherwise orig.
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

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls,
// with the same errors and concurrency: ServerStream.Context carries the
// account. With ServerOptions, RecvMsg returns the error of a message the
// budget refused (it matches limits.ErrResourceExhausted, code 8).
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
			c.release()
			w.Abandon()
		}
	}()
	wrapped := &stream{ServerStream: ss, ctx: wctx, c: c}
	err = handler(srv, wrapped)
	returned = true
	c.release()
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
// UNAVAILABLE for a closed pool, or the budget status inside work the heap
// watch canceled.
func startError(err error, setTrailer func(metadata.MD)) error {
	if st, pushback := budgetStatus(err); st != nil {
		if pushback != "" {
			setTrailer(metadata.Pairs(PushbackKey, pushback))
		}
		return st.Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

// stream is a ServerStream whose context carries the call's account; set
// records that the handler set the pushback trailer itself.
type stream struct {
	grpc.ServerStream
	ctx context.Context
	c   *call // with ServerOptions: the messages' refusals
	set atomic.Bool
}

func (s *stream) Context() context.Context { return s.ctx }

// RecvMsg also returns a refusal or unmarshal error (ServerOptions).
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

// Status returns the status a budget error maps to (RESOURCE_EXHAUSTED,
// err.Error() as the message) and the retry pushback trailer's value in
// milliseconds: the wait when a retry can succeed, "-1" when it cannot, ""
// when err carries no *limits.ExhaustedError. For nil, a non-budget error
// and one whose status has the handler's own code (see the package doc) it
// returns nil and "". For handlers that answer outside the interceptors.
// Safe for concurrent use.
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
			// A plain error's and a context's end's: not chosen.
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
