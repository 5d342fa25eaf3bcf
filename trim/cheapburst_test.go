package trim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The C heap's rule, look by look: R (free C memory a release returns),
// the count of trim decisions and what the last one left.
func TestCBurstRule(t *testing.T) {
	a, err := newAutoBurst(AutoBurstConfig{}, func() {}, time.Second)
	require.NoError(t, err)
	a.cRetained = func() int64 { return 10 * mb } // as startAutoBurst sets it, R at the start
	a.c.floor, a.c.level = 10*mb, 10*mb
	for i, s := range []struct {
		r, decided, left int64
		mark             bool
		floor, bursts    int64
	}{
		{20 * mb, 0, -1, false, 10 * mb, 0}, // under MinRise over the floor
		{5 * mb, 0, -1, false, 5 * mb, 0},   // the floor follows R down
		{40 * mb, 0, -1, true, 5 * mb, 1},   // Rise times the floor and MinRise over it
		{41 * mb, 0, -1, false, 5 * mb, 1},  // not a further MinRise: no mark
		{80 * mb, 0, -1, true, 5 * mb, 1},   // a further MinRise: marked again, the same burst
		{2 * mb, 1, 2 * mb, false, 2 * mb, 1},
		{-1, 1, 2 * mb, false, 2 * mb, 1}, // unknown: nothing
		{50 * mb, 1, 2 * mb, true, 2 * mb, 2},
		// A burst that came after a decision: measured from what the
		// decision left, not from R at the next look.
		{60 * mb, 2, 3 * mb, true, 3 * mb, 3},
		// A decision that left the burst (a release that returned
		// nothing): its level is the floor, and it needs Rise times it.
		{60 * mb, 3, 60 * mb, false, 60 * mb, 3},
		{100 * mb, 3, 60 * mb, false, 60 * mb, 3},
		{130 * mb, 3, 60 * mb, true, 60 * mb, 4},
	} {
		a.cmu.Lock()
		mark := a.observeC(s.r, s.decided, s.left)
		floor := a.c.floor
		a.cmu.Unlock()
		n := a.Counters()
		bursts, free := n.CBursts, n.CFree
		assert.Equal(t, s.mark, mark, "look %d", i)
		assert.Equal(t, s.floor, floor, "look %d: floor", i)
		assert.Equal(t, s.bursts, bursts, "look %d: bursts", i)
		assert.Equal(t, s.r, free, "look %d: free", i)
	}
}

// A Trimmer whose C heap holds still is never woken by the C heap's
// looks, which come at most once per cBurstEvery; a rise of MinRise makes
// it pending, and its trim runs the C step.
func TestCBurstWakesOnlyOnRise(t *testing.T) {
	h := &fakeCHeapRetained{retained: 4 * mb}
	tr, err := newT(testConfig{Config: Config{Delay: 20 * time.Millisecond}, hooks: hooks{cheap: h, estimate: func() int64 { return 0 }}})
	require.NoError(t, err)
	defer tr.Close()
	a, err := startAutoBurst(tr, AutoBurstConfig{})
	require.NoError(t, err)
	defer a.Close()
	a.sub.Stop() // the looks below only
	require.NotNil(t, a.cRetained)
	looks := 0
	a.cRetained = func() int64 { looks++; return h.retained }
	now := time.Now()
	for i := range 10 {
		a.lookC(now.Add(time.Duration(i) * cBurstEvery / 4))
	}
	assert.Equal(t, 3, looks, "one look per cBurstEvery")
	assert.True(t, tr.quiet(), "no rise: not woken")
	// A look of 10 ms of CPU or more: the next no sooner than 2 s after it.
	if linux { // the thread's CPU clock
		a.cRetained = func() int64 {
			looks++
			for t0 := threadCPU(); threadCPU()-t0 < 10*time.Millisecond; {
			}
			return h.retained
		}
		now = now.Add(5 * cBurstEvery)
		for i := range 7 {
			a.lookC(now.Add(time.Duration(i) * cBurstEvery / 4))
		}
		assert.Equal(t, 4, looks, "one look in 2 s")
	}
	h.retained = 40 * mb
	a.lookC(now.Add(10 * cBurstEvery))
	assert.False(t, tr.quiet(), "a rise of MinRise: a trim is pending")
	deadline := time.Now().Add(10 * time.Second) // a bound on a hang, not a timing
	for tr.Stats().Trims+tr.Stats().Skipped == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, int64(1), tr.Stats().Trims)
	assert.Equal(t, int64(1), h.releases.Load(), "the C step ran")
	assert.Equal(t, int64(1), a.Counters().CBursts)
}
