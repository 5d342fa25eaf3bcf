package trim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
		{"NeverSkip", with(func(s *snapshot) { s.minRelease, s.scan, s.markedEst, s.unmarkedEst, s.free = 0, 1<<30, 1, 1, 1 }),
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
