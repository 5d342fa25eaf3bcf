package pressure

import (
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
	// 196 MiB live under 200 MiB with 65% GC: an episode after a quarter
	// window at the earliest, within the window.
	started, ended := feed(s, 0, 20*time.Second, 10*time.Millisecond, 0.65, 196*mib, 200*mib, false)
	assert.Equal(t, DefaultWindow/4, started)
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
			s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
			started, _ := feed(s, 0, 30*time.Second, 10*time.Millisecond, tc.share, tc.live, tc.limit, tc.limiter)
			assert.Equal(t, time.Duration(-1), started)
		})
	}
}

func TestSpiralLimiterAloneCounts(t *testing.T) {
	// The GC CPU limiter caps the GC near 50%: a spiral it holds at 45% is
	// still one when the limiter engaged within the window.
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
	started, _ := feed(s, 0, 10*time.Second, 10*time.Millisecond, 0.45, 196*mib, 200*mib, true)
	assert.Equal(t, DefaultWindow/4, started)
}

func TestSpiralEndsAndStartsAgain(t *testing.T) {
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
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
	assert.Equal(t, from+DefaultWindow/4, ended)
	// One episode, one start: nothing more while it stays ended.
	started, _ = feed(s, from+4*time.Second+10*time.Millisecond, 2*time.Second, 10*time.Millisecond, 0.65, 100*mib, 200*mib, false)
	assert.Equal(t, time.Duration(-1), started)
}

func TestSpiralEndsWhenTheGCCalmsDown(t *testing.T) {
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
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
	assert.Equal(t, DefaultWindow/4+step, started)
	// The share over the window falls under 0.4 when (0.7(W-x) + 0.05x)/W
	// < 0.4: x > 4.6 s.
	assert.InDelta(t, 24.6, ended.Seconds(), 0.2)
}

func TestSpiralWindowSlides(t *testing.T) {
	// Ten minutes at 10% GC, then a spiral at 70%: the share over the
	// window crosses 50% within the window, whatever came before (the
	// ring keeps only about one window).
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
	gc, total := 0.0, 0.0
	step := 10 * time.Millisecond
	var at time.Duration = -1
	for t := step; t <= 10*time.Minute+DefaultWindow; t += step {
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
	assert.Less(t, at, DefaultWindow)
	// (0.7x + 0.1(W-x))/W = 0.5 at x = 2W/3.
	assert.InDelta(t, (2 * DefaultWindow / 3).Seconds(), at.Seconds(), 0.5)
}

func TestSpiralObserveAllocatesNothing(t *testing.T) {
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
	now := time.Duration(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += time.Millisecond
		s.observe(s.read())
	})
	assert.Zero(t, allocs)
}

func TestConfigInvalid(t *testing.T) {
	for name, cfg := range map[string]Config{
		"window short":      {Window: time.Millisecond},
		"window negative":   {Window: -time.Second},
		"share over 1":      {GCShare: 1.5},
		"share NaN":         {GCShare: math.NaN()},
		"share negative":    {GCShare: -0.1},
		"live ratio inf":    {LiveRatio: math.Inf(1)},
		"lift step 2":       {LiftStep: 2},
		"lift for long":     {LiftFor: 2 * time.Hour},
		"ceiling negative":  {LiftCeiling: -1},
		"interval short":    {MinInterval: time.Millisecond},
		"stall window long": {StallWindow: time.Minute},
		"stall > window":    {Stall: 3 * time.Second},
		"watch unknown":     {Watch: Watch(42)},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := Start(cfg)
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Contains(t, err.Error(), "pressure: Config.")
		})
	}
}

func TestSystemdSource(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	_, ok, _, err := systemdSource(env())
	require.NoError(t, err)
	assert.False(t, ok)

	_, ok, off, err := systemdSource(env("MEMORY_PRESSURE_WATCH", "/dev/null"))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.True(t, off)

	// systemd writes "some 200000 2000000" base64-encoded.
	s, ok, off, err := systemdSource(env("MEMORY_PRESSURE_WATCH", "/sys/fs/cgroup/a.service/memory.pressure",
		"MEMORY_PRESSURE_WRITE", "c29tZSAyMDAwMDAgMjAwMDAwMAA="))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.False(t, off)
	assert.Equal(t, "/sys/fs/cgroup/a.service/memory.pressure", s.path)
	assert.Equal(t, "some 200000 2000000\x00", string(s.write))

	for name, e := range map[string]func(string) string{
		"relative path": env("MEMORY_PRESSURE_WATCH", "memory.pressure"),
		"bad base64":    env("MEMORY_PRESSURE_WATCH", "/x", "MEMORY_PRESSURE_WRITE", "not base64!"),
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _, err := systemdSource(e)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "$MEMORY_PRESSURE_")
		})
	}
}

func TestPSITrigger(t *testing.T) {
	assert.Equal(t, "some 200000 2000000\x00", string(psiTrigger(DefaultStall, DefaultStallWindow)))
}

func newTestMonitor(t *testing.T, cfg Config) *Monitor {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	require.NoError(t, cfg.fill())
	m := &Monitor{cfg: cfg, log: cfg.Logger}
	m.subs.Store(new([]*subscriber))
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func TestSubscribeDropsWhenFull(t *testing.T) {
	m := newTestMonitor(t, Config{})
	ch, cancel := m.Subscribe(2)
	for range 5 {
		m.publish(Event{Kind: KindKernel})
	}
	assert.Len(t, ch, 2)
	assert.Equal(t, int64(3), m.Stats().Dropped)
	cancel()
	cancel() // idempotent
	n := 0
	for range ch {
		n++
	}
	assert.Equal(t, 2, n, "the buffered events stay readable, then the channel is closed")
	m.publish(Event{Kind: KindKernel}) // no subscriber: no panic, nothing dropped
	assert.Equal(t, int64(3), m.Stats().Dropped)

	ch2, _ := m.Subscribe(0)
	require.NoError(t, m.Close())
	_, open := <-ch2
	assert.False(t, open, "Close closes every channel")
	ch3, _ := m.Subscribe(1)
	_, open = <-ch3
	assert.False(t, open, "a channel from a closed Monitor is closed")

	var nilM *Monitor
	ch4, cancel4 := nilM.Subscribe(1)
	cancel4()
	_, open = <-ch4
	assert.False(t, open)
	assert.Equal(t, int64(-1), nilM.Stats().MemoryEvents.OOMKill)
}

func TestEpisodeActions(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOMEMLIMIT", "")
	var shed []bool
	m := newTestMonitor(t, Config{LiftCeiling: 256 * mib, LiftFor: time.Hour, Shed: func(on bool) { shed = append(shed, on) }})
	debug.SetMemoryLimit(230 * mib)
	ch, _ := m.Subscribe(4)

	m.inSpiral.Store(true)
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiral})
	assert.Equal(t, []bool{true}, shed)
	// +10% of 230 MiB is 253 MiB, under the 256 MiB ceiling.
	assert.Equal(t, int64(230*mib+23*mib), debug.SetMemoryLimit(-1))
	assert.Equal(t, int64(23*mib), m.Stats().Lifted)
	// A second start while lifted does not lift again.
	m.applied = false
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiral})
	assert.Equal(t, int64(253*mib), debug.SetMemoryLimit(-1))
	assert.Equal(t, int64(1), m.Stats().Lifts)

	m.inSpiral.Store(false)
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiralEnd})
	assert.Equal(t, []bool{true, true, false}, shed)

	require.NoError(t, m.Close())
	assert.Equal(t, int64(230*mib), debug.SetMemoryLimit(-1), "Close ends the lift")
	assert.Zero(t, m.Stats().Lifted)
	assert.Empty(t, ch, "episode() publishes nothing; gcEnd does")
}

// liftOnce runs one lift of m as an episode would, under its action lock.
func liftOnce(m *Monitor) (to int64, why string) {
	m.actMu.Lock()
	defer m.actMu.Unlock()
	return m.liftLocked()
}

func TestLiftBounds(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Run("ceiling", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftCeiling: 240 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, _ := liftOnce(m)
		assert.Equal(t, int64(240*mib), to, "never above the cgroup limit")
	})
	t.Run("no room", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftCeiling: 200 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, why := liftOnce(m)
		assert.Zero(t, to)
		assert.Contains(t, why, "no room")
		assert.Equal(t, int64(230*mib), debug.SetMemoryLimit(-1))
	})
	t.Run("operator", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "230MiB")
		m := newTestMonitor(t, Config{LiftCeiling: 256 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, why := liftOnce(m)
		assert.Zero(t, to)
		assert.Contains(t, why, "operator")
	})
	t.Run("off", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftCeiling: 256 * mib, LiftOff: true})
		debug.SetMemoryLimit(230 * mib)
		to, _ := liftOnce(m)
		assert.Zero(t, to)
	})
	t.Run("changed meanwhile", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftCeiling: 256 * mib, LiftFor: time.Second})
		debug.SetMemoryLimit(230 * mib)
		m.actMu.Lock()
		to, _ := m.liftLocked()
		require.Positive(t, to)
		debug.SetMemoryLimit(100 * mib) // a refresh after a cgroup resize
		m.endLiftLocked("test")
		// Cool-down: no new lift within LiftFor of the last.
		again, why := m.liftLocked()
		m.actMu.Unlock()
		assert.Equal(t, int64(100*mib), debug.SetMemoryLimit(-1), "the refresh wins over the restore")
		assert.Zero(t, again)
		assert.Contains(t, why, "not yet")
	})
	t.Run("restored after LiftFor", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftCeiling: 256 * mib, LiftFor: time.Second})
		debug.SetMemoryLimit(230 * mib)
		to, _ := liftOnce(m)
		require.Equal(t, int64(253*mib), to)
		require.Eventually(t, func() bool { return debug.SetMemoryLimit(-1) == 230*mib }, 10*time.Second, 20*time.Millisecond)
		assert.Zero(t, m.Stats().Lifted)
	})
	t.Run("through the owner", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		var asked []int64
		owner := func(extra int64) (int64, int64, bool) { // as limits.MemLimiter.Lift
			asked = append(asked, extra)
			from := debug.SetMemoryLimit(-1)
			debug.SetMemoryLimit(230*mib + extra)
			return from, 230*mib + extra, true
		}
		m := newTestMonitor(t, Config{LiftCeiling: 256 * mib, LiftFor: time.Second, Lift: owner})
		debug.SetMemoryLimit(230 * mib)
		m.actMu.Lock()
		to, _ := m.liftLocked()
		m.endLiftLocked("test")
		m.actMu.Unlock()
		assert.Equal(t, int64(253*mib), to)
		assert.Equal(t, []int64{23 * mib, 0}, asked, "the lift and its end go through the owner")
		assert.Equal(t, int64(230*mib), debug.SetMemoryLimit(-1))
	})
}

// BenchmarkGCEndCheck is the detector's work at each GC end: one
// runtime/metrics read of five metrics and the window update.
func BenchmarkGCEndCheck(b *testing.B) {
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
	b.ReportAllocs()
	for b.Loop() {
		s.observe(s.read())
	}
}

func TestStatsReadsMemoryEvents(t *testing.T) {
	m := newTestMonitor(t, Config{})
	m.events = "../internal/cgroupfs/testdata/events/v6.18"
	assert.Equal(t, MemoryEvents{Low: 0, High: 12, Max: 3456, OOM: 7, OOMKill: 2, OOMGroupKill: 0}, m.Stats().MemoryEvents)
	m.events = "../internal/cgroupfs/testdata/events/bad-negative"
	assert.Equal(t, MemoryEvents{-1, -1, -1, -1, -1, -1}, m.Stats().MemoryEvents, "malformed: unknown, not zero")
	m.events = ""
	assert.Equal(t, MemoryEvents{-1, -1, -1, -1, -1, -1}, m.Stats().MemoryEvents, "not cgroup v2")
}

func TestSpiralOneHighLiveReadingIsNotNear(t *testing.T) {
	// The GC is busy and the limiter engages, but only one cycle in eight
	// reads a live heap near the limit (a slow cycle counts what was
	// allocated during the mark): no episode.
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
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
	s := newSpiral(DefaultWindow, DefaultGCShare, DefaultLiveRatio)
	step := 10 * time.Millisecond
	var start verdict
	for i := 1; i <= 1000 && start.change == 0; i++ {
		now := time.Duration(i) * step
		live := int64(196 * mib)
		if now >= DefaultWindow/4 {
			live = 150 * mib
		}
		start = s.observe(reading{now: now, total: 2 * now.Seconds(), gc: 2 * now.Seconds() * 0.6, live: live, limit: 200 * mib, cycles: uint64(i)})
	}
	require.Equal(t, 1, start.change, "an episode began")
	assert.Equal(t, int64(196*mib), start.live)
	assert.GreaterOrEqual(t, float64(start.live), DefaultLiveRatio*200*mib)
}
