package limits

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/relief"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// While Shed is on (a GC death spiral), a Grow past ShedSize is refused
// with resource_exhausted and a Retry-After; smaller requests are served,
// and everything is served again once it is off.
func TestShedRefusesLargeGrows(t *testing.T) {
	t.Setenv("MEMCTL_BUDGETS", "")
	p := newTestPool(t, PoolConfig{Limit: 1 << 30, ShedSize: 8 * mib, HeapPressure: -1})
	big := mustOpen(t, p, "big", Unlimited)
	small := mustOpen(t, p, "small", Unlimited)
	require.NoError(t, big.Grow(6*mib))

	relief.Shed(true)
	t.Cleanup(func() { relief.Shed(false) })
	err := big.Grow(3 * mib)
	require.ErrorIs(t, err, ErrResourceExhausted)
	var e *ExhaustedError
	require.True(t, errors.As(err, &e))
	assert.Equal(t, ExhaustedError{Requested: 3 * mib, Used: 6 * mib, Limit: 8 * mib, Scope: "pool/big (shedding)", RetryAfter: defaultRetryAfter}, *e)
	assert.Equal(t, int64(6*mib), big.Used(), "a refused Grow takes nothing")
	require.NoError(t, big.Grow(2*mib), "up to ShedSize is served")
	require.NoError(t, small.Grow(1*mib), "small requests are served")

	// A child's bytes count toward its parent's size.
	kid, err := small.Open("kid", Unlimited)
	require.NoError(t, err)
	require.ErrorIs(t, kid.Grow(8*mib), ErrResourceExhausted)

	relief.Shed(false)
	require.NoError(t, big.Grow(64*mib), "served again once shedding is off")
	big.Shrink(72 * mib)
	small.Shrink(1 * mib)
	kid.Close()
}

func TestShedObserveRefusesNothing(t *testing.T) {
	t.Setenv("MEMCTL_BUDGETS", "observe")
	p := newTestPool(t, PoolConfig{Limit: 1 << 30, ShedSize: mib, HeapPressure: -1})
	a := mustOpen(t, p, "a", Unlimited)
	relief.Shed(true)
	t.Cleanup(func() { relief.Shed(false) })
	require.NoError(t, a.Grow(4*mib))
	assert.Positive(t, p.Stats().Observed, "counted, not refused")
	a.Shrink(4 * mib)
}

// CancelLargest (the kernel pressure watcher's action) reaches every open
// pool with CancelLargest set, cancels the largest account holding at least
// CancelShare of the live heap, and skips closed pools and pools without it.
func TestCancelLargestAcrossPools(t *testing.T) {
	t.Setenv("MEMCTL_BUDGETS", "")
	on := newTestPool(t, PoolConfig{Limit: 1 << 30, CancelLargest: true, CancelShare: 1e-9, HeapPressure: -1})
	off := newTestPool(t, PoolConfig{Limit: 1 << 30, HeapPressure: -1})
	ctxOf := func(p *Pool, name string, n int64) context.Context {
		a := mustOpen(t, p, name, Unlimited)
		ctx, done := WithAccount(context.Background(), a)
		t.Cleanup(done)
		require.NoError(t, Grow(ctx, n))
		t.Cleanup(func() { Shrink(ctx, n) })
		return ctx
	}
	large, smallCtx := ctxOf(on, "large", 4*mib), ctxOf(on, "small", mib)
	other := ctxOf(off, "other", 8*mib)

	runtime.GC() // a live-heap figure to compare with
	assert.Equal(t, 1, cancelLargest())
	<-large.Done()
	var e *ExhaustedError
	require.ErrorAs(t, context.Cause(large), &e)
	assert.Equal(t, "pool/large (memory pressure)", e.Scope)
	assert.NoError(t, smallCtx.Err())
	assert.NoError(t, other.Err(), "a pool without CancelLargest is left alone")

	on.Close()
	assert.Equal(t, 0, cancelLargest(), "a closed pool is not reached")
}

// TestShedBoundsTheFastPath: while Shed is on, small Grows stop at
// ShedSize, for an account and for a child's bytes in its parent. Before,
// a reservation rounded up to a chunk went past ShedSize and Grows on the
// fast path, which does not look at Shed, used it: ChunkSize 1000,
// ShedSize 1500, Grow(1000), Grow(400), Grow(500) left 1900 bytes granted.
func TestShedBoundsTheFastPath(t *testing.T) {
	t.Setenv("MEMCTL_BUDGETS", "")
	p := newTestPool(t, PoolConfig{Limit: 1 << 30, ChunkSize: 1000, ShedSize: 1500, HeapPressure: -1})
	relief.Shed(true)
	t.Cleanup(func() { relief.Shed(false) })
	a := mustOpen(t, p, "a", Unlimited)
	require.NoError(t, a.Grow(1000))
	require.NoError(t, a.Grow(400))
	require.ErrorIs(t, a.Grow(500), ErrResourceExhausted, "1900 bytes is past ShedSize")
	assert.Equal(t, int64(1400), a.Used())
	require.NoError(t, a.Grow(100), "up to ShedSize is served")
	require.ErrorIs(t, a.Grow(1), ErrResourceExhausted)
	a.Shrink(1500)
	a.Close()

	for _, step := range []int64{1, 7, 100, 999} {
		parent := mustOpen(t, p, "parent", Unlimited)
		kid := mustOpen(t, parent, "kid", Unlimited)
		var granted int64
		for kid.Grow(step) == nil {
			granted += step
			require.LessOrEqual(t, granted, int64(1500), "step %d", step)
		}
		assert.Greater(t, granted, int64(1500)-step, "step %d: up to ShedSize is served", step)
		assert.LessOrEqual(t, parent.Used(), int64(1500), "step %d: the parent holds no more than ShedSize", step)
		kid.Shrink(granted)
		parent.Close()
	}
	assert.Zero(t, p.Used())
}

func init() {
	children["cancel-before-gc"] = childCancelBeforeGC
}

// childCancelBeforeGC calls CancelLargest before the first GC cycle, when
// the live heap reads 0, with a 1-byte request and then a 64 MiB one open.
func childCancelBeforeGC() {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: liveHeapMetric}}
	metrics.Read(s)
	childtest.Say("CYCLES", s[0].Value.Uint64())
	childtest.Say("LIVE", s[1].Value.Uint64())
	p, err := NewPool(PoolConfig{Limit: 1 << 30, CancelLargest: true, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		childtest.Fail("%v", err)
	}
	a, err := p.Open("small", Unlimited)
	if err != nil {
		childtest.Fail("%v", err)
	}
	ctx, done := WithAccount(context.Background(), a)
	defer done()
	if err := Grow(ctx, 1); err != nil {
		childtest.Fail("%v", err)
	}
	childtest.Say("CANCELED_SMALL", cancelLargest())
	b, err := p.Open("large", Unlimited)
	if err != nil {
		childtest.Fail("%v", err)
	}
	bctx, bdone := WithAccount(context.Background(), b)
	defer bdone()
	if err := Grow(bctx, 64*mib); err != nil { // counted, not allocated
		childtest.Fail("%v", err)
	}
	childtest.Say("CANCELED_LARGE", cancelLargest())
	Shrink(ctx, 1)
	Shrink(bctx, 64*mib)
}

// TestCancelLargestBeforeFirstGC (a child process, so that no GC cycle has
// run yet): the kernel pressure watcher's CancelLargest does not cancel a
// 1-byte request because the live heap reads 0 before the first GC cycle;
// it still cancels a request that holds a large share of the Go memory.
// Before, the minimum share of 0 bytes was 1 byte and the 1-byte request
// was canceled.
func TestCancelLargestBeforeFirstGC(t *testing.T) {
	r := childtest.Report(t, childtest.Command(t, "cancel-before-gc", []string{"MEMCTL", "MEMCTL_BUDGETS", "GOGC", "GODEBUG"}))
	if r["CYCLES"] != "0" {
		t.Skipf("a GC cycle ran in the child before the test (%s)", r["CYCLES"])
	}
	require.Equal(t, "0", r["LIVE"], "the live heap reads 0 before the first GC cycle")
	assert.Equal(t, "0", r["CANCELED_SMALL"])
	assert.Equal(t, "1", r["CANCELED_LARGE"])
}

// TestCancelLargestWarnsOncePerMinute: the kernel pressure watcher calls
// CancelLargest up to every 2 s during an episode; with only small
// requests open it cancels nothing and says so in one WARN line, not one
// per call. Before, the heap watch re-armed the line at every GC cycle
// (the heap was not over its threshold), so each call logged again.
func TestCancelLargestWarnsOncePerMinute(t *testing.T) {
	t.Setenv("MEMCTL_BUDGETS", "")
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{Limit: 1 << 30, CancelLargest: true, HeapPressure: 0.9, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, done := WithAccount(context.Background(), mustOpen(t, p, "small", Unlimited))
	defer done()
	require.NoError(t, Grow(ctx, 1))
	defer Shrink(ctx, 1)
	for range 5 {
		waitCycles(t, p, 1)
		assert.Zero(t, cancelLargest())
	}
	assert.NoError(t, ctx.Err())
	assert.Equal(t, 1, strings.Count(logs.String(), "no request canceled"), logs.String())
	// A minute later it is said again.
	p.kernelWarnAt.Add(-int64(time.Minute))
	assert.Zero(t, cancelLargest())
	assert.Equal(t, 2, strings.Count(logs.String(), "no request canceled"), logs.String())
}

// TestCancelLargestOffLogsNothing: with MEMCTL_BUDGETS=off a pool logs
// nothing (Mode's doc), the kernel pressure's CancelLargest included.
// Before, it logged its no-cancel WARN line.
func TestCancelLargestOffLogsNothing(t *testing.T) {
	t.Setenv("MEMCTL_BUDGETS", "off")
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{Limit: 1 << 30, CancelLargest: true, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.Equal(t, ModeOff, p.Mode())
	ctx, done := WithAccount(context.Background(), mustOpen(t, p, "small", Unlimited))
	defer done()
	require.NoError(t, Grow(ctx, 1))
	defer Shrink(ctx, 1)
	assert.Zero(t, cancelLargest())
	assert.NoError(t, ctx.Err())
	assert.Empty(t, logs.String())
}
