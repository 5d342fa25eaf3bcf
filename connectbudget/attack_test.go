package connectbudget_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/memctl/memctl/connectbudget"
	"github.com/memctl/memctl/limits"
)

const mib = int64(1) << 20

type msg = wrapperspb.Int64Value

// attackServer serves a unary procedure "Do", a server stream "Server"
// and a bidi stream "Bidi", whose handlers each test sets, behind the
// budget interceptor (and any other options given before it), over
// HTTP/1.1 and h2c on 127.0.0.1.
type attackServer struct {
	pool   *limits.Pool
	url    string
	h1     *http.Client
	h2c    *http.Client
	mu     sync.Mutex
	unary  func(ctx context.Context, n int64) (int64, error)
	server func(ctx context.Context, n int64, send func(int64) error) error
	bidi   func(ctx context.Context, st *connect.BidiStream[msg, msg]) error
}

func startAttack(t testing.TB, pc limits.PoolConfig, budget int64, before ...connect.HandlerOption) *attackServer {
	t.Helper()
	pc.Name = "connect"
	pc.Logger = slog.New(slog.DiscardHandler)
	pool, err := limits.NewPool(pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	o, err := connectbudget.HandlerOptions(pool, connectbudget.Config{Limit: budget})
	require.NoError(t, err)
	opts := append(append([]connect.HandlerOption{}, before...), o)
	s := &attackServer{pool: pool}
	mux := http.NewServeMux()
	mux.Handle("/t.Attack/Do", connect.NewUnaryHandler("/t.Attack/Do", func(ctx context.Context, req *connect.Request[msg]) (*connect.Response[msg], error) {
		s.mu.Lock()
		fn := s.unary
		s.mu.Unlock()
		n, err := fn(ctx, req.Msg.GetValue())
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(wrapperspb.Int64(n)), nil
	}, opts...))
	mux.Handle("/t.Attack/Server", connect.NewServerStreamHandler("/t.Attack/Server", func(ctx context.Context, req *connect.Request[msg], st *connect.ServerStream[msg]) error {
		s.mu.Lock()
		fn := s.server
		s.mu.Unlock()
		return fn(ctx, req.Msg.GetValue(), func(v int64) error { return st.Send(wrapperspb.Int64(v)) })
	}, opts...))
	mux.Handle("/t.Attack/Bidi", connect.NewBidiStreamHandler("/t.Attack/Bidi", func(ctx context.Context, st *connect.BidiStream[msg, msg]) error {
		s.mu.Lock()
		fn := s.bidi
		s.mu.Unlock()
		return fn(ctx, st)
	}, opts...))
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	s.h2c = &http.Client{Transport: &http.Transport{Protocols: &h2}}
	s.h1 = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(s.h1.CloseIdleConnections)
	t.Cleanup(s.h2c.CloseIdleConnections)
	s.url = "http://" + ln.Addr().String()
	return s
}

// protocols are the client forms each call is made with: the Connect
// protocol over HTTP/1.1 and over HTTP/2, and the gRPC protocol (HTTP/2).
var protocols = []string{"connect-h1", "connect-h2", "grpc"}

func (s *attackServer) client(proc, proto string) *connect.Client[msg, msg] {
	switch proto {
	case "connect-h1":
		return connect.NewClient[msg, msg](s.h1, s.url+proc)
	case "connect-h2":
		return connect.NewClient[msg, msg](s.h2c, s.url+proc)
	}
	return connect.NewClient[msg, msg](s.h2c, s.url+proc, connect.WithGRPC())
}

func (s *attackServer) set(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

func code(err error) connect.Code { return connect.CodeOf(err) }

func waitIdle(t *testing.T, pool *limits.Pool) {
	t.Helper()
	require.Eventually(t, func() bool { return pool.Used() == 0 && pool.Stats().InFlight == 0 }, 10*time.Second, time.Millisecond,
		"the pool returns to zero")
}

// TestErrorShapes: a refused Grow's error reaches every client as
// resource_exhausted, with scope and sizes in the message and the pushback
// -1 (over its own budget: do not retry), however the handler returns it
// (as is, wrapped once or twice, joined, inside connect.NewError with
// CodeUnknown or CodeResourceExhausted); a *connect.Error with a code the
// handler chose is left alone.
func TestErrorShapes(t *testing.T) {
	s := startAttack(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib)
	other := errors.New("other failure")
	for _, tc := range []struct {
		name string
		wrap func(error) error
		code connect.Code
	}{
		{"as is", func(err error) error { return err }, connect.CodeResourceExhausted},
		{"wrapped", func(err error) error { return fmt.Errorf("query: %w", err) }, connect.CodeResourceExhausted},
		{"wrapped twice", func(err error) error { return fmt.Errorf("h: %w", fmt.Errorf("query: %w", err)) }, connect.CodeResourceExhausted},
		{"joined", func(err error) error { return errors.Join(other, err) }, connect.CodeResourceExhausted},
		{"connect.NewError unknown", func(err error) error { return connect.NewError(connect.CodeUnknown, err) }, connect.CodeResourceExhausted},
		{"connect.NewError resource_exhausted", func(err error) error { return connect.NewError(connect.CodeResourceExhausted, err) }, connect.CodeResourceExhausted},
		{"connect.NewError invalid_argument", func(err error) error { return connect.NewError(connect.CodeInvalidArgument, err) }, connect.CodeInvalidArgument},
		{"wrapped connect.NewError failed_precondition", func(err error) error {
			return fmt.Errorf("h: %w", connect.NewError(connect.CodeFailedPrecondition, err))
		}, connect.CodeFailedPrecondition},
	} {
		s.set(func() {
			s.unary = func(ctx context.Context, n int64) (int64, error) {
				if err := limits.Grow(ctx, n); err != nil {
					return 0, tc.wrap(err)
				}
				limits.Shrink(ctx, n)
				return n, nil
			}
		})
		for _, proto := range protocols {
			_, err := s.client("/t.Attack/Do", proto).CallUnary(context.Background(), connect.NewRequest(wrapperspb.Int64(1<<30)))
			t.Logf("%s (%s): %v", tc.name, proto, err)
			assert.Equal(t, tc.code, code(err), "%s (%s)", tc.name, proto)
			var ce *connect.Error
			require.True(t, errors.As(err, &ce))
			// 6 in use: the request message, charged before it was unmarshaled.
			assert.Contains(t, ce.Message(), "requested 1073741824 bytes, 6 in use, limit 67108864", tc.name)
			if tc.code == connect.CodeResourceExhausted {
				assert.Equal(t, connectbudget.NoRetryPushback, ce.Meta().Get(connectbudget.PushbackKey), "%s (%s)", tc.name, proto)
			} else {
				assert.Empty(t, ce.Meta().Get(connectbudget.PushbackKey), "%s (%s): the handler's own error", tc.name, proto)
			}
			assert.Empty(t, ce.Meta().Get("Retry-After"))
		}
	}
	// curl's view over HTTP/1.1: 429 with the JSON error.
	resp, err := s.h1.Post(s.url+"/t.Attack/Do", "application/json", strings.NewReader(`"1073741824"`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s.set(func() {}) // the last handler chose failed_precondition: HTTP 400
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", body)
	waitIdle(t, s.pool)
}

// TestHeapCancelShapes: after the heap watch canceled the call, a handler
// that returns ctx.Err(), wrapped or not, context.Cause, or
// connect.NewError(connect.CodeCanceled, ctx.Err()) answers
// resource_exhausted with the pushback, over each protocol.
func TestHeapCancelShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 48 MiB under a lowered GOMEMLIMIT")
	}
	s := startAttack(t, limits.PoolConfig{Limit: 256 * mib, CancelLargest: true}, 128*mib)
	for _, tc := range []struct {
		name string
		ret  func(ctx context.Context) error
	}{
		{"ctx.Err()", func(ctx context.Context) error { return ctx.Err() }},
		{"wrapped ctx.Err()", func(ctx context.Context) error { return fmt.Errorf("scan: %w", ctx.Err()) }},
		{"context.Cause", func(ctx context.Context) error { return context.Cause(ctx) }},
		{"connect.NewError canceled", func(ctx context.Context) error { return connect.NewError(connect.CodeCanceled, ctx.Err()) }},
	} {
		for _, proto := range protocols {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			old := debug.SetMemoryLimit(int64(ms.HeapAlloc) + 48*mib)
			s.set(func() {
				s.unary = func(ctx context.Context, n int64) (int64, error) {
					if err := limits.Grow(ctx, n); err != nil {
						return 0, err
					}
					defer limits.Shrink(ctx, n)
					b := make([]byte, n)
					for i := 0; i < len(b); i += 4096 {
						b[i] = 1
					}
					for ctx.Err() == nil {
						runtime.GC()
						select {
						case <-ctx.Done():
						case <-time.After(10 * time.Millisecond):
						}
					}
					runtime.KeepAlive(b)
					return 0, tc.ret(ctx)
				}
			})
			_, err := s.client("/t.Attack/Do", proto).CallUnary(context.Background(), connect.NewRequest(wrapperspb.Int64(48*mib)))
			debug.SetMemoryLimit(old)
			t.Logf("%s (%s): %v", tc.name, proto, err)
			assert.Equal(t, connect.CodeResourceExhausted, code(err), "%s (%s)", tc.name, proto)
			var ce *connect.Error
			if assert.True(t, errors.As(err, &ce)) {
				assert.Contains(t, ce.Message(), "(heap pressure)")
				assert.Equal(t, "1000", ce.Meta().Get(connectbudget.PushbackKey), "%s (%s)", tc.name, proto)
			}
			waitIdle(t, s.pool)
		}
	}
}

// TestStreamMidway: a refusal after messages were sent (headers out,
// HTTP 200 already written) ends the stream with resource_exhausted:
// server streaming over each protocol, bidi over HTTP/2 (Connect and
// gRPC).
func TestStreamMidway(t *testing.T) {
	s := startAttack(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib)
	s.set(func() {
		s.server = func(ctx context.Context, n int64, send func(int64) error) error {
			var total int64
			defer func() { limits.Shrink(ctx, total) }()
			for {
				if err := limits.Grow(ctx, n); err != nil {
					return fmt.Errorf("after %d: %w", total, err)
				}
				total += n
				if err := send(total); err != nil {
					return err
				}
			}
		}
		s.bidi = func(ctx context.Context, st *connect.BidiStream[msg, msg]) error {
			var total int64
			defer func() { limits.Shrink(ctx, total) }()
			for {
				in, err := st.Receive()
				if errors.Is(err, io.EOF) {
					return nil
				} else if err != nil {
					return err
				}
				if err := limits.Grow(ctx, in.GetValue()); err != nil {
					return err
				}
				total += in.GetValue()
				if err := st.Send(wrapperspb.Int64(total)); err != nil {
					return err
				}
			}
		}
	})
	for _, proto := range protocols {
		st, err := s.client("/t.Attack/Server", proto).CallServerStream(context.Background(), connect.NewRequest(wrapperspb.Int64(16*mib)))
		require.NoError(t, err)
		got := 0
		for st.Receive() {
			got++
		}
		err = st.Err()
		st.Close()
		t.Logf("server stream (%s): %d messages, then %v", proto, got, err)
		// The request message's 5 bytes are held with the stream: three
		// 16 MiB steps fit the 64 MiB budget beside them, not four.
		assert.Equal(t, 3, got, proto)
		assert.Equal(t, connect.CodeResourceExhausted, code(err), proto)
		assert.Contains(t, err.Error(), "requested 16777216 bytes, 50331653 in use, limit 67108864", proto)
	}
	for _, proto := range protocols[1:] { // bidi needs HTTP/2
		st := s.client("/t.Attack/Bidi", proto).CallBidiStream(context.Background())
		for i := range 3 {
			require.NoError(t, st.Send(wrapperspb.Int64(20*mib)))
			out, err := st.Receive()
			require.NoError(t, err)
			assert.Equal(t, int64(i+1)*20*mib, out.GetValue())
		}
		_ = st.Send(wrapperspb.Int64(20 * mib))
		_, err := st.Receive()
		t.Logf("bidi (%s): %v", proto, err)
		assert.Equal(t, connect.CodeResourceExhausted, code(err), proto)
		// 62914565: three steps and the last message received (5 bytes).
		assert.Contains(t, fmt.Sprint(err), "requested 20971520 bytes, 62914565 in use, limit 67108864", proto)
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	}
	waitIdle(t, s.pool)
	assert.Equal(t, int64(5), s.pool.Stats().RefusedBy.Account)
}

// TestPanicReleases: a handler that panics while holding bytes gives them
// back, with connect.WithRecover before the budget interceptor (outside
// it); in a Strict pool the client sees the handler's own panic, not the
// leak's.
func TestPanicReleases(t *testing.T) {
	for _, strict := range []bool{false, true} {
		var recovered []any
		var mu sync.Mutex
		rec := connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, r any) error {
			mu.Lock()
			recovered = append(recovered, r)
			mu.Unlock()
			return connect.NewError(connect.CodeInternal, fmt.Errorf("panic: %v", r))
		})
		s := startAttack(t, limits.PoolConfig{Limit: 512 * mib, Strict: strict}, 64*mib, rec)
		s.set(func() {
			s.unary = func(ctx context.Context, n int64) (int64, error) {
				if err := limits.Grow(ctx, n); err != nil {
					return 0, err
				}
				panic("boom")
			}
			s.server = func(ctx context.Context, n int64, _ func(int64) error) error {
				if err := limits.Grow(ctx, n); err != nil {
					return err
				}
				panic("boom")
			}
		})
		for _, proto := range protocols {
			_, err := s.client("/t.Attack/Do", proto).CallUnary(context.Background(), connect.NewRequest(wrapperspb.Int64(8*mib)))
			assert.Equal(t, connect.CodeInternal, code(err), "%s: %v", proto, err)
			assert.Contains(t, fmt.Sprint(err), "panic: boom", "strict %v (%s): the handler's own panic", strict, proto)
			st, err := s.client("/t.Attack/Server", proto).CallServerStream(context.Background(), connect.NewRequest(wrapperspb.Int64(8*mib)))
			require.NoError(t, err)
			for st.Receive() {
			}
			assert.Equal(t, connect.CodeInternal, code(st.Err()), "%s: %v", proto, st.Err())
			assert.Contains(t, fmt.Sprint(st.Err()), "panic: boom", "strict %v (%s): the handler's own panic", strict, proto)
			st.Close()
		}
		waitIdle(t, s.pool)
		assert.Equal(t, int64(6), s.pool.Stats().Leaked, "strict %v", strict)
	}
}

// TestNestedInOuterWork: a call inside an account of the same pool that
// the heap watch closed (an outer layer bound it, as the pool's HTTP
// middleware does) gets resource_exhausted with the pushback, over each
// protocol, without running the handler.
func TestNestedInOuterWork(t *testing.T) {
	var pool *limits.Pool
	outer := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			a, err := pool.Open("outer", 64*mib)
			if err != nil {
				return nil, err
			}
			pctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			wctx, done := limits.WithAccount(pctx, a)
			defer done()
			cancel(&limits.ExhaustedError{Scope: "connect/outer (heap pressure)", Requested: 1, Used: 2, Limit: 3, RetryAfter: time.Second})
			for a.Grow(1) == nil { // the close reaches a on a goroutine of its own
				a.Shrink(1)
				runtime.Gosched()
			}
			return next(wctx, req)
		}
	})
	s := startAttack(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib, connect.WithInterceptors(outer))
	pool = s.pool
	s.set(func() {
		s.unary = func(context.Context, int64) (int64, error) {
			t.Error("the handler ran")
			return 0, nil
		}
	})
	for _, proto := range protocols {
		_, err := s.client("/t.Attack/Do", proto).CallUnary(context.Background(), connect.NewRequest(wrapperspb.Int64(mib)))
		t.Logf("%s: %v", proto, err)
		assert.Equal(t, connect.CodeResourceExhausted, code(err), proto)
		var ce *connect.Error
		if assert.True(t, errors.As(err, &ce)) {
			assert.Contains(t, ce.Message(), "connect/outer (heap pressure)")
			assert.Equal(t, "1000", ce.Meta().Get(connectbudget.PushbackKey), proto)
		}
	}
	waitIdle(t, s.pool)
}
