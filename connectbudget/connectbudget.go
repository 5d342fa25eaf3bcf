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
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"weak"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

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

// HandlerOptions returns the handler option that charges each request
// message before it is unmarshaled: the interceptor (NewInterceptor) and
// codecs (cfg.Codecs, per procedure) that charge a message's size to the
// call's account and unmarshal it only if the budget grants it. A refused
// message is never unmarshaled and the handler does not run: the call gets
// resource_exhausted (a streaming handler's Receive returns the error).
// Pass it first among a handler's options.
//
// A unary call's account opens in the codec when its message arrives, a
// streaming call's when the call begins. A unary call holds its message's
// charge until the handler returns, a streaming call until its next
// message or its end. A unary message whose call never reached the
// interceptor gives its charge back when it is garbage collected.
//
// connect still reads and decompresses the message first, up to
// connect.WithReadMaxBytes (unlimited by default): set it to cfg.Limit.
//
// It returns an error matching limits.ErrInvalidSize for a cfg.Limit of 0
// or less.
func HandlerOptions(pool *limits.Pool, cfg Config) (connect.HandlerOption, error) {
	i, err := newInterceptor(pool, cfg)
	if err != nil {
		return nil, err
	}
	bases := cfg.Codecs
	if len(bases) == 0 {
		bases = []connect.Codec{protoCodec("proto"), protoCodec("json"), protoCodec("json; charset=utf-8")}
	}
	i.charging = true
	return connect.WithHandlerOptions(
		connect.WithInterceptors(i),
		connect.WithConditionalHandlerOptions(func(spec connect.Spec) []connect.HandlerOption {
			opts := make([]connect.HandlerOption, len(bases))
			for k, base := range bases {
				opts[k] = connect.WithCodec(&codec{base: base, i: i, spec: spec})
			}
			return opts
		}),
	), nil
}

// messages is the state HandlerOptions adds to an interceptor.
type messages struct {
	charging bool // HandlerOptions installed the codecs
	// parked holds, by message (weak.Pointer[byte]), the unary calls
	// (*parked) a codec charged or refused, until the interceptor takes them.
	parked sync.Map
	// receiving holds, by message, the streaming calls in Receive.
	receiving sync.Map
}

// parked is a unary call whose message the codec charged or refused.
type parked struct {
	w       *limits.Work
	wctx    context.Context  // the work's own context, which the heap watch cancels
	charge  budgetrpc.Charge // the message's
	err     error            // the refusal: the message was not unmarshaled
	cleanup runtime.Cleanup
}

// abandon returns the message's charge and ends the work.
func (p *parked) abandon() {
	p.charge.Release()
	p.w.Abandon()
}

// key returns msg's identity for parked and its address; ok is false for
// anything but a non-nil pointer.
func key(msg any) (k weak.Pointer[byte], ptr *byte, ok bool) {
	v := reflect.ValueOf(msg)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return k, nil, false
	}
	ptr = (*byte)(v.UnsafePointer())
	return weak.Make(ptr), ptr, true
}

// park records p for the interceptor; if never taken, it ends when msg is
// collected.
func (i *interceptor) park(msg any, p *parked) bool {
	k, ptr, ok := key(msg)
	if !ok {
		return false
	}
	i.parked.Store(k, p)
	p.cleanup = runtime.AddCleanup(ptr, i.orphan, k)
	return true
}

// orphan ends the parked call of a collected message.
func (i *interceptor) orphan(k weak.Pointer[byte]) {
	if p, ok := i.parked.LoadAndDelete(k); ok {
		p.(*parked).abandon()
	}
}

// take returns the parked call of msg, or nil.
func (i *interceptor) take(msg any) *parked {
	k, _, ok := key(msg)
	if !ok {
		return nil
	}
	p, ok := i.parked.LoadAndDelete(k)
	if !ok {
		return nil
	}
	p.(*parked).cleanup.Stop()
	return p.(*parked)
}

// codec charges a message's size before base unmarshals it.
type codec struct {
	base connect.Codec
	i    *interceptor
	spec connect.Spec
}

func (c *codec) Name() string                  { return c.base.Name() }
func (c *codec) Marshal(m any) ([]byte, error) { return c.base.Marshal(m) }

// MarshalAppend is connect's optional fast path, when base has it.
func (c *codec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	if a, ok := c.base.(interface {
		MarshalAppend([]byte, any) ([]byte, error)
	}); ok {
		return a.MarshalAppend(dst, m)
	}
	b, err := c.base.Marshal(m)
	return append(dst, b...), err
}

func (c *codec) Unmarshal(data []byte, msg any) error {
	if r, ok := c.i.receiving.Load(msg); ok {
		return r.(*budgetConn).receive(data, msg, c.base)
	}
	if c.spec.StreamType != connect.StreamTypeUnary {
		return c.base.Unmarshal(data, msg) // no interceptor around the stream
	}
	// A unary call's account opens here; the interceptor takes it over.
	wctx, w, err := c.i.pool.StartWork(context.Background(), c.i.work.Work(c.spec.Procedure))
	if err != nil {
		return c.base.Unmarshal(data, msg) // a closed pool: the interceptor answers
	}
	p := &parked{w: w, wctx: wctx, charge: budgetrpc.Charge{A: w.Account()}}
	// A refusal (p.err) is not unmarshaled.
	p.err, err = p.charge.Receive(int64(len(data)), func() error { return c.base.Unmarshal(data, msg) })
	if err != nil {
		w.Abandon()
		return err // connect answers invalid_argument, as without the budget
	}
	if !c.i.park(msg, p) {
		p.abandon()
		if p.err != nil {
			return p.err // cannot be: connect receives into pointers
		}
	}
	return nil
}

// budgetConn's Receive charges each message before it is unmarshaled.
type budgetConn struct {
	connect.StreamingHandlerConn
	i      *interceptor
	charge budgetrpc.Charge // the last message's
	err    error            // the message being received was refused
}

func (c *budgetConn) Receive(msg any) error {
	if t := reflect.TypeOf(msg); t == nil || t.Kind() != reflect.Pointer {
		return c.StreamingHandlerConn.Receive(msg)
	}
	c.err = nil
	c.i.receiving.Store(msg, c)
	err := c.StreamingHandlerConn.Receive(msg)
	c.i.receiving.Delete(msg)
	if err != nil {
		return err
	}
	if c.err != nil {
		return connect.NewError(connect.CodeResourceExhausted, c.err)
	}
	return nil
}

// receive, called by the codec within Receive, releases the previous
// message's charge and charges this one.
func (c *budgetConn) receive(data []byte, msg any, base connect.Codec) error {
	refused, err := c.charge.Receive(int64(len(data)), func() error { return base.Unmarshal(data, msg) })
	if refused != nil {
		c.err = refused // not unmarshaled; Receive returns the refusal
	}
	return err
}

// protoCodec is connect's unexported default codec of its name: protobuf
// binary ("proto") or JSON.
type protoCodec string

func (c protoCodec) Name() string                  { return string(c) }
func (c protoCodec) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

func (c protoCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	switch {
	case !ok:
		return nil, errNotProto(m)
	case c == "proto":
		return proto.MarshalOptions{}.MarshalAppend(dst, pm)
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (c protoCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	var err error
	switch {
	case !ok:
		return errNotProto(m)
	case c == "proto":
		err = proto.Unmarshal(data, pm)
	case len(data) == 0:
		return errors.New("zero-length payload is not a valid JSON object")
	default:
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, pm)
	}
	if err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

func errNotProto(m any) error { return fmt.Errorf("%T doesn't implement proto.Message", m) }
