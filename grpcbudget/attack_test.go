package grpcbudget_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"runtime/debug"
	"sync"
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
	mib = int64(1) << 20
	gib = int64(1) << 30
)

const svcName = "memctl.test.Attack"

// unaryFunc is a unary handler under test: it gets the call's size.
type unaryFunc func(ctx context.Context, n int64) (int64, error)

// streamFunc is a bidi streaming handler under test.
type streamFunc func(ss grpc.ServerStream) error

// attackServer serves one unary method, "Do", and one bidi stream,
// "Stream", whose handlers each test sets, behind the budget interceptors
// (and any interceptors given before or after them), on 127.0.0.1, with a
// real grpc-go client connection.
type attackServer struct {
	pool   *limits.Pool
	conn   *grpc.ClientConn
	addr   string
	mu     sync.Mutex
	unary  unaryFunc
	stream streamFunc
}

type chain struct {
	unaryBefore, unaryAfter   []grpc.UnaryServerInterceptor
	streamBefore, streamAfter []grpc.StreamServerInterceptor
}

func startAttack(t testing.TB, pc limits.PoolConfig, budget int64, ch chain) *attackServer {
	t.Helper()
	pc.Name = "grpc"
	if pc.Logger == nil {
		pc.Logger = slog.New(slog.DiscardHandler)
	}
	pool, err := limits.NewPool(pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := grpcbudget.Config{Limit: budget}
	unary, err := grpcbudget.UnaryServerInterceptor(pool, cfg)
	require.NoError(t, err)
	stream, err := grpcbudget.StreamServerInterceptor(pool, cfg)
	require.NoError(t, err)
	us := append(append(append([]grpc.UnaryServerInterceptor{}, ch.unaryBefore...), unary), ch.unaryAfter...)
	ss := append(append(append([]grpc.StreamServerInterceptor{}, ch.streamBefore...), stream), ch.streamAfter...)
	s := &attackServer{pool: pool}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(us...), grpc.ChainStreamInterceptor(ss...))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: svcName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Do",
			Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.Int64Value)
				if err := dec(in); err != nil {
					return nil, err
				}
				call := func(ctx context.Context, req any) (any, error) {
					s.mu.Lock()
					fn := s.unary
					s.mu.Unlock()
					n, err := fn(ctx, req.(*wrapperspb.Int64Value).GetValue())
					if err != nil {
						return nil, err
					}
					return wrapperspb.Int64(n), nil
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/" + svcName + "/Do"}, call)
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Stream",
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				s.mu.Lock()
				fn := s.stream
				s.mu.Unlock()
				return fn(ss)
			},
		}},
	}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	s.addr = ln.Addr().String()
	s.conn = s.dial(t)
	return s
}

func (s *attackServer) dial(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(s.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (s *attackServer) setUnary(fn unaryFunc) {
	s.mu.Lock()
	s.unary = fn
	s.mu.Unlock()
}

func (s *attackServer) setStream(fn streamFunc) {
	s.mu.Lock()
	s.stream = fn
	s.mu.Unlock()
}

func call(ctx context.Context, conn *grpc.ClientConn, n int64) (int64, metadata.MD, error) {
	var trailer metadata.MD
	out := new(wrapperspb.Int64Value)
	err := conn.Invoke(ctx, "/"+svcName+"/Do", wrapperspb.Int64(n), out, grpc.Trailer(&trailer))
	return out.GetValue(), trailer, err
}

// waitIdle waits until the pool holds nothing and no call is in flight.
func waitIdle(t *testing.T, pool *limits.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		st := pool.Stats()
		return pool.Used() == 0 && st.InFlight == 0
	}, 10*time.Second, time.Millisecond, "the pool returns to zero")
}

// TestErrorShapes: a refused Grow's error reaches the client as code 8,
// with the scope and sizes in the message, however the handler returns it
// (as is, wrapped once or twice, joined with another error, the cause of
// a gRPC status that a handler wrapped with %w beside it when the status
// is itself RESOURCE_EXHAUSTED), and a status the handler built with
// another code is left alone, as grpc-go would send it without the
// interceptor.
func TestErrorShapes(t *testing.T) {
	s := startAttack(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib, chain{})
	other := errors.New("other failure")
	for _, tc := range []struct {
		name string
		wrap func(error) error
		code codes.Code
	}{
		{"as is", func(err error) error { return err }, codes.ResourceExhausted},
		{"wrapped", func(err error) error { return fmt.Errorf("query: %w", err) }, codes.ResourceExhausted},
		{"wrapped twice", func(err error) error { return fmt.Errorf("handler: %w", fmt.Errorf("query: %w", err)) }, codes.ResourceExhausted},
		{"joined", func(err error) error { return errors.Join(other, err) }, codes.ResourceExhausted},
		{"joined and wrapped", func(err error) error { return fmt.Errorf("batch: %w", errors.Join(err, other)) }, codes.ResourceExhausted},
		{"beside a RESOURCE_EXHAUSTED status", func(err error) error {
			return fmt.Errorf("%w: %w", status.Error(codes.ResourceExhausted, "too big"), err)
		}, codes.ResourceExhausted},
		{"beside an INVALID_ARGUMENT status", func(err error) error {
			return fmt.Errorf("%w: %w", status.Error(codes.InvalidArgument, "bad size"), err)
		}, codes.InvalidArgument},
		{"joined with a FAILED_PRECONDITION status", func(err error) error {
			return errors.Join(err, status.Error(codes.FailedPrecondition, "not now"))
		}, codes.FailedPrecondition},
		{"inside an INTERNAL status's text", func(err error) error { return status.Errorf(codes.Internal, "query: %v", err) }, codes.Internal},
	} {
		s.setUnary(func(ctx context.Context, n int64) (int64, error) {
			if err := limits.Grow(ctx, n); err != nil {
				return 0, tc.wrap(err)
			}
			limits.Shrink(ctx, n)
			return n, nil
		})
		_, trailer, err := call(context.Background(), s.conn, gib)
		st := status.Convert(err)
		t.Logf("%s: %v %q; trailer %v", tc.name, st.Code(), st.Message(), trailer)
		assert.Equal(t, tc.code, st.Code(), tc.name)
		assert.Contains(t, st.Message(), "limits: resource_exhausted in grpc/req-", tc.name)
		assert.Contains(t, st.Message(), "requested 1073741824 bytes, 0 in use, limit 67108864", tc.name)
		if tc.code == codes.ResourceExhausted {
			assert.Equal(t, []string{"-1"}, trailer.Get(grpcbudget.PushbackKey), "%s: over its own budget, a retry cannot succeed", tc.name)
		} else {
			assert.Empty(t, trailer.Get(grpcbudget.PushbackKey), "%s: the handler's own status, untouched", tc.name)
		}
	}
	waitIdle(t, s.pool)
}

// heapWatch lowers GOMEMLIMIT so that a call that holds hold bytes puts
// the pool under heap pressure, until the test ends.
func heapWatch(t *testing.T, hold int64) {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	old := debug.SetMemoryLimit(int64(ms.HeapAlloc) + hold)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
}

// holdUntilCanceled charges and builds n bytes, waits for the heap watch
// to cancel ctx (running GC cycles so that it sees the heap), and returns
// what ret makes of ctx.
func holdUntilCanceled(ret func(ctx context.Context) error) unaryFunc {
	return func(ctx context.Context, n int64) (int64, error) {
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
		return 0, ret(ctx)
	}
}

// TestHeapCancelShapes: after the heap watch canceled a call, every way a
// handler reports its context's end reaches the client as code 8 with the
// pushback (the heap frees as the call ends): ctx.Err() as is or wrapped,
// context.Cause, and the gRPC status of the context error
// (status.FromContextError, CANCELLED), which grpc-go would otherwise send
// as "the caller gave up".
func TestHeapCancelShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 48 MiB under a lowered GOMEMLIMIT")
	}
	s := startAttack(t, limits.PoolConfig{Limit: 256 * mib, CancelLargest: true}, 128*mib, chain{})
	for _, tc := range []struct {
		name string
		ret  func(ctx context.Context) error
	}{
		{"ctx.Err()", func(ctx context.Context) error { return ctx.Err() }},
		{"wrapped ctx.Err()", func(ctx context.Context) error { return fmt.Errorf("scan: %w", ctx.Err()) }},
		{"context.Cause", func(ctx context.Context) error { return context.Cause(ctx) }},
		{"status.FromContextError", func(ctx context.Context) error { return status.FromContextError(ctx.Err()).Err() }},
		{"CANCELLED status", func(ctx context.Context) error { return status.Error(codes.Canceled, "stopped") }},
	} {
		heapWatch(t, 48*mib)
		s.setUnary(holdUntilCanceled(tc.ret))
		before := s.pool.Stats().Canceled
		_, trailer, err := call(context.Background(), s.conn, 48*mib)
		st := status.Convert(err)
		t.Logf("%s: %v %q; trailer %v", tc.name, st.Code(), st.Message(), trailer)
		assert.Equal(t, codes.ResourceExhausted, st.Code(), tc.name)
		assert.Contains(t, st.Message(), "(heap pressure)", tc.name)
		assert.Equal(t, []string{"1000"}, trailer.Get(grpcbudget.PushbackKey), tc.name)
		assert.Equal(t, before+1, s.pool.Stats().Canceled, tc.name)
		waitIdle(t, s.pool)
	}
}

// TestStreamMidway: a refusal in the middle of a stream, after the headers
// and some messages were sent, ends the stream with code 8 in the
// trailers; server, client and bidi streaming.
func TestStreamMidway(t *testing.T) {
	s := startAttack(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib, chain{})
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	// Bidi: each message charges its size and answers with the total.
	s.setStream(func(ss grpc.ServerStream) error {
		var total int64
		defer func() { limits.Shrink(ss.Context(), total) }()
		for {
			in := new(wrapperspb.Int64Value)
			if err := ss.RecvMsg(in); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
			if err := limits.Grow(ss.Context(), in.GetValue()); err != nil {
				return fmt.Errorf("message %d: %w", total, err)
			}
			total += in.GetValue()
			if err := ss.SendMsg(wrapperspb.Int64(total)); err != nil {
				return err
			}
		}
	})
	st, err := s.conn.NewStream(context.Background(), desc, "/"+svcName+"/Stream")
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, st.SendMsg(wrapperspb.Int64(20*mib)))
		out := new(wrapperspb.Int64Value)
		require.NoError(t, st.RecvMsg(out))
		assert.Equal(t, int64(i+1)*20*mib, out.GetValue())
	}
	_, err = st.Header()
	require.NoError(t, err, "headers were sent")
	require.NoError(t, st.SendMsg(wrapperspb.Int64(20*mib))) // 80 MiB: over the 64 MiB budget
	err = st.RecvMsg(new(wrapperspb.Int64Value))
	t.Logf("bidi midway: %v; trailer %v", err, st.Trailer())
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "requested 20971520 bytes, 62914560 in use, limit 67108864")
	assert.Equal(t, []string{"-1"}, st.Trailer().Get(grpcbudget.PushbackKey))

	// Server streaming: one request, answers of 16 MiB each until refused.
	s.setStream(func(ss grpc.ServerStream) error {
		in := new(wrapperspb.Int64Value)
		if err := ss.RecvMsg(in); err != nil {
			return err
		}
		var total int64
		defer func() { limits.Shrink(ss.Context(), total) }()
		for {
			if err := limits.Grow(ss.Context(), in.GetValue()); err != nil {
				return err
			}
			total += in.GetValue()
			if err := ss.SendMsg(wrapperspb.Int64(total)); err != nil {
				return err
			}
		}
	})
	st, err = s.conn.NewStream(context.Background(), desc, "/"+svcName+"/Stream")
	require.NoError(t, err)
	require.NoError(t, st.SendMsg(wrapperspb.Int64(16*mib)))
	require.NoError(t, st.CloseSend())
	got := 0
	for {
		if err = st.RecvMsg(new(wrapperspb.Int64Value)); err != nil {
			break
		}
		got++
	}
	assert.Equal(t, 4, got, "four answers of 16 MiB fit in 64 MiB")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)

	// Client streaming: many requests, refused before the one answer.
	s.setStream(func(ss grpc.ServerStream) error {
		var total int64
		defer func() { limits.Shrink(ss.Context(), total) }()
		for {
			in := new(wrapperspb.Int64Value)
			if err := ss.RecvMsg(in); err == io.EOF {
				return ss.SendMsg(wrapperspb.Int64(total))
			} else if err != nil {
				return err
			}
			if err := limits.Grow(ss.Context(), in.GetValue()); err != nil {
				return err
			}
			total += in.GetValue()
		}
	})
	st, err = s.conn.NewStream(context.Background(), desc, "/"+svcName+"/Stream")
	require.NoError(t, err)
	for range 5 {
		if err := st.SendMsg(wrapperspb.Int64(30 * mib)); err != nil {
			break // the server ended the stream
		}
	}
	_ = st.CloseSend()
	err = st.RecvMsg(new(wrapperspb.Int64Value))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	waitIdle(t, s.pool)
	assert.Equal(t, int64(3), s.pool.Stats().RefusedBy.Account)
}

// recoverUnary and recoverStream turn a handler's panic into INTERNAL, as
// grpc-ecosystem's recovery interceptor does.
func recoverUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return handler(ctx, req)
}

func recoverStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return handler(srv, ss)
}

// TestPanicReleases: a handler that panics while holding bytes (grown and
// never shrunk) gives them back to the pool, with the recovery interceptor
// before the budget interceptor or after it; the client sees the
// recovery's INTERNAL; in strict mode the leak does not replace the
// handler's own panic.
func TestPanicReleases(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ch     chain
		strict bool
	}{
		{"recovery outside", chain{unaryBefore: []grpc.UnaryServerInterceptor{recoverUnary}, streamBefore: []grpc.StreamServerInterceptor{recoverStream}}, false},
		{"recovery inside", chain{unaryAfter: []grpc.UnaryServerInterceptor{recoverUnary}, streamAfter: []grpc.StreamServerInterceptor{recoverStream}}, false},
		{"recovery outside, strict", chain{unaryBefore: []grpc.UnaryServerInterceptor{recoverUnary}, streamBefore: []grpc.StreamServerInterceptor{recoverStream}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startAttack(t, limits.PoolConfig{Limit: 512 * mib, Strict: tc.strict}, 64*mib, tc.ch)
			s.setUnary(func(ctx context.Context, n int64) (int64, error) {
				if err := limits.Grow(ctx, n); err != nil {
					return 0, err
				}
				panic("boom")
			})
			_, _, err := call(context.Background(), s.conn, 8*mib)
			t.Logf("unary: %v", err)
			assert.Equal(t, codes.Internal, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), "panic: boom", "the handler's own panic")
			s.setStream(func(ss grpc.ServerStream) error {
				if err := limits.Grow(ss.Context(), 8*mib); err != nil {
					return err
				}
				panic("boom")
			})
			st, err := s.conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/"+svcName+"/Stream")
			require.NoError(t, err)
			err = st.RecvMsg(new(wrapperspb.Int64Value))
			assert.Equal(t, codes.Internal, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), "panic: boom", "the handler's own panic")
			waitIdle(t, s.pool)
		})
	}
}

// TestCanceledClients: many concurrent calls, half of whose clients cancel
// while the handler holds its bytes: every account is closed, the pool
// returns to zero, and the calls that were not canceled all succeed.
func TestCanceledClients(t *testing.T) {
	s := startAttack(t, limits.PoolConfig{Limit: 512 * mib}, 64*mib, chain{})
	var holding [64]chan struct{} // closed by call i's handler once it holds its bytes
	for i := range holding {
		holding[i] = make(chan struct{})
	}
	s.setUnary(func(ctx context.Context, n int64) (int64, error) {
		if err := limits.Grow(ctx, n); err != nil {
			return 0, err
		}
		defer limits.Shrink(ctx, n)
		if n%2 == 1 { // odd: wait for the client to cancel
			close(holding[n-mib])
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return n, nil
	})
	_, _, err := call(context.Background(), s.conn, 2*mib) // the connection is up: its goroutines count in before
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			n := mib + int64(i)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%2 == 1 {
				go func() { <-holding[i]; cancel() }()
			}
			got, _, err := call(ctx, s.conn, n)
			switch {
			case i%2 == 0 && (err != nil || got != n):
				errs <- fmt.Errorf("call %d: %d, %v", i, got, err)
			case i%2 == 1 && status.Code(err) != codes.Canceled:
				errs <- fmt.Errorf("canceled call %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitIdle(t, s.pool)
	st := s.pool.Stats()
	assert.Equal(t, int64(65), st.Peaks.Count, "every call's account closed")
	assert.Zero(t, st.Leaked)
	if !assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+2 }, 10*time.Second, 10*time.Millisecond,
		"goroutines back to %d (now %d)", before, runtime.NumGoroutine()) {
		buf := make([]byte, 1<<20)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
	}
}

// TestOverBudgetNotRetried: a grpc-go client whose retry policy lists
// RESOURCE_EXHAUSTED does not retry a call refused over its own budget
// (the negative pushback of gRFC A6: a retry meets the same budget),
// while a call refused because the pool was full is retried after the
// pushback and succeeds.
func TestOverBudgetNotRetried(t *testing.T) {
	s := startAttack(t, limits.PoolConfig{Limit: 128 * mib}, 64*mib, chain{})
	conn := s.dial(t, grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"`+svcName+`"}],"retryPolicy":{
		"maxAttempts":3,"initialBackoff":"0.01s","maxBackoff":"0.01s","backoffMultiplier":1,
		"retryableStatusCodes":["RESOURCE_EXHAUSTED"]}}]}`))
	s.setUnary(func(ctx context.Context, n int64) (int64, error) {
		if err := limits.Grow(ctx, n); err != nil {
			return 0, err
		}
		limits.Shrink(ctx, n)
		return n, nil
	})
	_, trailer, err := call(context.Background(), conn, gib)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, []string{"-1"}, trailer.Get(grpcbudget.PushbackKey))
	assert.Equal(t, int64(1), s.pool.Stats().RefusedBy.Account, "one attempt: the client did not retry")

	// Pool full: a holder keeps 100 MiB until the first attempt is refused.
	release := make(chan struct{})
	holding := make(chan struct{})
	s.setUnary(func(ctx context.Context, n int64) (int64, error) {
		if err := limits.Grow(ctx, n); err != nil {
			return 0, err
		}
		defer limits.Shrink(ctx, n)
		if n == 60*mib {
			holding <- struct{}{}
			<-release
		}
		return n, nil
	})
	var held sync.WaitGroup
	for range 2 {
		held.Go(func() { _, _, _ = call(context.Background(), s.conn, 60*mib) })
		<-holding
	}
	done := make(chan error, 1)
	go func() { _, _, err := call(context.Background(), conn, 32*mib); done <- err }()
	require.Eventually(t, func() bool { return s.pool.Stats().RefusedBy.Pool == 1 }, 10*time.Second, time.Millisecond)
	close(release)
	held.Wait()
	require.NoError(t, <-done, "retried after the pushback")
	assert.Equal(t, int64(1), s.pool.Stats().RefusedBy.Pool)
}

// TestNestedInOuterWork: a call whose context already carries an account
// of the same pool (bound by an outer layer, as the pool's HTTP middleware
// does for a gRPC server mounted behind it) is nested in it: the outer
// account's budget refuses what the call holds beyond it, and one request
// counts. When the heap watch closed that outer account, the call gets
// code 8 with the pushback, without running the handler.
func TestNestedInOuterWork(t *testing.T) {
	var pool *limits.Pool
	var canceled sync.Map // call size → the outer account is closed with a heap-pressure cause first
	outer := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		a, err := pool.Open("outer", 64*mib)
		if err != nil {
			return nil, err
		}
		pctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		wctx, done := limits.WithAccount(pctx, a)
		defer done()
		if _, ok := canceled.Load(req.(*wrapperspb.Int64Value).GetValue()); ok {
			cancel(&limits.ExhaustedError{Scope: "grpc/outer (heap pressure)", Requested: 1, Used: 2, Limit: 3, RetryAfter: time.Second})
			for a.Grow(1) == nil { // the close reaches a on a goroutine of its own
				a.Shrink(1)
				runtime.Gosched()
			}
		}
		return handler(wctx, req)
	}
	s := startAttack(t, limits.PoolConfig{Limit: 512 * mib}, 128*mib, chain{unaryBefore: []grpc.UnaryServerInterceptor{outer}})
	pool = s.pool
	ran := 0
	s.setUnary(func(ctx context.Context, n int64) (int64, error) {
		ran++
		assert.Equal(t, "grpc/outer/req-", limits.FromContext(ctx).Name()[:len("grpc/outer/req-")])
		if err := limits.Grow(ctx, n); err != nil {
			return 0, err
		}
		defer limits.Shrink(ctx, n)
		return n, limits.Grow(ctx, n) // 2n in the call: within its 128 MiB, over the outer 64 MiB for n = 40 MiB
	})
	_, trailer, err := call(context.Background(), s.conn, 40*mib)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "limits: resource_exhausted in grpc/outer: requested 41943040 bytes")
	assert.Equal(t, []string{"-1"}, trailer.Get(grpcbudget.PushbackKey))
	waitIdle(t, s.pool)
	assert.Equal(t, int64(1), s.pool.Stats().Peaks.Count, "one request")

	canceled.Store(mib, true)
	_, trailer, err = call(context.Background(), s.conn, mib)
	t.Logf("outer canceled: %v; trailer %v", err, trailer)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "grpc/outer (heap pressure)")
	assert.Equal(t, []string{"1000"}, trailer.Get(grpcbudget.PushbackKey))
	assert.Equal(t, 1, ran, "the handler did not run")
	waitIdle(t, s.pool)
}

// TestHandlerPushbackStands: a streaming handler that sets
// grpc-retry-pushback-ms itself (ServerStream.SetTrailer) and returns a
// budget error keeps its value; the interceptor adds none. Two values in
// the trailer made grpc-go retry nothing ("Server retry pushback specified
// multiple values; not retrying"). A unary handler's grpc.SetTrailer is not
// seen (the transport stream stays grpc-go's own, which
// grpc.ClientSupportedCompressors needs: checked here too).
func TestHandlerPushbackStands(t *testing.T) {
	s := startAttack(t, limits.PoolConfig{Limit: 128 * mib}, 64*mib, chain{})
	s.setStream(func(ss grpc.ServerStream) error {
		in := new(wrapperspb.Int64Value)
		if err := ss.RecvMsg(in); err != nil {
			return err
		}
		if err := limits.Grow(ss.Context(), in.GetValue()); err != nil {
			ss.SetTrailer(metadata.Pairs(grpcbudget.PushbackKey, "20"))
			return err
		}
		limits.Shrink(ss.Context(), in.GetValue())
		return nil
	})
	st, err := s.conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/"+svcName+"/Stream")
	require.NoError(t, err)
	require.NoError(t, st.SendMsg(wrapperspb.Int64(gib)))
	require.NoError(t, st.CloseSend())
	err = st.RecvMsg(new(wrapperspb.Int64Value))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, []string{"20"}, st.Trailer().Get(grpcbudget.PushbackKey), "the stream handler's pushback, once")

	// A handler that sets other trailers gets the interceptor's pushback;
	// grpc-go's own transport stream is what the unary handler sees.
	var compressorsErr error
	s.setUnary(func(ctx context.Context, n int64) (int64, error) {
		_, compressorsErr = grpc.ClientSupportedCompressors(ctx)
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-served-by", "a"))
		if err := limits.Grow(ctx, n); err != nil {
			return 0, err
		}
		limits.Shrink(ctx, n)
		return n, nil
	})
	_, trailer, err := call(context.Background(), s.conn, gib)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, []string{"-1"}, trailer.Get(grpcbudget.PushbackKey))
	assert.Equal(t, []string{"a"}, trailer.Get("x-served-by"))
	assert.NoError(t, compressorsErr, "grpc.ClientSupportedCompressors works in a unary handler")
}
