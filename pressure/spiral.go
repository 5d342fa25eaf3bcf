package pressure

import (
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/logattr"
)

// reading is what the detector sees at one GC end.
type reading struct {
	now       time.Duration // monotonic time since the detector started
	gc, total float64       // CPU seconds
	limiter   uint64        // last GC cycle the limiter was on, 0 never
	cycles    uint64
	live      int64
	limit     int64 // GOMEMLIMIT
	// the cycle's heap goal; the one GOGC alone gives (MaxInt64 with GOGC=off)
	goal, gogcGoal int64
}

// limitSetsGoal reports whether GOMEMLIMIT, not GOGC, set the cycle's heap
// goal with a runway of at most (1 − ratio) × GOMEMLIMIT over the live heap.
func (r reading) limitSetsGoal(ratio float64) bool {
	return r.goal > 0 && r.goal < r.gogcGoal-r.gogcGoal/64 &&
		float64(r.goal-r.live) <= (1-ratio)*float64(r.limit)
}

type point struct {
	t         time.Duration
	gc, total float64
	cycles    uint64
}

// ringSize points spaced at least window/ringSpacing apart cover two windows.
const (
	ringSize    = 64
	ringSpacing = 32
)

// liveCycles is how many GC ends the live heap's median is taken over:
// /gc/heap/live counts what the mark allocated, so one slow cycle can read
// several times the retained heap.
const liveCycles = 8

// spiral is the detector's state. observe is called from one goroutine at a
// time (the runtime's cleanup goroutine, or a test), and allocates nothing.
type spiral struct {
	window           time.Duration
	share, liveRatio float64

	start   time.Time
	reader  gcend.Reader // for read, outside a GC end
	ring    [ringSize]point
	head, n int // oldest at head
	active  bool
	// lowSince is when, in an episode, the live heap fell under the end
	// threshold; -1 while it is not under it.
	lowSince time.Duration
	lives    [liveCycles]int64 // the last GC ends' live heaps: nLives so far, nextLive next
	nLives   int
	nextLive int
}

func newSpiral(window time.Duration, share, liveRatio float64) *spiral {
	return &spiral{window: window, share: share, liveRatio: liveRatio, start: time.Now(), lowSince: -1}
}

// medianLive adds live and returns the median of the last liveCycles
// readings (the lower middle one for an even count).
func (s *spiral) medianLive(live int64) int64 {
	s.lives[s.nextLive] = live
	s.nextLive = (s.nextLive + 1) % liveCycles
	s.nLives = min(s.nLives+1, liveCycles)
	v := s.lives // a copy
	slices.Sort(v[:s.nLives])
	return v[(s.nLives-1)/2]
}

// verdict is what observe decided at one GC end.
type verdict struct {
	share   float64
	span    time.Duration
	limiter bool
	live    int64 // bytes compared: the median for a start, this GC end's for an end
	change  int   // +1: an episode began, -1: it ended, 0: neither
}

// slide adds r to the window and returns the base point: the newest at
// least a window old, else the oldest.
func (s *spiral) slide(r reading) point {
	if s.n == 0 || r.now-s.ring[(s.head+s.n-1)%ringSize].t >= s.window/ringSpacing {
		if s.n == ringSize {
			s.head = (s.head + 1) % ringSize
			s.n--
		}
		s.ring[(s.head+s.n)%ringSize] = point{t: r.now, gc: r.gc, total: r.total, cycles: r.cycles}
		s.n++
	}
	for s.n > 1 && r.now-s.ring[(s.head+1)%ringSize].t >= s.window {
		s.head = (s.head + 1) % ringSize
		s.n--
	}
	return s.ring[s.head]
}

// observe adds r to the window and returns the GC share over it and
// whether an episode began or ended.
func (s *spiral) observe(r reading) verdict {
	base := s.slide(r)
	v := verdict{span: r.now - base.t, live: r.live}
	if d := r.total - base.total; d > 0 {
		v.share = min(max((r.gc-base.gc)/d, 0), 1)
	}
	v.limiter = r.limiter != 0 && r.limiter >= base.cycles
	limited := r.limit > 0 && r.limit != math.MaxInt64
	// Near GOMEMLIMIT: the median reaches LiveRatio of it, or the limit sets
	// the goal with that little runway (a heap just under the ratio).
	median := s.medianLive(r.live)
	byMedian := float64(median) >= s.liveRatio*float64(r.limit)
	near := limited && (byMedian || r.limitSetsGoal(s.liveRatio))
	hot := v.share >= s.share || v.limiter
	if !s.active {
		if byMedian {
			v.live = median
		}
		if near && hot && v.span >= s.window/4 {
			s.active, s.lowSince = true, -1
			v.change = 1
		}
		return v
	}
	// An episode ends when the share falls under 80% of the threshold, or the
	// live heap stays under LiveRatio-5% for a quarter window (it swings in a
	// spiral: one low cycle must not end the episode).
	low := !limited || float64(r.live) < (s.liveRatio-0.05)*float64(r.limit) && !r.limitSetsGoal(s.liveRatio-0.05)
	switch {
	case !low:
		s.lowSince = -1
	case s.lowSince < 0:
		s.lowSince = r.now
	}
	if (v.share < 0.8*s.share && !v.limiter) || (low && r.now-s.lowSince >= s.window/4) {
		s.active = false
		v.change = -1
	}
	return v
}

// from makes a reading of one GC end's sample.
func (s *spiral) from(gs *gcend.Sample) reading {
	return reading{now: gs.Time.Sub(s.start), gc: gs.GCCPU, total: gs.TotalCPU, limiter: gs.LimiterLast,
		live: gs.Live, cycles: gs.Cycles, limit: gs.GoMemLimit, goal: gs.Goal, gogcGoal: gs.GOGCGoal()}
}

// gcEnd, the GC-end hook, updates Stats and, when an episode begins or ends,
// publishes it and hands the log and actions to a goroutine (they may block).
func (m *Monitor) gcEnd(gs *gcend.Sample) bool {
	if m.closed.Load() {
		return false
	}
	r := m.spiral.from(gs)
	v := m.spiral.observe(r)
	m.lastShare.Store(math.Float64bits(v.share))
	m.lastLive.Store(r.live)
	m.lastCycles.Store(int64(min(r.cycles, math.MaxInt64)))
	if v.change == 0 {
		return true
	}
	e := Event{Kind: KindSpiral, Time: time.Now(), GCShare: v.share, Span: v.span,
		LiveHeap: v.live, HeapGoal: r.goal, GoMemLimit: r.limit, LimiterEngaged: v.limiter}
	if v.change < 0 {
		e.Kind = KindSpiralEnd
	} else {
		m.spirals.Add(1)
	}
	m.epMu.Lock()
	defer m.epMu.Unlock()
	if m.closed.Load() {
		return false
	}
	m.inSpiral.Store(v.change > 0)
	m.publish(e)
	m.episodes.Add(1)
	go m.episode(e)
	return true
}

// episode takes or undoes the actions (shedding, the lift) and logs. Episodes
// may run out of order: each applies the latest inSpiral, logging only a change.
func (m *Monitor) episode(e Event) {
	defer m.episodes.Done()
	m.actMu.Lock()
	defer m.actMu.Unlock()
	want := m.inSpiral.Load()
	if want == m.applied || m.closed.Load() {
		return
	}
	m.applied = want
	m.deps.shed(want)
	attrs := []slog.Attr{
		slog.Float64("gc_cpu_share", math.Round(e.GCShare*1000)/1000),
		slog.Duration("window", e.Span),
		slog.Int64("live_heap", e.LiveHeap),
		logattr.GoMemLimit("gomemlimit", e.GoMemLimit),
		slog.Bool("gc_limiter", e.LimiterEngaged),
	}
	if !want {
		m.log.LogAttrs(bg, slog.LevelInfo, "memctl: GC death spiral ended", attrs...)
		return
	}
	attrs = append(attrs, slog.Bool("shed", true))
	if to, why := m.liftLocked(); to > 0 {
		attrs = append(attrs, slog.Int64("gomemlimit_lifted_to", to), slog.Duration("lift_for", m.cfg.LiftFor))
	} else {
		attrs = append(attrs, slog.String("lift", why))
	}
	m.log.LogAttrs(bg, slog.LevelWarn, "memctl: GC death spiral: the GC is using most of the CPU with the live heap near GOMEMLIMIT", attrs...)
}

// liftLocked asks GOMEMLIMIT's owner (the limiter) for a lift if allowed;
// it returns the new limit, or 0 and why not. Called with actMu held.
func (m *Monitor) liftLocked() (to int64, why string) {
	c := m.cfg
	if strings.TrimSpace(m.deps.getenv("GOMEMLIMIT")) != "" {
		return 0, "off: GOMEMLIMIT set by the operator"
	}
	ceiling := m.deps.ceiling() // the limiter's cgroup limit, 0 without one
	switch {
	case c.LiftOff || ceiling == 0:
		return 0, "off"
	case m.liftTimer != nil:
		return 0, "already lifted"
	case !m.liftEnded.IsZero() && time.Since(m.liftEnded) < c.LiftFor:
		return 0, "not yet: a lift ended less than LiftFor ago"
	}
	cur := gomemlimit.Read()
	if cur <= 0 || cur == math.MaxInt64 {
		return 0, "no GOMEMLIMIT"
	}
	want := ceiling
	if step := float64(cur) * c.LiftStep; float64(cur)+step < float64(ceiling) {
		want = cur + int64(step)
	}
	if want <= cur {
		return 0, "no room under the cgroup limit"
	}
	from, to, ok := m.deps.lift(want - cur)
	if !ok || to <= from {
		return 0, "GOMEMLIMIT's owner refused the lift"
	}
	m.lifts.Add(1)
	m.lifted.Store(to - from)
	m.liftTimer = time.AfterFunc(c.LiftFor, func() {
		m.actMu.Lock()
		defer m.actMu.Unlock()
		m.endLiftLocked("lift time over")
	})
	return to, ""
}

// endLiftLocked ends a lift through the owner, which restores GOMEMLIMIT
// unless it changed since (a cgroup resize). Called with actMu held.
func (m *Monitor) endLiftLocked(why string) {
	if m.liftTimer == nil {
		return
	}
	m.liftTimer.Stop()
	m.liftTimer = nil
	m.liftEnded = time.Now()
	m.lifted.Store(0)
	_, _, restored := m.deps.lift(0)
	m.log.LogAttrs(bg, slog.LevelInfo, "memctl: GOMEMLIMIT lift ended",
		slog.String("why", why), slog.Bool("restored", restored),
		logattr.GoMemLimit("gomemlimit", gomemlimit.Read()))
}
