package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/plot"
)

// chartFile is one SVG of the -svg directory: its file name and its chart.
type chartFile struct {
	Name  string
	Chart plot.Chart
}

// chartWidth and chartHeight are the charts' size in pixels.
const chartWidth, chartHeight = 960, 400

// limitOffChart: a GOMEMLIMIT over this many times the largest RSS is named
// in the title, not drawn (it would squeeze the series).
const limitOffChart = 2

// charts returns the charts of scenario s drawn from its traces (none
// without): bench-NAME.svg, each arm's RSS in MiB, and where the traces
// hold p99 windows bench-NAME-p99.svg. The memctl arm's trims are marks,
// as is the end of the burst at 0 in burst; GOMEMLIMIT is drawn by
// limitLines.
func charts(rep *Report, s ScenarioReport) []chartFile {
	if len(s.Traces) == 0 {
		return nil
	}
	xlabel := "seconds since the start"
	var marks []plot.Mark
	if s.Name == "burst" {
		xlabel = "seconds since the burst ended"
		marks = append(marks, plot.Mark{Label: "burst ends", X: 0})
	}
	trims := s.Traces["memctl"].Trims
	for _, t := range trims {
		marks = append(marks, plot.Mark{Label: "trim", X: t})
	}
	suffix := ", first run of each arm"
	if len(trims) > 0 {
		suffix += "; marks: memctl's trims"
	}
	rss := plot.Chart{XLabel: xlabel, YLabel: "RSS (MiB)", Width: chartWidth, Height: chartHeight, Marks: marks}
	p99 := plot.Chart{XLabel: xlabel, YLabel: "p99 latency (ms)", Width: chartWidth, Height: chartHeight, Marks: marks}
	for _, a := range rep.Arms {
		tr, ok := s.Traces[a.Key]
		if !ok {
			continue
		}
		rss.Series = append(rss.Series, plot.Series{Name: a.Label, Points: tr.RSS})
		if len(tr.P99) > 0 {
			p99.Series = append(p99.Series, plot.Series{Name: a.Label, Points: tr.P99})
		}
	}
	lines, note := limitLines(rep, s, maxY(rss.Series))
	rss.Lines = lines
	rss.Title = s.Name + ": " + chartSubject(rep.Params, s.Name) + suffix + note
	out := []chartFile{{Name: "bench-" + s.Name + ".svg", Chart: rss}}
	if len(p99.Series) > 0 {
		p99.Title = s.Name + ": " + p99Subject(rep.Params, s.Name) + suffix
		out = append(out, chartFile{Name: "bench-" + s.Name + "-p99.svg", Chart: p99})
	}
	return out
}

// chartSubject is what the RSS chart of scenario name shows, for its title.
func chartSubject(p params, name string) string {
	switch name {
	case "burst":
		return fmt.Sprintf("RSS after one %s MiB burst (%s MiB live)", mibs(p.Burst), mibs(p.Live))
	case "cadence":
		return fmt.Sprintf("RSS, a %s MiB burst every %s from 0 s (%s MiB live)", mibs(p.CadenceBurst), secs(p.CadencePeriod), mibs(p.Live))
	}
	lp := variantParams(name, p.Load)
	return fmt.Sprintf("the server's RSS, a %s MiB burst every %s from %s", mibs(lp.Burst), secs(lp.Period), secs(lp.FirstBurst))
}

// p99Subject is what the p99 chart of load scenario name shows.
func p99Subject(p params, name string) string {
	lp := variantParams(name, p.Load)
	return fmt.Sprintf("p99 latency of the requests due in each %s (%s requests/s), a %s MiB burst every %s from %s",
		secs(p99Window), thousands(lp.Rate), mibs(lp.Burst), secs(lp.Period), secs(lp.FirstBurst))
}

// limitLines returns the GOMEMLIMIT lines of s's arms, one line where all
// are equal; a limit above limitOffChart times maxRSS is named in note for
// the title instead.
func limitLines(rep *Report, s ScenarioReport, maxRSS float64) (lines []plot.Line, note string) {
	var off []string
	for _, a := range rep.Arms {
		l := s.Traces[a.Key].GoMemLimit
		if l <= 0 {
			continue
		}
		if l > limitOffChart*maxRSS {
			if m := thousands(l) + " MiB"; !slices.Contains(off, m) {
				off = append(off, m)
			}
			continue
		}
		lines = append(lines, plot.Line{Label: "GOMEMLIMIT (" + a.Label + ")", Y: l})
	}
	if len(lines) > 0 && !slices.ContainsFunc(lines, func(l plot.Line) bool { return l.Y != lines[0].Y }) {
		lines = []plot.Line{{Label: "GOMEMLIMIT", Y: lines[0].Y}}
	}
	if len(off) > 0 {
		note = "; GOMEMLIMIT " + strings.Join(off, ", ") + " (above the chart)"
	}
	return lines, note
}

// maxY returns the largest Y of the series' points, 0 when there is none.
func maxY(series []plot.Series) float64 {
	m := 0.0
	for _, s := range series {
		for _, p := range s.Points {
			m = max(m, p.Y)
		}
	}
	return m
}

// checkSVGDir makes dir if missing and checks that a file can be created
// in it, so that a bad -svg fails before the run.
func checkSVGDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: -svg %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".bench-svg-*")
	if err != nil {
		return fmt.Errorf("bench: -svg %s: cannot write there: %w", dir, err)
	}
	return errors.Join(f.Close(), os.Remove(f.Name()))
}

// writeSVGs writes rep's charts into dir and returns the paths written; it
// stops at the first error.
func writeSVGs(dir string, rep *Report) ([]string, error) {
	var paths []string
	for _, s := range rep.Scenarios {
		for _, cf := range charts(rep, s) {
			if len(paths) == 0 {
				if err := checkSVGDir(dir); err != nil {
					return nil, err
				}
			}
			path := filepath.Join(dir, cf.Name)
			if err := cf.Chart.WriteFile(path); err != nil {
				return paths, fmt.Errorf("bench: -svg: %w", err)
			}
			paths = append(paths, path)
		}
	}
	return paths, nil
}

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
