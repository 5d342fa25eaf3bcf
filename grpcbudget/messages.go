package grpcbudget

import (
	"context"
	"reflect"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/memctl/memctl/internal/budgetrpc"
	"github.com/memctl/memctl/limits"
)

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

	mu   sync.Mutex
	held int64 // the last message's charge
	last any   // the message of the receive under way (see settle)
	err  error // the last message was refused (a budget error) or could not be unmarshaled
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
	c := &call{b: b}
	wctx, w, err := b.pool.StartWork(ctx, b.work.Work(info.FullMethodName))
	if err != nil {
		c.startErr = err
		return context.WithValue(ctx, callKey{}, c)
	}
	c.w = w
	c.stop = context.AfterFunc(wctx, c.abandon)
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
	refused, err := budgetrpc.Receive(c.w.Account(), &c.held, int64(data.Len()), func() error { return c.b.codec.Unmarshal(data, v) })
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
	held := c.held
	c.held = 0
	c.mu.Unlock()
	c.w.Account().Shrink(held)
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
