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
