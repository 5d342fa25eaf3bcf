package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestOverlapFigures(t *testing.T) {
	start := time.Unix(1000, 0)
	lat := make([]float64, 1000)
	for i := range lat {
		lat[i] = 0.010
		if i >= 199 && i <= 210 {
			lat[i] = 0.050
		}
	}
	trim := []span{{start.Add(2 * time.Second).UnixNano(), start.Add(2100 * time.Millisecond).UnixNano()}}
	in, out, ratio, n := overlapFigures(lat, start, 100, trim, nil)
	assert.Equal(t, 0.050, in.Value)
	assert.Equal(t, 0.010, out.Value)
	assert.InDelta(t, 5.0, ratio.Value, 1e-9)
	// Due from 1.99 s (its 50 ms reach into the trim) through 2.1 s: 199 to
	// 210; those due before 1.99 s end before the trim starts.
	assert.Equal(t, 12.0, n.Value)

	// The placebo: the same window half a period later holds no slow
	// request, and the requests of the real trim are left out: a ratio of 1.
	end := start.Add(10 * time.Second).UnixNano() // 1,000 requests at 100/s
	_, _, placebo, _ := overlapFigures(lat, start, 100, shiftSpans(trim, 5*time.Second, start.UnixNano(), end), trim)
	assert.Equal(t, 1.0, placebo.Value)

	// A trim in the second half: its window half a period later is past
	// the last request, so the placebo window is half a period earlier.
	late := []span{{start.Add(7 * time.Second).UnixNano(), start.Add(7100 * time.Millisecond).UnixNano()}}
	moved := shiftSpans(late, 5*time.Second, start.UnixNano(), end)
	assert.Equal(t, start.Add(2*time.Second).UnixNano(), moved[0][0])
	_, _, placebo, _ = overlapFigures(lat, start, 100, moved, late)
	assert.False(t, placebo.NA, "the placebo window lies among the requests")
	// A trim in the middle of a short run: neither a half period later nor
	// earlier fits, a quarter period does.
	mid := []span{{start.Add(5 * time.Second).UnixNano(), start.Add(5100 * time.Millisecond).UnixNano()}}
	moved = shiftSpans(mid, 6*time.Second, start.UnixNano(), end)
	assert.Equal(t, start.Add(8*time.Second).UnixNano(), moved[0][0])

	// No trim, or every request overlapping: not observed.
	in, _, ratio, n = overlapFigures(lat, start, 100, nil, nil)
	assert.True(t, in.NA && ratio.NA)
	assert.Zero(t, n.Value)
	all := []span{{start.UnixNano(), start.Add(time.Minute).UnixNano()}}
	_, _, ratio, n = overlapFigures(lat, start, 100, all, nil)
	assert.True(t, ratio.NA)
	assert.Equal(t, 1000.0, n.Value)
}
