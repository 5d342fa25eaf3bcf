package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/memctl/memctl/connectbudget"
	"github.com/memctl/memctl/limits"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// server is the example server on a loopback port.
type server struct {
	pool *limits.Pool
	url  string
	h1   *http.Client // HTTP/1.1: the Connect protocol
	h2c  *http.Client // HTTP/2 without TLS: the gRPC protocol
}

// startServer serves the Store on 127.0.0.1 with a pool configured by pc
// and, when budget > 0, the interceptor with that per-call budget.
func startServer(t testing.TB, pc limits.PoolConfig, budget int64, extra ...connect.HandlerOption) *server {
	t.Helper()
	return startServerWith(t, pc, budget, Options, extra...)
}

// startServerWith is startServer with the budget's option from options
// (Options or InterceptorOptions).
func startServerWith(t testing.TB, pc limits.PoolConfig, budget int64, options func(*limits.Pool, connectbudget.Config) (connect.HandlerOption, error), extra ...connect.HandlerOption) *server {
	t.Helper()
	pc.Name = "connect"
	pc.Logger = slog.New(slog.DiscardHandler)
	pool, err := limits.NewPool(pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	opts := extra
	if budget > 0 {
		o, err := options(pool, connectbudget.Config{Limit: budget})
		require.NoError(t, err)
		opts = append(opts, o)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(NewHandler(opts...))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &p}}
	h1 := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(h1.CloseIdleConnections)
	t.Cleanup(h2c.CloseIdleConnections)
	return &server{pool: pool, url: "http://" + ln.Addr().String(), h1: h1, h2c: h2c}
}

// client returns a Connect client of method, over the gRPC protocol when
// grpc is set.
func (s *server) client(method string, grpc bool) *connect.Client[wrapperspb.Int64Value, wrapperspb.Int64Value] {
	if grpc {
		return connect.NewClient[wrapperspb.Int64Value, wrapperspb.Int64Value](s.h2c, s.url+Procedure(method), connect.WithGRPC())
	}
	return connect.NewClient[wrapperspb.Int64Value, wrapperspb.Int64Value](s.h1, s.url+Procedure(method))
}

func (s *server) call(ctx context.Context, method string, n int64, grpc bool) (int64, error) {
	resp, err := s.client(method, grpc).CallUnary(ctx, connect.NewRequest(wrapperspb.Int64(n)))
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetValue(), nil
}

func (s *server) stream(ctx context.Context, n int64, grpc bool) (int64, error) {
	st, err := s.client("AllocStream", grpc).CallServerStream(ctx, connect.NewRequest(wrapperspb.Int64(n)))
	if err != nil {
		return 0, err
	}
	defer st.Close()
	var got int64
	for st.Receive() {
		got = st.Msg().GetValue()
	}
	return got, st.Err()
}

// raw posts n as JSON (the Connect protocol as curl speaks it) and returns
// the HTTP status, the Retry-After header and the body.
func (s *server) raw(t *testing.T, method string, n int64) (int, string, string) {
	t.Helper()
	resp, err := s.h1.Post(s.url+Procedure(method), "application/json", strings.NewReader(`"`+strconv.FormatInt(n, 10)+`"`))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
}

// smallCalls sends 64 KiB Alloc calls in a loop until stop is called.
func (s *server) smallCalls() (stop func() (ok int64, failed []error)) {
	var wg sync.WaitGroup
	var n atomic.Int64
	var mu sync.Mutex
	var errs []error
	ctx, cancel := context.WithCancel(context.Background())
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			got, err := s.call(ctx, "Alloc", 64*kib, i%2 == 0)
			switch {
			case err == nil && got == 64*kib:
				n.Add(1)
			case ctx.Err() == nil:
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			time.Sleep(time.Millisecond)
		}
	})
	return func() (int64, []error) {
		time.Sleep(20 * time.Millisecond)
		cancel()
		wg.Wait()
		return n.Load(), errs
	}
}

// requireExhausted checks that err is resource_exhausted with a message
// naming the scope and the sizes, and returns its pushback metadata.
func requireExhausted(t *testing.T, err error, scope, requested string) (retryAfter, pushback string) {
	t.Helper()
	var ce *connect.Error
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, connect.CodeResourceExhausted, ce.Code(), "%v", err)
	assert.Equal(t, "resource_exhausted", ce.Code().String())
	assert.Contains(t, ce.Message(), "limits: resource_exhausted in "+scope)
	if requested != "" {
		assert.Contains(t, ce.Message(), "requested "+requested+" bytes")
	}
	assert.Contains(t, ce.Message(), " in use, limit ")
	return ce.Meta().Get("Retry-After"), ce.Meta().Get(connectbudget.PushbackKey)
}

// TestOverBudget: a 1 GiB call against a 64 MiB budget gets
// resource_exhausted, HTTP 429, whether the handler returns the error as
// is, wrapped, or from a server stream, over the Connect and the gRPC
// protocols, with no Retry-After and the pushback -1 (do not retry); small
// calls keep succeeding.
func TestOverBudget(t *testing.T) {
	s := startServer(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib)
	stop := s.smallCalls()
	ctx := context.Background()
	for _, grpc := range []bool{false, true} {
		for _, tc := range []struct {
			name string
			call func() (int64, error)
		}{
			{"as is", func() (int64, error) { return s.call(ctx, "Alloc", gib, grpc) }},
			{"wrapped", func() (int64, error) { return s.call(ctx, "AllocWrapped", gib, grpc) }},
			{"stream", func() (int64, error) { return s.stream(ctx, gib, grpc) }},
		} {
			_, err := tc.call()
			t.Logf("%s (grpc %v): %v", tc.name, grpc, err)
			ra, pb := requireExhausted(t, err, "connect/req-", "1073741824")
			assert.Empty(t, ra, "no Retry-After over the call's own budget")
			assert.Equal(t, connectbudget.NoRetryPushback, pb, "gRFC A6: do not retry")
			got, err := s.call(ctx, "Alloc", mib, grpc)
			require.NoError(t, err)
			assert.Equal(t, mib, got)
		}
	}
	code, ra, body := s.raw(t, "Alloc", gib)
	t.Logf("curl: %d Retry-After %q %s", code, ra, body)
	assert.Equal(t, http.StatusTooManyRequests, code)
	assert.Empty(t, ra)
	var eb struct{ Code, Message string }
	require.NoError(t, json.Unmarshal([]byte(body), &eb))
	assert.Equal(t, "resource_exhausted", eb.Code)
	assert.True(t, strings.HasPrefix(eb.Message, "limits: resource_exhausted in connect/req-"), eb.Message)
	ok, failed := stop()
	assert.Empty(t, failed)
	assert.Positive(t, ok)
	st := s.pool.Stats()
	assert.Equal(t, int64(7), st.RefusedBy.Account)
	assert.Equal(t, int64(0), st.InFlight)
}

// TestWithoutInterceptor: the control, issue 20's first failure: behind
// an interceptor that only binds an account, the same 1 GiB call gets
// unknown (HTTP 500), and a heap-watch cancel canceled (HTTP 499).
func TestWithoutInterceptor(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	var pool *limits.Pool
	bind := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			a, err := pool.Open("by-hand", 64*mib)
			if err != nil {
				return nil, err
			}
			ctx, done := limits.WithAccount(ctx, a)
			defer done()
			return next(ctx, req)
		}
	})
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib, CancelLargest: true}, 0, connect.WithInterceptors(bind))
	pool = s.pool
	for _, m := range []string{"Alloc", "AllocWrapped"} {
		code, _, body := s.raw(t, m, gib)
		assert.Equal(t, http.StatusInternalServerError, code, "%s: %s", m, body)
		assert.Contains(t, body, `"code":"unknown"`)
	}
	if !testing.Short() {
		debug.SetMemoryLimit(256 * mib)
		calm(t, pool)
		code, _, body := s.raw(t, "AllocUndercharged", gib)
		assert.Equal(t, 499, code, body)
		assert.Contains(t, body, `"code":"canceled"`)
	}
}

// TestPoolFull: a call refused because the pool is full gets
// resource_exhausted with Retry-After: 1 (Connect, HTTP 429) and
// grpc-retry-pushback-ms: 1000 (gRPC); a call larger than the whole pool
// gets neither; once the holders end, the call succeeds.
func TestPoolFull(t *testing.T) {
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib}, 64*mib)
	hctx, release := context.WithCancel(context.Background())
	var held sync.WaitGroup
	for range 2 {
		held.Go(func() { _, _ = s.call(hctx, "Hold", 60*mib, false) })
	}
	require.Eventually(t, func() bool { return s.pool.Used() >= 120*mib }, 10*time.Second, time.Millisecond)
	stop := s.smallCalls() // 64 KiB calls fit in what the holders leave
	ctx := context.Background()
	for _, grpc := range []bool{false, true} {
		_, err := s.call(ctx, "Alloc", 32*mib, grpc)
		t.Logf("pool full (grpc %v): %v", grpc, err)
		ra, pb := requireExhausted(t, err, "connect: ", "33554432")
		assert.Equal(t, "1000", pb)
		if !grpc {
			assert.Equal(t, "1", ra)
		}
		_, err = s.stream(ctx, 32*mib, grpc)
		_, pb = requireExhausted(t, err, "connect: ", "33554432")
		assert.Equal(t, "1000", pb)
	}
	code, ra, body := s.raw(t, "Alloc", 32*mib)
	assert.Equal(t, http.StatusTooManyRequests, code, body)
	assert.Equal(t, "1", ra)

	big := startServer(t, limits.PoolConfig{Limit: 32 * mib}, limits.Unlimited)
	_, err := big.call(ctx, "Alloc", 64*mib, true)
	ra, pb := requireExhausted(t, err, "connect: ", "67108864")
	assert.Empty(t, ra)
	assert.Equal(t, connectbudget.NoRetryPushback, pb)

	ok, failed := stop()
	assert.Empty(t, failed, "small calls while the pool is nearly full")
	assert.Positive(t, ok)
	release()
	held.Wait()
	require.Eventually(t, func() bool { return s.pool.Used() == 0 }, 10*time.Second, time.Millisecond)
	got, err := s.call(ctx, "Alloc", 32*mib, false)
	require.NoError(t, err)
	assert.Equal(t, 32*mib, got)
}

// TestHeapCancel: with GOMEMLIMIT at 256 MiB, the 1 GiB under-charging
// call is canceled by the heap watch; the handler returns ctx.Err() and the
// client gets resource_exhausted (HTTP 429), with the pushback, not
// canceled; small calls succeed again once it ends.
func TestHeapCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds about 230 MiB")
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(256 * mib))
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib, CancelLargest: true}, 64*mib)
	ctx := context.Background()
	for _, grpc := range []bool{false, true} {
		calm(t, s.pool)
		_, err := s.call(ctx, "AllocUndercharged", gib, grpc)
		t.Logf("heap cancel (grpc %v): %v", grpc, err)
		ra, pb := requireExhausted(t, err, "connect/req-", "")
		assert.Equal(t, "1000", pb)
		if !grpc {
			assert.Equal(t, "1", ra)
		}
		var ce *connect.Error
		require.True(t, errors.As(err, &ce))
		assert.Contains(t, ce.Message(), "context canceled: limits: resource_exhausted in connect/req-")
		assert.Contains(t, ce.Message(), "(heap pressure)")
		require.Eventually(t, func() bool {
			_, err := s.call(ctx, "Alloc", mib, grpc)
			return err == nil
		}, 10*time.Second, 10*time.Millisecond, "small calls are served again")
	}
	calm(t, s.pool)
	code, _, body := s.raw(t, "AllocUndercharged", gib)
	assert.Equal(t, http.StatusTooManyRequests, code, body)
	assert.Equal(t, int64(3), s.pool.Stats().Canceled)
}

// TestAfterBurst: a call whose peak, or refused Grow, reached the burst
// threshold (32 MiB, half the 64 MiB budget) calls AfterBurst after the
// handler returns, unary and streaming; a small call does not.
func TestAfterBurst(t *testing.T) {
	pool, err := limits.NewPool(limits.PoolConfig{Name: "connect", Limit: 512 * mib, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	var bursts atomic.Int64
	i, err := connectbudget.NewInterceptor(pool, connectbudget.Config{Limit: 64 * mib, AfterBurst: func() { bursts.Add(1) }})
	require.NoError(t, err)
	srv := httptest.NewServer(NewHandler(connect.WithInterceptors(i)))
	defer srv.Close()
	s := &server{pool: pool, url: srv.URL, h1: srv.Client()}
	ctx := context.Background()
	_, err = s.call(ctx, "Alloc", mib, false)
	require.NoError(t, err)
	assert.Equal(t, int64(0), bursts.Load())
	_, err = s.call(ctx, "Alloc", 40*mib, false)
	require.NoError(t, err)
	assert.Equal(t, int64(1), bursts.Load())
	_, err = s.stream(ctx, 40*mib, false)
	require.NoError(t, err)
	_, err = s.call(ctx, "Alloc", gib, false)
	require.Error(t, err)
	assert.Eventually(t, func() bool { return bursts.Load() == 3 }, 5*time.Second, time.Millisecond, "a refused 1 GiB Grow ends a burst too")
}

// calm waits, running GC cycles, until the pool is not under heap
// pressure: what an earlier test (or iteration, with -count) built is
// collected before a call that the heap watch is to cancel.
func calm(t *testing.T, pool *limits.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		runtime.GC()
		return !pool.Stats().UnderHeapPressure
	}, 10*time.Second, 10*time.Millisecond, "the heap watch still sees pressure")
}

// TestConfigAndError: a budget of 0 or less is an error; Error maps only
// budget errors; a closed pool answers unavailable.
func TestConfigAndError(t *testing.T) {
	pool, err := limits.NewPool(limits.PoolConfig{Limit: mib, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	for _, l := range []int64{0, -1} {
		_, err := connectbudget.NewInterceptor(pool, connectbudget.Config{Limit: l})
		assert.ErrorIs(t, err, limits.ErrInvalidSize)
	}
	assert.Nil(t, connectbudget.Error(errors.New("other")))
	assert.Nil(t, connectbudget.Error(nil))
	e := connectbudget.Error(&limits.ExhaustedError{Scope: "connect", Requested: 1, Used: 2, Limit: 3, RetryAfter: 1500 * time.Millisecond})
	assert.Equal(t, connect.CodeResourceExhausted, e.Code())
	assert.Equal(t, "2", e.Meta().Get("Retry-After"))
	assert.Equal(t, "1500", e.Meta().Get(connectbudget.PushbackKey))
	// A handler that answered with the code itself keeps its error, and
	// gets the pushback.
	own := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("query: %w", &limits.ExhaustedError{Scope: "connect", RetryAfter: time.Second}))
	assert.Same(t, own, connectbudget.Error(own))
	assert.Equal(t, "1", own.Meta().Get("Retry-After"))
	// A code the handler chose, wrapping a budget error, stands (as a gRPC
	// status does in grpcbudget); unknown and canceled do not count as chosen.
	other := connect.NewError(connect.CodeInternal, &limits.ExhaustedError{Scope: "connect"})
	assert.Nil(t, connectbudget.Error(other))
	for _, c := range []connect.Code{connect.CodeUnknown, connect.CodeCanceled} {
		e := connectbudget.Error(connect.NewError(c, &limits.ExhaustedError{Scope: "connect"}))
		assert.Equal(t, connect.CodeResourceExhausted, e.Code())
		assert.Equal(t, connectbudget.NoRetryPushback, e.Meta().Get(connectbudget.PushbackKey))
	}
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib}, 64*mib)
	s.pool.Close()
	_, err = s.call(context.Background(), "Alloc", kib, false)
	assert.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
}

// BenchmarkInterceptorRatio: the budget's cost as a ratio: each iteration
// makes one 1 KiB Alloc call (Connect protocol, HTTP/1.1) to the server
// without the budget and one to the same server with it (alternating which
// goes first), and the ratio of the sums is reported (budget/plain).
// impl=budget is connectbudget.HandlerOptions (messages charged before
// they are unmarshaled), impl=interceptor the interceptor alone.
func BenchmarkInterceptorRatio(b *testing.B) {
	b.Run("impl=budget", func(b *testing.B) { benchRatio(b, Options) })
	b.Run("impl=interceptor", func(b *testing.B) { benchRatio(b, InterceptorOptions) })
}

func benchRatio(b *testing.B, options func(*limits.Pool, connectbudget.Config) (connect.HandlerOption, error)) {
	plain := startServer(b, limits.PoolConfig{Limit: 512 * mib}, 0)
	budget := startServerWith(b, limits.PoolConfig{Limit: 512 * mib}, 64*mib, options)
	ctx := context.Background()
	var tPlain, tBudget time.Duration
	timed := func(s *server) time.Duration {
		start := time.Now()
		if _, err := s.call(ctx, "Alloc", kib, false); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	i := 0
	for b.Loop() {
		if i++; i%2 == 0 {
			tPlain += timed(plain)
			tBudget += timed(budget)
		} else {
			tBudget += timed(budget)
			tPlain += timed(plain)
		}
	}
	b.ReportMetric(float64(tBudget)/float64(tPlain), "budget/plain")
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(i), "plain-ns/call")
	b.ReportMetric(float64(tBudget.Nanoseconds())/float64(i), "budget-ns/call")
}

// Options returns connectbudget.HandlerOptions: pass it first, with
// connect.WithReadMaxBytes(the per-call budget).
func Options(pool *limits.Pool, cfg connectbudget.Config) (connect.HandlerOption, error) {
	return connectbudget.HandlerOptions(pool, cfg)
}
