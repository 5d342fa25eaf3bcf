package limits

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/cgrouptest"
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

func init() { children["undercharge"] = childUndercharge }

// TestChargeCheck: at GC end the live heap beyond its baseline is compared
// with what the accounts hold: far more (past the ratio and the floor) with
// work in flight is counted at every such cycle and said once at WARN with
// the figures; honest charges, a small excess, nothing in flight, or the
// check turned off say nothing.
func TestChargeCheck(t *testing.T) {
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{Name: "http", Limit: 256 * mib, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const gml = 240 * mib // floor: 30 MiB beyond the baseline
	assert.Equal(t, int64(-1), p.Stats().HeapBaseline)
	p.observeHeap(20*mib, gml) // nothing in flight: the baseline
	assert.Equal(t, 20*mib, p.Stats().HeapBaseline)

	a := mustOpen(t, p, "req-1", 64*mib)
	require.NoError(t, a.Grow(mib))
	p.observeHeap(45*mib, gml) // 25 MiB beyond: under the floor
	assert.Zero(t, p.Stats().Undercharged)
	p.observeHeap(60*mib, gml) // 40 MiB beyond, 1 MiB held: 40x
	p.observeHeap(80*mib, gml)
	st := p.Stats()
	assert.Equal(t, int64(2), st.Undercharged)
	assert.Equal(t, 1, strings.Count(logs.String(), "charges look too small"), logs.String())
	assert.Contains(t, logs.String(), "level=WARN")
	for _, f := range []string{"pool=http", "heap_live=62914560", "heap_baseline=20971520", "beyond_baseline=41943040", "accounted=1048576", "in_flight=1"} {
		assert.Contains(t, logs.String(), f)
	}

	// Honest charges: 15 MiB held for 40 MiB beyond is under 4x.
	require.NoError(t, a.Grow(14*mib))
	p.observeHeap(60*mib, gml)
	assert.Equal(t, int64(2), p.Stats().Undercharged)
	a.Shrink(15 * mib)
	a.Close()

	// A live heap under the baseline lowers it; nothing in flight resets it.
	b := mustOpen(t, p, "req-2", 64*mib)
	p.observeHeap(10*mib, gml)
	assert.Equal(t, 10*mib, p.Stats().HeapBaseline)
	b.Close()
	p.observeHeap(30*mib, gml)
	assert.Equal(t, 30*mib, p.Stats().HeapBaseline)
	assert.Equal(t, int64(2), p.Stats().Undercharged)

	// Without GOMEMLIMIT the floor is chargeCheckFloor, 16 MiB.
	c := mustOpen(t, p, "req-3", 64*mib)
	defer c.Close()
	p.observeHeap(45*mib, math.MaxInt64) // math.MaxInt64: no GOMEMLIMIT
	assert.Equal(t, int64(2), p.Stats().Undercharged, "15 MiB beyond: under the floor")
	p.observeHeap(47*mib, math.MaxInt64)
	assert.Equal(t, int64(3), p.Stats().Undercharged)

	off := newTestPool(t, PoolConfig{Limit: 256 * mib, ChargeRatio: -1})
	d := mustOpen(t, off, "req-1", 64*mib)
	defer d.Close()
	off.observeHeap(10*mib, gml)
	off.observeHeap(200*mib, gml)
	assert.Zero(t, off.Stats().Undercharged)
	assert.Equal(t, int64(-1), off.Stats().HeapBaseline)

	_, err := NewPool(PoolConfig{Limit: mib, ChargeRatio: math.NaN()})
	assert.ErrorContains(t, err, "ChargeRatio")
}

// childUndercharge serves, in a cgroup, one request whose handler builds
// rows of 1 KiB and charges 8 bytes for each (the README's 8·n with n
// rows), until the kernel kills it. The pool's WARN is printed with the
// live heap it saw, the GC cycles counted in PoolStats.Undercharged, and
// what the handler had built by then.
func childUndercharge() {
	if _, err := SetGoMemLimit(context.Background(), MemLimitConfig{}); err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	var pool atomic.Pointer[Pool]
	var built atomic.Int64
	warned := make(chan struct{})
	h := &warnHook{Handler: slog.NewTextHandler(os.Stdout, nil), fn: func(r slog.Record) {
		if !strings.Contains(r.Message, "charges look too small") {
			return
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "heap_live" {
				fmt.Printf("WARN_HEAP_LIVE=%d\n", a.Value.Int64())
			}
			return true
		})
		fmt.Printf("WARN_UNDERCHARGED=%d\nWARN_BUILT=%d\n", pool.Load().Stats().Undercharged, built.Load())
		close(warned)
	}}
	p, err := NewPool(PoolConfig{Name: "http", Logger: slog.New(h)})
	if err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	pool.Store(p)
	fmt.Printf("GOMEMLIMIT=%d\nPOOL_LIMIT=%d\n", debug.SetMemoryLimit(-1), p.Limit())
	mw, _ := p.Middleware(HTTPConfig{Limit: 64 << 20})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rows [][]byte
		for {
			row := make([]byte, 1024)
			for i := range row {
				row[i] = byte(i)
			}
			rows = append(rows, row)
			if err := Grow(r.Context(), 8); err != nil { // 8 bytes a row: the mistake
				WriteError(w, err)
				return
			}
			built.Add(1024)
			if len(rows)%(16<<10) == 0 { // every 16 MiB
				s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
				metrics.Read(s)
				fmt.Printf("BUILT=%d HEAP_LIVE=%d\n", built.Load(), s[0].Value.Uint64())
			}
		}
	})))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("SURVIVED=%d %s\n", resp.StatusCode, body)
}

// warnHook is a slog.Handler that also calls fn for each record.
type warnHook struct {
	slog.Handler
	fn func(slog.Record)
}

func (h *warnHook) Handle(ctx context.Context, r slog.Record) error {
	h.fn(r)
	return h.Handler.Handle(ctx, r)
}

// TestUnderchargeWarnsInCgroup (issue 20): the handler that charges 8 bytes
// per 1 KiB row, in a 256 MiB cgroup with GOMEMLIMIT from it: budgets do
// not stop it (the heap watch refuses it at 90% of GOMEMLIMIT, or the
// kernel kills it), but the pool's WARN and its count in
// PoolStats.Undercharged come first, while the live heap is still well
// under the limit.
func TestUnderchargeWarnsInCgroup(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 256 MiB cgroup")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory fills the cgroup")
	}
	g := newIssueCgroup(t, 256*mib)
	cmd := childtest.Command(t, "undercharge", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL", "MEMCTL_BUDGETS"}, "GOGC=100")
	g.Wrap(cmd)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	report := map[string]string{}
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		if k, v, ok := strings.Cut(line, "="); ok && !strings.Contains(k, " ") {
			report[k] = v
		}
	}
	werr := cmd.Wait()
	kills, kerr := g.OOMKills()
	require.NoError(t, kerr)
	t.Logf("child: %v; OOM kills %d; output:\n%s\nstderr: %s", werr, kills, strings.Join(lines, "\n"), stderr.String())
	require.NotContains(t, report, "ERROR")
	require.Contains(t, report, "WARN_HEAP_LIVE", "the pool said nothing before the end")
	live := childtest.RequireInt(t, report, "WARN_HEAP_LIVE")
	under := childtest.RequireInt(t, report, "WARN_UNDERCHARGED")
	built := childtest.RequireInt(t, report, "WARN_BUILT")
	t.Logf("WARN at live heap %d MiB (%d MiB of rows built, %d KiB charged) in a %d MiB cgroup; Undercharged %d at the WARN",
		live>>20, built>>20, built/1024*8>>10, g.Limit>>20, under)
	assert.Positive(t, under, "counted by the time of the WARN")
	assert.Less(t, live, g.Limit/2, "the WARN comes before the heap is half way to the limit")
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		assert.Positive(t, kills, "ended by the OOM killer: the budget did not stop the under-charged request")
	}
}

// newIssueCgroup creates a child memory cgroup named after this issue and
// the test process, removed at the end of the test (also on failure); it
// skips when no writable memory cgroup exists.
func newIssueCgroup(t *testing.T, limit int64) *cgrouptest.Child {
	t.Helper()
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no writable memory cgroup: %v", err)
	}
	c, err := parent.NewChild(fmt.Sprintf("memctl-i20-%d-%d", os.Getpid(), time.Now().UnixNano()), limit)
	if err != nil {
		t.Skipf("cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Errorf("cgroup: %v", err)
		}
	})
	return c
}

func init() {
	children["pressure-recovers"] = childPressureRecovers
}

// TestPressureRecoversInCgroup (issue 11, input 6): in a real 256 MiB
// cgroup v1 (or v2) memory cgroup, GOMEMLIMIT 230 MiB, the heap-pressure
// guard with CancelLargest and no trimming: one request that builds 600 MiB
// is canceled (429), then ten 1 MiB requests 0.5 s apart are all served,
// and the pressure reading clears within a second of the cancel (the pool
// runs a GC when the canceled request ends). Nothing is OOM-killed.
func TestPressureRecoversInCgroup(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory does not fit a 256 MiB cgroup")
	}
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no child memory cgroup can be made here: %v", err)
	}
	g, err := parent.NewChild(fmt.Sprintf("memctl-i11-pressure-%d", os.Getpid()), 256<<20)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Remove()) })
	cmd := childtest.Command(t, "pressure-recovers", []string{"GOGC", "GOMEMLIMIT", "MEMCTL", "MEMCTL_BUDGETS"}, "GOMEMLIMIT=230MiB")
	g.Wrap(cmd)
	r := childtest.Report(t, cmd)
	t.Logf("child: %v", r)
	kills, err := g.OOMKills()
	require.NoError(t, err)
	assert.Zero(t, kills, "nothing OOM-killed")
	assert.Equal(t, "429", r["BIG_CODE"])
	assert.Equal(t, "1", r["CANCELED"])
	assert.Equal(t, strings.TrimSuffix(strings.Repeat("200,", 10), ","), r["SMALL_CODES"], "every small request served")
	ms := childtest.RequireFloat(t, r, "RECOVERY_MS") // the pressure cleared
	assert.Less(t, ms, 1000.0, "pressure cleared within a second of the cancel")
	assert.Equal(t, "0", r["USED_AT_END"])
}

func childPressureRecovers() {
	p, err := NewPool(PoolConfig{Name: "srv", Limit: 1 << 30, CancelLargest: true, Strict: true})
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer p.Close()
	mw, err := p.Middleware(HTTPConfig{Limit: Unlimited})
	if err != nil {
		childtest.Fail("%v", err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mibs, _ := strconv.Atoi(r.URL.Query().Get("mib"))
		var held [][]byte
		defer func() { Shrink(r.Context(), int64(len(held))*mib) }()
		for range mibs {
			if err := Grow(r.Context(), mib); err != nil {
				if !WriteError(w, err) {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
				return
			}
			b := make([]byte, mib)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			held = append(held, b)
		}
		fmt.Fprintln(w, len(held))
	})))
	defer srv.Close()
	get := func(mibs int) int {
		resp, err := http.Get(srv.URL + "/?mib=" + strconv.Itoa(mibs))
		if err != nil {
			childtest.Fail("%v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	childtest.Say("BIG_CODE", get(600))
	canceledAt := time.Now()
	childtest.Say("CANCELED", p.Stats().Canceled)
	// Watch for the pressure to clear while the small requests run.
	ctx, stop := context.WithCancel(context.Background())
	cleared := make(chan time.Duration, 1)
	go func() {
		for ctx.Err() == nil {
			if !p.Stats().UnderHeapPressure {
				cleared <- time.Since(canceledAt)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var codes []string
	for range 10 {
		time.Sleep(500 * time.Millisecond)
		codes = append(codes, strconv.Itoa(get(1)))
	}
	stop()
	childtest.Say("SMALL_CODES", strings.Join(codes, ","))
	select {
	case d := <-cleared:
		childtest.Say("RECOVERY_MS", float64(d.Microseconds())/1000)
	default:
		childtest.Say("RECOVERY_MS", "never")
	}
	st := p.Stats()
	childtest.Say("USED_AT_END", st.Used)
	childtest.Say("GC_CYCLES", st.GCCycles)
	childtest.Say("HEAP_LIVE", st.HeapLive)
	childtest.Say("REFUSED", st.Refused)
}
