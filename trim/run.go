package trim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/satmath"
	"github.com/memctl/memctl/trim/cheap"
)

// result is what a trim decided and, when it ran, what it did.
type result struct {
	plan
	ran      bool
	released int64
	lazy     int64
	cpu      time.Duration
	took     time.Duration
	abort    abortReason
	fellBack bool // the step without a GC released nothing: FreeOSMemory ran
	cErr     error
	clocks   cpuMark // the clocks' growth, for the DEBUG line
}

// trimLocked decides a trim of origin o (forced for originByName) and runs it;
// early: the throttled start at Delay/2 decided it. t.run must be held.
func (t *Trimmer) trimLocked(o origin, early bool) result {
	t.decisions.Add(1)
	s := t.snapshot(o)
	r := result{plan: decide(s)}
	if r.skip != skipNone {
		t.countSkip(o, r.skip, r.est)
		t.noteCLeft(s.cEst)
		t.logSkip(o, r.plan)
		t.gc.peak.Store(t.gc.last.Load()) // as after a trim: a burst collected before it is not one after it
		t.notify()
		return r
	}
	if o != originDebounced && o != originByName && t.state.Load() == statePending {
		// The pending trim, run sooner: later calls start a new period (step).
		t.dirty.Store(0)
		t.det.Store(0)
		t.served = true
	}
	t.runSteps(&r, s.marked)
	left := s.cEst
	if r.runC {
		left = t.cheap.Retained()
	}
	t.noteCLeft(left)
	t.record(o, early, &r)
	t.notify()
	return r
}

// snapshot reads what decide needs. t.run must be held.
func (t *Trimmer) snapshot(o origin) snapshot {
	s := snapshot{origin: o, force: o == originByName, minRelease: t.minRelease, scanCost: t.scanCost,
		noGCOK: !t.noGCBroken && !t.gcOnly, scan: t.scan(), noGCEst: t.noGCEst(), cEst: -1}
	s.gcSince = t.gcSinceMark() || t.markCollected || t.gc.collected(t.minRelease)
	s.busy = t.markSeen && t.gc.ends.Load() >= t.endsAtMark+2
	// The program's word: AfterBurst or Begin for the debounced or pending trim, or TrimNow.
	s.marked = s.force || ((o == originDebounced || t.state.Load() == statePending) &&
		(t.progMarked || t.dirty.Load() != 0 || t.inFlight() > 0))
	s.detected = t.markSeen && !t.progMarked && !t.markCollected
	s.floorScan = floorScan(s.scan, t.gc.floor.Load(), t.gc.last.Load())
	s.saved = time.Duration(cpuShare * float64(t.clock(time.Now())-t.lastStart))
	s.markedEst, _ = t.estimate(t, true)
	s.unmarkedEst, s.free = t.estimate(t, false)
	g := readSample()
	s.runway = max(g.Goal-g.Live, 0)
	if t.cheap != nil {
		s.hasC, s.cEst = true, t.cheap.Retained()
	}
	return s
}

// floorScan returns scan scaled by floor/live: what a GC would scan if the
// heap above the floor were garbage; scan when a figure is unknown.
func floorScan(scan, floor, live int64) int64 {
	if scan <= 0 || floor < 0 || live <= 0 || floor >= live {
		return scan
	}
	return int64(float64(scan) * float64(floor) / float64(live))
}

// gcSinceMark reports whether a GC cycle begun after the burst's last mark has
// ended: the first end after it counts only with the live heap back near the
// floor (the cycle may have begun before the drop), else the second does.
// t.run must be held.
func (t *Trimmer) gcSinceMark() bool {
	if !t.markSeen || t.dirty.Load() != 0 || t.det.Load() != 0 {
		return false // no mark in this period, or one no tick has seen yet
	}
	switch n := t.gc.ends.Load(); {
	case n >= t.endsAtMark+2:
		return true
	case n == t.endsAtMark+1:
		last, floor, peak := t.gc.last.Load(), t.gc.floor.Load(), t.gc.peak.Load()
		return last >= 0 && last < floor+max(t.minRelease, 1, min(floor/4, (peak-floor)/2))
	}
	return false
}

// runSteps runs the steps r plans on a locked thread, whose CPU clock covers
// the forced scavenge and the C step. t.run must be held.
func (t *Trimmer) runSteps(r *result, marked bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	cpu0 := t.readCPU(true)
	scan := t.scan()
	if r.runGo {
		lazy0 := int64(-1)
		if t.lazy {
			lazy0 = t.lazyFree()
		}
		t.runGoStep(r, marked)
		if l := t.lazyFree; lazy0 >= 0 {
			if v := l(); v >= 0 {
				r.lazy = min(max(v-lazy0, 0), r.released)
			}
		}
	}
	if r.runC {
		over := t.minRelease
		if r.force {
			over = neverSkip
		}
		n, err := t.cheap.ReleaseOver(over)
		r.released += max(n, 0)
		r.cErr = err
	}
	cpu1 := t.readCPU(false)
	measured := cpu0.charge(cpu1)
	r.clocks = cpuMark{cpu1.gc - cpu0.gc, cpu1.thread - cpu0.thread, cpu1.process - cpu0.process}
	r.cpu = max(measured, minTrimCharge)
	gcRan := r.runGo && !r.noGC
	if gcRan && scan > 0 {
		r.cpu = max(r.cpu, time.Duration(float64(scan)*minScanCost)) // the least its GC can cost
	}
	r.took = time.Since(start)
	r.ran = true
	t.lastStart = t.clock(start)
	t.nextOK = satmath.Add(t.lastStart, costFactor*min(int64(r.cpu), (1<<63-1)/costFactor))
	t.gc.peak.Store(t.gc.last.Load()) // a burst collected before this trim is not one after it
	if gcRan {
		live := readSample().Live // accurate: FreeOSMemory just ran a GC
		t.gc.floor.Store(live)
		t.gc.peak.Store(live) // its hook may run after the reset above
		t.scanCost = calibrated(t.scanCost, t.scan(), measured)
	}
}

// runGoStep runs the Go step on r's path.
func (t *Trimmer) runGoStep(r *result, marked bool) {
	if !r.noGC {
		r.released = t.goStep()
		return
	}
	var broken bool
	t.hold(func() { r.released, _, r.abort, broken = t.noGCStep() })
	if !broken {
		return
	}
	// Released nothing, unexplained: a GC from now on, within the same gate.
	t.noGCBroken, r.fellBack, r.noGC, r.abort = true, true, false, abortNone
	t.logOnceAt(onceNoGCBroken, slog.LevelInfo,
		"trim: the Go runtime released nothing under a lowered GOMEMLIMIT; the Go step runs debug.FreeOSMemory (a GC) from now on; counted in Stats.Fallbacks, logged once",
		slog.String("go", runtime.Version()))
	est, sure := t.estimate(t, marked)
	_, need := costOf(t.scan(), t.scanCost, t.minRelease)
	if !marked && need > t.minRelease && sure >= 0 {
		est = sure
	}
	if est < 0 || est >= need {
		r.released = t.goStep()
	} else {
		r.runGo = false
	}
}

// record counts a trim that ran in Stats and logs it.
func (t *Trimmer) record(o origin, early bool, r *result) {
	t.mu.Lock()
	st := &t.stats
	st.Trims++
	ost := st.of(o)
	ost.Trims++
	ost.CPU += r.cpu
	ost.Released += r.released
	if early {
		st.EarlyStarts++
	}
	if !r.runGo {
		st.GoSkipped++
	}
	if t.cheap != nil && !r.runC {
		st.CSkipped++
	}
	if r.noGC {
		st.NoGC++
		st.countAbort(r.abort)
	}
	if r.fellBack {
		st.Fallbacks++
	}
	st.LastDuration, st.LastCPU, st.TotalCPU = r.took, r.cpu, st.TotalCPU+r.cpu
	st.LastReleased, st.TotalReleased = r.released, st.TotalReleased+r.released
	st.LastLazy, st.TotalLazy = r.lazy, st.TotalLazy+r.lazy
	st.LastEstimate = r.est
	if r.runC {
		st.CHeapErr = r.cErr
	}
	t.mu.Unlock()
	if early {
		t.logOnceAt(onceEarly, slog.LevelInfo,
			"trim: the CPU cgroup is throttled: trims start at half the delay while it is; counted in Stats.EarlyStarts, logged once",
			slog.Duration("delay", t.delay), slog.Duration("start_after", t.delay/2))
	}
	if t.log == nil {
		return
	}
	ctx := context.Background()
	t.log.LogAttrs(ctx, slog.LevelDebug, "trim: done",
		slog.String("origin", o.String()),
		slog.Duration("took", r.took), slog.Duration("cpu", r.cpu),
		slog.Duration("gc_cpu", r.clocks.gc), slog.Duration("thread_cpu", r.clocks.thread),
		slog.Duration("process_cpu", r.clocks.process),
		slog.Int64("released_bytes", r.released), slog.Int64("lazy_bytes", r.lazy),
		slog.Bool("go_step", r.runGo), slog.Bool("no_gc", r.noGC), slog.Bool("probe", r.probe), slog.String("abort", r.abort.String()),
		slog.Bool("c_step", r.runC),
		logattr.Bytes("go_estimate_bytes", r.goEst), t.cEstimateAttr(r.cEst),
		logattr.Bytes("need_bytes", r.need), slog.Duration("cost_estimate", r.cost))
	if r.cErr != nil && !errors.Is(r.cErr, cheap.ErrUnavailable) {
		t.log.LogAttrs(ctx, slog.LevelWarn, "trim: C heap step failed",
			slog.String("allocator", st.CHeapAllocator), slog.Any("error", r.cErr))
	}
}

func (t *Trimmer) logSkip(o origin, p plan) {
	if t.log != nil {
		t.log.LogAttrs(context.Background(), slog.LevelDebug, "trim: skipped",
			slog.String("origin", o.String()), slog.String("reason", p.skip.String()),
			slog.Bool("no_gc", p.noGC), slog.Bool("probe", p.probe),
			logattr.Bytes("go_estimate_bytes", p.goEst), t.cEstimateAttr(p.cEst),
			logattr.Bytes("need_bytes", p.need), slog.Duration("cost_estimate", p.cost),
			slog.Int64("min_release_bytes", t.minRelease))
	}
}

// cEstimateAttr is the C estimate's DEBUG attr, empty without a C step.
func (t *Trimmer) cEstimateAttr(cEst int64) slog.Attr {
	if t.cheap == nil {
		return slog.Attr{}
	}
	return logattr.Bytes("c_estimate_bytes", cEst)
}

// request runs a trim now, in the calling goroutine, for an automatic origin
// (originPressure, originSpiral) through the debounced trim's gate and the
// CPU budget; it never waits for a running trim (skipRunning). A run ends the
// pending period unless a mark or a burst in flight keeps it. Another origin
// is misuse, treated as originPressure.
func (t *Trimmer) request(o origin) result {
	if t == nil {
		return result{plan: plan{skip: skipClosed}}
	}
	if o != originPressure && o != originSpiral {
		t.reportBadOrigin(o)
		o = originPressure
	}
	if t.state.Load() == stateClosed {
		return result{plan: plan{skip: skipClosed}}
	}
	if !t.run.TryLock() {
		t.countSkip(o, skipRunning, 0)
		t.notify()
		return result{plan: plan{skip: skipRunning}}
	}
	defer t.run.Unlock()
	if c := t.clock(time.Now()); c < t.nextOK {
		t.countSkip(o, skipBudget, 0)
		if t.log != nil {
			t.log.LogAttrs(context.Background(), slog.LevelDebug, "trim: request skipped",
				slog.String("origin", o.String()), slog.String("reason", skipBudget.String()),
				slog.Duration("budget_allows_in", time.Duration(t.nextOK-c)))
		}
		t.notify()
		return result{plan: plan{skip: skipBudget}}
	}
	return t.trimLocked(o, false)
}

func (t *Trimmer) countSkip(o origin, r skipReason, est int64) {
	t.mu.Lock()
	t.stats.Skipped++
	if p := t.stats.skipped(r); p != nil {
		*p++
	}
	t.stats.of(o).Skipped++
	if r == skipMinRelease || r == skipCost {
		t.stats.LastEstimate = est
	}
	t.mu.Unlock()
}

func (t *Trimmer) reportBadOrigin(o origin) {
	t.misuse.Add(1)
	if t.strict {
		panic(fmt.Sprintf("trim: request(%d): want pressure or spiral", o))
	}
	t.logOnceAt(onceBadOrigin, slog.LevelWarn,
		"trim: request with an origin that is not automatic; treated as pressure, counted in Stats.Misuse, logged once",
		slog.Int("origin", int(o)))
}
