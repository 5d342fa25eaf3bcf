package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/plot"
)

// Trace is what the first run of one arm of a scenario observed over time,
// kept beside the figures for the charts (svg.go). Times are seconds since
// the scenario's origin: the end of the burst in burst (the parent reading
// the child's "end"), the parent's "go" in cadence and the load scenarios.
// The http scenario keeps none.
type Trace struct {
	// RSS is the child's VmRSS in MiB, as the parent sampled it (every
	// params.Sample), rounded to 0.1 MiB at 0.01 s. In burst it starts
	// with the reading before the burst (at a negative time) and the peak
	// (VmHWM) at 0, where the burst ended.
	RSS Points `json:"rss_mib"`
	// P99 is, in the load scenarios, the p99 latency in milliseconds
	// (rounded to 0.01 ms) of the requests due in each p99Window of the
	// load generator, at the window's middle.
	P99 Points `json:"p99_ms,omitempty"`
	// Trims are the times the trims memctl ran started (the memctl arms'
	// "trim: done" log records), rounded to 0.01 s.
	Trims []float64 `json:"trims_s,omitempty"`
	// GoMemLimit is the child's GOMEMLIMIT in MiB, 0 when it had none.
	GoMemLimit float64 `json:"gomemlimit_mib,omitempty"`

	// origin is the scenario's origin, to place the child's trims.
	origin time.Time
}

// p99Window is the width of the load scenarios' p99 windows.
const p99Window = 2 * time.Second

// Points is a time series. In JSON it is one string of "x,y" pairs
// separated by spaces (as plot's data-points): the indented report would
// otherwise spend a line on each number.
type Points []plot.Point

// MarshalJSON writes the points as one string, each number in the fewest
// digits that read back to the same float64.
func (ps Points) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(p.X, 'g', -1, 64))
		b.WriteByte(',')
		b.WriteString(strconv.FormatFloat(p.Y, 'g', -1, 64))
	}
	return json.Marshal(b.String())
}

// UnmarshalJSON reads what MarshalJSON writes; a pair that does not parse
// is an error.
func (ps *Points) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	out := Points{}
	for _, f := range strings.Fields(s) {
		xs, ys, ok := strings.Cut(f, ",")
		x, err1 := strconv.ParseFloat(xs, 64)
		y, err2 := strconv.ParseFloat(ys, 64)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("point %q: want x,y", f)
		}
		out = append(out, plot.Point{X: x, Y: y})
	}
	*ps = out
	return nil
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

// complete adds what the child reported: the start of each of its trims,
// in seconds since the trace's origin, and its GOMEMLIMIT.
func (tr *Trace) complete(r childResult) {
	for _, sp := range r.TrimSpans {
		tr.Trims = append(tr.Trims, round(float64(sp[0]-tr.origin.UnixNano())/1e9, 100))
	}
	if r.GoMemLimit > 0 && r.GoMemLimit < math.MaxInt64 {
		tr.GoMemLimit = inMiB(r.GoMemLimit)
	}
}

// p99Windows returns the p99 latency in milliseconds (nearest rank) of the
// requests due in each window of w, the last one possibly partial, at the
// window's middle in seconds since the trace's origin. The i-th request
// (latency lat[i] seconds) was due at i/rate seconds after the load
// started, offset seconds after the origin. A window with no request is
// left out.
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
