package main

import (
	"cmp"
	"math"
	"slices"
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

// cmp orders observations by value, Over after a plain one of the same
// value, NA last.
func (o Obs) cmp(p Obs) int {
	if o.NA || p.NA {
		return cmpBool(o.NA, p.NA)
	}
	if c := cmp.Compare(o.Value, p.Value); c != 0 {
		return c
	}
	return cmpBool(o.Over, p.Over)
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
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
// Over if either is.
func summarize(runs []Obs) Summary {
	s := Summary{Runs: slices.Clone(runs)}
	var obs []Obs
	for _, o := range runs {
		if !o.NA {
			obs = append(obs, o)
		}
	}
	if len(obs) == 0 {
		na := Obs{NA: true}
		s.Median, s.Min, s.Max = na, na, na
		return s
	}
	slices.SortStableFunc(obs, Obs.cmp)
	s.Min, s.Max = obs[0], obs[len(obs)-1]
	n := len(obs)
	if n%2 == 1 {
		s.Median = obs[n/2]
		return s
	}
	lo, hi := obs[n/2-1], obs[n/2]
	s.Median = Obs{Value: (lo.Value + hi.Value) / 2, Over: lo.Over || hi.Over}
	if lo.Over && hi.Over {
		s.Median.Value = math.Min(lo.Value, hi.Value)
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
