package trim

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/gcend"
)

// AutoBurstConfig configures the burst detector memctl.Start runs beside its
// Trimmer: at each GC end, a live heap at Rise times its recent floor and
// MinRise over it is a burst, as if marked by AfterBurst, and so is such a rise
// of the C heap's free memory, looked at at most once a second
// (docs/bursts.md). The zero value is the default.
type AutoBurstConfig struct {
	// Off turns burst detection off. Default: false.
	Off bool
	// Rise is the factor over the floor, in [1.25, 1000], at which the live
	// heap is a burst. Default: 2.
	Rise float64
	// MinRise is the least rise over the floor that is a burst, in bytes, at
	// least 1 MiB. Default: 32 MiB.
	MinRise int64
}

const (
	defaultBurstRise          = 2.0
	defaultBurstMinRise int64 = 32 << 20
	minBurstRise              = 1.25
	maxBurstRise              = 1000
	minBurstBytes             = 1 << 20
)

// AutoBurstStats are the burst detector's counters (memctl.Stats.AutoBurst).
type AutoBurstStats struct {
	Bursts  int64 // bursts detected: the live heap at Rise times its floor
	Drops   int64 // GC ends that found gone a burst a forced GC had made the floor
	Marks   int64 // GC ends that marked a burst or its collection
	Settled int64 // bursts taken as growth for good
	Floor   int64 // the live heap the next rise is measured from, in bytes
	GCEnds  int64 // GC ends looked at
	CBursts int64 // C heap bursts
	CFree   int64 // the C heap's releasable bytes at the last look, -1 unknown
}

// autoBurst detects bursts at GC ends (a gcend subscriber: no goroutine or
// timer) and marks them on its Trimmer. At each GC end, with L the live heap
// and F the floor:
//
//   - A forced GC (a trim's FreeOSMemory, runtime.GC) makes L the floor and
//     ends a burst in progress: a heap that grows for good must double again.
//   - A burst starts when L ≥ Rise·F and L − F ≥ MinRise; every GC end that
//     sees L ≥ Rise·F (F as at the start) marks it.
//   - It ends, collected, at the first GC end with L under Rise·F or fallen
//     to 1/Rise of its peak (and MinRise under it): that end marks once more
//     (the trim needs no GC) and L is the floor again.
//   - A burst still at its level after a trim decision since it began, or
//     after the max wait plus the delay, is growth for good: L is the floor
//     (Settled).
//   - Outside a burst F follows L down; a GC that finds L at 1/Rise of F
//     (and MinRise under it) collected a burst a forced GC had counted as
//     live, and marks (Drops).
//
// With GOGC=off a GC runs only at GOMEMLIMIT, so a burst under it is not
// seen. Safe for concurrent use; a nil *autoBurst does nothing.
type autoBurst struct {
	onBurst     func()
	onCollected func()       // if set, called instead of onBurst by the GC end that collected the burst
	collected   bool         // the last mark of observe was a collection; a.mu
	decisions   func() int64 // the Trimmer's count of trim decisions
	rise        float64
	minRise     int64
	settle      time.Duration
	sub         *gcend.Subscription
	base        time.Time
	closed      atomic.Bool
	mu          sync.Mutex // guards the fields below
	forced0     uint64
	st          burstState
	n           AutoBurstStats

	// The C heap's look (lookC); cRetained nil: none.
	cRetained func() int64           // the C step's Retained
	cAfter    func() (n, left int64) // Trimmer.cAfter
	onCBurst  func()
	cmu       sync.Mutex // guards c
	c         cState
}

// burstState is the detector's state between GC ends.
type burstState struct {
	floor   int64 // F
	prev    int64 // L at the previous GC end
	inBurst bool
	base    int64 // F when the burst started
	since   int64 // clock (ns since AutoBurst.base) when the burst started
	peak    int64 // the highest L seen in the burst
	decided int64 // the Trimmer's count of decisions when the burst started
}

// startAutoBurst starts a detector that marks t's bursts. It returns nil
// and no error when cfg.Off is set or t is nil, and an error naming the
// field for a Rise outside [1.25, 1000] or a MinRise under 1 MiB. The floor
// starts at the live heap of the last GC cycle. Close stops it.
func startAutoBurst(t *Trimmer, cfg AutoBurstConfig) (*autoBurst, error) {
	if cfg.Off || t == nil {
		return nil, nil
	}
	a, err := newAutoBurst(cfg, func() { t.detect(1) }, t.MaxWait()+t.Delay())
	if err != nil {
		return nil, err
	}
	a.onCollected = func() { t.detect(2) }
	a.decisions = t.decisions.Load
	if t.cheap != nil && t.cheap.Allocator() != "none" {
		a.cRetained, a.cAfter, a.onCBurst = t.cheap.Retained, t.cAfter, t.detectC
		a.c.decided, _ = t.cAfter()
		a.c.free = t.cheap.Retained()
		a.c.floor, a.c.level = max(a.c.free, 0), max(a.c.free, 0)
	}
	a.sub = gcend.Subscribe(a.atGCEnd)
	return a, nil
}

// newAutoBurst checks cfg and returns an unsubscribed detector calling onBurst.
func newAutoBurst(cfg AutoBurstConfig, onBurst func(), settle time.Duration) (*autoBurst, error) {
	rise := cfg.Rise
	switch {
	case rise == 0:
		rise = defaultBurstRise
	case !(rise >= minBurstRise && rise <= maxBurstRise): // NaN fails too
		return nil, fmt.Errorf("trim: AutoBurstConfig.Rise %g: want 0 (the default, %g) or from %g to %d", cfg.Rise, defaultBurstRise, minBurstRise, maxBurstRise)
	}
	minRise := cfg.MinRise
	switch {
	case minRise == 0:
		minRise = defaultBurstMinRise
	case minRise < minBurstBytes:
		return nil, fmt.Errorf("trim: AutoBurstConfig.MinRise %d: want 0 (the default, %d) or at least %d bytes", cfg.MinRise, defaultBurstMinRise, minBurstBytes)
	}
	a := &autoBurst{onBurst: onBurst, rise: rise, minRise: minRise, settle: settle, base: time.Now(),
		decisions: func() int64 { return 0 }}
	g := readSample()
	a.forced0 = g.Forced
	a.st.floor, a.st.prev, a.n.Floor = g.Live, g.Live, g.Live
	return a, nil
}

// atGCEnd is the GC-end subscriber.
func (a *autoBurst) atGCEnd(gs *gcend.Sample) bool {
	if a.closed.Load() {
		return false
	}
	a.mu.Lock()
	live, forced := gs.Live, gs.Forced
	wasForced := forced != a.forced0
	a.forced0 = forced
	mark := a.observe(live, wasForced, max(int64(time.Since(a.base)), 1))
	collected := a.collected
	a.mu.Unlock()
	switch {
	case mark && collected && a.onCollected != nil:
		a.onCollected()
	case mark:
		a.onBurst()
	}
	if a.cRetained != nil {
		a.lookC(gs.Time)
	}
	return true
}

// observe applies the rule (see autoBurst) to one GC end and reports whether
// it marks a burst. a.mu must be held.
func (a *autoBurst) observe(live int64, forced bool, now int64) (mark bool) {
	s := &a.st
	a.n.GCEnds++
	defer func() {
		s.prev, a.n.Floor = live, s.floor
		if mark {
			a.n.Marks++
		}
	}()
	if forced || s.floor == 0 { // 0: no GC cycle had run at the start
		s.floor, s.inBurst = live, false
		return false
	}
	a.collected = false
	if s.inBurst {
		// Collected by the peak rule too, so that a heap built since the
		// floor was taken (a cache filled after Start) is the new floor.
		dropped := a.high(s.peak, live) && s.peak-live >= a.minRise
		if a.high(live, s.base) && !dropped {
			if now-s.since > int64(a.settle) || a.decisions() != s.decided {
				s.floor, s.inBurst = live, false
				a.n.Settled++
				return false
			}
			s.peak = max(s.peak, live)
			return true
		}
		s.floor, s.inBurst = live, false
		a.collected = true
		return true // this cycle collected the burst
	}
	if a.high(live, s.floor) && live-s.floor >= a.minRise {
		s.inBurst, s.base, s.since, s.decided, s.peak = true, s.floor, now, a.decisions(), live
		a.n.Bursts++
		return true
	}
	if a.high(s.floor, live) && s.floor-live >= a.minRise {
		s.floor = live
		a.n.Drops++
		a.collected = true
		return true
	}
	s.floor = min(s.floor, live)
	return false
}

// high reports whether x ≥ rise·f.
func (a *autoBurst) high(x, f int64) bool { return float64(x) >= a.rise*float64(f) }

// Counters returns the detector's counters; a nil *autoBurst returns zeros.
func (a *autoBurst) Counters() AutoBurstStats {
	if a == nil {
		return AutoBurstStats{}
	}
	a.mu.Lock()
	s := a.n
	a.mu.Unlock()
	a.cmu.Lock()
	s.CBursts, s.CFree = a.c.bursts, a.c.free
	a.cmu.Unlock()
	if a.cRetained == nil {
		s.CFree = -1
	}
	return s
}

// Close stops the detector: no mark follows its return but one from a GC end
// already running. Idempotent; a nil *autoBurst does nothing.
func (a *autoBurst) Close() {
	if a == nil || a.closed.Swap(true) {
		return
	}
	a.sub.Stop()
}
