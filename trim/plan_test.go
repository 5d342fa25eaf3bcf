package trim

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The gate as a table: the path, the estimates and the skip, from one
// snapshot each.
func TestDecide(t *testing.T) {
	const mib = 1 << 20
	base := snapshot{origin: originPressure, minRelease: defaultMinRelease, scanCost: float64(defaultScanCost),
		scan: 0, markedEst: 100 * mib, unmarkedEst: 100 * mib, free: 100 * mib, noGCEst: 90 * mib, cEst: -1, noGCOK: true}
	with := func(f func(*snapshot)) snapshot { s := base; f(&s); return s }
	for _, tc := range []struct {
		name string
		s    snapshot
		want plan
	}{
		{"noscan heap, 100 MiB: GC path runs", base,
			plan{runGo: true, goEst: 100 * mib, cEst: -1, est: 100 * mib, need: defaultMinRelease}},
		{"under MinRelease: skipped", with(func(s *snapshot) { s.markedEst, s.unmarkedEst, s.free = 4*mib, 4*mib, 4*mib }),
			plan{skip: skipMinRelease, goEst: 4 * mib, cEst: -1, est: 4 * mib, need: defaultMinRelease}},
		{"pointer-rich heap, 20 MiB: not worth its GC", with(func(s *snapshot) {
			s.scan, s.markedEst, s.unmarkedEst, s.free, s.noGCOK = 254*mib, 20*mib, 20*mib, 20*mib, false
		}), plan{skip: skipCost, goEst: 20 * mib, cEst: -1, est: 20 * mib, need: 35747322, cost: 532676608}},
		{"unknown Go estimate runs", with(func(s *snapshot) { s.markedEst, s.unmarkedEst, s.free = -1, -1, -1 }),
			plan{runGo: true, goEst: -1, cEst: -1, est: -1, need: defaultMinRelease}},
		{"TrimNow: forced, both steps, with a GC", with(func(s *snapshot) {
			s.origin, s.force, s.marked, s.hasC, s.cEst, s.markedEst, s.gcSince, s.busy = originByName, true, true, true, 0, 0, true, true
		}), plan{force: true, runGo: true, runC: true, marked: true, goEst: 0, cEst: 0, est: 0, need: defaultMinRelease}},
		{"collected burst under load: without a GC", with(func(s *snapshot) { s.gcSince, s.busy = true, true }),
			plan{runGo: true, noGC: true, goEst: 90 * mib, cEst: -1, est: 90 * mib, need: defaultMinRelease, cost: 5625000}},
		{"collected burst, idle, cheap GC: with a GC", with(func(s *snapshot) { s.gcSince = true }),
			plan{runGo: true, goEst: 100 * mib, cEst: -1, est: 100 * mib, need: defaultMinRelease}},
		{"collected burst, path without a GC broken: with a GC", with(func(s *snapshot) { s.gcSince, s.busy, s.noGCOK = true, true, false }),
			plan{runGo: true, goEst: 100 * mib, cEst: -1, est: 100 * mib, need: defaultMinRelease}},
		{"no GC since, expensive GC returning no more: without", with(func(s *snapshot) {
			s.scan, s.markedEst, s.unmarkedEst, s.free = 254*mib, 100*mib, 100*mib, 100*mib
		}), plan{runGo: true, noGC: true, goEst: 90 * mib, cEst: -1, est: 90 * mib, need: defaultMinRelease, cost: 5625000}},
		{"no GC since, expensive GC returning far more: with", with(func(s *snapshot) {
			s.scan, s.markedEst, s.unmarkedEst, s.free, s.noGCEst = 254*mib, 500*mib, 500*mib, 500*mib, 10*mib
		}), plan{runGo: true, goEst: 500 * mib, cEst: -1, est: 500 * mib, need: 35747322, cost: 532676608}},
		{"the detector's burst, cheap GC: counted as marked", with(func(s *snapshot) {
			s.origin, s.unmarkedEst, s.free = originDebounced, 0, 0
		}), plan{runGo: true, marked: true, goEst: 100 * mib, cEst: -1, est: 100 * mib, need: defaultMinRelease}},
		{"the detector's burst, dear GC within the saved budget: asked, priced at the floor", with(func(s *snapshot) {
			s.origin, s.detected, s.scan, s.floorScan, s.saved, s.markedEst, s.free, s.noGCEst = originDebounced, true, 254*mib, 20*mib, time.Second, 280*mib, 2*mib, 2*mib
		}), plan{runGo: true, marked: true, probe: true, goEst: 280 * mib, cEst: -1, est: 280 * mib, need: defaultMinRelease, cost: 41943040}},
		{"the detector's burst, dear GC over the saved budget: only the free heap counts", with(func(s *snapshot) {
			s.origin, s.detected, s.scan, s.floorScan, s.saved, s.markedEst, s.free, s.noGCOK = originDebounced, true, 254*mib, 20*mib, 500*time.Millisecond, 280*mib, 2*mib, false
		}), plan{skip: skipMinRelease, goEst: 2 * mib, cEst: -1, est: 2 * mib, need: 35747322, cost: 532676608}},
		{"the detector's burst, collected since: no question to ask", with(func(s *snapshot) {
			s.origin, s.detected, s.gcSince, s.scan, s.floorScan, s.saved, s.noGCOK = originDebounced, true, true, 254*mib, 20*mib, time.Second, false
		}), plan{runGo: true, goEst: 100 * mib, cEst: -1, est: 100 * mib, need: 35747322, cost: 532676608}},
		{"unmarked, expensive GC: only the free heap counts", with(func(s *snapshot) {
			s.scan, s.free, s.noGCOK = 254*mib, 2*mib, false
		}), plan{skip: skipMinRelease, goEst: 2 * mib, cEst: -1, est: 2 * mib, need: 35747322, cost: 532676608}},
		{"C step alone: unknown C estimate runs it", with(func(s *snapshot) {
			s.markedEst, s.unmarkedEst, s.free, s.hasC = 0, 0, 0, true
		}), plan{runC: true, goEst: 0, cEst: -1, est: 0, need: defaultMinRelease}},
		{"C estimate under MinRelease: skipped", with(func(s *snapshot) {
			s.markedEst, s.unmarkedEst, s.free, s.hasC, s.cEst = 0, 0, 0, true, mib
		}), plan{skip: skipMinRelease, goEst: 0, cEst: mib, est: mib, need: defaultMinRelease}},
		{"neverSkip", with(func(s *snapshot) { s.minRelease, s.scan, s.markedEst, s.unmarkedEst, s.free = 0, 1<<30, 1, 1, 1 }),
			plan{runGo: true, goEst: 1, cEst: -1, est: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, decide(tc.s))
		})
	}
}

func TestCostOf(t *testing.T) {
	cost, need := costOf(254<<20, float64(defaultScanCost), defaultMinRelease)
	assert.Equal(t, time.Duration(2*254<<20), cost)
	assert.Equal(t, int64(cost.Seconds()*float64(releasePerCPUSecond)), need)
	cost, need = costOf(-1, float64(defaultScanCost), defaultMinRelease)
	assert.Zero(t, cost)
	assert.Equal(t, defaultMinRelease, need, "unknown scan: the floor alone")
	cost, need = noGCCostOf(1<<30, defaultMinRelease)
	assert.Equal(t, defaultScavengeCost, cost)
	assert.Equal(t, defaultMinRelease, need)
	assert.Equal(t, float64(defaultScanCost), calibrated(float64(defaultScanCost), 1<<20, time.Second), "too small to tell")
	assert.Equal(t, maxScanCost, calibrated(0, 64<<20, time.Hour), "bounded")
}

func TestSkipBelowMinRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{}
		est := int64(defaultMinRelease - 1)
		cfg := fakeConfig(f)
		cfg.estimate = func() int64 { return est }
		tr := mustNew(t, cfg)
		defer tr.Close()
		tr.AfterBurst()
		time.Sleep(time.Minute)
		assert.Empty(t, f.starts(), "estimate below threshold: no trim")
		s := tr.Stats()
		assert.Equal(t, int64(1), s.Skipped)
		assert.Equal(t, int64(0), s.Trims)
		assert.Equal(t, est, s.LastEstimate)
		assert.True(t, tr.quiet())

		est = defaultMinRelease
		tr.AfterBurst()
		time.Sleep(time.Minute)
		assert.Len(t, f.starts(), 1, "estimate at threshold: trim")

		est = -1 // unknown: trim
		tr.AfterBurst()
		time.Sleep(time.Minute)
		assert.Len(t, f.starts(), 2, "unknown estimate: trim")
		assert.Equal(t, int64(1), tr.Stats().Skipped)
	})
}

// Inputs 4 and 5: each step decides for itself. An unknown C figure
// (mimalloc) runs the C step even when the Go heap has nothing to give; a
// small C figure (glibc after a release) skips the C step and does not
// make the Go step run.
func TestEachStepDecides(t *testing.T) {
	for _, tc := range []struct {
		name            string
		goEst, cRet     int64
		goRuns, cRuns   bool
		goSkip, cSkip   int64
		skipped, trims  int64
		wantReleasedMiB int64
	}{
		{"C unknown, Go small", 40 << 10, -1, false, true, 1, 0, 0, 1, 1},
		{"C small, Go small", 40 << 10, 1 << 20, false, false, 0, 0, 1, 0, 0},
		{"C large, Go small", 40 << 10, 100 << 20, false, true, 1, 0, 0, 1, 1},
		{"C small, Go large", 100 << 20, 1 << 20, true, false, 0, 1, 0, 1, 1},
		{"both large", 100 << 20, 100 << 20, true, true, 0, 0, 0, 1, 2},
		{"Go unknown, C small", -1, 0, true, false, 0, 1, 0, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeStep{}
				h := &fakeCHeapRetained{retained: tc.cRet}
				cfg := fakeConfig(f)
				cfg.NoCHeap, cfg.cheap = false, h
				cfg.estimate = func() int64 { return tc.goEst }
				tr := mustNew(t, cfg)
				defer tr.Close()
				tr.AfterBurst()
				time.Sleep(time.Minute)
				assert.Equal(t, tc.goRuns, f.finished() == 1, "Go step ran")
				assert.Equal(t, tc.cRuns, h.releases.Load() == 1, "C step ran")
				s := tr.Stats()
				assert.Equal(t, tc.goSkip, s.GoSkipped)
				assert.Equal(t, tc.cSkip, s.CSkipped)
				assert.Equal(t, tc.skipped, s.Skipped)
				assert.Equal(t, tc.trims, s.Trims)
				assert.Equal(t, tc.wantReleasedMiB<<20, s.TotalReleased)
			})
		})
	}
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
	// neverSkip turns the cost rule off too.
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.MinRelease = neverSkip
	cfg.estimate = func() int64 { return 1 }
	cfg.scan = func() int64 { return 1 << 30 }
	tr := mustNew(t, cfg)
	defer tr.Close()
	assert.True(t, tr.request(originPressure).ran)
}

// skippedFor returns s's count of skips for r.
func skippedFor(s Stats, r skipReason) int64 { return *s.skipped(r) }

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

// Attack input (issue 17, cost rule): one trim charged an absurd CPU time
// (30 s for a Go step on 8 MiB of scannable heap: the process's CPU
// clock across a trim that a busy service's other threads shared). Before,
// the scan cost became 3.6 µs per byte, a 1 GiB pointer-rich heap then
// needed 60 GiB of garbage to be worth a trim, so no Go step ran again and
// nothing could correct the figure: trims were off for good. Now the
// calibrated scan cost stays within [defaultScanCost/8, 8×defaultScanCost]:
// a trim with 8 times the garbage the default would need still runs, and
// re-measures.
func TestCalibrationHugeCannotDisableTrims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStep{cpu: 30 * time.Second}
		cfg := fakeConfig(f)
		var scan, est int64 = 8 << 20, 1 << 30
		cfg.scan = func() int64 { return scan }
		cfg.estimate = func() int64 { return est }
		tr := mustNew(t, cfg)
		defer tr.Close()
		require.True(t, tr.request(originPressure).ran)

		f.cpu = 500 * time.Millisecond // the true cost of the next trim
		scan, est = 255<<20, 300<<20   // 300 MiB of garbage over a pointer-rich heap
		time.Sleep(time.Hour)          // past the budget of the 30 s trim
		r := tr.request(originPressure)
		assert.True(t, r.ran, "%+v", r)
		assert.InDelta(t, 8*float64(scan)*float64(defaultScanCost)/1e9*float64(releasePerCPUSecond), float64(r.need), 1<<10, "at most 8 times what the default rule needs")

		// The trim re-measured: 500 ms on 255 MiB, about 1.9 ns per byte.
		time.Sleep(time.Hour)
		est = 20 << 20
		r = tr.request(originPressure)
		assert.Equal(t, skipCost, r.skip, "20 MiB is not worth 0.5 s")
		assert.InDelta(t, float64(500*time.Millisecond), float64(r.cost), float64(time.Millisecond))
	})
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

// scanNode is the pointer-rich live heap of TestScanCost (and of issue
// 17's case 1): two pointers and 48 bytes.
type scanNode struct {
	a, b *scanNode
	_    [48]byte
}

// TestScanCost measures the figures behind the cost rule (see
// releasePerCPUSecond and defaultScanCost): the GC CPU of a full GC
// (runtime.GC, as the trim's FreeOSMemory runs one) with about 1 GiB live,
// first as 64 KiB []byte objects (nothing to scan), then as 16.7M nodes of
// two pointers and 48 bytes, against /gc/scan/total:bytes. It needs about
// 2 GiB and half a minute, so it runs only with MEMCTL_TEST_SCAN_COST=1:
//
//	MEMCTL_TEST_SCAN_COST=1 go test ./trim/ -run TestScanCost -v -count 1
func TestScanCost(t *testing.T) {
	if os.Getenv("MEMCTL_TEST_SCAN_COST") != "1" {
		t.Skip("set MEMCTL_TEST_SCAN_COST=1 to measure (about 2 GiB, half a minute)")
	}
	if raceEnabled {
		t.Skip("the race detector distorts CPU")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	gcCPU := func() time.Duration {
		s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
		metrics.Read(s)
		return time.Duration(s[0].Value.Float64() * 1e9)
	}
	measure := func(name string) (cost time.Duration, scan int64) {
		runtime.GC()
		for i := range 3 {
			c0, m0 := gcCPU(), readCPU(true)
			runtime.GC()
			c, m1 := gcCPU()-c0, readCPU(false)
			scan = scanBytes()
			h := readSample()
			// The charge of a trim: GC CPU, at most the process's CPU (the
			// GC figure counts workers' time off CPU on a loaded machine).
			ch := m0.charge(m1)
			t.Logf("%s: GC %d: %v of GC CPU, %v charged (process CPU %v), live %d MiB, scannable %d MiB",
				name, i, c, ch, m1.process-m0.process, h.Live>>20, scan>>20)
			cost = max(cost, ch)
		}
		return cost, scan
	}
	var bufs [][]byte
	for range 16384 {
		bufs = append(bufs, make([]byte, 64<<10))
	}
	noscan, _ := measure("1 GiB of 64 KiB []byte")
	runtime.KeepAlive(bufs)
	bufs = nil
	var head *scanNode
	for i := range 16_700_000 {
		x := &scanNode{a: head}
		if i%3 == 0 && head != nil {
			x.b = head.a
		}
		head = x
	}
	rich, scan := measure("1 GiB of 16.7M two-pointer nodes")
	runtime.KeepAlive(head)
	t.Logf("charged CPU per scannable byte: %.1f ns (defaultScanCost %v); noscan heap %v, pointer-rich %v: %.0fx",
		float64(rich)/float64(scan), defaultScanCost, noscan, rich, float64(rich)/float64(max(noscan, 1)))
	require.Greater(t, rich, 10*noscan, "the GC's cost follows the pointers, not the bytes")
}
