package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/memctl/memctl/connectbudget"
	"github.com/memctl/memctl/limits"
)

// countingCodec is protobuf binary ("proto"), counting the BytesValue
// messages it unmarshals.
type countingCodec struct{ bytes atomic.Int64 }

func (*countingCodec) Name() string                  { return "proto" }
func (*countingCodec) Marshal(m any) ([]byte, error) { return proto.Marshal(m.(proto.Message)) }

func (c *countingCodec) Unmarshal(data []byte, m any) error {
	if _, ok := m.(*wrapperspb.BytesValue); ok {
		c.bytes.Add(1)
	}
	return proto.Unmarshal(data, m.(proto.Message))
}

// startUploads serves the Store with connectbudget.HandlerOptions (or,
// with interceptorOnly, the interceptor alone) with budget per call,
// counting unmarshals, and a maximum read size.
func startUploads(t *testing.T, poolLimit, budget, maxRead int64, interceptorOnly bool) (*server, *countingCodec) {
	t.Helper()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "connect", Limit: poolLimit, Logger: slog.New(slog.DiscardHandler), Strict: true})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	codec := &countingCodec{}
	cfg := connectbudget.Config{Limit: budget, Codecs: []connect.Codec{codec}}
	options := Options
	if interceptorOnly {
		options = InterceptorOptions
	}
	o, err := options(pool, cfg)
	require.NoError(t, err)
	opts := []connect.HandlerOption{o, connect.WithReadMaxBytes(int(maxRead))}
	if interceptorOnly {
		opts = append(opts, connect.WithCodec(codec))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(NewHandler(opts...))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	h1 := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(h1.CloseIdleConnections)
	return &server{pool: pool, url: "http://" + ln.Addr().String(), h1: h1}, codec
}

// upload calls Upload with n bytes over the Connect protocol, asking the
// handler to hold them hold.
func upload(ctx context.Context, client *http.Client, url string, n int64, hold time.Duration) (int64, error) {
	req := connect.NewRequest(wrapperspb.Bytes(make([]byte, n)))
	if hold > 0 {
		req.Header().Set("Hold-Ms", fmt.Sprint(hold.Milliseconds()))
	}
	resp, err := connect.NewClient[wrapperspb.BytesValue, wrapperspb.Int64Value](client, url+Procedure("Upload")).CallUnary(ctx, req)
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetValue(), nil
}

// uploadStream sends messages of the given sizes on UploadStream.
func uploadStream(ctx context.Context, s *server, sizes ...int64) (int64, error) {
	st := connect.NewClient[wrapperspb.BytesValue, wrapperspb.Int64Value](s.h1, s.url+Procedure("UploadStream")).CallClientStream(ctx)
	for _, n := range sizes {
		if err := st.Send(wrapperspb.Bytes(make([]byte, n))); err != nil {
			break // the server ended the call: its error comes with CloseAndReceive
		}
	}
	resp, err := st.CloseAndReceive()
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetValue(), nil
}

// TestMessageRefusedBeforeUnmarshal (issue 34): a message larger than the
// call's budget (2 MiB against 1 MiB) gets resource_exhausted and is never
// unmarshaled, unary or on a client stream; messages within it are, and a
// stream's messages are charged one at a time (three of 600 KiB pass a
// 1 MiB budget); one past the maximum read size is refused by connect.
// The control: with the interceptor alone the same 2 MiB message is
// unmarshaled before any budget sees it. (2 MiB of bytes is 2097157 bytes
// on the wire: the field's tag and length.)
func TestMessageRefusedBeforeUnmarshal(t *testing.T) {
	s, codec := startUploads(t, 16*mib, mib, 4*mib, false)
	ctx := context.Background()

	_, err := upload(ctx, s.h1, s.url, 2*mib, 0)
	t.Logf("2 MiB message, 1 MiB budget: %v", err)
	retryAfter, pushback := requireExhausted(t, err, "connect/req-", "2097157")
	assert.Contains(t, err.Error(), "2097157 bytes, 0 in use, limit 1048576")
	assert.Empty(t, retryAfter)
	assert.Equal(t, connectbudget.NoRetryPushback, pushback)
	assert.Zero(t, codec.bytes.Load(), "the refused message was not unmarshaled")

	got, err := upload(ctx, s.h1, s.url, 512*kib, 0)
	require.NoError(t, err)
	assert.Equal(t, 512*kib, got)
	assert.Equal(t, int64(1), codec.bytes.Load())

	got, err = uploadStream(ctx, s, 600*kib, 600*kib, 600*kib)
	require.NoError(t, err, "each message's charge goes when the next arrives")
	assert.Equal(t, 1800*kib, got)
	assert.Equal(t, int64(4), codec.bytes.Load())
	_, err = uploadStream(ctx, s, 100*kib, 2*mib)
	requireExhausted(t, err, "connect/req-", "2097157")
	assert.Equal(t, int64(5), codec.bytes.Load(), "the stream's 2 MiB message was not unmarshaled")

	_, err = upload(ctx, s.h1, s.url, 5*mib, 0)
	assert.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "%v", err)
	assert.Contains(t, err.Error(), "larger than configured max")
	assert.Equal(t, int64(5), codec.bytes.Load())

	st := s.pool.Stats()
	assert.Zero(t, st.Used)
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.Leaked)
	assert.Equal(t, int64(2), st.RefusedBy.Account)

	before, codec := startUploads(t, 16*mib, mib, 4*mib, true)
	got, err = upload(ctx, before.h1, before.url, 2*mib, 0)
	require.NoError(t, err, "the interceptor alone: no budget sees the message")
	assert.Equal(t, 2*mib, got)
	assert.Equal(t, int64(1), codec.bytes.Load(), "unmarshaled")
}

// TestMessagesPoolRoom (issue 34's shape, scaled down): eight concurrent
// 3 MiB messages, a 4 MiB budget per call, a 16 MiB pool, each admitted
// call holding its message: five fit the pool and are unmarshaled, three
// get resource_exhausted with Retry-After: 1 (a retry can succeed), never
// unmarshaled.
func TestMessagesPoolRoom(t *testing.T) {
	s, codec := startUploads(t, 16*mib, 4*mib, 4*mib, false)
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	var mu sync.Mutex
	var other []error
	for range 8 {
		wg.Go(func() {
			got, err := upload(context.Background(), s.h1, s.url, 3*mib, 3*time.Second)
			switch {
			case err == nil && got == 3*mib:
				ok.Add(1)
			case connect.CodeOf(err) == connect.CodeResourceExhausted:
				retryAfter, pushback := requireExhausted(t, err, "connect", "")
				assert.Equal(t, "1", retryAfter)
				assert.Equal(t, "1000", pushback)
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

// TestOrphanedMessage: a unary message the codec charged whose call never
// reached the budget's interceptor (an interceptor before it answered)
// gives its charge back once the message is collected.
func TestOrphanedMessage(t *testing.T) {
	pool, err := limits.NewPool(limits.PoolConfig{Name: "connect", Limit: 16 * mib, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	o, err := Options(pool, connectbudget.Config{Limit: 4 * mib})
	require.NoError(t, err)
	deny := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			return nil, connect.NewError(connect.CodePermissionDenied, nil)
		}
	})
	srv := NewServer(NewHandler(connect.WithInterceptors(deny), o))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	_, err = upload(context.Background(), http.DefaultClient, "http://"+ln.Addr().String(), 3*mib, 0)
	assert.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.Eventually(t, func() bool {
		runtime.GC()
		return pool.Used() == 0 && pool.Stats().InFlight == 0
	}, 10*time.Second, 10*time.Millisecond, "the charge of a message no one took is given back")
}
