package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The latency cost of a trim, measured within one arm (issue 19): the A/A
// spread of p99 between two identical arms on these shared machines (17% to
// 73%) hides a 10% effect between arms. Within one run of one arm the
// machine's state is the same for every request, so the p99 of the requests
// that overlap a trim against the p99 of those that do not measures what
// the trim costs them, and the same comparison against windows where no
// trim runs (the trims' windows shifted by half the burst period, leaving
// out the requests that overlap a real trim) is its A/A: the spread that
// picking that many requests by a window alone gives.

// span is a trim's wall-clock interval in the child, in Unix nanoseconds
// (CLOCK_REALTIME, the same in the parent on the same machine).
type span [2]int64

// trimsLinePrefix starts the line of trim spans the load child says
// before "end": "trims [[start,end],...]".
const trimsLinePrefix = "trims "

// formatSpans is the child's trims line.
func formatSpans(s []span) string {
	b, _ := json.Marshal(s) // [][2]int64 cannot fail
	return trimsLinePrefix + string(b)
}

// parseSpans parses a trims line.
func parseSpans(line string) ([]span, error) {
	rest, ok := strings.CutPrefix(line, trimsLinePrefix)
	if !ok {
		return nil, fmt.Errorf("said %q, want its trims", line)
	}
	var s []span
	if err := json.Unmarshal([]byte(rest), &s); err != nil {
		return nil, fmt.Errorf("trims line %q: %w", line, err)
	}
	return s, nil
}

// overlapFigures splits the requests (the i-th due at start + i/rate,
// latency lat[i] seconds from its due time) that overlap none of exclude
// into those whose interval [due, due+latency] overlaps one of spans and
// the rest, and returns the p99 of each, their ratio, and how many
// overlapped. With no span, or no request on one side, the figures are NA.
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

// shiftSpans returns spans moved by d: the placebo windows of the A/A. A
// window that would leave the requests' time [lo, hi] or meet a real trim
// is moved by -d, then by ±d/2, whichever first lies among the requests:
// a quick run's one trim, half a period from either end, still gets its
// placebo window. A window no move fits stays moved by d (no request
// falls in it: the figure is then NA).
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
