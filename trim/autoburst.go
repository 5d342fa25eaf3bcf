package trim

import (
	"fmt"
	"math"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/gcend"
)

const (
	// DefaultBurstRise is the factor by which the live heap at the end of a
	// GC cycle must exceed its recent floor to be taken as a burst in
	// progress (see AutoBurst): 2. With GOGC=100 a heap whose objects all
	// stay live reaches the next GC at about twice the live heap of the
	// previous one, so a burst held in memory passes this factor by its
	// second GC cycle (the 1 GiB burst over 20 MiB live of
	// auto.TestImportTrimsBurstWithoutAfterBurst is detected at its GC
	// ends at about 72, 137, 260, 494 and 940 MiB), while a flat live heap
	// stays within a few percent of its floor however fast it allocates:
	// 20.2 to 20.9 MiB at 208 GC ends in 60 s of 1,000 requests per second
	// of 64 KiB garbage each (auto.TestNoBurstNoTrim, measured on this
	// repository's 2-core test machine). It is also the doubling of the
	// "at most one trim per doubling" bound for a heap that grows for good.
	DefaultBurstRise = 2.0

	// DefaultBurstMinRise is the least rise of the live heap over its floor,
	// in bytes, that counts as a burst: 32 MiB. Below it a trim returns
	// less than it costs in the common case: the runtime keeps a few MiB of
	// free spans in normal operation and a trim's Go step skips below
	// DefaultMinRelease (8 MiB), and a trim costs a full GC whatever it
	// returns (see DefaultMinRelease and BENCHMARKS.md); and it keeps the
	// GC-to-GC noise of a small live heap (0.7 MiB at 20 MiB live with
	// 64 MiB/s of garbage, auto.TestNoBurstNoTrim) and the doubling of a
	// tiny heap at start-up (the runtime's first GC cycles run at 4 MiB)
	// far from a detection.
	DefaultBurstMinRise int64 = 32 << 20
)

// AutoBurstConfig configures a burst detector (StartAutoBurst). The zero
// value is the default: on, a rise of DefaultBurstRise (2×) and at least
// DefaultBurstMinRise (32 MiB).
type AutoBurstConfig struct {
	// Off turns burst detection off: StartAutoBurst returns a nil
	// *AutoBurst, and only AfterBurst and Begin start trims. Default: false
	// (on). Environment (package memctl): MEMCTL_AUTOBURST=off.
	Off bool
	// Rise is the factor over the floor, in [1.25, 1000], at which the live
	// heap is a burst. Default (0): DefaultBurstRise (2).
	Rise float64
	// MinRise is the least rise over the floor, in bytes, that is a burst;
	// at least 1 MiB. Default (0): DefaultBurstMinRise (32 MiB).
	MinRise int64
}

// AutoBurstStats are a detector's counters (AutoBurst.Stats).
type AutoBurstStats struct {
	// Bursts counts the bursts detected: rises of the live heap to Rise
	// times its floor (and MinRise over it).
	Bursts int64
	// Drops counts the GC cycles that collected a burst outside a detected
	// one: the live heap fell to 1/Rise of the level a forced GC (a trim
	// during the burst) had left as the floor.
	Drops int64
	// Marks counts the GC ends that called the Trimmer's AfterBurst (each
	// GC end that saw a burst in progress or its collection).
	Marks int64
	// Settled counts the bursts that were taken as growth for good: the
	// live heap stayed at the burst's level after a trim decided on its
	// estimate (and skipped its GC), or past the Trimmer's max wait plus its
	// delay, with no forced GC in between, and became the floor.
	Settled int64
	// Floor is the floor now, in bytes: the live heap the next rise is
	// measured from.
	Floor int64
	// GCEnds counts the GC ends the detector looked at.
	GCEnds int64
}

// AutoBurst detects bursts at the end of GC cycles and calls the Trimmer's
// AfterBurst for them, so that a program that never calls AfterBurst still
// has its bursts trimmed. It has no goroutine and no timer: it is a
// subscriber of the GC-end hook (internal/gcend), so an idle process runs
// none of it; each GC end costs one runtime/metrics read of two counters
// and allocates nothing: 0.7 to 1.1 µs and 0 allocations
// (BenchmarkAutoBurstGCEnd), against 4.4 to 8.7 ms for the GC cycle it
// follows (BenchmarkAutoBurstGC: runtime.GC of the benchmark's small heap,
// no detector), in the same run (go test -run '^$' -bench AutoBurst
// -benchmem -count 5 ./trim/, on this repository's shared 2-core test
// machine): under 0.03% of a GC cycle.
//
// The rule, at each GC end, with L the live heap (/gc/heap/live:bytes) and
// F the floor:
//
//   - A forced GC cycle (/gc/cycles/forced:gc-cycles grew: a trim's
//     debug.FreeOSMemory, or the program's runtime.GC) makes L the floor: it
//     is the heap's true level after a full collection. A burst in progress
//     ends there; if its memory is still live (a heap that grows for good,
//     or a burst held through the trim) the floor rises to it, so the next
//     burst must double again: a growing heap causes at most one trim per
//     doubling.
//   - A burst starts when L ≥ Rise·F and L − F ≥ MinRise. Every GC end that
//     sees L ≥ Rise·F (F as it was when the burst started) calls
//     AfterBurst: the debounced trim runs one Delay after the last GC end
//     that saw the burst, as after an AfterBurst there.
//   - The burst ends at the first GC end with L below Rise·F, or fallen
//     to 1/Rise of the burst's peak (and MinRise under it): that cycle
//     collected it, calls AfterBurst once more (its garbage is now free
//     pages for the trim to return, without a GC: see Trimmer) and L is
//     the floor again. The second condition makes a live heap built after
//     the floor was taken (a service that fills its cache after Start)
//     the floor once a burst over it is collected, so that the GC ends
//     that follow do not mark again and the trim runs one Delay after
//     the collection, not at the max wait.
//   - A burst still at its level once the Trimmer has decided a trim on
//     its estimate since the burst began, with no forced GC (the trim was
//     skipped: its estimate saw the burst's memory live), or after the
//     Trimmer's MaxWait plus Delay (the trim was deferred), is growth for
//     good: L becomes the floor, counted in AutoBurstStats.Settled. So a
//     heap that grows for good gets one trim decision per doubling, not one
//     per GC end while it grows; should the burst's memory be freed later,
//     the GC that collects it marks again (the drop below).
//   - Outside a burst the floor follows L down (F = min(F, L)); a GC that
//     finds L at 1/Rise of the floor (and MinRise under it) collected a
//     burst that a forced GC had counted as live, and calls AfterBurst.
//
// A flat live heap never rises to twice its floor however fast it
// allocates: it gets no automatic trim. With GOGC=off a GC cycle runs only
// at GOMEMLIMIT, so a burst that stays under it has no GC end and is not
// seen (the runtime keeps its garbage until the limit too; AfterBurst
// still trims it): measured here with the 1 GiB burst over 20 MiB live of
// auto.TestImportGOGCOff, GOGC=off and GOMEMLIMIT=1536MiB gave no GC end
// and 1,060 MiB resident 3 s after it, while GOGC=off and
// GOMEMLIMIT=512MiB gave 23 to 28 GC ends, one trim and 36 MiB. Every trim that a detection causes
// is an ordinary debounced trim: it passes the Trimmer's skip rule and its
// 2% CPU limit.
//
// An AutoBurst is safe for concurrent use; a nil *AutoBurst does nothing.
type AutoBurst struct {
	onBurst func()
	// onCollected, when set, is called instead of onBurst for a mark made
	// by the GC end that collected the burst (the Trimmer's
	// detectedCollected: its Go step then needs no GC).
	onCollected func()
	// collected says the last mark of observe was a collection. a.mu.
	collected bool
	// decisions returns the Trimmer's count of trims decided on their
	// estimate (run or skipped; nil: none known).
	decisions func() int64
	rise      float64
	minRise   int64
	settle    time.Duration
	sub       *gcend.Subscription
	mu        sync.Mutex // held by observe; guards the samples and the state
	samples   [2]metrics.Sample
	forced0   uint64
	st        burstState
	base      time.Time
	bursts    atomic.Int64
	drops     atomic.Int64
	marks     atomic.Int64
	settled   atomic.Int64
	floor     atomic.Int64
	gcEnds    atomic.Int64
	closed    atomic.Bool
}

// burstState is the detector's state between GC ends.
type burstState struct {
	floor   int64 // F
	prev    int64 // L at the previous GC end
	inBurst bool
	base    int64 // F when the burst started
	since   int64 // clock (ns since AutoBurst.base) when the burst started
	peak    int64 // the highest L seen in the burst
	// decided is the Trimmer's count of decisions when the burst started.
	decided int64
}

const (
	metricForcedGC = "/gc/cycles/forced:gc-cycles"
	minBurstRise   = 1.25
	maxBurstRise   = 1000
	minBurstBytes  = 1 << 20
)

// StartAutoBurst starts a burst detector that calls t.AfterBurst (see
// AutoBurst). It returns nil and no error when cfg.Off is set or t is nil
// (trimming off), and an error naming the field for a Rise outside
// [1.25, 1000] or a MinRise under 1 MiB (nothing is started then). The floor
// starts at the live heap of the last GC cycle, or of the next one when
// none has run yet. Close stops it.
func StartAutoBurst(t *Trimmer, cfg AutoBurstConfig) (*AutoBurst, error) {
	if cfg.Off || t == nil {
		return nil, nil
	}
	a, err := newAutoBurst(cfg, t.detected, t.MaxWait()+t.Delay())
	if err != nil {
		return nil, err
	}
	a.onCollected = t.detectedCollected
	a.decisions = t.decisions.Load
	a.sub = gcend.Subscribe(a.gcEnd)
	return a, nil
}

// newAutoBurst checks cfg and returns a detector that calls onBurst, not
// yet subscribed.
func newAutoBurst(cfg AutoBurstConfig, onBurst func(), settle time.Duration) (*AutoBurst, error) {
	rise := cfg.Rise
	switch {
	case rise == 0:
		rise = DefaultBurstRise
	case !(rise >= minBurstRise && rise <= maxBurstRise): // NaN fails too
		return nil, fmt.Errorf("trim: AutoBurstConfig.Rise %g: want 0 (the default, %g) or from %g to %d", cfg.Rise, DefaultBurstRise, minBurstRise, maxBurstRise)
	}
	minRise := cfg.MinRise
	switch {
	case minRise == 0:
		minRise = DefaultBurstMinRise
	case minRise < minBurstBytes:
		return nil, fmt.Errorf("trim: AutoBurstConfig.MinRise %d: want 0 (the default, %d) or at least %d bytes", cfg.MinRise, DefaultBurstMinRise, minBurstBytes)
	}
	a := &AutoBurst{onBurst: onBurst, rise: rise, minRise: minRise, settle: settle, base: time.Now()}
	a.samples[0].Name = metricHeapLive
	a.samples[1].Name = metricForcedGC
	live, forced, ok := a.read()
	if ok {
		a.forced0 = forced
		a.st.floor, a.st.prev = live, live
		a.floor.Store(live)
	}
	return a, nil
}

// read returns the live heap and the count of forced GC cycles. a.mu must
// be held, or a not yet shared.
func (a *AutoBurst) read() (live int64, forced uint64, ok bool) {
	metrics.Read(a.samples[:])
	if a.samples[0].Value.Kind() != metrics.KindUint64 || a.samples[1].Value.Kind() != metrics.KindUint64 {
		return 0, 0, false
	}
	return int64(min(a.samples[0].Value.Uint64(), math.MaxInt64)), a.samples[1].Value.Uint64(), true
}

// gcEnd is the GC-end subscriber.
func (a *AutoBurst) gcEnd() bool {
	if a.closed.Load() {
		return false
	}
	a.mu.Lock()
	live, forced, ok := a.read()
	if !ok {
		a.mu.Unlock()
		return false // this runtime lacks the metrics: nothing to detect with
	}
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
	return true
}

// observe applies the rule (see AutoBurst) to one GC end: the live heap,
// whether a forced cycle completed since the last one, and the clock. It
// reports whether the GC end saw a burst (AfterBurst is due). a.mu must be
// held.
func (a *AutoBurst) observe(live int64, forced bool, now int64) (mark bool) {
	s := &a.st
	a.gcEnds.Add(1)
	defer func() {
		s.prev = live
		a.floor.Store(s.floor)
		if mark {
			a.marks.Add(1)
		}
	}()
	if forced || s.floor == 0 { // 0: no GC cycle had run at the start
		s.floor, s.inBurst = live, false
		return false
	}
	a.collected = false
	if s.inBurst {
		// Collected: below Rise times the floor it rose from, or fallen
		// from the burst's peak to 1/Rise of it (and MinRise under it): a
		// live heap built since the floor was taken (a service that fills
		// its cache after Start) stays as the new floor, and the GC ends
		// that follow do not mark again.
		dropped := a.high(s.peak, live) && s.peak-live >= a.minRise
		if a.high(live, s.base) && !dropped {
			if now-s.since > int64(a.settle) || a.decided() != s.decided {
				s.floor, s.inBurst = live, false
				a.settled.Add(1)
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
		s.inBurst, s.base, s.since, s.decided, s.peak = true, s.floor, now, a.decided(), live
		a.bursts.Add(1)
		return true
	}
	if a.high(s.floor, live) && s.floor-live >= a.minRise {
		s.floor = live
		a.drops.Add(1)
		a.collected = true
		return true
	}
	s.floor = min(s.floor, live)
	return false
}

// decided returns the Trimmer's count of trims decided on their estimate,
// 0 when unknown.
func (a *AutoBurst) decided() int64 {
	if a.decisions == nil {
		return 0
	}
	return a.decisions()
}

// high reports whether x ≥ rise·f.
func (a *AutoBurst) high(x, f int64) bool { return float64(x) >= a.rise*float64(f) }

// Stats returns the detector's counters. Safe for concurrent use; a nil
// *AutoBurst returns zeros.
func (a *AutoBurst) Stats() AutoBurstStats {
	if a == nil {
		return AutoBurstStats{}
	}
	return AutoBurstStats{
		Bursts: a.bursts.Load(), Drops: a.drops.Load(), Marks: a.marks.Load(),
		Settled: a.settled.Load(), Floor: a.floor.Load(), GCEnds: a.gcEnds.Load(),
	}
}

// Close stops the detector: no AfterBurst follows once it returns, except
// one from a GC end already running. It is idempotent; a nil *AutoBurst
// does nothing.
func (a *AutoBurst) Close() {
	if a == nil || a.closed.Swap(true) {
		return
	}
	a.sub.Stop()
}
