package main

import (
	"slices"
	"time"
)

// A trim's latency cost is measured within one arm: the p99 of requests
// overlapping a trim against the others' (docs/benchmarks.md says why).

// span is a trim's wall-clock interval in Unix nanoseconds (CLOCK_REALTIME,
// the same in parent and child).
type span [2]int64

// overlapFigures splits the requests (the i-th due at start + i/rate,
// taking lat[i] seconds) that overlap none of exclude into those whose
// [due, due+latency] overlaps one of spans and the rest, and returns the
// p99 of each, their ratio and how many overlapped; NA with no span or an
// empty side.
func overlapFigures(lat []float64, start time.Time, rate float64, spans, exclude []span) (overlap, clear, ratio, n Obs) {
	na := Obs{NA: true}
	if len(spans) == 0 {
		return na, na, na, Obs{Value: 0}
	}
	var in, out []float64
	t0 := start.UnixNano()
	for i, l := range lat {
		due := t0 + int64(float64(i)/rate*1e9)
		end := due + int64(l*1e9)
		switch {
		case overlaps(exclude, due, end):
		case overlaps(spans, due, end):
			in = append(in, l)
		default:
			out = append(out, l)
		}
	}
	n = Obs{Value: float64(len(in))}
	if len(in) == 0 || len(out) == 0 {
		return na, na, na, n
	}
	slices.Sort(in)
	slices.Sort(out)
	po, pc := percentile(in, 99), percentile(out, 99)
	overlap, clear = Obs{Value: po}, Obs{Value: pc}
	if pc > 0 {
		ratio = Obs{Value: po / pc}
	} else {
		ratio = na
	}
	return overlap, clear, ratio, n
}

// overlaps reports whether [from, to] meets one of spans.
func overlaps(spans []span, from, to int64) bool {
	for _, sp := range spans {
		if sp[0] <= to && sp[1] >= from {
			return true
		}
	}
	return false
}

// shiftSpans returns spans moved by d, the A/A's placebo windows. A window
// that would leave [lo, hi] or meet a real trim is moved by -d, then ±d/2
// instead (so a quick run's one trim gets one); if none fits it stays
// moved by d, and its figure is NA.
func shiftSpans(spans []span, d time.Duration, lo, hi int64) []span {
	out := make([]span, len(spans))
	for i, s := range spans {
		out[i] = span{s[0] + int64(d), s[1] + int64(d)}
		for _, m := range []time.Duration{d, -d, d / 2, -d / 2} {
			c := span{s[0] + int64(m), s[1] + int64(m)}
			if c[0] >= lo && c[1] <= hi && !overlaps(spans, c[0], c[1]) {
				out[i] = c
				break
			}
		}
	}
	return out
}
