package trim

import (
	"math"
	"time"
)

// The cost rule. The Go step with a GC marks the whole live heap whatever it
// releases:
//
//	cost = scan cost × /gc/scan/total:bytes
//	need = max(MinRelease, cost × releasePerCPUSecond)
//
// and the step runs when its estimate reaches need. The scan cost starts at
// defaultScanCost, then is what the last trim over calibrateMinScan of
// scannable heap was charged per byte, within [minScanCost, maxScanCost].
// The step without a GC costs defaultScavengeCost per GiB it returns. The
// figures behind these constants: docs/benchmarks.md, "The trim's defaults".
const (
	defaultScanCost           = 2 * time.Nanosecond   // per scannable byte
	defaultScavengeCost       = 64 * time.Millisecond // per GiB returned without a GC
	releasePerCPUSecond int64 = 64 << 20              // the exchange rate of RAM for CPU
	calibrateMinScan          = 8 << 20
	minScanCost               = float64(defaultScanCost) / 8
	maxScanCost               = float64(defaultScanCost) * 8
	minTrimCharge             = time.Millisecond // the least CPU a trim is charged
	// cheapGC is the GC cost up to which a GC is forced in a process idle
	// after its burst: FreeOSMemory returns the slack the no-GC step leaves.
	cheapGC = 10 * time.Millisecond
)

// snapshot is what a trim decision reads, at one moment.
type snapshot struct {
	origin   origin
	force    bool // TrimNow: both steps, with a GC, whatever the estimates
	marked   bool // the program marked the burst: its growth is garbage
	gcSince  bool // a GC cycle collected the burst since its mark
	detected bool // only the detector marked this burst, in progress, not collected
	busy     bool // a whole GC cycle ran since the mark: the process allocates
	noGCOK   bool // the path without a GC may be taken

	minRelease int64
	scanCost   float64       // ns per scannable byte
	scan       int64         // scannable bytes, -1 unknown
	floorScan  int64         // scan scaled to the live heap before the burst
	saved      time.Duration // cpuShare of the time since the last trim (or New)
	// The GC path's estimates with and without the program's mark, and the
	// free heap (estimateGo); the no-GC path's; the heap goal less the live
	// heap. -1: unknown.
	markedEst, unmarkedEst, free, noGCEst, runway int64
	hasC                                          bool
	cEst                                          int64 // the C step's estimate, -1 unknown
}

// plan is what a trim will do, and why.
type plan struct {
	skip        skipReason // skipNone: at least one step runs
	force       bool       // TrimNow's: every step, every allocator
	runGo, runC bool
	noGC        bool  // the Go step takes the path without a GC
	goEst, cEst int64 // the steps' estimates, -1 unknown
	est         int64 // their known sum, -1 when both are unknown
	need        int64 // what the Go step must be expected to release
	cost        time.Duration
	marked      bool // the GC path's estimate counted the burst as garbage
	probe       bool // the GC asks whether a detected burst died (see decide)
}

// decide is the gate: which steps of a trim run, on which path. Pure.
func decide(s snapshot) plan {
	p := plan{cEst: -1, force: s.force}
	cost, need := costOf(s.scan, s.scanCost, s.minRelease)
	// Only a GC can tell whether a detected, uncollected burst died. One
	// dearer than cheapGC is asked (a probe, priced at the heap before the
	// burst) only when its cost with the burst live fits the budget saved:
	// a heap that grew for good then costs one forced GC, which resets the floor.
	if s.origin == originDebounced && s.detected && !s.marked && !s.gcSince && cost > cheapGC && cost <= s.saved {
		p.probe = true
		cost, need = costOf(s.floorScan, s.scanCost, s.minRelease)
	}
	p.marked = s.marked || p.probe || (s.origin == originDebounced && cost <= cheapGC)
	p.goEst = s.gcEst(p.marked, need)
	p.cost, p.need = cost, need
	if !s.force && s.noGCOK {
		switch {
		case s.gcSince && (s.busy || cost > cheapGC):
			p.noGC = true
		case !s.gcSince && cost > cheapGC:
			// Its GC runs only when it beats the path without one by its cost.
			a := s.noGCEst
			p.noGC = p.goEst >= 0 && a >= max(s.minRelease, 1) && (p.goEst < need || p.goEst-a-s.runway < need)
		}
	}
	if p.noGC {
		p.goEst = s.noGCEst
		p.cost, p.need = noGCCostOf(p.goEst, s.minRelease)
	}
	if s.hasC {
		p.cEst = s.cEst
	}
	p.est = -1
	if p.goEst >= 0 || p.cEst >= 0 {
		p.est = max(p.goEst, 0) + max(p.cEst, 0)
	}
	p.runGo = s.force || p.goEst < 0 || p.goEst >= p.need
	p.runC = s.hasC && (s.force || p.cEst < 0 || p.cEst >= s.minRelease)
	if !p.runGo && !p.runC {
		p.skip = skipCost
		if p.goEst < s.minRelease {
			p.skip = skipMinRelease
		}
	}
	return p
}

// gcEst is the GC path's estimate: unmarked, memory allocated since the last
// GC counts only when the GC that would find out is cheap (need is MinRelease).
func (s snapshot) gcEst(marked bool, need int64) int64 {
	switch {
	case marked:
		return s.markedEst
	case need > s.minRelease && s.free >= 0:
		return s.free
	}
	return s.unmarkedEst
}

// costOf returns the estimated CPU of a GC with scan scannable bytes at
// perByte ns each and the release it must be expected to give.
func costOf(scan int64, perByte float64, minRelease int64) (cost time.Duration, need int64) {
	if minRelease == 0 || scan <= 0 { // neverSkip, or unknown: the floor alone
		return 0, minRelease
	}
	cost = time.Duration(min(float64(scan)*perByte, math.MaxInt64/2))
	return cost, max(minRelease, int64(min(cost.Seconds()*float64(releasePerCPUSecond), math.MaxInt64/2)))
}

// noGCCostOf returns the estimated CPU of the step without a GC that
// returns est bytes and the release it must be expected to give.
func noGCCostOf(est, minRelease int64) (cost time.Duration, need int64) {
	if est <= 0 || minRelease == 0 {
		return 0, minRelease
	}
	cost = time.Duration(float64(est) / (1 << 30) * float64(defaultScavengeCost))
	return cost, max(minRelease, int64(min(cost.Seconds()*float64(releasePerCPUSecond), math.MaxInt64/2)))
}

// calibrated returns the scan cost measured by a trim with a GC over scan
// scannable bytes charged cpu, or old when the heap was too small to tell.
func calibrated(old float64, scan int64, cpu time.Duration) float64 {
	if scan >= calibrateMinScan && cpu > 0 {
		return min(max(float64(cpu)/float64(scan), minScanCost), maxScanCost)
	}
	return old
}
