package trim

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// growSkipped feeds a detector a live heap that grows for good by ratio at
// each GC end, every `every` seconds, from 20 MiB to 4 GiB, with a
// simulated Trimmer whose every trim is skipped by its estimate (the
// growth is live: no forced GC follows): a decision comes one delay after
// the last mark, or the max wait after the first of its pending period.
// It returns the decisions and the doublings.
func growSkipped(t *testing.T, every, ratio float64, hook bool) (decisions int, doublings float64) {
	a, _ := detector(t)
	var n int64
	if hook {
		a.decisions = func() int64 { return n }
	}
	const delay, maxWait = 2.0, 20.0
	live, now := float64(20*mb), 0.0
	lastMark, firstMark := -1.0, -1.0
	for live < 4<<30 {
		now += every
		if lastMark >= 0 && math.Min(lastMark+delay, firstMark+maxWait) <= now {
			n++ // skipped: no forced GC
			lastMark, firstMark = -1, -1
		}
		live *= ratio
		if feed(a, []gc{{int64(live), false, now}})[0] {
			if firstMark < 0 {
				firstMark = now
			}
			lastMark = now
		}
	}
	return int(n), math.Log2(live / (20 * mb))
}

// Attack input (issue 19): a heap that grows for good while every trim it
// causes is skipped by the estimate (the growth is live, so no forced GC
// resets the floor). Before, each GC end within the max wait plus delay of
// the burst's start marked it again, and with GC ends more than a delay
// apart each mark was one more trim decision: 8 per doubling with a GC
// every 3 s. Now the first decision settles the burst: one per doubling.
func TestAutoBurstGrowthSkippedOnePerDoubling(t *testing.T) {
	for _, g := range []struct {
		name         string
		every, ratio float64
	}{
		{"GC every 3 s", 3, 1.02}, {"GC every 2.5 s, fast growth", 2.5, 1.3}, {"GC every 0.5 s", 0.5, 1.05},
		{"GC every 30 s", 30, 1.1}, {"GC every 50 ms", 0.05, 1.01},
	} {
		t.Run(g.name, func(t *testing.T) {
			before, _ := growSkipped(t, g.every, g.ratio, false)
			got, doublings := growSkipped(t, g.every, g.ratio, true)
			t.Logf("%d trim decisions over %.1f doublings (%d without the settle on a decision)", got, doublings, before)
			assert.LessOrEqual(t, float64(got), math.Ceil(doublings), "at most one per doubling")
		})
	}
}

// Attack inputs (issue 19): live heaps that never burst, whatever their
// cadence: a sawtooth just under twice the floor, a sawtooth of twice the
// floor just under MinRise, each at a very high GC rate (100,000 GC ends),
// and GOGC=off (only forced GC ends, each resetting the floor).
func TestAutoBurstSawtoothNeverBursts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		low, top int64
		forced   bool
	}{
		{"just under 2x", 100 * mb, 2*100*mb - 1, false},
		{"2x but 32 MiB - 1 byte", 32*mb - 1, 2 * (32*mb - 1), false},
		{"GOGC=off: forced GCs only", 20 * mb, 900 * mb, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, marks := detector(t)
			a.st = burstState{floor: tc.low, prev: tc.low}
			for i := range 100_000 {
				l := tc.low
				if i%2 == 1 {
					l = tc.top
				}
				a.observe(l, tc.forced, int64(i)*1000) // a GC end every microsecond
			}
			assert.Zero(t, marks())
			assert.Zero(t, a.stats().Bursts)
		})
	}
}
