package limits

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gcendtest"
)

func init() {
	children["heap-pressure"] = childHeapPressure
}

// waitCycles runs GCs until the pool's heap watch has seen n more cycles,
// or fails after 5 s (the watch runs on the runtime's cleanup goroutine,
// shortly after each cycle).
func waitCycles(t testing.TB, p *Pool, n int64) {
	t.Helper()
	want := p.Stats().GCCycles + n
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().GCCycles < want {
		if time.Now().After(deadline) {
			t.Fatalf("heap watch saw %d GC cycles, want %d", p.Stats().GCCycles, want)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestHeapPressureRefusesPoolGrowth(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 100 * mib, ChunkSize: 64 * kib, HeapPressure: 0.8})
	a := mustOpen(t, p, "a", Unlimited)
	require.NoError(t, a.Grow(10))

	p.observeHeap(900*mib, 1000*mib) // threshold 800 MiB
	st := p.Stats()
	assert.True(t, st.UnderHeapPressure)
	assert.Equal(t, 800*mib, st.HeapThreshold)
	assert.Equal(t, 900*mib, st.HeapLive)

	require.NoError(t, a.Grow(kib), "a Grow within what the account holds does not add to the pool")
	err := a.Grow(mib)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, ExhaustedError{Requested: mib, Used: 900 * mib, Limit: 800 * mib, Scope: "pool (heap pressure)", RetryAfter: defaultRetryAfter}, *e)
	assert.True(t, errors.Is(err, ErrResourceExhausted))
	_, err = p.Open("b", Unlimited)
	require.NoError(t, err, "Open itself does not add to the pool")

	p.observeHeap(700*mib, 1000*mib)
	assert.False(t, p.Stats().UnderHeapPressure)
	require.NoError(t, a.Grow(mib))

	p.observeHeap(900*mib, 0x7fffffffffffffff) // GOMEMLIMIT not set: no pressure
	assert.False(t, p.Stats().UnderHeapPressure)
	assert.Zero(t, p.Stats().HeapThreshold)
	shrinkClose(a)
}

func TestCancelLargest(t *testing.T) {
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{Limit: 100 * mib, HeapPressure: 0.9, CancelLargest: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	sizes := []int64{3 * mib, 10 * mib, 0, 5 * mib}
	ctxs := make([]context.Context, len(sizes))
	accts := make([]*Account, len(sizes))
	for i, n := range sizes {
		accts[i] = mustOpen(t, p, "req-"+strconv.Itoa(i), Unlimited)
		var done context.CancelFunc
		ctxs[i], done = WithAccount(context.Background(), accts[i])
		defer done()
		require.NoError(t, Grow(ctxs[i], n))
		defer Shrink(ctxs[i], n)
	}
	// 95 MiB live: an account must hold 5% of it, 4.75 MiB, to be canceled.
	p.observeHeap(95*mib, 100*mib)
	<-ctxs[1].Done()
	cause := context.Cause(ctxs[1])
	require.ErrorIs(t, cause, ErrResourceExhausted)
	var e *ExhaustedError
	require.ErrorAs(t, cause, &e)
	assert.Equal(t, ExhaustedError{Requested: 10 * mib, Used: 95 * mib, Limit: 90 * mib, Scope: "pool/req-1 (heap pressure)", RetryAfter: defaultRetryAfter}, *e)
	for _, i := range []int{0, 2, 3} {
		assert.NoError(t, ctxs[i].Err(), "only the largest is canceled")
	}
	// The canceled context closes its account, which returns its bytes.
	require.Eventually(t, func() bool { return accts[1].Used() == 0 }, 5*time.Second, time.Millisecond)

	// The next cycle under pressure picks the next largest.
	p.observeHeap(95*mib, 100*mib)
	<-ctxs[3].Done()
	assert.NoError(t, ctxs[0].Err())
	assert.Equal(t, int64(2), p.Stats().Canceled)
	assert.NotContains(t, logs.String(), "outside")
	// 3 MiB is less than 5% of the heap: the pressure is not its doing.
	for range 10 {
		p.observeHeap(95*mib, 100*mib)
	}
	assert.NoError(t, ctxs[0].Err(), "an account below the minimum share is never picked")
	assert.NoError(t, ctxs[2].Err(), "an account using nothing is never picked")
	assert.Equal(t, int64(2), p.Stats().Canceled)
	assert.Equal(t, 1, strings.Count(logs.String(), "heap pressure from memory outside"), "one WARN per episode: %s", logs.String())
	assert.Contains(t, logs.String(), "level=WARN")
	// A new episode says it again.
	p.observeHeap(50*mib, 100*mib)
	p.observeHeap(95*mib, 100*mib)
	assert.Equal(t, 2, strings.Count(logs.String(), "heap pressure from memory outside"), logs.String())
}

// TestCancelLargestSpareSmallRequests (issue 11, input 6, second part):
// while the heap is over the threshold because of memory outside any
// account (a cache), five requests of 1 to 5 bytes are never canceled,
// however many GC cycles pass, whatever the share setting.
func TestCancelLargestSpareSmallRequests(t *testing.T) {
	for _, share := range []float64{0, 0.001, 1} {
		var logs strings.Builder
		p := newTestPool(t, PoolConfig{Limit: 100 * mib, HeapPressure: 0.9, CancelLargest: true, CancelShare: share, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		var ctxs []context.Context
		for n := int64(1); n <= 5; n++ {
			ctx, done := WithAccount(context.Background(), mustOpen(t, p, "small", Unlimited))
			defer done()
			require.NoError(t, Grow(ctx, n))
			defer Shrink(ctx, n)
			ctxs = append(ctxs, ctx)
		}
		for range 20 {
			p.observeHeap(95*mib, 100*mib) // a 95 MiB cache
		}
		for _, ctx := range ctxs {
			assert.NoError(t, ctx.Err(), "share %v", share)
		}
		assert.Zero(t, p.Stats().Canceled)
		assert.Equal(t, 1, strings.Count(logs.String(), "outside"), logs.String())
	}
}

func TestWithAccountClosesWhenContextEnds(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, CancelLargest: true, HeapPressure: 0.9})
	a := mustOpen(t, p, "a", Unlimited)
	parent, cancel := context.WithCancel(context.Background())
	ctx, done := WithAccount(parent, a)
	defer done()
	assert.Same(t, a, FromContext(ctx))
	require.NoError(t, Grow(ctx, mib))
	assert.Equal(t, mib, p.Used())
	cancel()
	require.Eventually(t, func() bool { return p.Used() == 0 }, 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, Grow(ctx, 1), ErrClosed)
	p.mu.Lock()
	assert.Nil(t, p.head, "a closed account leaves the pool's list")
	p.mu.Unlock()

	b := mustOpen(t, p, "b", Unlimited)
	ctx, done = WithAccount(context.Background(), b)
	require.NoError(t, Grow(ctx, mib))
	Shrink(ctx, mib)
	done()
	assert.Zero(t, p.Used(), "the returned cancel closes the account before it returns")
	assert.ErrorIs(t, context.Cause(ctx), context.Canceled)
}

func TestContextWithoutAccount(t *testing.T) {
	ctx := context.Background()
	assert.Nil(t, FromContext(ctx))
	assert.NoError(t, Grow(ctx, 1<<40), "no account: nothing is counted")
	assert.ErrorIs(t, Grow(ctx, -1), ErrInvalidSize)
	Shrink(ctx, 5)
}

// TestHeapWatchStopsOnClose: the watch is a GC hook, not a goroutine; it
// runs once per real GC cycle and is gone once the pool is closed, or once
// the pool is dropped without Close.
func TestHeapWatchStopsOnClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	armed := int64(gcend.Active())
	goroutines := runtime.NumGoroutine()
	p, err := NewPool(PoolConfig{Limit: mib})
	require.NoError(t, err)
	assert.Equal(t, armed+1, int64(gcend.Active()))
	assert.LessOrEqual(t, runtime.NumGoroutine(), goroutines, "idle means idle: the watch starts no goroutine")
	waitCycles(t, p, 3)
	st := p.Stats()
	if debug.SetMemoryLimit(-1) == 0x7fffffffffffffff {
		assert.Zero(t, st.HeapThreshold)
	}
	assert.Positive(t, st.HeapLive, "live heap read from runtime/metrics")

	p.Close()
	assert.Equal(t, armed, int64(gcend.Active()), "Close removes the hook at once")
	cycles := p.Stats().GCCycles
	gcendtest.Seen(t)
	assert.Equal(t, cycles, p.Stats().GCCycles, "no cycle is seen after Close")

	// A pool dropped without Close: its watch stops at the next cycle.
	func() {
		_, err := NewPool(PoolConfig{Limit: mib})
		require.NoError(t, err)
	}()
	assert.Equal(t, armed+1, int64(gcend.Active()))
	require.Eventually(t, func() bool {
		runtime.GC()
		return int64(gcend.Active()) == armed
	}, 5*time.Second, time.Millisecond, "the watch of an unreachable pool stops")
}

// TestHeapPressureRealHeap runs a child process with GOMEMLIMIT=256MiB and a
// pool watching at 50%: a real 160 MiB live heap puts the pool under
// pressure at the next GC cycle and the largest request is canceled;
// freeing it lifts the pressure.
func TestHeapPressureRealHeap(t *testing.T) {
	r := childtest.Report(t, childtest.Command(t, "heap-pressure", []string{"GOGC"}, "GOMEMLIMIT=256MiB"))
	t.Logf("child: %v", r)
	assert.Equal(t, "false", r["PRESSURE_BEFORE"])
	assert.Equal(t, "true", r["PRESSURE_LOADED"])
	assert.Equal(t, "pool (heap pressure)", r["SCOPE"])
	assert.Equal(t, "true", r["IS_EXHAUSTED"])
	assert.Equal(t, "true", r["BIG_CANCELED"])
	assert.Equal(t, "false", r["SMALL_CANCELED"])
	assert.Equal(t, "false", r["PRESSURE_AFTER"])
	assert.Equal(t, "<nil>", r["GROW_AFTER"])
	assert.Equal(t, "0", r["ARMED_AFTER_CLOSE"])
	live := childtest.RequireInt(t, r, "LIVE_LOADED")
	assert.GreaterOrEqual(t, live, 160*mib, "the ballast is live")
	assert.Equal(t, strconv.FormatInt(128*mib, 10), r["THRESHOLD"])
}

var pressureBallast [][]byte

func childHeapPressure() {
	p, err := NewPool(PoolConfig{Limit: 64 * mib, HeapPressure: 0.5, CancelLargest: true, Strict: true})
	if err != nil {
		childtest.Fail("%v", err)
	}
	wait := func(n int64) {
		want := p.Stats().GCCycles + n
		for deadline := time.Now().Add(5 * time.Second); p.Stats().GCCycles < want; {
			if time.Now().After(deadline) {
				childtest.Fail("no GC cycle seen")
			}
			runtime.GC()
			time.Sleep(time.Millisecond)
		}
	}
	wait(1)
	childtest.Say("PRESSURE_BEFORE", p.Stats().UnderHeapPressure)

	small, _ := p.Open("small", Unlimited)
	big, _ := p.Open("big", Unlimited)
	smallCtx, doneSmall := WithAccount(context.Background(), small)
	defer doneSmall()
	bigCtx, doneBig := WithAccount(context.Background(), big)
	defer doneBig()
	// The small request holds a chunk but uses nothing: never picked.
	if err := Grow(smallCtx, mib); err != nil {
		childtest.Fail("%v", err)
	}
	Shrink(smallCtx, mib)
	// The big request accounts its 160 MiB honestly but the pool's limit is
	// only 64 MiB: the heap is what tells.
	if err := Grow(bigCtx, 32*mib); err != nil {
		childtest.Fail("%v", err)
	}
	for range 160 {
		pressureBallast = append(pressureBallast, make([]byte, mib))
	}
	// Two cycles: the first may have marked before the ballast was complete.
	wait(2)
	st := p.Stats()
	childtest.Say("PRESSURE_LOADED", st.UnderHeapPressure)
	childtest.Say("LIVE_LOADED", st.HeapLive)
	childtest.Say("THRESHOLD", st.HeapThreshold)
	other, _ := p.Open("other", Unlimited)
	err = other.Grow(1)
	var e *ExhaustedError
	if errors.As(err, &e) {
		childtest.Say("SCOPE", e.Scope)
	}
	childtest.Say("IS_EXHAUSTED", errors.Is(err, ErrResourceExhausted))
	select {
	case <-bigCtx.Done():
		childtest.Say("BIG_CANCELED", errors.Is(context.Cause(bigCtx), ErrResourceExhausted))
	case <-time.After(5 * time.Second):
		childtest.Say("BIG_CANCELED", false)
	}
	childtest.Say("SMALL_CANCELED", smallCtx.Err() != nil)

	pressureBallast = nil
	wait(2)
	childtest.Say("PRESSURE_AFTER", p.Stats().UnderHeapPressure)
	childtest.Say("GROW_AFTER", other.Grow(1))
	other.Shrink(1)
	other.Close()
	p.Close()
	childtest.Say("ARMED_AFTER_CLOSE", int64(gcend.Active()))
	os.Stdout.Sync()
}

// TestGrowAfterContextEndWrapsCause: an account closed because its context
// ended fails Grow and Open with ErrClosed and the context's cause.
func TestGrowAfterContextEndWrapsCause(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 100 * mib, HeapPressure: 0.9, CancelLargest: true})
	closed := func(a *Account) func() bool { return func() bool { return a.reserved.Load() < 0 } }

	// Canceled by the heap watch.
	a := mustOpen(t, p, "req-1", Unlimited)
	ctx, done := WithAccount(context.Background(), a)
	defer done()
	child, err := a.Open("sort", Unlimited)
	require.NoError(t, err)
	require.NoError(t, Grow(ctx, mib))
	p.observeHeap(15*mib, 16*mib)
	<-ctx.Done()
	require.Eventually(t, closed(a), 5*time.Second, time.Millisecond)
	err = Grow(ctx, mib)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, err, ErrResourceExhausted)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "pool/req-1 (heap pressure)", e.Scope)
	_, err = a.Open("x", Unlimited)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, err, ErrResourceExhausted)
	err = child.Grow(mib)
	assert.ErrorIs(t, err, ErrClosed, "a child of the closed account cannot reserve")
	assert.ErrorIs(t, err, ErrResourceExhausted, "and says why")
	child.Close()
	assert.Zero(t, p.Stats().Refused, "Grow calls on a closed account are not refusals")

	// The client went away: the parent context was canceled.
	b := mustOpen(t, p, "req-2", Unlimited)
	parent, cancel := context.WithCancel(context.Background())
	ctx, doneB := WithAccount(parent, b)
	defer doneB()
	cancel()
	require.Eventually(t, closed(b), 5*time.Second, time.Millisecond)
	err = Grow(ctx, 1)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrResourceExhausted)
	assert.False(t, WriteError(httptest.NewRecorder(), err))

	// A deadline.
	c := mustOpen(t, p, "req-3", Unlimited)
	parent, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	ctx, doneC := WithAccount(parent, c)
	defer doneC()
	<-ctx.Done()
	require.Eventually(t, closed(c), 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, Grow(ctx, 1), context.DeadlineExceeded)

	// Closed by the returned cancel (the work ended) or by Close: ErrClosed
	// alone.
	d := mustOpen(t, p, "req-4", Unlimited)
	ctx, doneD := WithAccount(context.Background(), d)
	doneD()
	err = Grow(ctx, 1)
	assert.ErrorIs(t, err, ErrClosed)
	assert.NotErrorIs(t, err, context.Canceled)
	assert.Equal(t, "limits: closed: pool/req-4: Grow(1)", err.Error())
}

// TestPoolLimitAndHeapThresholdFollowGOMEMLIMIT (issue 27, item 6, after
// OpenTelemetry Collector #15580): a pool made with Limit 0 and its
// heap-pressure threshold both follow GOMEMLIMIT; a change made outside
// this package (the program's SetMemoryLimit) is seen at the next GC
// cycle's end. A pool with a Limit of its own keeps it.
func TestPoolLimitAndHeapThresholdFollowGOMEMLIMIT(t *testing.T) {
	prev := debug.SetMemoryLimit(4 * gib)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{HeapPressure: 0.5, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	fixed := newTestPool(t, PoolConfig{Name: "fixed", Limit: gib, HeapPressure: 0.5})
	assert.Equal(t, 2*gib, p.Limit(), "defaultPoolRatio of GOMEMLIMIT at NewPool")
	assert.Contains(t, logs.String(), `msg="limits: pool made" pool=pool limit=2048.0MiB limit_source="half of GOMEMLIMIT 4096.0MiB, following it"`)
	waitCycles(t, p, 1)
	assert.Equal(t, 2*gib, p.Stats().HeapThreshold)

	debug.SetMemoryLimit(8 * gib) // the program's own change
	waitCycles(t, p, 2)
	assert.Equal(t, 4*gib, p.Stats().HeapThreshold, "the threshold follows GOMEMLIMIT")
	assert.Equal(t, 4*gib, p.Limit(), "so does the pool's limit")
	assert.Equal(t, 4*gib, p.Stats().Limit)
	assert.Contains(t, logs.String(), `msg="limits: pool limit follows GOMEMLIMIT" pool=pool limit=4096.0MiB was=2048.0MiB`)
	assert.Equal(t, gib, fixed.Limit(), "PoolConfig.Limit is the pool's own")
}

// TestPoolFollowsMemLimiterWithoutGC: a change this package makes (the
// MemLimiter's refresh) is seen by the pool's next reservation, with no GC
// cycle between.
func TestPoolFollowsMemLimiterWithoutGC(t *testing.T) {
	prev := debug.SetMemoryLimit(4 * gib)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	p := newTestPool(t, PoolConfig{HeapPressure: -1})
	assert.Equal(t, 2*gib, p.Limit())
	debug.SetMemoryLimit(gib)
	assert.Equal(t, 2*gib, p.Limit(), "no GC end, no generation: not seen yet")
	noteMemLimitSet()
	assert.Equal(t, gib/2, p.Limit(), "the generation changed: read at once")
	a := mustOpen(t, p, "big", Unlimited)
	defer a.Close()
	err := a.Grow(gib/2 + 1)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, gib/2, e.Limit, "the refusal uses the limit followed")
}

// TestHeapThresholdClamped: HeapPressure 1 with a GOMEMLIMIT within 512
// bytes of math.MaxInt64 rounds to 2^63 in float64, which does not convert
// to an int64; the threshold is clamped to GOMEMLIMIT.
func TestHeapThresholdClamped(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: mib, HeapPressure: 1})
	p.sub.Stop() // no GC cycle overwrites what observeHeap records
	p.observeHeap(1<<30, math.MaxInt64-1)
	st := p.Stats()
	assert.Equal(t, int64(math.MaxInt64-1), st.HeapThreshold)
	assert.False(t, st.UnderHeapPressure)
	p.observeHeap(math.MaxInt64, math.MaxInt64-1)
	assert.True(t, p.Stats().UnderHeapPressure)

	for _, tc := range []struct {
		limit int64
		ratio float64
		want  int64
	}{
		{math.MaxInt64 - 1, 1, math.MaxInt64 - 1},
		{math.MaxInt64 - 512, 1, math.MaxInt64 - 1023}, // float64 rounds to 2^63-1024
		{math.MaxInt64 - 1, 0.5, 1 << 62},
		{4 * gib, 0.9, 3865470566}, // 0.9 × 4 GiB, rounded down
		{1, 1, 1},
		{1, 0.5, 0},
	} {
		assert.Equal(t, tc.want, heapThreshold(tc.limit, tc.ratio), "%d × %v", tc.limit, tc.ratio)
	}
}

// TestPressureReadAgainAfterCancel (issue 11, input 6): when the work of a
// request canceled under heap pressure ends, the pool runs a GC at once, on
// a goroutine that exits, and the heap watch clears the pressure: a small
// request is served again without waiting for a GC that refused requests
// would not cause. A pool refusing under a stale reading (no cycle for a
// second) does the same; one with a fresh reading does not.
func TestPressureReadAgainAfterCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	prev := debug.SetMemoryLimit(math.MaxInt64) // the real heap is under no threshold
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	p := newTestPool(t, PoolConfig{Limit: 100 * mib, HeapPressure: 0.9, CancelLargest: true})
	a := mustOpen(t, p, "big", Unlimited)
	ctx, done := WithAccount(context.Background(), a)
	require.NoError(t, Grow(ctx, mib))
	p.observeHeap(15*mib, 16*mib)
	<-ctx.Done()
	small := mustOpen(t, p, "small", Unlimited)
	require.ErrorIs(t, small.Grow(mib), ErrResourceExhausted, "under pressure")
	start := time.Now()
	done() // the canceled request's handler returned
	require.Eventually(t, func() bool { return !p.Stats().UnderHeapPressure }, 5*time.Second, time.Millisecond)
	t.Logf("pressure cleared %v after the canceled request ended", time.Since(start))
	require.NoError(t, small.Grow(mib))
	small.Shrink(mib)

	// A fresh reading: a refused Grow starts nothing.
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.refreshing
	}, 5*time.Second, time.Millisecond, "the pool's GC goroutine ends")
	p.observeHeap(15*mib, 16*mib)
	require.ErrorIs(t, small.Grow(mib), ErrResourceExhausted)
	p.mu.Lock()
	assert.False(t, p.refreshing, "no GC for a reading less than a second old")
	p.mu.Unlock()
	// A stale one: the refused Grow runs a GC.
	p.lastCycle.Store(time.Now().Add(-2 * time.Second).UnixNano())
	require.ErrorIs(t, small.Grow(mib), ErrResourceExhausted)
	require.Eventually(t, func() bool { return !p.Stats().UnderHeapPressure }, 5*time.Second, time.Millisecond)
	small.Close()
	p.Close() // waits for the pool's GC goroutine
}

// TestCancelLargestSpreadIsNotOutside: under heap pressure from twenty
// requests of 3 MiB each (60 of 95 MiB live, each under CancelShare), none
// is canceled and the WARN line says the pressure comes from the pool's
// accounts, not from memory outside them. Before, it blamed memory outside
// the accounts.
func TestCancelLargestSpreadIsNotOutside(t *testing.T) {
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{Limit: 100 * mib, HeapPressure: 0.9, CancelLargest: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 20 {
		ctx, done := WithAccount(context.Background(), mustOpen(t, p, "small", Unlimited))
		defer done()
		require.NoError(t, Grow(ctx, 3*mib)) // counted, not allocated
		defer Shrink(ctx, 3*mib)
	}
	for range 5 {
		p.observeHeap(95*mib, 100*mib)
	}
	assert.Zero(t, p.Stats().Canceled)
	assert.Equal(t, 1, strings.Count(logs.String(), "none of which holds PoolConfig.CancelShare"), logs.String())
	assert.NotContains(t, logs.String(), "outside")
}

// Input (issue 27, item 4): the HTTP and gRPC examples each made a pool
// with the default limit, half of GOMEMLIMIT each, together all of it,
// with no warning. The second such pool is warned about; a pool with a
// Limit of its own is not.
func TestSecondDefaultPoolWarned(t *testing.T) {
	prev := debug.SetMemoryLimit(4 * gib)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	var logs strings.Builder
	l := slog.New(slog.NewTextHandler(&logs, nil))
	newTestPool(t, PoolConfig{Name: "http", Logger: l})
	newTestPool(t, PoolConfig{Name: "sized", Limit: gib, Logger: l})
	assert.NotContains(t, logs.String(), "level=WARN", "one default pool, one sized: nothing to warn about")
	newTestPool(t, PoolConfig{Name: "grpc", Logger: l})
	assert.Contains(t, logs.String(), `level=WARN msg="limits: a second pool with the default limit`)
	assert.Contains(t, logs.String(), "pool=grpc other_pool=http")
}
