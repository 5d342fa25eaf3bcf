package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/memctl/memctl/grpcbudget"
	"github.com/memctl/memctl/limits"
)

// countingCodec is grpc-go's protobuf codec, counting the BytesValue
// messages it unmarshals.
type countingCodec struct {
	encoding.CodecV2
	bytes atomic.Int64
}

func (c *countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if _, ok := v.(*wrapperspb.BytesValue); ok {
		c.bytes.Add(1)
	}
	return c.CodecV2.Unmarshal(data, v)
}

// startUploads serves the Store with opts (nil: grpcbudget.ServerOptions
// with budget, counting unmarshals) and a maximum receive size.
func startUploads(t *testing.T, poolLimit, budget, maxRecv int64, interceptorsOnly bool) (*server, *countingCodec) {
	t.Helper()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "grpc", Limit: poolLimit, Logger: slog.New(slog.DiscardHandler), Strict: true})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	codec := &countingCodec{CodecV2: encoding.GetCodecV2("proto")}
	cfg := grpcbudget.Config{Limit: budget, Codec: codec}
	var opts []grpc.ServerOption
	if interceptorsOnly {
		opts, err = InterceptorOptions(pool, cfg)
		opts = append(opts, grpc.ForceServerCodecV2(codec))
	} else {
		opts, err = grpcbudget.ServerOptions(pool, cfg)
	}
	require.NoError(t, err)
	srv := NewServer(append(opts, grpc.MaxRecvMsgSize(int(maxRecv)))...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &server{pool: pool, conn: conn}, codec
}

// upload calls Upload with n bytes, asking the handler to hold them hold.
func upload(ctx context.Context, conn *grpc.ClientConn, n int64, hold time.Duration) (int64, metadata.MD, error) {
	if hold > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, "hold-ms", fmt.Sprint(hold.Milliseconds()))
	}
	var trailer metadata.MD
	out := new(wrapperspb.Int64Value)
	err := conn.Invoke(ctx, "/"+ServiceName+"/Upload", wrapperspb.Bytes(make([]byte, n)), out, grpc.Trailer(&trailer))
	return out.GetValue(), trailer, err
}

// uploadStream sends messages of the given sizes on UploadStream and
// returns the total the handler counted.
func uploadStream(ctx context.Context, conn *grpc.ClientConn, sizes ...int64) (int64, metadata.MD, error) {
	st, err := conn.NewStream(ctx, &storeDesc.Streams[1], "/"+ServiceName+"/UploadStream")
	if err != nil {
		return 0, nil, err
	}
	for _, n := range sizes {
		if err := st.SendMsg(wrapperspb.Bytes(make([]byte, n))); err != nil {
			break // the server ended the call: its status comes with RecvMsg
		}
	}
	_ = st.CloseSend()
	out := new(wrapperspb.Int64Value)
	err = st.RecvMsg(out)
	return out.GetValue(), st.Trailer(), err
}

// TestMessageRefusedBeforeUnmarshal (issue 34): a message larger than the
// call's budget (2 MiB against 1 MiB) gets code 8 and is never
// unmarshaled, unary or on a client stream; messages within it are, and a
// stream's messages are charged one at a time (three of 600 KiB pass a
// 1 MiB budget); one past the maximum receive size is refused by grpc-go
// from its header. The control: with the interceptors alone the same
// 2 MiB message is unmarshaled before any budget sees it. (2 MiB of bytes
// is 2097157 bytes on the wire: the field's tag and length.)
func TestMessageRefusedBeforeUnmarshal(t *testing.T) {
	s, codec := startUploads(t, 16*mib, mib, 4*mib, false)
	ctx := context.Background()

	_, trailer, err := upload(ctx, s.conn, 2*mib, 0)
	t.Logf("2 MiB message, 1 MiB budget: %v; trailer %v", err, trailer)
	assert.Equal(t, []string{grpcbudget.NoRetryPushback}, requireExhausted(t, err, trailer, "grpc/req-", "2097157"))
	assert.Contains(t, status.Convert(err).Message(), "2097157 bytes, 0 in use, limit 1048576")
	assert.Zero(t, codec.bytes.Load(), "the refused message was not unmarshaled")

	got, _, err := upload(ctx, s.conn, 512*kib, 0)
	require.NoError(t, err)
	assert.Equal(t, 512*kib, got)
	assert.Equal(t, int64(1), codec.bytes.Load())

	got, _, err = uploadStream(ctx, s.conn, 600*kib, 600*kib, 600*kib)
	require.NoError(t, err, "each message's charge goes when the next is received")
	assert.Equal(t, 1800*kib, got)
	assert.Equal(t, int64(4), codec.bytes.Load())
	_, trailer, err = uploadStream(ctx, s.conn, 100*kib, 2*mib)
	requireExhausted(t, err, trailer, "grpc/req-", "2097157")
	assert.Equal(t, int64(5), codec.bytes.Load(), "the stream's 2 MiB message was not unmarshaled")

	_, _, err = upload(ctx, s.conn, 5*mib, 0)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "grpc: received message larger than max")
	assert.Equal(t, int64(5), codec.bytes.Load())

	st := s.pool.Stats()
	assert.Zero(t, st.Used)
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.Leaked)
	assert.Equal(t, int64(2), st.RefusedBy.Account)

	before, codec := startUploads(t, 16*mib, mib, 4*mib, true)
	got, _, err = upload(ctx, before.conn, 2*mib, 0)
	require.NoError(t, err, "the interceptors alone: no budget sees the message")
	assert.Equal(t, 2*mib, got)
	assert.Equal(t, int64(1), codec.bytes.Load(), "unmarshaled")
}

// TestMessagesPoolRoom (issue 34's shape, scaled down): eight concurrent
// 3 MiB messages, a 4 MiB budget per call, a 16 MiB pool, each admitted
// call holding its message: five fit the pool and are unmarshaled, three
// are refused with code 8 and the pushback 1000 (a retry can succeed),
// never unmarshaled.
func TestMessagesPoolRoom(t *testing.T) {
	s, codec := startUploads(t, 16*mib, 4*mib, 4*mib, false)
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	var mu sync.Mutex
	var other []error
	for range 8 {
		wg.Go(func() {
			got, trailer, err := upload(context.Background(), s.conn, 3*mib, 3*time.Second)
			switch {
			case err == nil && got == 3*mib:
				ok.Add(1)
			case status.Code(err) == codes.ResourceExhausted && assert.Equal(t, []string{"1000"}, trailer.Get(grpcbudget.PushbackKey)):
				refused.Add(1)
			default:
				mu.Lock()
				other = append(other, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Empty(t, other)
	assert.Equal(t, int64(5), ok.Load())
	assert.Equal(t, int64(3), refused.Load())
	assert.Equal(t, int64(5), codec.bytes.Load(), "only the admitted messages were unmarshaled")
	assert.Equal(t, int64(3), s.pool.Stats().RefusedBy.Pool)
	assert.Zero(t, s.pool.Used())
}

// TestUnknownMethodEndsWork: with ServerOptions a call's account opens when
// the call begins, before grpc-go knows whether the method exists; a call
// of an unknown method, which never reaches a handler, still closes it.
func TestUnknownMethodEndsWork(t *testing.T) {
	s, _ := startUploads(t, 16*mib, mib, 4*mib, false)
	err := s.conn.Invoke(context.Background(), "/"+ServiceName+"/Missing", wrapperspb.Int64(1), new(wrapperspb.Int64Value))
	assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
	err = s.conn.Invoke(context.Background(), "/no.Such/Service", wrapperspb.Int64(1), new(wrapperspb.Int64Value))
	assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
	require.Eventually(t, func() bool { return s.pool.Stats().InFlight == 0 }, 10*time.Second, time.Millisecond,
		"the accounts of calls that reached no handler are closed")
	assert.Zero(t, s.pool.Used())
}
