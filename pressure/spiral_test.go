package pressure

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/gcend"
)

const mib = 1 << 20

// feed runs the detector over readings one GC apart for d, with the GC
// taking share of the CPU (2 CPUs available), and returns the time of the
// first start and of the first end (-1 when none).
func feed(s *spiral, from time.Duration, d, gcEvery time.Duration, share float64, live, limit int64, limiter bool) (started, ended time.Duration) {
	started, ended = -1, -1
	for t := from; t <= from+d; t += gcEvery {
		r := reading{now: t, total: 2 * t.Seconds(), gc: 2 * t.Seconds() * share, live: live, limit: limit, cycles: uint64(t / gcEvery)}
		if limiter {
			r.limiter = r.cycles
		}
		switch s.observe(r).change {
		case 1:
			if started < 0 {
				started = t
			}
		case -1:
			if ended < 0 {
				ended = t
			}
		}
	}
	return started, ended
}

func TestSpiralStartsWithinWindow(t *testing.T) {
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	// 196 MiB live under 200 MiB with 65% GC: an episode after a quarter
	// window at the earliest, within the window.
	started, ended := feed(s, 0, 20*time.Second, 10*time.Millisecond, 0.65, 196*mib, 200*mib, false)
	assert.Equal(t, defaultWindow/4, started)
	assert.Equal(t, time.Duration(-1), ended)
	assert.True(t, s.active)
}

func TestSpiralControls(t *testing.T) {
	for _, tc := range []struct {
		name        string
		share       float64
		live, limit int64
		limiter     bool
	}{
		{"20 MiB live", 0.65, 20 * mib, 200 * mib, false},
		{"20 MiB live, limiter on", 0.65, 20 * mib, 200 * mib, true},
		{"busy GC under the share", 0.3, 196 * mib, 200 * mib, false},
		{"no GOMEMLIMIT", 0.9, 196 * mib, math.MaxInt64, false},
		{"GOMEMLIMIT 0", 0.9, 196 * mib, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
			started, _ := feed(s, 0, 30*time.Second, 10*time.Millisecond, tc.share, tc.live, tc.limit, tc.limiter)
			assert.Equal(t, time.Duration(-1), started)
		})
	}
}

func TestSpiralLimiterAloneCounts(t *testing.T) {
	// The GC CPU limiter caps the GC near 50%: a spiral it holds at 45% is
	// still one when the limiter engaged within the window.
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	started, _ := feed(s, 0, 10*time.Second, 10*time.Millisecond, 0.45, 196*mib, 200*mib, true)
	assert.Equal(t, defaultWindow/4, started)
}

func TestSpiralEndsAndStartsAgain(t *testing.T) {
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	started, _ := feed(s, 0, 12*time.Second, 10*time.Millisecond, 0.65, 196*mib, 200*mib, false)
	require.GreaterOrEqual(t, started, time.Duration(0))
	// One cycle with a low live heap (objects allocated during the mark
	// count as live, so it swings) does not end the episode.
	_, ended := feed(s, 12*time.Second+10*time.Millisecond, 0, 10*time.Millisecond, 0.65, 100*mib, 200*mib, false)
	assert.Equal(t, time.Duration(-1), ended)
	_, ended = feed(s, 12*time.Second+20*time.Millisecond, time.Second, 10*time.Millisecond, 0.65, 196*mib, 200*mib, false)
	assert.Equal(t, time.Duration(-1), ended)
	// The live heap stays low (load shed): the episode ends a quarter
	// window later.
	from := 13*time.Second + 30*time.Millisecond
	_, ended = feed(s, from, 4*time.Second, 10*time.Millisecond, 0.65, 100*mib, 200*mib, false)
	assert.Equal(t, from+defaultWindow/4, ended)
	// One episode, one start: nothing more while it stays ended.
	started, _ = feed(s, from+4*time.Second+10*time.Millisecond, 2*time.Second, 10*time.Millisecond, 0.65, 100*mib, 200*mib, false)
	assert.Equal(t, time.Duration(-1), started)
}

func TestSpiralEndsWhenTheGCCalmsDown(t *testing.T) {
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	gc, total := 0.0, 0.0
	step := 10 * time.Millisecond
	var started, ended time.Duration = -1, -1
	for now := step; now <= 40*time.Second; now += step {
		share := 0.7
		if now > 20*time.Second {
			share = 0.05 // a lift gave the GC room
		}
		total += 2 * step.Seconds()
		gc += 2 * step.Seconds() * share
		switch s.observe(reading{now: now, gc: gc, total: total, live: 196 * mib, limit: 200 * mib}).change {
		case 1:
			started = now
		case -1:
			ended = now
		}
	}
	assert.Equal(t, defaultWindow/4+step, started)
	// The share over the window falls under 0.4 when (0.7(W-x) + 0.05x)/W
	// < 0.4: x > 4.6 s.
	assert.InDelta(t, 24.6, ended.Seconds(), 0.2)
}

func TestSpiralWindowSlides(t *testing.T) {
	// Ten minutes at 10% GC, then a spiral at 70%: the share over the
	// window crosses 50% within the window, whatever came before (the
	// ring keeps only about one window).
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	gc, total := 0.0, 0.0
	step := 10 * time.Millisecond
	var at time.Duration = -1
	for t := step; t <= 10*time.Minute+defaultWindow; t += step {
		share := 0.1
		if t > 10*time.Minute {
			share = 0.7
		}
		total += 2 * step.Seconds()
		gc += 2 * step.Seconds() * share
		if s.observe(reading{now: t, gc: gc, total: total, live: 196 * mib, limit: 200 * mib}).change == 1 && at < 0 {
			at = t - 10*time.Minute
		}
	}
	require.Positive(t, at)
	assert.Less(t, at, defaultWindow)
	// (0.7x + 0.1(W-x))/W = 0.5 at x = 2W/3.
	assert.InDelta(t, (2 * defaultWindow / 3).Seconds(), at.Seconds(), 0.5)
}

func TestSpiralObserveAllocatesNothing(t *testing.T) {
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	now := time.Duration(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += time.Millisecond
		s.observe(s.read())
	})
	assert.Zero(t, allocs)
}

// BenchmarkGCEndCheck is the detector's work at each GC end: one
// runtime/metrics read of five metrics and the window update.
func BenchmarkGCEndCheck(b *testing.B) {
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	b.ReportAllocs()
	for b.Loop() {
		s.observe(s.read())
	}
}

func TestSpiralOneHighLiveReadingIsNotNear(t *testing.T) {
	// The GC is busy and the limiter engages, but only one cycle in eight
	// reads a live heap near the limit (a slow cycle counts what was
	// allocated during the mark): no episode.
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	step := 10 * time.Millisecond
	for i := 1; i <= 3000; i++ {
		now := time.Duration(i) * step
		live := int64(40 * mib)
		if i%8 == 0 {
			live = 196 * mib
		}
		v := s.observe(reading{now: now, total: 2 * now.Seconds(), gc: 2 * now.Seconds() * 0.6, live: live, limit: 200 * mib, cycles: uint64(i), limiter: uint64(i)})
		require.Zero(t, v.change, "at %v", now)
	}
	assert.Equal(t, int64(40*mib), s.medianLive(40*mib))
}

func TestSpiralStartCarriesTheMedianLive(t *testing.T) {
	// The GC is hot from the start and the live heap sits at 196 MiB under
	// GOMEMLIMIT 200 MiB; the GC end at which the window is long enough
	// reads 150 MiB (a short mark). The episode starts there, on the
	// median, and reports the median: the figure the rule compared, at
	// least LiveRatio × GOMEMLIMIT (CI saw 176 MiB reported, the one GC
	// end's figure, under a rule of 180).
	s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
	step := 10 * time.Millisecond
	var start verdict
	for i := 1; i <= 1000 && start.change == 0; i++ {
		now := time.Duration(i) * step
		live := int64(196 * mib)
		if now >= defaultWindow/4 {
			live = 150 * mib
		}
		start = s.observe(reading{now: now, total: 2 * now.Seconds(), gc: 2 * now.Seconds() * 0.6, live: live, limit: 200 * mib, cycles: uint64(i)})
	}
	require.Equal(t, 1, start.change, "an episode began")
	assert.Equal(t, int64(196*mib), start.live)
	assert.GreaterOrEqual(t, float64(start.live), defaultLiveRatio*200*mib)
}

// A heap held just under LiveRatio, whose median reading stays there,
// is near the limit when GOMEMLIMIT (not GOGC) sets its goal with little
// runway: 171 MiB live, goal 181 MiB under 200 MiB, GOGC's 342 MiB.
func TestSpiralLimitSetsGoal(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		live, goal, gogcGoal int64
		want                 bool
	}{
		{"limit sets the goal, 10 MiB runway", 171 * mib, 181 * mib, 342 * mib, true},
		{"GOGC=off, 10 MiB runway", 171 * mib, 181 * mib, math.MaxInt64, true},
		{"GOGC sets the goal", 171 * mib, 181 * mib, 181 * mib, false},
		{"limit sets the goal, 60 MiB runway", 120 * mib, 180 * mib, 240 * mib, false},
		{"goal unknown", 171 * mib, 0, 342 * mib, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSpiral(defaultWindow, defaultGCShare, defaultLiveRatio)
			started := time.Duration(-1)
			for at := time.Duration(0); at <= 20*time.Second; at += 10 * time.Millisecond {
				r := reading{now: at, total: 2 * at.Seconds(), gc: 2 * at.Seconds() * 0.6, live: tc.live,
					limit: 200 * mib, cycles: uint64(at / (10 * time.Millisecond)), goal: tc.goal, gogcGoal: tc.gogcGoal}
				if v := s.observe(r); v.change == 1 && started < 0 {
					started = at
					assert.Equal(t, tc.live, v.live, "the event carries the deciding GC end's live heap")
				}
			}
			assert.Equal(t, tc.want, started >= 0, "started at %v", started)
		})
	}
}

// read makes a reading from runtime/metrics now.
func (s *spiral) read() reading {
	var gs gcend.Sample
	s.reader.Read(&gs)
	return s.from(&gs)
}

func TestLimitSetsGoal(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    reading
		want bool
	}{
		{"limit sets the goal, 10 MiB runway", reading{live: 171 * mib, goal: 181 * mib, limit: 200 * mib, gogcGoal: 342 * mib}, true},
		{"GOGC off, 10 MiB runway", reading{live: 171 * mib, goal: 181 * mib, limit: 200 * mib, gogcGoal: math.MaxInt64}, true},
		{"GOGC sets the goal", reading{live: 20 * mib, goal: 40 * mib, limit: 200 * mib, gogcGoal: 40 * mib}, false},
		{"limit sets the goal, 60 MiB runway", reading{live: 120 * mib, goal: 180 * mib, limit: 200 * mib, gogcGoal: 240 * mib}, false},
	} {
		assert.Equal(t, tc.want, tc.r.limitSetsGoal(0.9), tc.name)
	}
}
