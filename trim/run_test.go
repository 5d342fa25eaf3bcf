package trim

import (
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcendtest"
	"github.com/memctl/memctl/trim/cheap"
)

// Input (issue 17, case 1): a kernel-pressure trim with under 100 KiB to
// release does not run: it is skipped and counted as skipped, by reason
// and by origin, and costs no GC.
func TestRequestSkipsSmallEstimate(t *testing.T) {
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.estimate = func() int64 { return 90 << 10 }
	tr := mustNew(t, cfg)
	defer tr.Close()
	for range 12 {
		r := tr.request(originPressure)
		assert.False(t, r.ran)
		assert.Equal(t, skipMinRelease, r.skip)
		assert.Equal(t, int64(90<<10), r.est)
	}
	assert.Empty(t, f.starts(), "no GC forced")
	s := tr.Stats()
	assert.Equal(t, int64(12), s.Skipped)
	assert.Equal(t, int64(12), s.SkippedMinRelease)
	assert.Equal(t, OriginStats{Skipped: 12}, s.Pressure)
	assert.Equal(t, OriginStats{}, s.Debounced)
	assert.Zero(t, s.Trims)
	assert.Zero(t, s.TotalCPU)
}

// Requests are charged to the same 2% budget as debounced trims: a request
// right after a trim of 200 ms of CPU is skipped (skipBudget) until 10 s
// after that trim's start, and a debounced trim after a request waits the
// same way.
func TestRequestSharesBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{took: 10 * time.Millisecond, cpu: 200 * time.Millisecond}
		tr := newFake(t, f)
		defer tr.Close()
		t0 := time.Now()
		require.True(t, tr.request(originPressure).ran)
		time.Sleep(time.Second)
		r := tr.request(originPressure)
		assert.Equal(t, skipBudget, r.skip)
		tr.AfterBurst() // due at 3 s, allowed at 10 s
		time.Sleep(time.Minute)
		got := since(t0, f.starts())
		require.Len(t, got, 2)
		assert.GreaterOrEqual(t, got[1], 10*time.Second)
		s := tr.Stats()
		assert.Equal(t, int64(1), s.SkippedBudget)
		assert.Equal(t, OriginStats{Trims: 1, Skipped: 1, CPU: 200 * time.Millisecond, Released: 1 << 20}, s.Pressure)
		assert.Equal(t, int64(1), s.Debounced.Trims)
		assert.Equal(t, 400*time.Millisecond, s.TotalCPU)
	})
}

// Requests of every origin, mixed with debounced trims, for 10 minutes:
// over every window between two trim starts the CPU charged is at most 2%
// of the window (so over any window at most 2% plus one trim).
func TestAllOriginsWithinCPUShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{took: time.Millisecond, cpu: 60 * time.Millisecond}
		cfg := fakeConfig(f)
		cfg.Delay = 200 * time.Millisecond
		tr := mustNew(t, cfg)
		defer tr.Close()
		t0 := time.Now()
		var wg sync.WaitGroup
		var stop atomic.Bool
		wg.Go(func() {
			for !stop.Load() {
				tr.request(originPressure)
				time.Sleep(300 * time.Millisecond)
			}
		})
		wg.Go(func() {
			for !stop.Load() {
				tr.request(originSpiral)
				time.Sleep(700 * time.Millisecond)
			}
		})
		for time.Since(t0) < 10*time.Minute {
			tr.AfterBurst()
			time.Sleep(250 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		time.Sleep(time.Minute)
		starts := f.starts()
		require.Greater(t, len(starts), 50)
		for i := range starts {
			for j := i + 1; j < len(starts); j++ {
				w := starts[j].Sub(starts[i])
				charged := time.Duration(j-i) * f.cpu
				assert.LessOrEqual(t, float64(charged), 0.02*float64(w)+1, "trims %d..%d", i, j)
			}
		}
		s := tr.Stats()
		for _, o := range []origin{originDebounced, originPressure, originSpiral} {
			assert.Positive(t, s.of(o).Skipped+s.of(o).Trims, o.String())
		}
		assert.Positive(t, s.SkippedBudget)
	})
}

// A request while a debounced trim is pending runs that trim sooner: the
// pending period ends with it, no second trim follows Delay after.
func TestRequestServesPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{took: time.Millisecond, cpu: time.Millisecond}
		tr := newFake(t, f)
		defer tr.Close()
		t0 := time.Now()
		tr.AfterBurst()
		time.Sleep(500 * time.Millisecond)
		require.True(t, tr.request(originPressure).ran)
		time.Sleep(time.Minute)
		got := since(t0, f.starts())
		require.Len(t, got, 1, "the pending trim was the one requested")
		assert.Less(t, got[0], time.Second)
		assert.True(t, tr.quiet(), "%+v", tr.Stats())

		// AfterBurst after the request's trim: a new period, one more trim
		// Delay after it.
		tr.AfterBurst()
		time.Sleep(100 * time.Millisecond)
		time.Sleep(200 * time.Millisecond) // > the 50 ms budget of a 1 ms trim
		require.True(t, tr.request(originPressure).ran)
		t1 := time.Now()
		tr.AfterBurst()
		time.Sleep(time.Minute)
		got = since(t1, f.starts())
		require.Len(t, got, 3)
		assertWindow(t, got[2], 0)
	})
}

// A request that finds a trim running does not wait: that trim answers it.
func TestRequestWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{took: time.Second}
		tr := newFake(t, f)
		defer tr.Close()
		go tr.TrimNow()
		time.Sleep(100 * time.Millisecond)
		r := tr.request(originPressure)
		assert.Equal(t, skipRunning, r.skip)
		time.Sleep(2 * time.Second)
		assert.Equal(t, int64(1), tr.Stats().SkippedRunning)
	})
}

func TestRequestMisuseAndClosed(t *testing.T) {
	f := &fakeStep{}
	tr := newFake(t, f) // strict
	assert.PanicsWithValue(t, "trim: request(3): want pressure or spiral", func() { tr.request(originByName) })
	require.NoError(t, tr.Close())
	assert.Equal(t, skipClosed, tr.request(originPressure).skip)
	var nilT *Trimmer
	assert.Equal(t, skipClosed, nilT.request(originPressure).skip)
	assert.Empty(t, f.starts())

	cfg := fakeConfig(f)
	cfg.Strict = false
	tr = mustNew(t, cfg)
	defer tr.Close()
	assert.True(t, tr.request(origin(99)).ran, "treated as pressure")
	s := tr.Stats()
	assert.Equal(t, int64(1), s.Misuse)
	assert.Equal(t, int64(1), s.Pressure.Trims)
}

// Found by the idle test of the auto package: with CGO_ENABLED=0 (or no
// allocator the C heap step can reach) the step's estimate was -1,
// "unknown", and every kernel-pressure Request of an idle service ran a
// trim of nothing (8 in a minute of a neighbour's pressure). With the
// process's real default step and an idle heap, a Request runs no trim in
// either build: the Go estimate is under MinRelease, and the C step runs
// only for what it can release.
func TestRequestIdleDefaultStepRunsNothing(t *testing.T) {
	tr, err := New(Config{MaxWait: time.Minute})
	require.NoError(t, err)
	defer tr.Close()
	c := realDeps.cheap()
	// Let the C heap and the Go heap both hold nothing to release first.
	_, _ = c.ReleaseOver(-1)
	debug.FreeOSMemory()
	if r := c.Retained(); r >= defaultMinRelease || r < 0 && cheap.Detect().Err() == nil {
		t.Skipf("the C heap step's estimate is %d B after a release (%s): a trim may have something to do", r, c.Allocator())
	}
	for range 5 {
		r := tr.request(originPressure)
		assert.False(t, r.ran, "allocator %s, estimate %d B, need %d B", c.Allocator(), r.est, r.need)
		assert.Contains(t, []skipReason{skipMinRelease, skipCost}, r.skip)
	}
	assert.Zero(t, tr.Stats().Trims)
}

// Attack input (issue 17, budget): trims whose CPU clock reads 0 (or
// next to nothing) across a trim. Before, each was charged 0, so the 2%
// budget allowed the next at once: a Request every millisecond ran a
// forced GC every millisecond. Now a trim is charged at least
// minTrimCharge (1 ms) and at least the least its GC can cost
// (defaultScanCost/8 per scannable byte).
func TestCalibrationZeroCannotEscapeBudget(t *testing.T) {
	for _, tc := range []struct {
		name string
		cpu  time.Duration
		scan int64
	}{
		{"clock reads 0, nothing to scan", 0, 0},
		{"clock reads 1 ns, 100 MiB to scan", time.Nanosecond, 100 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeStep{cpu: tc.cpu}
				cfg := fakeConfig(f)
				cfg.scan = func() int64 { return tc.scan }
				tr := mustNew(t, cfg)
				defer tr.Close()
				t0 := time.Now()
				for time.Since(t0) < 10*time.Second {
					tr.request(originPressure)
					time.Sleep(time.Millisecond)
				}
				s := tr.Stats()
				floor := time.Millisecond
				if tc.scan > 0 {
					floor = max(floor, time.Duration(float64(tc.scan)*float64(defaultScanCost)/8))
				}
				t.Logf("%d trims in 10 s, %v charged, %d skipped by the budget", s.Trims, s.TotalCPU, s.SkippedBudget)
				assert.LessOrEqual(t, s.Trims, int64(10*time.Second/(costFactor*floor))+1,
					"at most one trim per 50 times its least charge")
				assert.GreaterOrEqual(t, s.TotalCPU, time.Duration(s.Trims)*floor)
			})
		})
	}
}

// Attack input (issue 17, gate): every automatic origin at once (pressure
// and spiral Requests from several goroutines, AfterBurst as a program and
// the GC-end detector call it) with trims of very different costs (0 to
// 2 s of CPU, some taking a second of wall time so that others find them
// running), then Close while a trim is pending and another running. Over
// every window between two trim starts, the CPU charged to the trims that
// started in it is at most 2% of the window; no trim starts after Close.
func TestGateAllOriginsVariedCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		costs := []time.Duration{0, time.Nanosecond, 3 * time.Millisecond, 2 * time.Second, 40 * time.Millisecond, 700 * time.Millisecond}
		var mu sync.Mutex
		var starts []time.Time
		var charges []time.Duration
		var clock atomic.Int64
		var closed atomic.Bool
		var afterClose atomic.Int64
		n := 0
		step := func() int64 {
			if closed.Load() {
				afterClose.Add(1)
			}
			mu.Lock()
			c := costs[n%len(costs)]
			took := time.Duration(0)
			if n%4 == 3 {
				took = time.Second
			}
			n++
			starts = append(starts, time.Now())
			mu.Unlock()
			time.Sleep(took)
			clock.Add(int64(c))
			return 32 << 20
		}
		cfg := testConfig{Config: Config{Delay: 100 * time.Millisecond, NoCHeap: true, Strict: true}, hooks: hooks{goStep: step, estimate: func() int64 { return 1 << 30 }, cpuClock: func() time.Duration { return time.Duration(clock.Load()) }, scan: func() int64 { return 0 }, throttled: func(bool) (time.Duration, error) { return 0, cgroupfs.ErrNoThrottleCounter }}}
		cfg = withLazy(cfg, false, nil)
		tr := mustNew(t, cfg)
		var wg sync.WaitGroup
		var stop atomic.Bool
		for i, o := range []origin{originPressure, originPressure, originSpiral} {
			wg.Go(func() {
				for !stop.Load() {
					tr.request(o)
					time.Sleep(time.Duration(97+i*61) * time.Millisecond)
				}
			})
		}
		wg.Go(func() {
			for !stop.Load() {
				end := tr.Begin()
				time.Sleep(30 * time.Millisecond)
				end()
				time.Sleep(170 * time.Millisecond)
			}
		})
		t0 := time.Now()
		for time.Since(t0) < 20*time.Minute {
			tr.AfterBurst()
			time.Sleep(90 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		tr.AfterBurst() // pending when Close comes
		go tr.request(originPressure)
		time.Sleep(time.Millisecond)
		closed.Store(true)
		require.NoError(t, tr.Close())
		time.Sleep(time.Minute)
		assert.Zero(t, afterClose.Load(), "no trim starts after Close")

		s := tr.Stats()
		mu.Lock()
		defer mu.Unlock()
		require.Greater(t, len(starts), 20)
		// Charges as the Trimmer charged them.
		for _, c := range costs {
			charges = append(charges, max(c, minTrimCharge))
		}
		charge := func(k int) time.Duration { return charges[k%len(costs)] }
		var sum time.Duration
		for k := range starts {
			sum += charge(k)
		}
		assert.Equal(t, sum, s.TotalCPU, "each trim charged as expected")
		for i := range starts {
			var c time.Duration
			for j := i + 1; j < len(starts); j++ {
				c += charge(j - 1)
				w := starts[j].Sub(starts[i])
				if float64(c) > 0.02*float64(w)+1 {
					t.Fatalf("trims %d..%d: %v charged in %v (over 2%%)", i, j-1, c, w)
				}
			}
		}
		for _, o := range []origin{originDebounced, originPressure, originSpiral} {
			assert.Positive(t, s.of(o).Trims+s.of(o).Skipped, o.String())
		}
		t.Logf("%d trims, %v charged over 20 min; skipped %d", len(starts), s.TotalCPU, s.Skipped)
	})
}

// A pressure Request with no mark in the pending period (none ever, or an
// earlier period's: found by a review of gcSinceMark), 200 MiB of garbage
// no GC has collected and a cheap GC, runs that GC. Reading the count of
// GC ends at the last mark ever seen, it took two GC ends in the process's
// life for "a GC since the mark" and a busy process, took the path
// without a GC, found 2 MiB free and was skipped.
func TestPressureRequestIgnoresAnOldPeriodsMark(t *testing.T) {
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.scan = func() int64 { return 1 << 20 }         // a GC of about 2 ms: cheap
	cfg.estimate = func() int64 { return 200 << 20 }   // with a GC: the uncollected garbage
	cfg.noGCEstimate = func() int64 { return 2 << 20 } // without: the free heap
	var noGC int
	cfg.noGCStep = func() (int64, int, abortReason, bool) { noGC++; return 2 << 20, 1, abortNone, false }
	tr := mustNew(t, cfg)
	defer tr.Close()
	tr.gcEnd() // two GC ends, long before the garbage; no mark in this period
	tr.gcEnd()
	r := tr.request(originPressure)
	t.Logf("%+v; steps without a GC %d", r, noGC)
	assert.True(t, r.ran, "the Request ran")
	assert.False(t, r.noGC, "with a GC")
	assert.Len(t, f.starts(), 1, "FreeOSMemory ran")
}

// A peak of the live heap left by an earlier burst that no trim ran for
// (a skip: the background scavenger had returned it) made the straddling
// GC end of the next burst look like its collection (the live heap a
// quarter under that old peak): the path without a GC, nothing free, the
// burst kept (0 of 48 MiB returned). A decision now resets the peak as a
// trim does.
func TestStalePeakAfterASkip(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory keeps RSS up after a trim")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	runtime.GC()
	cfg := testConfig{Config: Config{Delay: 250 * time.Millisecond, MaxWait: 10 * time.Second, NoCHeap: true}}
	cfg.scan = func() int64 { return 32 << 20 } // a GC of about 67 ms: not cheap
	tr, err := newT(cfg)
	require.NoError(t, err)
	defer tr.Close()
	a := burst.Alloc(128 << 20)
	runtime.GC() // sees A live: the peak
	runtime.KeepAlive(a)
	a = nil
	runtime.GC()         // collects A
	debug.FreeOSMemory() // returns it, as the background scavenger would
	require.Eventually(t, func() bool { return tr.gc.ends.Load() >= 3 }, 5*time.Second, time.Millisecond)
	tr.AfterBurst() // A's trim: nothing left to return
	require.Eventually(t, func() bool { return tr.Stats().Skipped > 0 }, 10*time.Second, 10*time.Millisecond)
	end := tr.Begin() // B in flight: the GC ends that see it do not make it the floor
	b := burst.Alloc(48 << 20)
	gcendtest.Seen(t) // sees B live, the end delivered before the drop (see TestNoGCNeedsACycleAfterTheDrop)
	runtime.KeepAlive(b)
	b = nil
	released0 := readSample().HeapReleased
	end()
	awaitMark(t, tr)
	straddle(t, tr) // the cycle that straddled B's drop ends
	require.Eventually(t, func() bool { return tr.Stats().Trims > 0 || tr.Stats().Skipped > 1 }, 20*time.Second, 10*time.Millisecond)
	s := tr.Stats()
	got := int64(readSample().HeapReleased) - int64(released0)
	t.Logf("trims %d, skipped %d (cost %d), no GC %d, released %d MiB", s.Trims, s.Skipped, s.SkippedCost, s.NoGC, got>>20)
	assert.GreaterOrEqual(t, got, int64(36<<20), "B was returned")
}

// Issue 32: no log line shows a sentinel as a number. The DEBUG lines of a
// trim ("trim: done", "trim: skipped") printed go_estimate_bytes=-1 and
// c_estimate_bytes=-1 for an estimate that is unknown (the Go heap's when
// it cannot be read, mimalloc's always) and for a Trimmer with no C step.
// Now: "unknown", and the C estimate is left out where there is no C step.
func TestTrimLinesNoSentinel(t *testing.T) {
	for _, tc := range []struct {
		name        string
		goEst, cRet int64
		noC         bool
		msg, want   string
		absent      string
	}{
		{"done, both unknown", -1, -1, false, "trim: done", "go_estimate_bytes=unknown c_estimate_bytes=unknown", ""},
		{"done, no C step", -1, 0, true, "trim: done", "go_estimate_bytes=unknown", "c_estimate_bytes"},
		{"skipped, C known", 40 << 10, 1 << 20, false, "trim: skipped", "go_estimate_bytes=40960 c_estimate_bytes=1048576", ""},
		{"skipped, no C step", 40 << 10, 0, true, "trim: skipped", "go_estimate_bytes=40960", "c_estimate_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeStep{}
				logs, logger := newLog()
				cfg := fakeConfig(f)
				cfg.Logger = logger
				if !tc.noC {
					cfg.NoCHeap, cfg.cheap = false, &fakeCHeapRetained{retained: tc.cRet}
				}
				cfg.estimate = func() int64 { return tc.goEst }
				tr := mustNew(t, cfg)
				defer tr.Close()
				tr.AfterBurst()
				time.Sleep(time.Minute)
				var line string
				for l := range strings.SplitSeq(logs.String(), "\n") {
					if strings.Contains(l, `msg="`+tc.msg+`"`) {
						line = l
					}
				}
				assert.Contains(t, line, tc.want, logs.String())
				assert.NotContains(t, line, "=-", line)
				if tc.absent != "" {
					assert.NotContains(t, line, tc.absent, line)
				}
			})
		})
	}
}
