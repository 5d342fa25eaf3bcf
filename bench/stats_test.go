package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func v(x float64) Obs    { return Obs{Value: x} }
func over(x float64) Obs { return Obs{Value: x, Over: true} }

var na = Obs{NA: true}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name             string
		runs             []Obs
		median, min, max Obs
	}{
		{"one", []Obs{v(7)}, v(7), v(7), v(7)},
		{"odd unsorted", []Obs{v(5), v(1), v(9), v(3), v(7)}, v(5), v(1), v(9)},
		{"even: mean of the middle two", []Obs{v(4), v(1), v(2), v(10)}, v(3), v(1), v(10)},
		{"over sorts after its bound", []Obs{over(30), v(30), v(2)}, v(30), v(2), over(30)},
		{"median over", []Obs{over(30), over(30), v(2)}, over(30), v(2), over(30)},
		{"even, upper middle over", []Obs{v(2), v(4), over(30), over(30)}, over(17), v(2), over(30)},
		{"even, both middles over", []Obs{v(2), over(30), over(30), over(30)}, over(30), v(2), over(30)},
		{"NA runs ignored", []Obs{na, v(3), v(1), na, v(2)}, v(2), v(1), v(3)},
		{"all NA", []Obs{na, na}, na, na, na},
		{"none", nil, na, na, na},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]Obs(nil), tc.runs...)
			s := summarize(tc.runs)
			assert.Equal(t, tc.median, s.Median, "median")
			assert.Equal(t, tc.min, s.Min, "min")
			assert.Equal(t, tc.max, s.Max, "max")
			assert.Equal(t, in, tc.runs, "input left in run order")
			assert.Equal(t, len(in), len(s.Runs))
		})
	}
}

func TestSummaryN(t *testing.T) {
	assert.Equal(t, 2, summarize([]Obs{v(1), na, over(3)}).N())
	assert.Equal(t, 0, summarize(nil).N())
}

func TestRelDiff(t *testing.T) {
	for _, tc := range []struct {
		a, b Obs
		want float64
		ok   bool
	}{
		{v(100), v(104), 0.04, true},
		{v(100), v(95), 0.05, true},
		{v(0), v(0), 0, true},
		{v(0), v(1), math.Inf(1), true},
		{over(30), over(30), 0, true},
		{over(30), over(10), 0, false},
		{over(30), v(29), 0, false},
		{na, v(1), 0, false},
		{na, na, 0, false},
	} {
		got, ok := relDiff(tc.a, tc.b)
		assert.Equal(t, tc.ok, ok, "%v %v", tc.a, tc.b)
		assert.InDelta(t, tc.want, got, 1e-12, "%v %v", tc.a, tc.b)
	}
}

func TestSamples(t *testing.T) {
	const mib = 1 << 20
	s := []sample{{0.05, 1000 * mib}, {2.05, 1000 * mib}, {2.10, 40 * mib}, {3.0, 31 * mib}, {3.05, 30 * mib}, {4.0, 30 * mib}}
	assert.Equal(t, v(31*mib), rssAt(s, 3), "first sample at or after 3 s")
	assert.Equal(t, v(30*mib), rssAt(s, 3.01))
	assert.Equal(t, na, rssAt(s, 10), "after the last sample")
	assert.Equal(t, v(3.0), backWithin(s, 29*mib, 0.10, 4), "31 <= 29*1.1 = 31.9: back at 3.0")
	assert.Equal(t, v(2.10), backWithin(s, 40*mib, 0, 4), "exactly at the bound counts")
	assert.Equal(t, over(4), backWithin(s, 20*mib, 0.10, 4), "never back: > window")
	assert.Equal(t, over(4), backWithin(nil, 20*mib, 0.10, 4))
	assert.InDelta(t, (2000+40+31+30+30)*mib/6.0, meanRSS(s).Value, 1)
	assert.Equal(t, na, meanRSS(nil))
}

func TestBackWithinBoundary(t *testing.T) {
	// 28 MiB * 1.1 = 30.8 MiB: 31 MiB is out, 30 MiB in.
	const mib = 1 << 20
	s := []sample{{3.0, 31 * mib}, {3.05, 30 * mib}}
	assert.Equal(t, v(3.05), backWithin(s, 28*mib, 0.10, 4))
}

func TestPercentile(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	assert.Equal(t, 50.0, percentile(xs, 50))
	assert.Equal(t, 99.0, percentile(xs, 99))
	assert.Equal(t, 100.0, percentile(xs, 100))
	assert.Equal(t, 1.0, percentile(xs, 0))
	assert.Equal(t, 7.0, percentile([]float64{7}, 99))
	assert.Equal(t, 0.0, percentile(nil, 50))
}

func TestBurstFigures(t *testing.T) {
	const mib = 1 << 20
	s := []sample{{1, 1000 * mib}, {3, 1000 * mib}, {10, 1000 * mib}, {30, 1000 * mib}}
	f := burstFigures(25*mib, 1050*mib, s, 30*time.Second)
	assert.Equal(t, map[string]Obs{
		"rss_before":        v(25 * mib),
		"peak_rss":          v(1050 * mib),
		"rss_3s":            v(1000 * mib),
		"rss_10s":           v(1000 * mib),
		"back_within_10pct": over(30),
	}, f)
	for _, fd := range burstScenario.Figures {
		assert.Contains(t, f, fd.Key, "every figure of the table is computed")
	}
}

func TestDeriveRatio(t *testing.T) {
	obs := map[string]map[string][]Obs{}
	for _, a := range arms {
		obs[a.Key] = map[string][]Obs{}
	}
	obs["plain"]["rps"] = []Obs{v(100), v(200), v(0)}
	obs["memctl"]["rps"] = []Obs{v(98), v(150), v(5)}
	deriveRatio(obs, "rps", "ratio")
	assert.Equal(t, []Obs{v(1), v(1), na}, obs["plain"]["ratio"])
	assert.Equal(t, []Obs{v(0.98), v(0.75), na}, obs["memctl"]["ratio"], "paired by round; plain 0 gives NA")
	assert.Empty(t, obs["gomemlimit"]["ratio"])
}
