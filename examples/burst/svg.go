package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/memctl/memctl/internal/plot"
)

// chart draws each arm's RSS in MiB against the seconds since its burst
// ended: the samples and the table's readings, so that every figure of the
// table is a point. The burst's end and the trim are marks, GOMEMLIMIT a
// line.
func chart(arms []*armRun) plot.Chart {
	c := plot.Chart{
		Title:  fmt.Sprintf("RSS of a Go process after a %d MiB burst (%d MiB live), read every %v", burstBytes>>20, liveBytes>>20, sampleStep),
		XLabel: "seconds since the burst ended",
		YLabel: "RSS (MiB)",
		Marks:  []plot.Mark{{Label: "burst ends", X: 0}},
	}
	for _, a := range arms {
		a.mu.Lock()
		since := func(t time.Time) float64 { return t.Sub(a.end).Seconds() }
		inMiB := func(b int64) float64 { return float64(b) / (1 << 20) }
		s := plot.Series{Name: a.name}
		for _, r := range a.samples {
			s.Points = append(s.Points, plot.Point{X: since(r.at), Y: inMiB(r.rss)})
		}
		s.Points = append(s.Points,
			plot.Point{X: since(a.ready), Y: inMiB(a.before)},
			plot.Point{X: 0, Y: inMiB(a.peak)})
		if a.trimmed >= 0 {
			s.Points = append(s.Points, plot.Point{X: since(a.trimAt), Y: inMiB(a.trimmed)})
			c.Marks = append(c.Marks, plot.Mark{Label: a.name + " trimmed", X: since(a.trimAt)})
		}
		slices.SortStableFunc(s.Points, func(p, q plot.Point) int { return cmp.Compare(p.X, q.X) })
		c.Series = append(c.Series, s)
		if a.limit > 0 && a.limit < math.MaxInt64 {
			c.Lines = append(c.Lines, plot.Line{Label: "GOMEMLIMIT (" + a.name + ")", Y: inMiB(a.limit)})
		}
		a.mu.Unlock()
	}
	if len(c.Lines) == 2 && c.Lines[0].Y == c.Lines[1].Y {
		c.Lines = []plot.Line{{Label: "GOMEMLIMIT", Y: c.Lines[0].Y}}
	}
	if len(c.Lines) == 0 {
		c.Title += "; no GOMEMLIMIT"
	}
	return c
}

// writeSVG writes the arms' chart to the file at path.
func writeSVG(path string, arms []*armRun) error {
	c := chart(arms)
	return c.WriteFile(path)
}
