package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

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
	lp := p.Load
	return fmt.Sprintf("the server's RSS, a %s MiB burst every %s from %s", mibs(lp.Burst), secs(lp.Period), secs(lp.FirstBurst))
}

// p99Subject is what the p99 chart of load scenario name shows.
func p99Subject(p params, name string) string {
	lp := p.Load
	return fmt.Sprintf("p99 latency of the requests due in each %s (%s requests/s), a %s MiB burst every %s from %s",
		secs(p99Window), thousands(variantParams(name, lp).Rate), mibs(lp.Burst), secs(lp.Period), secs(lp.FirstBurst))
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
