package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Obs is one observation of a figure in one run of one arm. Values are in
// the figure's base unit (bytes, seconds, requests per second, a fraction).
type Obs struct {
	Value float64 `json:"value"`
	// Over means the true value is greater than Value: the window (Value
	// seconds) ended first.
	Over bool `json:"over,omitempty"`
	// NA means the figure was not observed in this run (beyond the window).
	NA bool `json:"na,omitempty"`
}

// Summary is a figure over the runs of one arm, runs in order.
type Summary struct {
	Median Obs   `json:"median"`
	Min    Obs   `json:"min"`
	Max    Obs   `json:"max"`
	Runs   []Obs `json:"runs"`
}

// N returns the number of runs in which the figure was observed.
func (s Summary) N() int {
	n := 0
	for _, o := range s.Runs {
		if !o.NA {
			n++
		}
	}
	return n
}

// summarize returns the median, min and max of runs, ignoring NA runs (NA
// if all are). For an even count the median is the mean of the middle two,
// Over if either is (the lesser bound if both are).
func summarize(runs []Obs) Summary {
	s := Summary{Runs: slices.Clone(runs)}
	obs := slices.DeleteFunc(slices.Clone(runs), func(o Obs) bool { return o.NA })
	n := len(obs)
	if n == 0 {
		s.Median, s.Min, s.Max = Obs{NA: true}, Obs{NA: true}, Obs{NA: true}
		return s
	}
	// By value, Over after a plain one of the same value.
	over := func(o Obs) int {
		if o.Over {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(obs, func(a, b Obs) int {
		return cmp.Or(cmp.Compare(a.Value, b.Value), over(a)-over(b))
	})
	s.Min, s.Max, s.Median = obs[0], obs[n-1], obs[n/2]
	if n%2 == 0 {
		lo, hi := obs[n/2-1], obs[n/2]
		s.Median = Obs{Value: (lo.Value + hi.Value) / 2, Over: lo.Over || hi.Over}
		if lo.Over && hi.Over {
			s.Median.Value = lo.Value
		}
	}
	return s
}

// relDiff returns |a-b|/|a| and whether a and b can be compared: both Over
// with the same bound agree (0); NA, or one Over, cannot.
func relDiff(a, b Obs) (float64, bool) {
	switch {
	case a.NA || b.NA:
		return 0, false
	case a.Over && b.Over:
		return 0, a.Value == b.Value
	case a.Over != b.Over:
		return 0, false
	case a.Value == b.Value:
		return 0, true
	case a.Value == 0:
		return math.Inf(1), true
	}
	return math.Abs(a.Value-b.Value) / math.Abs(a.Value), true
}

// rssAt returns the first sample at or after d seconds, or NA.
func rssAt(samples []sample, d float64) Obs {
	for _, s := range samples {
		if s.at >= d {
			return Obs{Value: float64(s.rss)}
		}
	}
	return Obs{NA: true}
}

// backWithin returns the time of the first sample with rss <=
// base*(1+ratio), or window with Over set.
func backWithin(samples []sample, base int64, ratio, window float64) Obs {
	limit := float64(base) * (1 + ratio)
	for _, s := range samples {
		if float64(s.rss) <= limit {
			return Obs{Value: s.at}
		}
	}
	return Obs{Value: window, Over: true}
}

// meanRSS returns the mean of evenly spaced samples' RSS, NA for none.
func meanRSS(samples []sample) Obs {
	if len(samples) == 0 {
		return Obs{NA: true}
	}
	var sum float64
	for _, s := range samples {
		sum += float64(s.rss)
	}
	return Obs{Value: sum / float64(len(samples))}
}

// percentile returns the nearest-rank p-th percentile (p in [0, 100]) of
// sorted, 0 for none.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// sample is one VmRSS reading: at seconds after the phase began, rss bytes.
type sample struct {
	at  float64
	rss int64
}

// unit is a figure's unit: values are in the base unit String names,
// rendered as each constant's comment says.
type unit int

const (
	unitBytes    unit = iota // MiB, rounded, thousands separated: "1,055"
	unitSeconds              // "2.1 s", "> 30 s"
	unitLatency              // seconds, rendered "85 µs", "1.2 ms"
	unitCount                // "28"
	unitFraction             // a share in [0, 1], rendered "0.41%"
	unitRate                 // per second, rendered "12,345"
	unitRatio                // "0.987"
)

// unitNames are the base units' names as written in the JSON output.
var unitNames = []string{"bytes", "seconds", "seconds", "count", "fraction", "per second", "ratio"}

func (u unit) String() string {
	if u >= 0 && int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unit(" + strconv.Itoa(int(u)) + ")"
}

// MarshalText writes the unit's name.
func (u unit) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// formatValue renders v (in the base unit u) for a table cell.
func formatValue(u unit, v float64) string {
	switch u {
	case unitBytes:
		return thousands(math.Round(v / (1 << 20)))
	case unitSeconds:
		return trimZero(strconv.FormatFloat(v, 'f', 1, 64)) + " s"
	case unitLatency:
		switch {
		case v < 1e-3:
			return strconv.FormatFloat(v*1e6, 'f', 0, 64) + " µs"
		case v < 1:
			return strconv.FormatFloat(v*1e3, 'f', 1, 64) + " ms"
		}
		return strconv.FormatFloat(v, 'f', 2, 64) + " s"
	case unitCount:
		return trimZero(strconv.FormatFloat(v, 'f', 1, 64))
	case unitFraction:
		return strconv.FormatFloat(v*100, 'f', 2, 64) + "%"
	case unitRate:
		return thousands(math.Round(v))
	case unitRatio:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// formatObs renders one observation: "> T" for Over, "–" for NA.
func formatObs(u unit, o Obs) string {
	switch {
	case o.NA:
		return "–"
	case o.Over:
		return "> " + formatValue(u, o.Value)
	}
	return formatValue(u, o.Value)
}

// formatCell renders "median (min – max)", or the median alone when min
// and max render the same.
func formatCell(u unit, s Summary) string {
	med := formatObs(u, s.Median)
	if s.N() <= 1 {
		return med
	}
	lo, hi := formatObs(u, s.Min), formatObs(u, s.Max)
	if lo == hi {
		return med
	}
	return fmt.Sprintf("%s (%s – %s)", med, lo, hi)
}

// thousands renders an integral v with comma thousands separators.
func thousands(v float64) string {
	s := strconv.FormatFloat(math.Abs(v), 'f', 0, 64)
	var b strings.Builder
	if v < 0 && s != "0" {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// trimZero drops a trailing ".0".
func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }

// UnmarshalText accepts any name: readReport sets the unit ("seconds"
// names two).
func (u *unit) UnmarshalText([]byte) error { return nil }

// secs renders a duration in seconds as the tables do: "30 s", "2.1 s".
func secs(d time.Duration) string { return formatValue(unitSeconds, d.Seconds()) }
