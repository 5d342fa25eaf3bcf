package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/plot"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pts(xy ...float64) Points {
	var ps Points
	for i := 0; i+1 < len(xy); i += 2 {
		ps = append(ps, plot.Point{X: xy[i], Y: xy[i+1]})
	}
	return ps
}

// tracedReport is fakeReport with traces in burst and cadence, and a load
// scenario with traces (plain, memctl and A/A arms); http has none.
func tracedReport(t *testing.T) *Report {
	t.Helper()
	rep := fakeReport(t, defaultParams(false))
	burst := pts(-0.81, 30.2, 0, 1059, 0.05, 1059, 2.1, 34.5, 3, 34.5)
	flat := pts(-0.8, 30, 0, 1059, 0.05, 1059, 3, 1059)
	rep.Scenarios[0].Traces = map[string]Trace{
		"plain":      {RSS: flat},
		"gomemlimit": {RSS: flat, GoMemLimit: 1843},
		"memctl":     {RSS: burst, Trims: []float64{2.05}, GoMemLimit: 1843},
		"memctl-aa":  {RSS: burst, Trims: []float64{2.07}, GoMemLimit: 1843},
		"freeos":     {RSS: pts(-0.8, 30.1, 0, 1059, 0.05, 1059, 2.1, 36.2, 3, 36.2)},
	}
	saw := pts(0.05, 100, 2.1, 164, 4.2, 150)
	rep.Scenarios[1].Traces = map[string]Trace{
		"plain":      {RSS: saw},
		"gomemlimit": {RSS: saw, GoMemLimit: 1843},
		"memctl":     {RSS: saw, Trims: []float64{2.2, 4.3}, GoMemLimit: 1843},
		"memctl-aa":  {RSS: saw, Trims: []float64{2.3}, GoMemLimit: 1843},
	}
	load := fakeLoadReport(map[string]map[string]float64{"plain": {"p99": 0.01}}).Scenarios[0]
	load.Traces = map[string]Trace{
		"plain":     {RSS: pts(0.05, 1100, 3, 2300), P99: pts(1.02, 2.5, 3.02, 41.25)},
		"memctl":    {RSS: pts(0.05, 1100, 3, 1200), P99: pts(1.02, 2.4, 3.02, 9.5), Trims: []float64{4.1}, GoMemLimit: 3686.4},
		"memctl-aa": {RSS: pts(0.05, 1100, 3, 1190), P99: pts(1.02, 2.6, 3.02, 8.75), Trims: []float64{4.2}, GoMemLimit: 3686.4},
	}
	rep.Scenarios = append(rep.Scenarios, load)
	return rep
}

// drawn writes c as SVG and reads it back.
func drawn(t *testing.T, c plot.Chart) plot.Chart {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, c.WriteSVG(&b))
	got, err := plot.Read(&b)
	require.NoError(t, err)
	return got
}

func TestSVGCharts(t *testing.T) {
	rep := tracedReport(t)
	cs := charts(rep, rep.Scenarios[0])
	require.Len(t, cs, 1)
	assert.Equal(t, "bench-burst.svg", cs[0].Name)
	c := drawn(t, cs[0].Chart)
	assert.Equal(t, "burst: RSS after one 1,024 MiB burst (20 MiB live), first run of each arm; marks: memctl's trims", c.Title)
	require.Len(t, c.Series, 5)
	for i, name := range []string{"plain", "GOMEMLIMIT only", "memctl", "memctl (A/A)", "plain + FreeOSMemory"} {
		assert.Equal(t, name, c.Series[i].Name)
		assert.Equal(t, []plot.Point(rep.Scenarios[0].Traces[rep.Arms[i].Key].RSS), c.Series[i].Points, name)
	}
	assert.Equal(t, []plot.Mark{{Label: "burst ends", X: 0}, {Label: "trim", X: 2.05}}, c.Marks, "the memctl arm's trims")
	assert.Equal(t, []plot.Line{{Label: "GOMEMLIMIT", Y: 1843}}, c.Lines, "one line for equal limits")

	// cadence: the limit is far above its RSS: named in the title.
	cs = charts(rep, rep.Scenarios[1])
	require.Len(t, cs, 1)
	c = drawn(t, cs[0].Chart)
	assert.Len(t, c.Series, 4, "no freeos arm in cadence")
	assert.Equal(t, "cadence: RSS, a 64 MiB burst every 2.1 s from 0 s (20 MiB live), first run of each arm; marks: memctl's trims; GOMEMLIMIT 1,843 MiB (above the chart)", c.Title)
	assert.Empty(t, c.Lines)
	assert.Equal(t, []plot.Mark{{Label: "trim", X: 2.2}, {Label: "trim", X: 4.3}}, c.Marks)

	assert.Empty(t, charts(rep, rep.Scenarios[2]), "http keeps no traces")

	cs = charts(rep, rep.Scenarios[3])
	require.Len(t, cs, 2)
	assert.Equal(t, "bench-load.svg", cs[0].Name)
	assert.Equal(t, "bench-load-p99.svg", cs[1].Name)
	c = drawn(t, cs[0].Chart)
	assert.Equal(t, "load: the server's RSS, a 512 MiB burst every 10 s from 2 s, first run of each arm; marks: memctl's trims", c.Title)
	assert.Len(t, c.Series, 3, "no GOMEMLIMIT-only arm in load")
	assert.Equal(t, []plot.Line{{Label: "GOMEMLIMIT", Y: 3686.4}}, c.Lines)
	p := drawn(t, cs[1].Chart)
	assert.Equal(t, "load: p99 latency of the requests due in each 2 s (200 requests/s), a 512 MiB burst every 10 s from 2 s, first run of each arm; marks: memctl's trims", p.Title)
	require.Len(t, p.Series, 3)
	assert.Equal(t, "memctl", p.Series[1].Name)
	assert.Equal(t, []plot.Point{{X: 1.02, Y: 2.4}, {X: 3.02, Y: 9.5}}, p.Series[1].Points)
	assert.Equal(t, []plot.Mark{{Label: "trim", X: 4.1}}, p.Marks)
	assert.Empty(t, p.Lines)
}

// Arms with different limits get a line each; a memctl arm without trims
// adds no marks.
func TestSVGLimitLines(t *testing.T) {
	rep := tracedReport(t)
	s := rep.Scenarios[0]
	tr := s.Traces["gomemlimit"]
	tr.GoMemLimit = 1500
	s.Traces["gomemlimit"] = tr
	lines, note := limitLines(rep, s, 1059)
	assert.Equal(t, []plot.Line{{Label: "GOMEMLIMIT (GOMEMLIMIT only)", Y: 1500}, {Label: "GOMEMLIMIT (memctl)", Y: 1843}, {Label: "GOMEMLIMIT (memctl (A/A))", Y: 1843}}, lines)
	assert.Empty(t, note)
	lines, note = limitLines(rep, s, 800)
	assert.Equal(t, []plot.Line{{Label: "GOMEMLIMIT", Y: 1500}}, lines)
	assert.Equal(t, "; GOMEMLIMIT 1,843 MiB (above the chart)", note)

	tr = s.Traces["memctl"]
	tr.Trims = nil
	s.Traces["memctl"] = tr
	c := charts(rep, s)[0].Chart
	assert.Equal(t, []plot.Mark{{Label: "burst ends", X: 0}}, c.Marks)
	assert.NotContains(t, c.Title, "trims")
}

func TestSVGTraceJSON(t *testing.T) {
	rep := tracedReport(t)
	var js bytes.Buffer
	require.NoError(t, writeJSON(&js, rep))
	assert.Contains(t, js.String(), `"rss_mib": "-0.81,30.2 0,1059 0.05,1059 2.1,34.5 3,34.5"`, "a trace is one string")
	assert.Contains(t, js.String(), `"p99_ms": "1.02,2.4 3.02,9.5"`)
	assert.Contains(t, js.String(), `"gomemlimit_mib": 3686.4`)
	assert.NotContains(t, js.String(), `"p99_ms": ""`, "omitted where empty")
	path := filepath.Join(t.TempDir(), "r.json")
	require.NoError(t, os.WriteFile(path, js.Bytes(), 0o644))
	got, err := readReport(path)
	require.NoError(t, err)
	require.Len(t, got.Scenarios, 4)
	for i, s := range rep.Scenarios {
		assert.Equal(t, s.Traces, got.Scenarios[i].Traces, s.Name)
	}

	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"scenarios":[{"name":"burst","traces":{"plain":{"rss_mib":"1,2 3;4"}}}]}`), 0o644))
	_, err = readReport(bad)
	assert.ErrorContains(t, err, `point "3;4": want x,y`)
}

func TestSVGTrace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := rssTrace(t0, []sample{{at: 0.0512, rss: 30*mib + 100_000}, {at: 0.1, rss: 1 << 30}})
	assert.Equal(t, pts(0.05, 30.1, 0.1, 1024), tr.RSS)
	tr.complete(childResult{GoMemLimit: 1843 * mib, TrimSpans: []span{{t0.Add(2054 * time.Millisecond).UnixNano(), t0.Add(2100 * time.Millisecond).UnixNano()}}})
	assert.Equal(t, []float64{2.05}, tr.Trims, "the trim's start, in seconds since the origin")
	assert.Equal(t, 1843.0, tr.GoMemLimit)
	tr = Trace{}
	tr.complete(childResult{GoMemLimit: math.MaxInt64})
	assert.Zero(t, tr.GoMemLimit, "no GOMEMLIMIT: none")

	// 2 requests/s, 2 s windows: 4 requests each, the last window partial.
	lat := []float64{0.001, 0.002, 0.004, 0.003, 0.010, 0.040, 0.020, 0.030, 0.5}
	assert.Equal(t, pts(1.25, 4, 3.25, 40, 5.25, 500), p99Windows(lat, 2, 0.25, 2*time.Second))
	assert.Empty(t, p99Windows(nil, 2, 0, 2*time.Second))
}

func TestSVGFiles(t *testing.T) {
	rep := tracedReport(t)
	dir := filepath.Join(t.TempDir(), "a", "b")
	paths, err := writeSVGs(dir, rep)
	require.NoError(t, err)
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
		f, err := os.Open(p)
		require.NoError(t, err)
		c, err := plot.Read(f)
		f.Close()
		require.NoError(t, err)
		assert.NotEmpty(t, c.Series, p)
	}
	assert.Equal(t, []string{"bench-burst.svg", "bench-cadence.svg", "bench-load.svg", "bench-load-p99.svg"}, names)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 4, "no probe file left")

	// A bad directory: a clear error, before any run.
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	err = checkSVGDir(file)
	assert.ErrorContains(t, err, "bench: -svg "+file+": ")
	assert.ErrorContains(t, err, "not a directory")
	_, err = writeSVGs(filepath.Join(file, "sub"), rep)
	assert.ErrorContains(t, err, "not a directory")
}

func TestSVGCLI(t *testing.T) {
	rep := tracedReport(t)
	var js bytes.Buffer
	require.NoError(t, writeJSON(&js, rep))
	path := filepath.Join(t.TempDir(), "r.json")
	require.NoError(t, os.WriteFile(path, js.Bytes(), 0o644))

	dir := t.TempDir()
	var out, errb bytes.Buffer
	require.Equal(t, 0, cli([]string{"-from", path, "-svg", dir}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "### burst:", "the report first")
	assert.Equal(t, "bench: wrote "+filepath.Join(dir, "bench-burst.svg")+"\n", strings.SplitAfter(errb.String(), "\n")[0])
	assert.Contains(t, errb.String(), "bench: wrote "+filepath.Join(dir, "bench-load-p99.svg"))

	out.Reset()
	errb.Reset()
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	assert.Equal(t, 1, cli([]string{"-from", path, "-svg", file}, &out, &errb))
	assert.Contains(t, errb.String(), "bench: -svg "+file)
	assert.Empty(t, out.String(), "a bad -svg fails before the report")

	// A report without traces: no chart, and stderr says so.
	old := filepath.Join(t.TempDir(), "old.json")
	js.Reset()
	require.NoError(t, writeJSON(&js, fakeReport(t, defaultParams(false))))
	require.NoError(t, os.WriteFile(old, js.Bytes(), 0o644))
	errb.Reset()
	dir = t.TempDir()
	require.Equal(t, 0, cli([]string{"-from", old, "-svg", dir}, &out, &errb), errb.String())
	assert.Contains(t, errb.String(), "no chart written")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)

	for args, want := range map[string]string{"": ".", "-svg off": "", "-svg=": "", "-svg x/y": "x/y"} {
		cfg, _, err := parseFlags(strings.Fields(args), &errb)
		require.NoError(t, err, args)
		assert.Equal(t, want, cfg.SVGDir, args)
	}
}

// A load variant's chart titles name that variant's burst and rate:
// load-contended's charts said "512 MiB" (the load scenario's burst) over
// its 32 MiB bursts.
func TestSVGSubjectsOfLoadVariants(t *testing.T) {
	p := defaultParams(false)
	for _, name := range []string{"load", "load-gc", "load-contended"} {
		lp := variantParams(name, p.Load)
		burst := mibs(lp.Burst) + " MiB burst"
		assert.Contains(t, chartSubject(p, name), burst, name)
		assert.Contains(t, p99Subject(p, name), burst, name)
		assert.Contains(t, p99Subject(p, name), "("+thousands(lp.Rate)+" requests/s)", name)
	}
	assert.Contains(t, chartSubject(p, "load-contended"), "a 32 MiB burst")
}
