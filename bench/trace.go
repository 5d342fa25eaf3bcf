package main

import (
	"encoding/json"
	"math"
	"slices"
	"time"

	"github.com/memctl/memctl/internal/plot"
)

// Trace is what the first run of one arm observed over time, for the
// charts (svg.go). Times are seconds since the origin: the end of the burst
// in burst, the parent's "go" elsewhere. http keeps none.
type Trace struct {
	// RSS is VmRSS in MiB (0.1 MiB, 0.01 s); in burst it starts with the
	// reading before the burst (a negative time) and the peak at 0.
	RSS Points `json:"rss_mib"`
	// P99 is the load scenarios' p99 latency in ms of the requests due in
	// each p99Window, at the window's middle.
	P99        Points    `json:"p99_ms,omitempty"`
	Trims      []float64 `json:"trims_s,omitempty"`        // the memctl trims' starts
	GoMemLimit float64   `json:"gomemlimit_mib,omitempty"` // 0: none

	origin time.Time
}

// p99Window is the width of the load scenarios' p99 windows.
const p99Window = 2 * time.Second

// Points is a time series; in JSON one string of space-separated "x,y"
// pairs, not a line per number.
type Points []plot.Point

// MarshalJSON writes plot.FormatPoints's string.
func (ps Points) MarshalJSON() ([]byte, error) { return json.Marshal(plot.FormatPoints(ps)) }

// UnmarshalJSON reads what MarshalJSON writes.
func (ps *Points) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	pts, err := plot.ParsePoints(s)
	*ps = append(Points{}, pts...)
	return err
}

// round returns v rounded to 1/scale (scale a power of 10).
func round(v, scale float64) float64 { return math.Round(v*scale) / scale }

// inMiB returns b bytes in MiB rounded to 0.1.
func inMiB(b int64) float64 { return round(float64(b)/(1<<20), 10) }

// rssTrace returns the samples (at in seconds since origin) as a trace.
func rssTrace(origin time.Time, samples []sample) Trace {
	tr := Trace{origin: origin, RSS: make(Points, 0, len(samples))}
	for _, s := range samples {
		tr.RSS = append(tr.RSS, plot.Point{X: round(s.at, 100), Y: inMiB(s.rss)})
	}
	return tr
}

// complete adds the child's trims and GOMEMLIMIT.
func (tr *Trace) complete(r childResult) {
	for _, sp := range r.TrimSpans {
		tr.Trims = append(tr.Trims, round(float64(sp[0]-tr.origin.UnixNano())/1e9, 100))
	}
	if r.GoMemLimit > 0 && r.GoMemLimit < math.MaxInt64 {
		tr.GoMemLimit = inMiB(r.GoMemLimit)
	}
}

// p99Windows returns the p99 latency in ms of the requests due in each
// window w, at its middle; the i-th request (lat[i] seconds) was due
// offset + i/rate seconds after the origin. Empty windows are left out.
func p99Windows(lat []float64, rate, offset float64, w time.Duration) Points {
	ws := w.Seconds()
	var out Points
	var win []float64
	k := 0
	flush := func() {
		if len(win) == 0 {
			return
		}
		slices.Sort(win)
		x := offset + (float64(k)+0.5)*ws
		out = append(out, plot.Point{X: round(x, 100), Y: round(percentile(win, 99)*1e3, 100)})
		win = win[:0]
	}
	for i, l := range lat {
		if j := int(float64(i) / rate / ws); j != k {
			flush()
			k = j
		}
		win = append(win, l)
	}
	flush()
	return out
}
