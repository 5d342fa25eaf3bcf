// Package grpcbudget gives each gRPC call a memory budget of its own from a
// limits.Pool, and answers a budget error with RESOURCE_EXHAUSTED (code 8),
// as limits.Pool.Middleware answers it with 429. It is a module of its own,
// so that the memctl module does not depend on google.golang.org/grpc.
//
//	pool, _ := limits.NewPool(limits.PoolConfig{Name: "grpc", CancelLargest: true})
//	opts, _ := grpcbudget.ServerOptions(pool, grpcbudget.Config{Limit: 64 << 20, AfterBurst: memctl.AfterBurst})
//	srv := grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(64<<20))...) // first: before other interceptors
//
// A handler charges what it builds with limits.Grow(ctx, n) and returns the
// error, as is or wrapped with %w. ServerOptions charges each message
// before it is unmarshaled (docs/budgets.md); the interceptors alone open
// the account once the request is unmarshaled.
//
// A call gets code 8, with the error's text as the message, for an error
// matching limits.ErrResourceExhausted (unless inside a status of the
// handler's own code other than UNKNOWN and CANCELLED) and for any error
// after the heap watch canceled its context (PoolConfig.CancelLargest).
// The trailer grpc-retry-pushback-ms (gRFC A6) carries
// limits.ExhaustedError.RetryAfter in milliseconds, or NoRetryPushback when
// a retry cannot succeed; a pushback a streaming handler set itself stands.
// When the pool is closed a call gets UNAVAILABLE. A call whose context
// carries an account of the same pool is nested in it
// (limits.Pool.StartWork).
package grpcbudget

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/memctl/memctl/internal/budgetrpc"
	"github.com/memctl/memctl/limits"
)

// The retry pushback of gRFC A6: PushbackKey, "grpc-retry-pushback-ms", is
// the trailer of the pushback in milliseconds, and NoRetryPushback, "-1",
// the pushback when a retry cannot succeed ("do not retry").
const (
	PushbackKey     = budgetrpc.PushbackKey
	NoRetryPushback = budgetrpc.NoRetryPushback
)

// Config configures the interceptors.
type Config struct {
	// Limit is each call's budget in bytes, required: 0 and negative values
	// are errors (limits.ErrInvalidSize). limits.Unlimited leaves calls
	// limited by the pool alone.
	Limit int64
	// Name returns the account name of a call given its full method
	// ("/package.Service/Method"). Default: nil ("req-N").
	Name func(fullMethod string) string
	// BurstThreshold is the size in bytes at or above which a call ends a
	// burst, as limits.HTTPConfig.BurstThreshold (default 64 MiB, or
	// Limit/2 when smaller; negative: never).
	BurstThreshold int64
	// AfterBurst is called on the call's goroutine, once its account is
	// closed, after a call that reached BurstThreshold; pass
	// memctl.AfterBurst. Default: nil (none).
	AfterBurst func()
	// Codec marshals and unmarshals messages under ServerOptions. Default:
	// nil (encoding.GetCodecV2("proto")).
	Codec encoding.CodecV2
}

// newBudget returns the interceptors' state, or an error matching
// limits.ErrInvalidSize for a cfg.Limit of 0 or less.
func newBudget(pool *limits.Pool, cfg Config) (*budget, error) {
	w := budgetrpc.Config{Limit: cfg.Limit, Name: cfg.Name, BurstThreshold: cfg.BurstThreshold, AfterBurst: cfg.AfterBurst}
	if err := w.Check("grpcbudget"); err != nil {
		return nil, err
	}
	return &budget{pool: pool, work: w}, nil
}

// UnaryServerInterceptor returns a unary server interceptor that runs each
// call under an account of its own from pool (limits.Pool.StartWork) with
// cfg.Limit bytes and maps budget errors as the package doc says. It
// returns an error matching limits.ErrInvalidSize for a cfg.Limit of 0 or
// less. The interceptor is safe for concurrent use.
func UnaryServerInterceptor(pool *limits.Pool, cfg Config) (grpc.UnaryServerInterceptor, error) {
	b, err := newBudget(pool, cfg)
	if err != nil {
		return nil, err
	}
	return b.unary, nil
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls:
// ServerStream.Context carries the account. With ServerOptions, RecvMsg
// returns the error of a message the budget refused (code 8).
func StreamServerInterceptor(pool *limits.Pool, cfg Config) (grpc.StreamServerInterceptor, error) {
	b, err := newBudget(pool, cfg)
	if err != nil {
		return nil, err
	}
	return b.stream, nil
}

// open returns the call's work: the one the stats handler opened
// (ServerOptions), with its call, or a new one.
func (b *budget) open(ctx context.Context, method string, setTrailer func(metadata.MD)) (c *call, wctx context.Context, w *limits.Work, err error) {
	if c = callFrom(ctx, b); c != nil {
		wctx, w, err = ctx, c.w, c.startErr
	} else {
		wctx, w, err = b.pool.StartWork(ctx, b.work.Work(method))
	}
	if err != nil {
		return nil, nil, nil, answer(err, status.Error(codes.Unavailable, err.Error()), setTrailer)
	}
	return c, wctx, w, nil
}

func (b *budget) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	setTrailer := func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }
	c, wctx, w, err := b.open(ctx, info.FullMethod, setTrailer)
	if err != nil {
		return nil, err
	}
	if err := c.settle(); err != nil {
		// Refused before it was unmarshaled, or not unmarshaled.
		c.release()
		return nil, answer(w.Finish(err), err, setTrailer)
	}
	var resp any
	_, ferr := budgetrpc.Run(w, c.release, func() (err error) {
		resp, err = handler(wctx, req)
		return err
	})
	if isBudget(ferr) {
		return nil, answer(ferr, ferr, setTrailer)
	}
	return resp, ferr
}

func (b *budget) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c, wctx, w, err := b.open(ss.Context(), info.FullMethod, ss.SetTrailer)
	if err != nil {
		return err
	}
	wrapped := &stream{ServerStream: ss, ctx: wctx, c: c}
	err, ferr := budgetrpc.Run(w, c.release, func() error { return handler(srv, wrapped) })
	switch {
	case !isBudget(ferr):
		return err
	case wrapped.set.Load():
		return answer(ferr, err, nil) // the handler's pushback stands
	}
	return answer(ferr, err, ss.SetTrailer)
}

// answer returns the status of budget error err, setting the pushback
// trailer unless setTrailer is nil; for another error, orig.
func answer(err, orig error, setTrailer func(metadata.MD)) error {
	st, pushback := Status(err)
	if st == nil {
		return orig
	}
	if pushback != "" && setTrailer != nil {
		setTrailer(metadata.Pairs(PushbackKey, pushback))
	}
	return st.Err()
}

// isBudget reports whether Status maps err.
func isBudget(err error) bool { st, _ := Status(err); return st != nil }

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
	err := s.c.settle()
	if isBudget(err) {
		return refusal{err}
	}
	return err
}

func (s *stream) SetTrailer(md metadata.MD) {
	if len(md.Get(PushbackKey)) > 0 {
		s.set.Store(true)
	}
	s.ServerStream.SetTrailer(md)
}

// grpcStatus is what status.FromError looks for in an error's chain.
type grpcStatus interface {
	error
	GRPCStatus() *status.Status
}

// Status returns the status a budget error maps to (RESOURCE_EXHAUSTED,
// err.Error() as the message) and the pushback trailer's value ("" when err
// carries no *limits.ExhaustedError), as the package doc says; nil and ""
// for any other error. For handlers that answer outside the interceptors.
func Status(err error) (st *status.Status, pushback string) {
	if err == nil || !errors.Is(err, limits.ErrResourceExhausted) {
		return nil, ""
	}
	if s, ok := errors.AsType[grpcStatus](err); ok {
		switch s.GRPCStatus().Code() {
		case codes.Unknown, codes.Canceled, codes.ResourceExhausted:
		default:
			return nil, "" // the handler chose a code: its answer stands
		}
	}
	pushback, _ = budgetrpc.Pushback(err)
	return status.New(codes.ResourceExhausted, err.Error()), pushback
}

// ServerOptions returns the server options that give each call a budget
// and charge each received message before it is unmarshaled: a codec
// (grpc.ForceServerCodecV2) that keeps the wire bytes, a stats handler that
// opens the call's account and charges and unmarshals each message, and the
// interceptors, which answer a refused message with code 8 without running
// the handler. Pass them before other stats handlers and interceptors.
//
// grpc-go still reads and decompresses the wire bytes first, up to
// grpc.MaxRecvMsgSize (4 MiB by default): set it to cfg.Limit. A message's
// charge is its decompressed size; a unary call holds it until the handler
// returns, a streaming call until its next message or its end.
//
// It returns an error matching limits.ErrInvalidSize for a cfg.Limit of 0
// or less. The options are safe for concurrent use.
func ServerOptions(pool *limits.Pool, cfg Config) ([]grpc.ServerOption, error) {
	b, err := newBudget(pool, cfg)
	if err != nil {
		return nil, err
	}
	b.codec = cfg.Codec
	if b.codec == nil {
		b.codec = encoding.GetCodecV2("proto")
	}
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(&keepCodec{b: b}),
		grpc.StatsHandler(b),
		grpc.ChainUnaryInterceptor(b.unary),
		grpc.ChainStreamInterceptor(b.stream),
	}, nil
}

// budget is the interceptors, and under ServerOptions the codec's and stats
// handler's state.
type budget struct {
	pool  *limits.Pool
	work  budgetrpc.Config
	codec encoding.CodecV2 // nil: messages are not charged (the interceptors alone)
	// parked holds the wire bytes (mem.BufferSlice) the codec kept, by
	// message, until the stats handler unmarshals them.
	parked sync.Map
}

// keepCodec's Unmarshal parks the wire bytes for the stats handler.
type keepCodec struct{ b *budget }

func (c *keepCodec) Name() string                           { return c.b.codec.Name() }
func (c *keepCodec) Marshal(v any) (mem.BufferSlice, error) { return c.b.codec.Marshal(v) }

func (c *keepCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if t := reflect.TypeOf(v); t == nil || t.Kind() != reflect.Pointer {
		return c.b.codec.Unmarshal(data, v) // not a message a handler receives into
	}
	data.Ref()
	if old, ok := c.b.parked.Swap(v, data); ok {
		old.(mem.BufferSlice).Free() // a second message for v in one receive: cannot happen
	}
	return nil
}

// callKey is the context key of a call's *call.
type callKey struct{}

// call is one call seen by the stats handler.
type call struct {
	b        *budget
	w        *limits.Work
	startErr error       // StartWork's error: the interceptor answers with it
	stop     func() bool // at Begin: stops the abandon of a call that never reaches End

	mu     sync.Mutex
	charge budgetrpc.Charge // the last message's
	last   any              // the message of the receive under way (see settle)
	err    error            // the last message was refused (a budget error) or could not be unmarshaled
}

func callFrom(ctx context.Context, b *budget) *call {
	if c, ok := ctx.Value(callKey{}).(*call); ok && c.b == b {
		return c
	}
	return nil
}

// TagRPC opens the call's account, carried by the call's context; a call
// that never reaches End (an unknown method) is abandoned when it ends.
func (b *budget) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	wctx, w, err := b.pool.StartWork(ctx, b.work.Work(info.FullMethodName)) // ctx on an error
	c := &call{b: b, w: w, startErr: err}
	if err == nil {
		c.charge.A = w.Account()
		c.stop = context.AfterFunc(wctx, c.abandon)
	}
	return context.WithValue(wctx, callKey{}, c)
}

// HandleRPC unmarshals a received message once its size is charged, and
// ends the call's work at End if the interceptors did not.
func (b *budget) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s := s.(type) {
	case *stats.Begin:
		if c := callFrom(ctx, b); c != nil && c.stop != nil {
			c.stop() // the call reached its handler: End ends it, not its context
		}
	case *stats.InPayload:
		if s.Client {
			return
		}
		kept, ok := b.parked.LoadAndDelete(s.Payload)
		if !ok {
			return
		}
		data := kept.(mem.BufferSlice)
		defer data.Free()
		if c := callFrom(ctx, b); c != nil {
			c.receive(s.Payload, data)
		} else {
			_ = b.codec.Unmarshal(data, s.Payload) // not a call of ours: cannot happen
		}
	case *stats.End:
		if c := callFrom(ctx, b); c != nil {
			c.abandon()
		}
	}
}

func (b *budget) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (b *budget) HandleConn(context.Context, stats.ConnStats)                       {}

// receive releases the previous message's charge, charges data's size and
// unmarshals it into v if granted; an error is kept for the interceptor
// (the receive itself has succeeded).
func (c *call) receive(v any, data mem.BufferSlice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last, c.err = v, nil
	if c.w == nil {
		return // the interceptor answers with startErr; nothing to unmarshal for
	}
	refused, err := c.charge.Receive(int64(data.Len()), func() error { return c.b.codec.Unmarshal(data, v) })
	switch {
	case refused != nil:
		c.err = refused
	case err != nil:
		// What grpc-go answers when its codec fails.
		c.err = status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
}

// settle ends the last message's receive once RecvMsg returned: it frees
// wire bytes parked without an InPayload, forgets the message and returns
// its error, once. A nil call has none.
func (c *call) settle() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil {
		if kept, ok := c.b.parked.LoadAndDelete(c.last); ok {
			kept.(mem.BufferSlice).Free()
		}
		c.last = nil
	}
	err := c.err
	c.err = nil
	return err
}

// release returns the last message's charge; a nil call has none.
func (c *call) release() {
	if c == nil {
		return
	}
	_ = c.settle()
	c.mu.Lock()
	c.charge.Release()
	c.mu.Unlock()
}

// abandon ends the call's work if nothing else did.
func (c *call) abandon() {
	if c.w == nil {
		return
	}
	c.release()
	c.w.Abandon() // nothing when the interceptor finished it
}

// refusal is a refused message's error: it matches
// limits.ErrResourceExhausted and carries code 8.
type refusal struct {
	error
}

func (r refusal) Unwrap() error { return r.error }

func (r refusal) GRPCStatus() *status.Status {
	return status.New(codes.ResourceExhausted, r.Error())
}
