package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDoCharges: Do runs the job under an account of its own named
// "req-N" (or cfg.Name), a refused Grow comes back out of Do as is, and
// the account is closed (its peak recorded, nothing in flight) when Do
// returns.
func TestDoCharges(t *testing.T) {
	p := newTestPool(t, PoolConfig{Name: "jobs", Limit: 256 * mib})
	var inside *Account
	err := p.Do(context.Background(), WorkConfig{Limit: 64 * mib}, func(ctx context.Context) error {
		inside = FromContext(ctx)
		if err := Grow(ctx, 8*mib); err != nil {
			return err
		}
		defer Shrink(ctx, 8*mib)
		assert.Equal(t, int64(1), p.Stats().InFlight)
		return Grow(ctx, 1<<30)
	})
	require.ErrorIs(t, err, ErrResourceExhausted)
	e, ok := errors.AsType[*ExhaustedError](err)
	require.True(t, ok)
	assert.Equal(t, "jobs/req-1", e.Scope)
	assert.Equal(t, int64(1<<30), e.Requested)
	assert.Zero(t, e.RetryAfter, "over its own budget: a retry cannot succeed")
	require.NotNil(t, inside)
	assert.Equal(t, int64(0), inside.Used(), "closed when Do returned")
	st := p.Stats()
	assert.Equal(t, int64(0), st.InFlight)
	assert.Equal(t, int64(1), st.Peaks.Count)
	assert.Equal(t, int64(1), st.Peaks.Counts[peakBucket(8*mib+1<<30)], "the peak is what the job asked for")
	assert.Equal(t, "jobs", st.Name)

	err = p.Do(context.Background(), WorkConfig{Limit: mib, Name: "msg-7f3a"}, func(ctx context.Context) error {
		return fmt.Errorf("step 2: %w", Grow(ctx, 2*mib))
	})
	require.ErrorIs(t, err, ErrResourceExhausted)
	assert.Contains(t, err.Error(), "step 2: limits: resource_exhausted in jobs/msg-7f3a: requested 2097152 bytes, 0 in use, limit 1048576")

	// Bad limits and a closed pool: fn is not called.
	called := false
	require.ErrorIs(t, p.Do(context.Background(), WorkConfig{}, func(context.Context) error { called = true; return nil }), ErrInvalidSize)
	require.ErrorIs(t, p.Do(context.Background(), WorkConfig{Limit: -1}, func(context.Context) error { called = true; return nil }), ErrInvalidSize)
	p.Close()
	require.ErrorIs(t, p.Do(context.Background(), WorkConfig{Limit: mib}, func(context.Context) error { called = true; return nil }), ErrClosed)
	assert.False(t, called)
}

// TestDoAfterBurst: the burst rule of the middleware: a job whose peak, or
// a refused Grow, reached the threshold calls AfterBurst once its account
// is closed; a small job does not.
func TestDoAfterBurst(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var bursts atomic.Int64
	var usedAtBurst int64 = -1
	cfg := WorkConfig{Limit: 64 * mib, AfterBurst: func() { bursts.Add(1); usedAtBurst = p.Used() }}
	job := func(n int64) func(context.Context) error {
		return func(ctx context.Context) error {
			if err := Grow(ctx, n); err != nil {
				return err
			}
			Shrink(ctx, n)
			return nil
		}
	}
	require.NoError(t, p.Do(context.Background(), cfg, job(mib)))
	assert.Equal(t, int64(0), bursts.Load(), "1 MiB is under the threshold, 32 MiB (half the limit)")
	require.NoError(t, p.Do(context.Background(), cfg, job(32*mib)))
	assert.Equal(t, int64(1), bursts.Load())
	assert.Equal(t, int64(0), usedAtBurst, "called after the account is closed")
	require.ErrorIs(t, p.Do(context.Background(), cfg, job(1<<30)), ErrResourceExhausted)
	assert.Equal(t, int64(2), bursts.Load(), "a refused Grow past the threshold ends a burst too")
	cfg.BurstThreshold = -1
	require.NoError(t, p.Do(context.Background(), cfg, job(32*mib)))
	assert.Equal(t, int64(2), bursts.Load(), "negative: never")
}

// TestDoPanicClosesAccount: a panic in the job closes the account and goes
// on unchanged, even in a strict pool with the bytes still grown.
func TestDoPanicClosesAccount(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var a *Account
	func() {
		defer func() { assert.Equal(t, "job failed", recover()) }()
		_ = p.Do(context.Background(), WorkConfig{Limit: 64 * mib}, func(ctx context.Context) error {
			a = FromContext(ctx)
			require.NoError(t, Grow(ctx, mib))
			panic("job failed")
		})
	}()
	assert.Equal(t, int64(0), a.Used())
	assert.Equal(t, int64(0), p.Used())
	assert.Equal(t, int64(0), p.Stats().InFlight)
	// Returning with bytes grown is a leak: strict panics after closing.
	assert.PanicsWithValue(t, "limits: pool/req-2: closed with 1024 bytes grown and not shrunk", func() {
		_ = p.Do(context.Background(), WorkConfig{Limit: 64 * mib}, func(ctx context.Context) error { return Grow(ctx, kib) })
	})
	assert.Equal(t, int64(0), p.Used())
}

// TestAbandonKeepsThePanic: work begun with StartWork that panics with
// bytes grown and ends with Abandon (what the gRPC and Connect interceptors
// defer) closes its account and counts the leak, and a strict pool does not
// replace the work's panic with its own; a later Finish does nothing.
func TestAbandonKeepsThePanic(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib, Strict: true})
	var w *Work
	func() {
		defer func() { assert.Equal(t, "handler failed", recover()) }()
		ctx, work, err := p.StartWork(context.Background(), WorkConfig{Limit: 64 * mib})
		require.NoError(t, err)
		w = work
		defer func() {
			if r := recover(); r != nil {
				w.Abandon()
				panic(r)
			}
		}()
		require.NoError(t, Grow(ctx, mib))
		panic("handler failed")
	}()
	assert.Equal(t, int64(0), p.Used())
	st := p.Stats()
	assert.Equal(t, int64(0), st.InFlight)
	assert.Equal(t, int64(1), st.Leaked)
	assert.Equal(t, int64(1), st.Peaks.Count)
	assert.NotPanics(t, func() { assert.NoError(t, w.Finish(nil)) })
}

// TestFinishMapsHeapCancel: after the heap watch canceled the work's
// context, the work returning ctx.Err() (as is, wrapped, or any other
// error) gets an error matching ErrResourceExhausted with the cancel's
// cause, which still matches context.Canceled; a nil error stays nil, and
// an error that matches ErrResourceExhausted already is returned as is.
func TestFinishMapsHeapCancel(t *testing.T) {
	p := newTestPool(t, PoolConfig{Name: "rpc", Limit: 256 * mib, HeapPressure: 0.9, CancelLargest: true})
	for _, tc := range []struct {
		name string
		ret  func(ctx context.Context) error
		same bool // Finish returns the error unchanged
	}{
		{"ctx.Err", func(ctx context.Context) error { return ctx.Err() }, false},
		{"wrapped", func(ctx context.Context) error { return fmt.Errorf("scan: %w", ctx.Err()) }, false},
		{"other", func(context.Context) error { return errors.New("io: short read") }, false},
		{"grow after cancel", func(ctx context.Context) error { return Grow(ctx, mib) }, true},
		{"nil", func(context.Context) error { return nil }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, w, err := p.StartWork(context.Background(), WorkConfig{Limit: 64 * mib})
			require.NoError(t, err)
			require.NoError(t, Grow(ctx, 32*mib))
			p.observeHeap(95*mib, 100*mib) // over 90%: the largest is canceled
			<-ctx.Done()
			require.Eventually(t, func() bool { return w.Account().Used() == 0 }, 5*time.Second, time.Millisecond)
			ret := tc.ret(ctx)
			got := w.Finish(ret)
			p.observeHeap(10*mib, 100*mib) // pressure over
			if tc.same {
				assert.Equal(t, ret, got)
			}
			if ret == nil {
				return
			}
			require.ErrorIs(t, got, ErrResourceExhausted)
			e, ok := errors.AsType[*ExhaustedError](got)
			require.True(t, ok)
			assert.True(t, strings.HasPrefix(e.Scope, "rpc/req-"), e.Scope)
			assert.True(t, strings.HasSuffix(e.Scope, " (heap pressure)"), e.Scope)
			assert.Equal(t, defaultRetryAfter, e.RetryAfter)
			if errors.Is(ret, context.Canceled) {
				assert.ErrorIs(t, got, context.Canceled)
			}
			assert.Equal(t, got, w.Finish(got), "a second Finish does nothing")
		})
	}
	// A client that went away is not a budget error.
	parent, cancel := context.WithCancel(context.Background())
	ctx, w, err := p.StartWork(parent, WorkConfig{Limit: 64 * mib})
	require.NoError(t, err)
	cancel()
	<-ctx.Done()
	got := w.Finish(ctx.Err())
	assert.ErrorIs(t, got, context.Canceled)
	assert.NotErrorIs(t, got, ErrResourceExhausted)
}

// TestStartWorkNumbersPerPool: numbered accounts count per pool, from 1,
// shared by every StartWork and Do of that pool.
func TestStartWorkNumbersPerPool(t *testing.T) {
	p := newTestPool(t, PoolConfig{Name: "grpc", Limit: 256 * mib, Logger: slog.New(slog.DiscardHandler)})
	for i := 1; i <= 3; i++ {
		_, w, err := p.StartWork(context.Background(), WorkConfig{Limit: mib})
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("grpc/req-%d", i), w.Account().Name())
		require.NoError(t, w.Finish(nil))
	}
}

// TestDoNested: a job run with Do inside another job of the same pool
// (a step of a batch) is charged to the outer job too: the outer budget
// refuses what the two hold together, the scope shows the nesting, the
// peak histogram and InFlight count one request, and the heap watch's
// cancel of the outer job reaches the step's Finish as
// resource_exhausted. A job of another pool inside is top-level there.
func TestDoNested(t *testing.T) {
	p := newTestPool(t, PoolConfig{Name: "jobs", Limit: 256 * mib})
	err := p.Do(context.Background(), WorkConfig{Limit: 64 * mib}, func(ctx context.Context) error {
		if err := Grow(ctx, 40*mib); err != nil {
			return err
		}
		defer Shrink(ctx, 40*mib)
		assert.Equal(t, int64(1), p.Stats().InFlight)
		return p.Do(ctx, WorkConfig{Limit: 64 * mib}, func(ctx context.Context) error {
			assert.Equal(t, "jobs/req-1/req-2", FromContext(ctx).Name())
			assert.Equal(t, int64(1), p.Stats().InFlight, "one request in flight")
			require.NoError(t, Grow(ctx, 20*mib), "within both budgets")
			defer Shrink(ctx, 20*mib)
			return Grow(ctx, 20*mib) // 80 MiB in the outer job: over its 64 MiB
		})
	})
	require.ErrorIs(t, err, ErrResourceExhausted)
	e, ok := errors.AsType[*ExhaustedError](err)
	require.True(t, ok)
	assert.Equal(t, "jobs/req-1", e.Scope, "the outer job's budget refused")
	st := p.Stats()
	assert.Equal(t, int64(0), st.InFlight)
	assert.Equal(t, int64(0), p.Used())
	assert.Equal(t, int64(1), st.Peaks.Count, "one request in the histogram")
	assert.Equal(t, int64(1), st.Peaks.Above(64*mib), "its peak is what the two asked for together, 80 MiB")

	// Another pool's account in ctx: top-level in p.
	q := newTestPool(t, PoolConfig{Name: "other", Limit: 256 * mib})
	require.NoError(t, q.Do(context.Background(), WorkConfig{Limit: mib}, func(ctx context.Context) error {
		return p.Do(ctx, WorkConfig{Limit: 64 * mib, Name: "step"}, func(ctx context.Context) error {
			assert.Equal(t, "jobs/step", FromContext(ctx).Name())
			if err := Grow(ctx, 8*mib); err != nil { // over q's 1 MiB, within p's 64 MiB
				return err
			}
			Shrink(ctx, 8*mib)
			return nil
		})
	}))
	assert.Equal(t, int64(2), p.Stats().Peaks.Count)

	// The outer job's context canceled by the heap watch: the step that
	// returns ctx.Err() gets resource_exhausted from its Finish.
	hp := newTestPool(t, PoolConfig{Name: "heap", Limit: 256 * mib, HeapPressure: 0.9, CancelLargest: true})
	err = hp.Do(context.Background(), WorkConfig{Limit: 64 * mib}, func(ctx context.Context) error {
		return hp.Do(ctx, WorkConfig{Limit: 64 * mib}, func(ctx context.Context) error {
			if err := Grow(ctx, 32*mib); err != nil {
				return err
			}
			defer Shrink(ctx, 32*mib)
			hp.observeHeap(200*mib, 200*mib) // live heap over 0.9 × GOMEMLIMIT: the watch cancels the largest
			<-ctx.Done()
			return ctx.Err()
		})
	})
	require.ErrorIs(t, err, ErrResourceExhausted)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "heap/req-1 (heap pressure)", "the outer job was the one canceled")
	assert.Equal(t, int64(1), hp.Stats().Canceled)
}

// TestWorkBadSizes: the sizes a job may pass to Grow and Shrink through
// its context: negative, zero, math.MaxInt64 and a sum past it get a clear
// error and change nothing; a Shrink past what was grown is misuse (it
// changes nothing, and a strict pool panics); after Finish the context's
// account refuses with ErrClosed, and a second Finish does nothing.
func TestWorkBadSizes(t *testing.T) {
	p := newTestPool(t, PoolConfig{Name: "jobs", Limit: 256 * mib})
	ctx, w, err := p.StartWork(context.Background(), WorkConfig{Limit: Unlimited})
	require.NoError(t, err)
	require.ErrorIs(t, Grow(ctx, -1), ErrInvalidSize)
	require.NoError(t, Grow(ctx, 0))
	err = Grow(ctx, math.MaxInt64)
	require.ErrorIs(t, err, ErrResourceExhausted)
	e, _ := errors.AsType[*ExhaustedError](err)
	require.NotNil(t, e)
	assert.Equal(t, "jobs", e.Scope, "an unlimited job is limited by the pool")
	assert.Zero(t, e.RetryAfter, "larger than the whole pool: a retry cannot succeed")
	require.NoError(t, Grow(ctx, 8*mib))
	require.ErrorIs(t, Grow(ctx, math.MaxInt64-4*mib), ErrResourceExhausted, "the sum wraps past math.MaxInt64")
	assert.Equal(t, 8*mib, w.Account().Used(), "nothing counted by the refusals")
	assert.PanicsWithValue(t, "limits: jobs/req-1: Shrink(16777216) below what it grew itself, 8388608", func() { Shrink(ctx, 16*mib) })
	assert.Equal(t, 8*mib, w.Account().Used(), "nothing changed by the misuse")
	Shrink(ctx, 8*mib)
	require.NoError(t, w.Finish(nil))
	require.ErrorIs(t, Grow(ctx, 1), ErrClosed, "after Finish")
	Shrink(ctx, 1) // after Close: nothing, not misuse
	assert.NoError(t, w.Finish(nil), "a second Finish does nothing")
	st := p.Stats()
	assert.Equal(t, int64(0), st.InFlight)
	assert.Equal(t, int64(1), st.Peaks.Count)
	assert.Equal(t, int64(1), st.Misuse)
	assert.Equal(t, int64(0), p.Used())
}
