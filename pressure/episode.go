package pressure

import (
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/logattr"
)

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

// lift is a GOMEMLIMIT lift in progress.
type lift struct {
	timer *time.Timer
	ended time.Time // when the last lift ended
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
	case m.lift.timer != nil:
		return 0, "already lifted"
	case !m.lift.ended.IsZero() && time.Since(m.lift.ended) < c.LiftFor:
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
	m.lift.timer = time.AfterFunc(c.LiftFor, func() {
		m.actMu.Lock()
		defer m.actMu.Unlock()
		m.endLiftLocked("lift time over")
	})
	return to, ""
}

// endLiftLocked ends a lift through the owner, which restores GOMEMLIMIT
// unless it changed since (a cgroup resize). Called with actMu held.
func (m *Monitor) endLiftLocked(why string) {
	if m.lift.timer == nil {
		return
	}
	m.lift.timer.Stop()
	m.lift.timer = nil
	m.lift.ended = time.Now()
	m.lifted.Store(0)
	_, _, restored := m.deps.lift(0)
	m.log.LogAttrs(bg, slog.LevelInfo, "memctl: GOMEMLIMIT lift ended",
		slog.String("why", why), slog.Bool("restored", restored),
		logattr.GoMemLimit("gomemlimit", gomemlimit.Read()))
}
