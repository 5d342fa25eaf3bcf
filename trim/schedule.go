package trim

import (
	"errors"
	"log/slog"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/satmath"
)

// sched is the state of the schedule and the gate, guarded by Trimmer.run.
// Clock readings (see Trimmer.clock) are 0 when unset.
type sched struct {
	quietSince int64 // latest tick that saw a mark; 0 when idle
	nextOK     int64 // earliest start of the next trim by the CPU budget
	lastStart  int64 // start of the last trim that ran; 0: none since New
	lastFlip   int64 // last flip of the Begin epoch
	deferred   bool  // this pending period was counted in Stats.Deferred
	// In this pending period: the program marked the burst (AfterBurst,
	// Begin); the last mark was the detector's for the collecting GC end; a
	// tick saw a mark. endsAtMark is the count of GC ends at that tick.
	progMarked, markCollected, markSeen bool
	endsAtMark                          uint64
	noGCBroken                          bool          // the step without a GC released nothing: FreeOSMemory from now on
	thr0                                time.Duration // throttled time when the pending period began
	thrAt                               int64         // when thr0 was read; 0 unknown
	early                               bool          // this pending period's trim starts at Delay/2
	served                              bool          // a request ran this pending period's trim
	scanCost                            float64       // GC CPU per scannable byte, ns (see costOf)
}

// arm sets the timer to tick after d, unless the Trimmer is closed.
func (t *Trimmer) arm(d time.Duration) {
	t.mu.Lock()
	if !t.closed {
		t.armed = true
		t.ticks.Add(1)
		if t.timer == nil {
			t.timer = time.AfterFunc(d, t.tickFn)
		} else {
			t.timer.Reset(d)
		}
	}
	t.mu.Unlock()
}

// isClosed reports whether Close was called.
func (t *Trimmer) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// tick runs in the timer's goroutine every interval while a trim is pending.
func (t *Trimmer) tick() {
	defer t.ticks.Done()
	t.mu.Lock()
	t.armed = false
	t.mu.Unlock()
	if t.isClosed() {
		return
	}
	if !t.run.TryLock() {
		// A TrimNow runs: look again next tick, so Close never waits for it.
		t.arm(t.interval)
		return
	}
	if t.isClosed() {
		t.run.Unlock()
		return
	}
	next, idle := t.step(time.Now())
	t.run.Unlock()
	if idle {
		t.goIdle()
	} else {
		t.arm(next)
	}
}

// step decides, at now, what a tick does: it returns idle true after a trim
// or skip; otherwise how long until the next tick. t.run must be held.
func (t *Trimmer) step(now time.Time) (next time.Duration, idle bool) {
	c := t.clock(now)
	if t.served {
		// A request ran this period's trim; a mark since or a burst in flight begins a new one.
		t.served = false
		prog, det := t.dirty.Swap(0) != 0, t.det.Swap(0)
		t.markSeen, t.markCollected = false, false
		t.quietSince, t.deferred, t.early, t.thrAt = 0, false, false, 0
		if !prog && det == 0 && t.inFlight() == 0 {
			t.since.Store(0)
			return 0, true
		}
		t.since.Store(c)
		t.noteMark(prog, det)
	}
	if t.quietSince == 0 {
		t.beginThrottleWatch(c)
	}
	// Bursts in flight are read before the marks: a burst's end marks
	// before its count falls, so a count of 0 here comes with its mark.
	inFlight := t.inFlight() > 0
	prog, det := t.dirty.Swap(0) != 0, t.det.Swap(0)
	if prog || det != 0 {
		t.noteMark(prog, det)
	}
	if prog || det != 0 || t.quietSince == 0 {
		t.quietSince = c // a call came since the last tick: quiet from now
	}
	since := t.since.Load()
	if since == 0 {
		since = c
		t.since.Store(c)
	}
	t.checkStale(c)
	due, full := t.due(c, since, inFlight)
	if c < due {
		return min(time.Duration(due-c), t.interval), false
	}
	early := t.early && c < full // the early start decided it
	t.quietSince, t.deferred, t.early, t.thrAt = 0, false, false, 0
	t.since.Store(0)
	if inFlight {
		t.progMarked = true // held to the max wait by a Begin
	}
	t.trimLocked(originDebounced, early)
	t.progMarked, t.markSeen, t.markCollected = false, false, false
	return 0, true
}

// due returns when the pending trim may start at c (the pending period
// began at since; a burst in flight or not), and when it would without the
// early start.
func (t *Trimmer) due(c, since int64, inFlight bool) (due, full int64) {
	bound := satmath.Add(since, int64(t.maxWait))
	if !t.early && t.thrAt != 0 && c >= satmath.Add(t.quietSince, int64(t.delay/2)) {
		t.early = t.throttledSince(c)
	}
	full = min(satmath.Add(t.quietSince, int64(t.delay)), bound)
	due = full
	if t.early {
		due = min(satmath.Add(t.quietSince, int64(t.delay/2)), bound)
	}
	if c < bound && inFlight {
		due = bound // the burst's end calls AfterBurst: look again each interval
	}
	if t.nextOK > due {
		if t.nextOK > bound && !t.deferred {
			t.deferred = true
			t.noteDeferred(time.Duration(t.nextOK - since))
		}
		due = t.nextOK
	}
	return due, full
}

// noteMark records a tick's sight of a mark: the program's (prog) and the
// detector's (det: 1 in progress, 2 collected). t.run must be held.
func (t *Trimmer) noteMark(prog bool, det uint32) {
	t.endsAtMark = t.gc.ends.Load()
	t.markSeen = true
	t.markCollected = !prog && det == 2
	t.progMarked = t.progMarked || prog
}

// detect is the burst detector's mark: 1 a burst in progress, 2 the GC end
// that collected it; unlike AfterBurst, not the program's word it is garbage.
func (t *Trimmer) detect(kind uint32) {
	if t.state.Load() == stateClosed {
		return
	}
	t.det.Store(kind)
	t.pend()
}

// detectC is the C heap detector's mark: free already, as detect(2), and it
// does not replace a Go burst's mark.
func (t *Trimmer) detectC() {
	if t.state.Load() == stateClosed {
		return
	}
	t.det.CompareAndSwap(0, 2)
	t.pend()
}

// noteCLeft records a trim decision and the C step's estimate it left.
func (t *Trimmer) noteCLeft(left int64) {
	t.mu.Lock()
	t.cDecided, t.cLeft = t.cDecided+1, left
	t.mu.Unlock()
}

// cAfter returns the trim decisions and the C estimate the last one left.
func (t *Trimmer) cAfter() (n, left int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cDecided, t.cLeft
}

// goIdle leaves the pending state, and arms again if a mark came since the
// last tick. A burst in flight does not keep it pending: its end calls
// AfterBurst, and a lost end must not keep a timer running forever.
func (t *Trimmer) goIdle() {
	if !t.state.CompareAndSwap(statePending, stateIdle) {
		return // closed
	}
	if t.dirty.Load() != 0 || t.det.Load() != 0 {
		t.pend()
	}
}

// checkStale flips the Begin epoch at most once per max wait, and reports
// the bursts of the old epoch still in flight one max wait after a flip.
// t.run must be held.
func (t *Trimmer) checkStale(c int64) {
	if t.lastFlip != 0 && c-t.lastFlip < int64(t.maxWait) {
		return
	}
	cur := t.epoch.Load() & 1
	old := t.inflight[cur^1].Load()
	if old <= 0 {
		t.epoch.Store(cur ^ 1)
		t.lastFlip = c
		old = 0
	}
	t.mu.Lock()
	t.stats.StaleBegins = old
	t.mu.Unlock()
	if old > 0 {
		t.logOnceAt(onceStale, slog.LevelWarn,
			"trim: burst begun and not ended for longer than the max wait (a lost end func?); reported in Stats.StaleBegins, logged once",
			slog.Int64("stale_begins", old), slog.Duration("max_wait", t.maxWait))
	}
}

// beginThrottleWatch reads the throttled time at a pending period's first
// tick, finding the cgroup again. t.run must be held.
func (t *Trimmer) beginThrottleWatch(c int64) {
	t.early, t.thrAt = false, 0
	if t.throttled == nil {
		return
	}
	if d, err := t.throttled(true); err == nil {
		t.thr0, t.thrAt = d, c
	} else {
		t.noteThrottleErr(err)
	}
}

// throttledSince reports whether the throttled time grew by at least
// throttledShare of the wall time since beginThrottleWatch (the kernel
// sums it over CPUs). t.run must be held.
func (t *Trimmer) throttledSince(c int64) bool {
	d, err := t.throttled(false)
	if err != nil {
		t.noteThrottleErr(err)
		return false
	}
	return c > t.thrAt && float64(d-t.thr0) >= throttledShare*float64(c-t.thrAt)
}

// noteThrottleErr logs once at INFO an error reading the throttled time,
// except a missing counter.
func (t *Trimmer) noteThrottleErr(err error) {
	if !errors.Is(err, cgroupfs.ErrNoThrottleCounter) {
		t.logOnceAt(onceThrottleErr, slog.LevelInfo,
			"trim: cannot read the CPU cgroup's throttled time: trims wait the whole delay while it fails; logged once",
			slog.Any("error", err))
	}
}

// noteDeferred counts a trim held past the max wait by the CPU budget and
// logs the first at INFO.
func (t *Trimmer) noteDeferred(wait time.Duration) {
	t.mu.Lock()
	t.stats.Deferred++
	last := t.stats.LastCPU
	t.mu.Unlock()
	t.logOnceAt(onceDeferred, slog.LevelInfo,
		"trim: deferred past the max wait by the 2% CPU limit; counted in Stats.Deferred, logged once",
		slog.Duration("max_wait", t.maxWait), slog.Duration("wait", wait.Round(time.Millisecond)),
		slog.Duration("last_trim_cpu", last))
}
