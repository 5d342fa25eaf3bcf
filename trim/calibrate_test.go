package trim

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
)

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
