package pressure

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"time"
)

// The runtime/metrics the detector reads at each GC end.
var spiralMetrics = [...]string{
	"/cpu/classes/gc/total:cpu-seconds",
	"/cpu/classes/total:cpu-seconds",
	"/gc/limiter/last-enabled:gc-cycle",
	"/gc/heap/live:bytes",
	"/gc/cycles/total:gc-cycles",
}

// reading is what the detector sees at one GC end.
type reading struct {
	now       time.Duration // monotonic time since the detector started
	gc, total float64       // CPU seconds
	limiter   uint64        // last GC cycle the limiter was on, 0 never
	cycles    uint64
	live      int64
	limit     int64 // GOMEMLIMIT
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

// spiral is the detector's state. observe is called from one goroutine at a
// time (the runtime's cleanup goroutine, or a test), and allocates nothing.
type spiral struct {
	window           time.Duration
	share, liveRatio float64

	start   time.Time
	samples [len(spiralMetrics)]metrics.Sample
	ring    [ringSize]point
	head, n int // oldest at head
	active  bool
	// lowSince is when the live heap fell under the end threshold during an
	// episode, -1 while it is not under it.
	lowSince time.Duration
	// lives are the live heaps of the last liveCycles GC ends (nLives of
	// them so far), nextLive the slot for the next.
	lives    [liveCycles]int64
	nLives   int
	nextLive int
}

// liveCycles is how many GC ends the live heap is taken over (the median):
// /gc/heap/live counts what was allocated during the mark, so one slow
// cycle can read several times the retained heap (180 MiB for 20 MiB of
// objects in the control of TestDeathSpiralChild), while a spiral's
// readings stay near the limit.
const liveCycles = 8

// medianLive adds live and returns the median of the last liveCycles
// readings (the lower middle one for an even count). No allocation.
func (s *spiral) medianLive(live int64) int64 {
	s.lives[s.nextLive] = live
	s.nextLive = (s.nextLive + 1) % liveCycles
	s.nLives = min(s.nLives+1, liveCycles)
	var v [liveCycles]int64
	n := copy(v[:], s.lives[:s.nLives])
	for i := 1; i < n; i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
	return v[(n-1)/2]
}

func newSpiral(window time.Duration, share, liveRatio float64) *spiral {
	s := &spiral{window: window, share: share, liveRatio: liveRatio, start: time.Now(), lowSince: -1}
	for i, name := range spiralMetrics {
		s.samples[i].Name = name
	}
	return s
}

// verdict is what observe decided at one GC end.
type verdict struct {
	share   float64
	span    time.Duration
	limiter bool
	// live is the live heap the rule compared, in bytes: the median of the
	// last liveCycles GC ends for a start, this GC end's for an end.
	live   int64
	change int // +1: an episode began, -1: it ended, 0: neither
}

// observe adds r to the window and returns the GC share over it and
// whether an episode began or ended.
func (s *spiral) observe(r reading) verdict {
	if s.n == 0 || r.now-s.ring[(s.head+s.n-1)%ringSize].t >= s.window/ringSpacing {
		if s.n == ringSize {
			s.head = (s.head + 1) % ringSize
			s.n--
		}
		s.ring[(s.head+s.n)%ringSize] = point{t: r.now, gc: r.gc, total: r.total, cycles: r.cycles}
		s.n++
	}
	// The base is the newest point at least a window old, else the oldest.
	for s.n > 1 && r.now-s.ring[(s.head+1)%ringSize].t >= s.window {
		s.head = (s.head + 1) % ringSize
		s.n--
	}
	base := s.ring[s.head]
	v := verdict{span: r.now - base.t}
	if d := r.total - base.total; d > 0 {
		v.share = min(max((r.gc-base.gc)/d, 0), 1)
	}
	v.limiter = r.limiter != 0 && r.limiter >= base.cycles
	limited := r.limit > 0 && r.limit != math.MaxInt64
	median := s.medianLive(r.live)
	near := limited && float64(median) >= s.liveRatio*float64(r.limit)
	hot := v.share >= s.share || v.limiter
	v.live = r.live
	if !s.active {
		v.live = median
		if near && hot && v.span >= s.window/4 {
			s.active, s.lowSince = true, -1
			v.change = 1
		}
		return v
	}
	// An episode ends when the GC's share over the window falls under 80%
	// of the threshold (the window itself smooths it), or when the live
	// heap stays under LiveRatio-5% of GOMEMLIMIT for a quarter window:
	// the live heap of one cycle swings by tens of MiB in a spiral (objects
	// allocated during the mark count as live), and a single low cycle
	// must not end the episode and start another, with another WARN.
	low := !limited || float64(r.live) < (s.liveRatio-0.05)*float64(r.limit)
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

// read fills a reading from runtime/metrics and GOMEMLIMIT.
func (s *spiral) read() reading {
	metrics.Read(s.samples[:])
	u := func(i int) uint64 {
		if s.samples[i].Value.Kind() == metrics.KindUint64 {
			return s.samples[i].Value.Uint64()
		}
		return 0
	}
	f := func(i int) float64 {
		if s.samples[i].Value.Kind() == metrics.KindFloat64 {
			return s.samples[i].Value.Float64()
		}
		return 0
	}
	return reading{
		now:     time.Since(s.start),
		gc:      f(0),
		total:   f(1),
		limiter: u(2),
		live:    int64(min(u(3), math.MaxInt64)),
		cycles:  u(4),
		limit:   debug.SetMemoryLimit(-1),
	}
}

// gcEnd runs on the runtime's cleanup goroutine at the end of each GC
// cycle: it reads the metrics, updates Stats and, when an episode begins or
// ends, publishes the event and hands the log line and the actions to a
// short-lived goroutine (they may block; this hook must not).
func (m *Monitor) gcEnd() bool {
	if m.closed.Load() {
		return false
	}
	r := m.spiral.read()
	v := m.spiral.observe(r)
	m.lastShare.Store(math.Float64bits(v.share))
	m.lastLive.Store(r.live)
	m.lastCycles.Store(int64(min(r.cycles, math.MaxInt64)))
	if v.change == 0 {
		return true
	}
	e := Event{Kind: KindSpiral, Time: time.Now(), GCShare: v.share, Span: v.span,
		LiveHeap: v.live, GoMemLimit: r.limit, LimiterEngaged: v.limiter}
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

// episode logs an episode's start or end and takes or undoes the actions.
// Goroutines for successive changes may run out of order: each applies the
// latest state (inSpiral) and logs only a change it applies.
func (m *Monitor) episode(e Event) {
	defer m.episodes.Done()
	m.actMu.Lock()
	defer m.actMu.Unlock()
	want := m.inSpiral.Load()
	if want == m.applied || m.closed.Load() {
		return
	}
	m.applied = want
	attrs := []slog.Attr{
		slog.Float64("gc_cpu_share", round(e.GCShare)),
		slog.Duration("window", e.Span),
		slog.Int64("live_heap", e.LiveHeap),
		slog.Int64("gomemlimit", e.GoMemLimit),
		slog.Bool("gc_limiter", e.LimiterEngaged),
	}
	if !want {
		m.log.LogAttrs(bg, slog.LevelInfo, "memctl: GC death spiral ended", attrs...)
		if m.cfg.Shed != nil {
			m.cfg.Shed(false)
		}
		return
	}
	if m.cfg.Shed != nil {
		m.cfg.Shed(true)
		attrs = append(attrs, slog.Bool("shed", true))
	}
	if to, why := m.liftLocked(); to > 0 {
		attrs = append(attrs, slog.Int64("gomemlimit_lifted_to", to), slog.Duration("lift_for", m.cfg.LiftFor))
	} else {
		attrs = append(attrs, slog.String("lift", why))
	}
	m.log.LogAttrs(bg, slog.LevelWarn, "memctl: GC death spiral: the GC is using most of the CPU with the live heap near GOMEMLIMIT", attrs...)
}

func round(f float64) float64 { return math.Round(f*1000) / 1000 }

// lift is a GOMEMLIMIT lift in progress.
type lift struct {
	from, to int64
	timer    *time.Timer
	ended    time.Time // when the last lift ended
}

// liftLocked lifts GOMEMLIMIT if allowed; it returns the new limit, or 0
// and why not. Called with actMu held.
func (m *Monitor) liftLocked() (to int64, why string) {
	c := m.cfg
	switch {
	case strings.TrimSpace(os.Getenv("GOMEMLIMIT")) != "":
		return 0, "off: GOMEMLIMIT set by the operator"
	case c.LiftOff || c.LiftCeiling == 0:
		return 0, "off"
	case m.lift.timer != nil:
		return 0, "already lifted"
	case !m.lift.ended.IsZero() && time.Since(m.lift.ended) < c.LiftFor:
		return 0, "not yet: a lift ended less than LiftFor ago"
	}
	cur := debug.SetMemoryLimit(-1)
	if cur <= 0 || cur == math.MaxInt64 {
		return 0, "no GOMEMLIMIT"
	}
	step := float64(cur) * c.LiftStep
	want := c.LiftCeiling
	if float64(cur)+step < float64(c.LiftCeiling) {
		want = cur + int64(step)
	}
	if want <= cur {
		return 0, "no room under the cgroup limit"
	}
	if c.Lift != nil {
		from, to, ok := c.Lift(want - cur)
		if !ok || to <= from {
			return 0, "GOMEMLIMIT's owner refused the lift"
		}
		cur, want = from, to
	} else {
		debug.SetMemoryLimit(want)
	}
	m.lift.from, m.lift.to = cur, want
	m.lifts.Add(1)
	m.lifted.Store(want - cur)
	m.lift.timer = time.AfterFunc(c.LiftFor, func() {
		m.actMu.Lock()
		defer m.actMu.Unlock()
		m.endLiftLocked("lift time over")
	})
	return want, ""
}

// endLiftLocked ends a lift in progress: GOMEMLIMIT goes back to what it
// was, unless something else (a refresh after a cgroup resize) changed it
// since the lift, which then wins. Called with actMu held.
func (m *Monitor) endLiftLocked(why string) {
	if m.lift.timer == nil {
		return
	}
	m.lift.timer.Stop()
	m.lift.timer = nil
	m.lift.ended = time.Now()
	m.lifted.Store(0)
	var restored bool
	if m.cfg.Lift != nil {
		_, _, restored = m.cfg.Lift(0)
	} else if restored = debug.SetMemoryLimit(-1) == m.lift.to; restored {
		debug.SetMemoryLimit(m.lift.from)
	}
	m.log.LogAttrs(bg, slog.LevelInfo, "memctl: GOMEMLIMIT lift ended",
		slog.String("why", why), slog.Bool("restored", restored),
		slog.Int64("gomemlimit", debug.SetMemoryLimit(-1)))
}
