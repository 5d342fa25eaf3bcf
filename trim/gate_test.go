package trim

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// The cost rule (issue 19 item 4): above MinRelease, the Go step must
// return releasePerCPUSecond per second of its estimated GC. 1 GiB
// live of which 254 MiB scannable (the pointer-rich heap measured in
// gate.go): about 0.53 s of GC, so 20 MiB to release is not worth it and
// 100 MiB is; with nothing to scan, 10 MiB is.
func TestCostRule(t *testing.T) {
	for _, tc := range []struct {
		name      string
		scan, est int64
		want      skipReason
	}{
		{"pointer-rich heap, 20 MiB garbage", 254 << 20, 20 << 20, skipCost},
		{"pointer-rich heap, 100 MiB garbage", 254 << 20, 100 << 20, skipNone},
		{"noscan heap, 10 MiB garbage", 0, 10 << 20, skipNone},
		{"noscan heap, 4 MiB garbage", 0, 4 << 20, skipMinRelease},
		{"unknown scan, 10 MiB garbage", -1, 10 << 20, skipNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeStep{}
			cfg := fakeConfig(f)
			cfg.estimate = func() int64 { return tc.est }
			cfg.scan = func() int64 { return tc.scan }
			tr := mustNew(t, cfg)
			defer tr.Close()
			r := tr.request(originPressure)
			assert.Equal(t, tc.want, r.skip)
			assert.Equal(t, tc.want == skipNone, r.ran)
			if tc.scan > 0 {
				assert.InDelta(t, float64(tc.scan)*2, float64(r.cost), 1, "defaultScanCost per scannable byte")
				assert.Equal(t, max(defaultMinRelease, int64(r.cost.Seconds()*float64(releasePerCPUSecond))), r.need)
			} else {
				assert.Equal(t, defaultMinRelease, r.need)
			}
			if tc.want != skipNone {
				assert.Equal(t, int64(1), skippedFor(tr.Stats(), tc.want))
			}
		})
	}
	// NeverSkip turns the cost rule off too.
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.MinRelease = NeverSkip
	cfg.estimate = func() int64 { return 1 }
	cfg.scan = func() int64 { return 1 << 30 }
	tr := mustNew(t, cfg)
	defer tr.Close()
	assert.True(t, tr.request(originPressure).ran)
}

// The debounced path uses the same rule: a burst whose trim would not pay
// for its GC is skipped by reason skipCost.
func TestDebouncedUsesCostRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		cfg := fakeConfig(f)
		cfg.estimate = func() int64 { return 20 << 20 }
		cfg.scan = func() int64 { return 254 << 20 }
		tr := mustNew(t, cfg)
		defer tr.Close()
		tr.AfterBurst()
		time.Sleep(time.Minute)
		assert.Empty(t, f.starts())
		s := tr.Stats()
		assert.Equal(t, int64(1), s.SkippedCost)
		assert.Equal(t, int64(1), s.Debounced.Skipped)
	})
}

// A trim's measured CPU per scannable byte replaces defaultScanCost.
func TestCostCalibrates(t *testing.T) {
	f := &fakeStep{cpu: 500 * time.Millisecond}
	cfg := fakeConfig(f)
	cfg.scan = func() int64 { return 100 << 20 }
	tr := mustNew(t, cfg)
	defer tr.Close()
	r := tr.request(originPressure)
	require.True(t, r.ran)
	assert.InDelta(t, float64(100<<20)*2, float64(r.cost), 1)
	tr.run.Lock()
	cost, _ := costOf(100<<20, tr.scanCost, tr.minRelease)
	tr.run.Unlock()
	assert.InDelta(t, float64(500*time.Millisecond), float64(cost), float64(time.Microsecond), "the measured 500 ms")
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

// TrimNow is forced and counted by name.
func TestTrimNowByName(t *testing.T) {
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.estimate = func() int64 { return 0 }
	tr := mustNew(t, cfg)
	defer tr.Close()
	_, err := tr.TrimNow()
	require.NoError(t, err)
	assert.Equal(t, int64(1), tr.Stats().ByName.Trims)
	assert.Len(t, f.starts(), 1)
}

func TestOriginAndReasonNames(t *testing.T) {
	var names []string
	for o := originDebounced; o <= originByName; o++ {
		names = append(names, o.String())
	}
	assert.Equal(t, []string{"debounced", "pressure", "spiral", "by_name"}, names)
	names = nil
	for r := skipNone; r <= skipClosed; r++ {
		names = append(names, r.String())
	}
	assert.Equal(t, []string{"none", "min_release", "cost", "budget", "running", "closed"}, names)
}

// skippedFor returns s's count of skips for r.
func skippedFor(s Stats, r skipReason) int64 { return *s.skipped(r) }

// The GC-end hook's cost per cycle, given the sample.
func BenchmarkGCEndHook(b *testing.B) {
	tr, err := New(Config{NoCHeap: true})
	require.NoError(b, err)
	defer tr.Close()
	tr.gcSub.Stop() // the benchmark is the only caller of gcEnd
	b.ReportAllocs()
	live := readSample().Live
	for b.Loop() {
		tr.atGCEnd(live)
	}
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

// Issue 34, item 3: the trim after a burst that the detector saw and no GC
// collected asks its GC only when the GC's whole cost fits in the CPU
// budget saved since the last trim. 254 MiB to scan at the default 2 ns a
// byte is 532 ms: 26.6 s of saved budget. 5 s after New the trim counts
// only the free heap (2 MiB) and is skipped; 40 s after, it runs with a GC,
// on the estimate that counts the burst as garbage.
func TestDetectedBurstAsksItsGCWithinSavedBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{cpu: 20 * time.Millisecond}
		cfg := fakeConfig(f)
		cfg.scan = func() int64 { return 254 << 20 }
		tr := mustNew(t, cfg)
		defer tr.Close()
		tr.deps.estimate = func(_ *Trimmer, marked bool) (int64, int64) {
			if marked {
				return 280 << 20, 280 << 20
			}
			return 2 << 20, 2 << 20
		}
		t0 := time.Now()
		time.Sleep(3 * time.Second)
		tr.detect(1)
		time.Sleep(2 * testDelay)
		st := tr.Stats()
		require.Equal(t, int64(0), st.Trims, "%v after New: the GC would cost more than the budget saved", time.Since(t0))
		require.Equal(t, int64(1), st.Skipped)
		time.Sleep(40*time.Second - time.Since(t0))
		tr.detect(1)
		time.Sleep(2 * testDelay)
		st = tr.Stats()
		assert.Equal(t, int64(1), st.Trims, "%v after New: the budget saved pays for the GC", time.Since(t0))
		assert.Equal(t, 1, f.finished(), "the step with a GC ran")
		assert.Equal(t, int64(280<<20), st.LastEstimate, "the burst counted as garbage")
	})
}
