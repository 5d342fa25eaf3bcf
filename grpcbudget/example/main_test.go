package main

import (
	"context"
	"errors"
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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/memctl/memctl/grpcbudget"
	"github.com/memctl/memctl/limits"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// server is the example server on a loopback port, and a real grpc-go
// client connection to it.
type server struct {
	pool *limits.Pool
	conn *grpc.ClientConn
}

// startServer serves the Store on 127.0.0.1 with a pool configured by pc
// and, when budget > 0, the interceptors with that per-call budget.
func startServer(t testing.TB, pc limits.PoolConfig, budget int64) *server {
	t.Helper()
	return startServerWith(t, pc, budget, Options)
}

// startServerWith is startServer with the budget's options from options
// (Options or InterceptorOptions).
func startServerWith(t testing.TB, pc limits.PoolConfig, budget int64, options func(*limits.Pool, grpcbudget.Config) ([]grpc.ServerOption, error)) *server {
	t.Helper()
	pc.Name = "grpc"
	pc.Logger = slog.New(slog.DiscardHandler)
	pool, err := limits.NewPool(pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var opts []grpc.ServerOption
	if budget > 0 {
		opts, err = options(pool, grpcbudget.Config{Limit: budget})
		require.NoError(t, err)
	}
	srv := NewServer(opts...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &server{pool: pool, conn: conn}
}

// call is one unary call of method with size n; it returns the answer, the
// error and the trailer.
func (s *server) call(ctx context.Context, method string, n int64) (int64, metadata.MD, error) {
	var trailer metadata.MD
	out := new(wrapperspb.Int64Value)
	err := s.conn.Invoke(ctx, "/"+ServiceName+"/"+method, wrapperspb.Int64(n), out, grpc.Trailer(&trailer))
	return out.GetValue(), trailer, err
}

// stream calls AllocStream with size n and returns its one answer.
func (s *server) stream(ctx context.Context, n int64) (int64, metadata.MD, error) {
	st, err := s.conn.NewStream(ctx, &storeDesc.Streams[0], "/"+ServiceName+"/AllocStream")
	if err != nil {
		return 0, nil, err
	}
	if err := st.SendMsg(wrapperspb.Int64(n)); err != nil {
		return 0, nil, err
	}
	if err := st.CloseSend(); err != nil {
		return 0, nil, err
	}
	out := new(wrapperspb.Int64Value)
	err = st.RecvMsg(out)
	return out.GetValue(), st.Trailer(), err
}

// smallCalls sends 64 KiB Alloc calls in a loop until stop is called, which
// returns how many succeeded and the errors of those that failed.
func (s *server) smallCalls() (stop func() (ok int64, failed []error)) {
	var wg sync.WaitGroup
	var n atomic.Int64
	var mu sync.Mutex
	var errs []error
	ctx, cancel := context.WithCancel(context.Background())
	wg.Go(func() {
		for ctx.Err() == nil {
			got, _, err := s.call(ctx, "Alloc", 64*kib)
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
		time.Sleep(20 * time.Millisecond) // a few after the large ones
		cancel()
		wg.Wait()
		return n.Load(), errs
	}
}

// requireExhausted checks that err is code 8 with a message naming the
// scope and the sizes, and returns the pushback trailer's values.
func requireExhausted(t *testing.T, err error, trailer metadata.MD, scope string, requested string) []string {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	assert.Equal(t, 8, int(st.Code()))
	assert.Contains(t, st.Message(), "limits: resource_exhausted in "+scope)
	if requested != "" {
		assert.Contains(t, st.Message(), "requested "+requested+" bytes")
	}
	assert.Contains(t, st.Message(), " in use, limit ")
	return trailer.Get(grpcbudget.PushbackKey)
}

// TestOverBudget: a 1 GiB call against a 64 MiB budget gets code 8 whether
// the handler returns the budget error as is, wrapped with %w, or from a
// server stream, with the pushback -1, do not retry (a retry meets the same budget);
// small calls keep succeeding all along.
func TestOverBudget(t *testing.T) {
	s := startServer(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib)
	stop := s.smallCalls()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() (int64, metadata.MD, error)
	}{
		{"as is", func() (int64, metadata.MD, error) { return s.call(ctx, "Alloc", gib) }},
		{"wrapped", func() (int64, metadata.MD, error) { return s.call(ctx, "AllocWrapped", gib) }},
		{"stream", func() (int64, metadata.MD, error) { return s.stream(ctx, gib) }},
	} {
		_, trailer, err := tc.call()
		t.Logf("%s: %v; trailer %v", tc.name, err, trailer)
		assert.Equal(t, []string{grpcbudget.NoRetryPushback}, requireExhausted(t, err, trailer, "grpc/req-", "1073741824"), "do not retry over the call's own budget")
		got, _, err := s.call(ctx, "Alloc", mib)
		require.NoError(t, err, "a small call after %s", tc.name)
		assert.Equal(t, mib, got)
	}
	got, _, err := s.stream(ctx, mib)
	require.NoError(t, err)
	assert.Equal(t, mib, got)
	ok, failed := stop()
	assert.Empty(t, failed)
	assert.Positive(t, ok)
	st := s.pool.Stats()
	assert.Equal(t, int64(3), st.RefusedBy.Account)
	assert.Equal(t, int64(0), st.InFlight)
	assert.Equal(t, int64(3), st.Peaks.Above(64*mib), "the three refused calls are in the peak histogram")
}

// TestWithoutInterceptors: the control, issue 20's first failure. The same
// handlers behind an interceptor that only binds an account (what a
// service writes by hand without this package) send the 1 GiB call's
// budget error as code 2 Unknown, as is or wrapped, and a heap-watch
// cancel as 1 CANCELLED.
func TestWithoutInterceptors(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(debug.SetMemoryLimit(-1)))
	pool, err := limits.NewPool(limits.PoolConfig{Name: "grpc", Limit: 128 * mib, CancelLargest: true, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	bind := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		a, err := pool.Open("by-hand", 64*mib)
		if err != nil {
			return nil, err
		}
		ctx, done := limits.WithAccount(ctx, a)
		defer done()
		return handler(ctx, req)
	}
	srv := NewServer(grpc.UnaryInterceptor(bind))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	s := &server{pool: pool, conn: conn}
	for _, m := range []string{"Alloc", "AllocWrapped"} {
		_, _, err := s.call(context.Background(), m, gib)
		assert.Equal(t, codes.Unknown, status.Code(err), "%s: %v", m, err)
	}
	if !testing.Short() {
		debug.SetMemoryLimit(256 * mib)
		calm(t, pool)
		_, _, err := s.call(context.Background(), "AllocUndercharged", gib)
		assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	}
}

// TestPoolFull: a call refused because the pool is full (two calls hold
// 2×60 MiB of a 128 MiB pool; a third asks for 32 MiB, within its own
// budget) gets code 8 and grpc-retry-pushback-ms: 1000, for the unary and
// the streaming form; once the holders end, the same call succeeds.
func TestPoolFull(t *testing.T) {
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib}, 64*mib)
	hctx, release := context.WithCancel(context.Background())
	var held sync.WaitGroup
	for range 2 {
		held.Go(func() { _, _, _ = s.call(hctx, "Hold", 60*mib) })
	}
	require.Eventually(t, func() bool { return s.pool.Used() >= 120*mib }, 10*time.Second, time.Millisecond)
	stop := s.smallCalls() // 64 KiB calls fit in what the holders leave
	ctx := context.Background()
	_, trailer, err := s.call(ctx, "Alloc", 32*mib)
	t.Logf("pool full: %v; trailer %v", err, trailer)
	assert.Equal(t, []string{"1000"}, requireExhausted(t, err, trailer, "grpc: ", "33554432"))
	_, trailer, err = s.stream(ctx, 32*mib)
	assert.Equal(t, []string{"1000"}, requireExhausted(t, err, trailer, "grpc: ", "33554432"))
	// A call larger than the whole pool cannot succeed on a retry: do not retry.
	big := startServer(t, limits.PoolConfig{Limit: 32 * mib}, limits.Unlimited)
	_, trailer, err = big.call(ctx, "Alloc", 64*mib)
	assert.Equal(t, []string{grpcbudget.NoRetryPushback}, requireExhausted(t, err, trailer, "grpc: ", "67108864"))

	ok, failed := stop()
	assert.Empty(t, failed, "small calls while the pool is nearly full")
	assert.Positive(t, ok)
	release()
	held.Wait()
	require.Eventually(t, func() bool { return s.pool.Used() == 0 }, 10*time.Second, time.Millisecond, "the holders' handlers end")
	got, _, err := s.call(ctx, "Alloc", 32*mib)
	require.NoError(t, err)
	assert.Equal(t, 32*mib, got)
	assert.Equal(t, int64(2), s.pool.Stats().RefusedBy.Pool)
}

// TestPushbackRetry: a grpc-go client whose retry policy lists
// RESOURCE_EXHAUSTED (with a 10 ms backoff of its own) waits the server's
// pushback, 1 s, after a pool-full refusal, and its retry succeeds once
// the holders have ended.
func TestPushbackRetry(t *testing.T) {
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib}, 64*mib)
	hctx, release := context.WithCancel(context.Background())
	defer release()
	var held sync.WaitGroup
	for range 2 {
		held.Go(func() { _, _, _ = s.call(hctx, "Hold", 60*mib) })
	}
	require.Eventually(t, func() bool { return s.pool.Used() >= 120*mib }, 10*time.Second, time.Millisecond)
	conn, err := grpc.NewClient(s.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"`+ServiceName+`"}],"retryPolicy":{
			"maxAttempts":2,"initialBackoff":"0.01s","maxBackoff":"0.01s","backoffMultiplier":1,
			"retryableStatusCodes":["RESOURCE_EXHAUSTED"]}}]}`))
	require.NoError(t, err)
	defer conn.Close()
	retrying := &server{pool: s.pool, conn: conn}
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, _, err := retrying.call(context.Background(), "Alloc", 32*mib)
		done <- err
	}()
	require.Eventually(t, func() bool { return s.pool.Stats().RefusedBy.Pool == 1 }, 10*time.Second, time.Millisecond, "the first attempt is refused")
	release()
	held.Wait()
	require.Eventually(t, func() bool { return s.pool.Used() == 0 }, 10*time.Second, time.Millisecond)
	require.NoError(t, <-done, "the retry after the pushback succeeds")
	elapsed := time.Since(start)
	t.Logf("refused, then served by the client's retry after %v", elapsed.Round(time.Millisecond))
	assert.GreaterOrEqual(t, elapsed, 900*time.Millisecond, "the client waited the pushback, not its own 10 ms backoff")
	assert.Equal(t, int64(1), s.pool.Stats().RefusedBy.Pool)
}

// TestHeapCancel: with GOMEMLIMIT at 256 MiB, a 1 GiB call whose handler
// under-charges (32 MiB charged) is canceled by the heap watch
// (PoolConfig.CancelLargest) before it reaches its 64 MiB budget; the
// handler returns ctx.Err(), and the client gets code 8, with the pushback
// (the heap frees as the call ends), not CANCELLED. Small calls succeed
// again once it ends.
func TestHeapCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds about 230 MiB")
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(256 * mib))
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib, CancelLargest: true}, 64*mib)
	ctx := context.Background()
	calm(t, s.pool)
	_, trailer, err := s.call(ctx, "AllocUndercharged", gib)
	t.Logf("heap cancel: %v; trailer %v", err, trailer)
	assert.Equal(t, []string{"1000"}, requireExhausted(t, err, trailer, "grpc/req-", ""))
	assert.Contains(t, status.Convert(err).Message(), "context canceled: limits: resource_exhausted in grpc/req-1 (heap pressure)")
	assert.Equal(t, int64(1), s.pool.Stats().Canceled)
	require.Eventually(t, func() bool {
		_, _, err := s.call(ctx, "Alloc", mib)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "small calls are served again")
	// The streaming form.
	st, err := s.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/"+ServiceName+"/AllocStream")
	require.NoError(t, err)
	require.NoError(t, st.SendMsg(wrapperspb.Int64(mib)))
	require.NoError(t, st.CloseSend())
	require.NoError(t, st.RecvMsg(new(wrapperspb.Int64Value)))
}

// TestAfterBurst: a call whose peak reached the burst threshold (32 MiB,
// half the 64 MiB budget), or whose refused Grow did, calls AfterBurst
// after the handler returns, unary and streaming; a small call does not.
func TestAfterBurst(t *testing.T) {
	pool, err := limits.NewPool(limits.PoolConfig{Name: "grpc", Limit: 512 * mib, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	var bursts atomic.Int64
	opts, err := Options(pool, grpcbudget.Config{Limit: 64 * mib, AfterBurst: func() { bursts.Add(1) }})
	require.NoError(t, err)
	srv := NewServer(opts...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	s := &server{pool: pool, conn: conn}
	ctx := context.Background()
	_, _, err = s.call(ctx, "Alloc", mib)
	require.NoError(t, err)
	assert.Equal(t, int64(0), bursts.Load())
	_, _, err = s.call(ctx, "Alloc", 40*mib)
	require.NoError(t, err)
	assert.Equal(t, int64(1), bursts.Load())
	_, _, err = s.stream(ctx, 40*mib)
	require.NoError(t, err)
	_, _, err = s.call(ctx, "Alloc", gib)
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

// TestConfigAndStatus: a budget of 0 or less is an error; Status maps only
// budget errors.
func TestConfigAndStatus(t *testing.T) {
	pool, err := limits.NewPool(limits.PoolConfig{Limit: mib, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	for _, l := range []int64{0, -1} {
		_, err := grpcbudget.UnaryServerInterceptor(pool, grpcbudget.Config{Limit: l})
		assert.ErrorIs(t, err, limits.ErrInvalidSize)
		_, err = grpcbudget.StreamServerInterceptor(pool, grpcbudget.Config{Limit: l})
		assert.ErrorIs(t, err, limits.ErrInvalidSize)
	}
	st, pb := grpcbudget.Status(errors.New("other"))
	assert.Nil(t, st)
	assert.Empty(t, pb)
	st, pb = grpcbudget.Status(&limits.ExhaustedError{Scope: "grpc", Requested: 1, Used: 2, Limit: 3, RetryAfter: 1500 * time.Millisecond})
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	assert.Equal(t, "1500", pb)
	assert.True(t, strings.HasPrefix(st.Message(), "limits: resource_exhausted in grpc: requested 1 bytes"))
	// A closed pool: UNAVAILABLE, the handler does not run.
	s := startServer(t, limits.PoolConfig{Limit: 128 * mib}, 64*mib)
	s.pool.Close()
	_, _, err = s.call(context.Background(), "Alloc", kib)
	assert.Equal(t, codes.Unavailable, status.Code(err))
}

// BenchmarkInterceptor: 1 KiB Alloc calls over loopback against the same
// server without the budget (impl=plain), with the interceptors alone
// (impl=interceptors) and with grpcbudget.ServerOptions (impl=budget:
// messages charged before they are unmarshaled); compare with benchstat
// -col /impl.
func BenchmarkInterceptor(b *testing.B) {
	for _, impl := range []string{"plain", "interceptors", "budget"} {
		b.Run("impl="+impl, func(b *testing.B) {
			budget, options := int64(64*mib), Options
			switch impl {
			case "plain":
				budget = 0
			case "interceptors":
				options = InterceptorOptions
			}
			s := startServerWith(b, limits.PoolConfig{Limit: 512 * mib}, budget, options)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := s.call(ctx, "Alloc", kib); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkInterceptorRatio: the budget's cost as a ratio, measured so
// that the shared machine's drift cancels: each iteration makes one 1 KiB
// Alloc call to the server without the budget and one to the same server
// with it (alternating which goes first), timing each, and reports the
// ratio of the sums (budget/plain). impl=budget is grpcbudget.ServerOptions
// (messages charged before they are unmarshaled), impl=interceptors the
// interceptors alone.
func BenchmarkInterceptorRatio(b *testing.B) {
	b.Run("impl=budget", func(b *testing.B) { benchRatio(b, Options) })
	b.Run("impl=interceptors", func(b *testing.B) { benchRatio(b, InterceptorOptions) })
}

func benchRatio(b *testing.B, options func(*limits.Pool, grpcbudget.Config) ([]grpc.ServerOption, error)) {
	plain := startServer(b, limits.PoolConfig{Limit: 512 * mib}, 0)
	budget := startServerWith(b, limits.PoolConfig{Limit: 512 * mib}, 64*mib, options)
	ctx := context.Background()
	var tPlain, tBudget time.Duration
	timed := func(s *server) time.Duration {
		start := time.Now()
		if _, _, err := s.call(ctx, "Alloc", kib); err != nil {
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

// Input (issue 27, item 4): the HTTP and gRPC examples each made a pool of
// half of GOMEMLIMIT, and request names repeated across them. Here one pool
// serves both: a 1 GiB HTTP request and a 1 GiB gRPC call are refused by
// the same pool, under names numbered in it.
func TestOnePoolForHTTPAndGRPC(t *testing.T) {
	s := startServer(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib)
	h, err := HTTPHandler(s.pool, 64*mib)
	require.NoError(t, err)
	hs := httptest.NewServer(h)
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/alloc?n=" + strconv.FormatInt(gib, 10))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Contains(t, string(body), "resource_exhausted in grpc/req-1:")
	_, trailer, err := s.call(context.Background(), "Alloc", gib)
	requireExhausted(t, err, trailer, "grpc/req-2:", "1073741824")
	resp, err = http.Get(hs.URL + "/alloc?n=" + strconv.FormatInt(mib, 10))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	st := s.pool.Stats()
	assert.Equal(t, int64(2), st.RefusedBy.Account, "both transports in the one pool")
	assert.Equal(t, int64(3), st.Peaks.Count, "three requests closed in the pool")
}

// Options returns grpcbudget.ServerOptions: pass them before the server's
// other options, with grpc.MaxRecvMsgSize(cfg.Limit).
func Options(pool *limits.Pool, cfg grpcbudget.Config) ([]grpc.ServerOption, error) {
	return grpcbudget.ServerOptions(pool, cfg)
}
