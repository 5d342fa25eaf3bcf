package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

// fakeReport builds a report as run does, from made-up observations: three
// runs per arm, every scenario.
func fakeReport(t *testing.T, p params) *Report {
	t.Helper()
	perArm := map[string]map[string][]Obs{
		"plain": {
			"rss_before": {v(23 * mib), v(23 * mib), v(24 * mib)}, "peak_rss": {v(1055 * mib), v(1055 * mib), v(1056 * mib)},
			"rss_3s": {v(1055 * mib), v(1055 * mib), v(1055 * mib)}, "rss_10s": {v(1055 * mib), v(1055 * mib), v(1055 * mib)},
			"back_within_10pct": {over(30), over(30), over(30)},
			"trims":             {v(0), v(0), v(0)}, "trim_share": {v(0), v(0), v(0)}, "mean_rss": {v(120 * mib), v(118 * mib), v(125 * mib)},
			"rps": {v(20000), v(21000), v(19000)}, "p50": {v(180e-6), v(170e-6), v(190e-6)}, "p99": {v(3e-3), v(3e-3), v(3e-3)},
		},
		"memctl": {
			"rss_before": {v(24 * mib), v(24 * mib), v(24 * mib)}, "peak_rss": {v(1056 * mib), v(1056 * mib), v(1056 * mib)},
			"rss_3s": {v(27 * mib), v(27 * mib), v(28 * mib)}, "rss_10s": {v(27 * mib), v(27 * mib), v(27 * mib)},
			"back_within_10pct": {v(2.1), v(2.2), v(2.1)},
			"trims":             {v(28), v(28), v(28)}, "trim_share": {v(0.004), v(0.005), v(0.004)}, "mean_rss": {v(80 * mib), v(82 * mib), v(79 * mib)},
			"rps": {v(19800), v(20700), v(18900)}, "p50": {v(182e-6), v(171e-6), v(192e-6)}, "p99": {v(3e-3), v(3e-3), v(3e-3)},
		},
	}
	perArm["gomemlimit"] = perArm["plain"]
	perArm["memctl-aa"] = perArm["memctl"]
	perArm["freeos"] = map[string][]Obs{ // burst only
		"rss_before": {v(24 * mib), v(24 * mib), v(24 * mib)}, "peak_rss": {v(1056 * mib), v(1056 * mib), v(1056 * mib)},
		"rss_3s": {v(27 * mib), v(28 * mib), v(28 * mib)}, "rss_10s": {v(27 * mib), v(28 * mib), v(27 * mib)},
		"back_within_10pct": {v(2.1), v(2.1), v(2.2)},
	}
	rep := &Report{Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Seconds: 2000, Runs: 3, Params: p,
		Machine: Machine{Go: "go1.26.8", OS: "linux", Arch: "amd64", CPUs: 2, GOMAXPROCS: 2, Kernel: "6.18.0", THP: "madvise"},
		Cgroup:  CgroupInfo{Used: true, Version: 1, LimitBytes: 2 << 30}}
	for _, s := range []scenario{burstScenario, cadenceScenario, httpScenario} { // the load scenarios: load_test.go
		obs := map[string]map[string][]Obs{}
		for _, a := range arms {
			obs[a.Key] = map[string][]Obs{}
			if !s.runs(a) {
				continue
			}
			for k, runs := range perArm[a.Key] {
				obs[a.Key][k] = append([]Obs(nil), runs...)
			}
		}
		if s.Name == "http" {
			deriveRatio(obs, "rps", "rps_vs_plain")
		}
		rep.Scenarios = append(rep.Scenarios, collate(s, p, obs))
	}
	for _, a := range arms {
		ml := int64(1843 * mib)
		if a.Key == "plain" || a.Key == "freeos" {
			ml = math.MaxInt64
		}
		rep.Arms = append(rep.Arms, ArmInfo{arm: a, GoMemLimit: ml})
	}
	rep.Targets = targets(rep)
	return rep
}

func TestMarkdown(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, writeMarkdown(&b, fakeReport(t, defaultParams(false))))
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"go1.26.8 linux/amd64, 2 CPUs (GOMAXPROCS 2), Linux 6.18.0, THP madvise. 3 run(s) per arm, arms interleaved (A B C D E A B C D E ...)",
		"Cgroups: each arm ran in its own child memory cgroup (v1, limit 2,048 MiB each).",
		"| plain | Go defaults: no GOMEMLIMIT, no trim | none |",
		"| memctl | memctl.Start() with defaults; AfterBurst after each burst; the budget middleware in http | 1,843 |",
		"| plain + FreeOSMemory | Go defaults; debug.FreeOSMemory one trim delay (memctl's, 2 s unless -trim-delay) after each burst: what the runtime itself returns; burst only | none |",
		"### burst: 20 MiB live, one 1,024 MiB burst, then idle for 30 s\n\n" +
			"| burst | plain | GOMEMLIMIT only | memctl | memctl (A/A) | plain + FreeOSMemory | A/A Δ |\n" +
			"| --- | --- | --- | --- | --- | --- | --- |\n" +
			"| RSS before (MiB) | 23 (23 – 24) | 23 (23 – 24) | 24 | 24 | 24 | 0.0% |\n" +
			"| peak RSS (MiB) | 1,055 (1,055 – 1,056) | 1,055 (1,055 – 1,056) | 1,056 | 1,056 | 1,056 | 0.0% |\n" +
			"| RSS 3 s after (MiB) | 1,055 | 1,055 | 27 (27 – 28) | 27 (27 – 28) | 28 (27 – 28) | 0.0% |\n" +
			"| RSS 10 s after (MiB) | 1,055 | 1,055 | 27 | 27 | 27 (27 – 28) | 0.0% |\n" +
			"| back within 10% | > 30 s | > 30 s | 2.1 s (2.1 s – 2.2 s) | 2.1 s (2.1 s – 2.2 s) | 2.1 s (2.1 s – 2.2 s) | 0.0% |\n",
		// freeos runs in burst only: "–" elsewhere.
		"| wall time in trims | 0.00% | 0.00% | 0.40% (0.40% – 0.50%) | 0.40% (0.40% – 0.50%) | – | 0.0% |",
		"| requests per second / plain (same round) | 1.000 | 1.000 | 0.990 (0.986 – 0.995) | 0.990 (0.986 – 0.995) | – | 0.0% |",
		"| p50 latency | 180 µs (170 µs – 190 µs) |",
		"| burst | memctl's RSS rise 3 s after the burst at most plain Go's with debug.FreeOSMemory at the trim's moment + 0.5% of the burst (5.1 MiB), A/A too | memctl 24 → 27 MiB (+3.0 MiB), A/A 24 → 27 MiB (+3.0 MiB), plain + FreeOSMemory 24 → 28 MiB (+4.0 MiB) | yes |",
		"| burst | plain Go not back within 10% in 30 s | plain > 30 s | yes |",
		"| http | the budget middleware costs at most 2% of requests per second | memctl/plain 0.990, A/A/plain 0.990, GOMEMLIMIT only/plain 1.000 | yes |",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "–: after the", "no note with a 30 s window")
	// Every table row has the same number of cells as its header.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "| ") && strings.Count(line, " | ") > 3 && !strings.Contains(line, "what it runs") {
			n := strings.Count(line, "|")
			assert.Contains(t, []int{5, 8}, n, line)
		}
	}
}

func TestMarkdownQuickAndNoCgroup(t *testing.T) {
	rep := fakeReport(t, defaultParams(true))
	rep.Cgroup = CgroupInfo{Note: "no child memory cgroup could be made here (not root): the arms ran without a memory limit, so the GOMEMLIMIT arms set none"}
	rep.Runs, rep.Quick = 1, true
	var b bytes.Buffer
	require.NoError(t, writeMarkdown(&b, rep))
	out := b.String()
	assert.Contains(t, out, "1 run(s) per arm (-quick)")
	assert.NotContains(t, out, "with (min – max)")
	assert.Contains(t, out, "Cgroups: none; no child memory cgroup could be made here (not root)")
	assert.Contains(t, out, "–: after the 3.5 s observation window.")

	i := slices.IndexFunc(rep.Arms, func(a ArmInfo) bool { return a.Key == "freeos" })
	rep.Arms[i].GoMemLimit = -1 // as when burst did not run
	b.Reset()
	require.NoError(t, writeMarkdown(&b, rep))
	assert.Contains(t, b.String(), "| plain + FreeOSMemory | Go defaults; debug.FreeOSMemory one trim delay (memctl's, 2 s unless -trim-delay) after each burst: what the runtime itself returns; burst only | – (not run) |")
}

func TestJSONShape(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, writeJSON(&b, fakeReport(t, defaultParams(false))))
	var got struct {
		Started time.Time `json:"started"`
		Seconds float64   `json:"seconds"`
		Quick   bool      `json:"quick"`
		Runs    int       `json:"runs"`
		Machine struct {
			CPUs int `json:"cpus"`
		} `json:"machine"`
		Cgroup struct {
			Used       bool  `json:"used"`
			Version    int   `json:"version"`
			LimitBytes int64 `json:"limit_bytes"`
		} `json:"cgroup"`
		Params map[string]any `json:"params"`
		Arms   []struct {
			Key        string `json:"key"`
			Label      string `json:"label"`
			GoMemLimit int64  `json:"gomemlimit_bytes"`
		} `json:"arms"`
		Scenarios []struct {
			Name    string `json:"name"`
			Figures []struct {
				Key  string `json:"key"`
				Unit string `json:"unit"`
				Arms map[string]struct {
					Median map[string]any   `json:"median"`
					Min    map[string]any   `json:"min"`
					Max    map[string]any   `json:"max"`
					Runs   []map[string]any `json:"runs"`
				} `json:"arms"`
			} `json:"figures"`
		} `json:"scenarios"`
		Targets []struct {
			Scenario string `json:"scenario"`
			Met      *bool  `json:"met"`
		} `json:"targets"`
	}
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b.Bytes(), &top))
	var keys []string
	for k := range top {
		keys = append(keys, k)
	}
	assert.ElementsMatch(t, []string{"started", "seconds", "machine", "quick", "runs", "cgroup", "params", "arms", "scenarios", "targets"}, keys)
	require.NoError(t, json.Unmarshal(b.Bytes(), &got))
	assert.Equal(t, 3, got.Runs)
	assert.Equal(t, 2000.0, got.Seconds)
	assert.False(t, got.Started.IsZero())
	assert.Equal(t, 2, got.Machine.CPUs)
	assert.True(t, got.Cgroup.Used)
	assert.Equal(t, int64(2<<30), got.Cgroup.LimitBytes)
	assert.Equal(t, 30e9, got.Params["window"], "durations in nanoseconds")
	require.Len(t, got.Arms, 5)
	assert.Equal(t, "plain", got.Arms[0].Key)
	assert.Equal(t, "freeos", got.Arms[4].Key)
	assert.Equal(t, int64(math.MaxInt64), got.Arms[0].GoMemLimit)
	require.Len(t, got.Scenarios, 3)
	assert.Equal(t, "burst", got.Scenarios[0].Name)
	back := got.Scenarios[0].Figures[4]
	assert.Equal(t, "back_within_10pct", back.Key)
	assert.Equal(t, "seconds", back.Unit)
	assert.Equal(t, map[string]any{"value": 30.0, "over": true}, back.Arms["plain"].Median, "> T in JSON: over")
	assert.Equal(t, map[string]any{"value": 2.1}, back.Arms["memctl"].Median)
	assert.Len(t, back.Arms["memctl"].Runs, 3)
	assert.Len(t, back.Arms, 5)
	assert.Equal(t, "bytes", got.Scenarios[0].Figures[0].Unit)
	assert.Equal(t, "per second", got.Scenarios[2].Figures[0].Unit)
	require.Len(t, got.Targets, 6)
	for _, tg := range got.Targets {
		require.NotNil(t, tg.Met, tg.Scenario)
	}
}

func TestTargets(t *testing.T) {
	rep := fakeReport(t, defaultParams(false))
	for _, tg := range rep.Targets {
		require.NotNil(t, tg.Met)
		assert.True(t, *tg.Met, "%s: %s: %s", tg.Scenario, tg.Target, tg.Measured)
	}

	// Make memctl miss: slow back, A/A disagreeing, trims too long, RSS and
	// rps worse than plain.
	set := func(scen, key, arm string, runs ...Obs) {
		for i, s := range rep.Scenarios {
			if s.Name != scen {
				continue
			}
			for j, f := range s.Figures {
				if f.Key == key {
					rep.Scenarios[i].Figures[j].Arms[arm] = summarize(runs)
				}
			}
		}
	}
	set("burst", "back_within_10pct", "memctl", v(3.2))
	set("burst", "rss_3s", "memctl-aa", v(34*mib)) // +10 MiB: over plain + FreeOSMemory's +4 and 5.1 MiB
	set("cadence", "trim_share", "memctl-aa", v(0.021))
	set("cadence", "mean_rss", "memctl", v(130*mib))
	set("http", "rps_vs_plain", "memctl", v(0.979))
	got := targets(rep)
	require.Len(t, got, 6)
	for i, tg := range got {
		require.NotNil(t, tg.Met)
		if i == 1 {
			assert.True(t, *tg.Met, "plain still not back")
			continue
		}
		assert.False(t, *tg.Met, "%s: %s: %s", tg.Scenario, tg.Target, tg.Measured)
	}
	assert.Equal(t, "largest difference 34.4% (back within 10%)", got[2].Measured, "relative to the memctl arm: |3.2-2.1|/3.2")

	// An Over A/A against a plain memctl value cannot agree.
	set("burst", "rss_3s", "memctl-aa", v(27*mib))
	set("burst", "back_within_10pct", "memctl-aa", over(30))
	got = targets(rep)
	assert.False(t, *got[2].Met)
	assert.Contains(t, got[2].Measured, "not comparable: back within 10%: 3.2 s vs > 30 s")

	// A window shorter than 30 s cannot show that plain is not back in 30 s.
	rep = fakeReport(t, defaultParams(true))
	set("burst", "back_within_10pct", "plain", over(3.5))
	got = targets(rep)
	rep.Targets = got
	assert.Nil(t, got[1].Met)
	assert.Contains(t, got[1].Measured, "shorter than 30 s")
	var b bytes.Buffer
	require.NoError(t, writeMarkdown(&b, rep))
	assert.Contains(t, b.String(), "| not judged (window shorter than 30 s) |")
}

// A -quick run judges the burst RSS target only; the rest say why not.
func TestTargetsQuick(t *testing.T) {
	rep := fakeReport(t, defaultParams(true))
	rep.Quick, rep.Runs = true, 1
	rep.Targets = targets(rep)
	require.Len(t, rep.Targets, 6)
	require.NotNil(t, rep.Targets[0].Met, "the burst RSS target is judged")
	assert.True(t, *rep.Targets[0].Met)
	for _, tg := range rep.Targets[1:] {
		assert.Nil(t, tg.Met, tg.Target)
		assert.Equal(t, "quick run", tg.NotJudged, tg.Target)
	}
	var b bytes.Buffer
	require.NoError(t, writeMarkdown(&b, rep))
	assert.Equal(t, 5, strings.Count(b.String(), "| not judged (quick run) |"))
	assert.NotContains(t, b.String(), "**no**")
	assert.Contains(t, b.String(), "the full run (`go run ./bench`) judges the rest")
}

// burstReport is a report of the burst scenario alone with one run per arm
// of the given RSS before and 3 s after the burst, in MiB (NaN: NA); an arm
// missing from rss is left out of the report, as in one written before it.
func burstReport(rss map[string][2]float64) *Report {
	p := defaultParams(false)
	rep := &Report{Params: p, Runs: 1}
	obs := map[string]map[string][]Obs{}
	for _, a := range arms {
		obs[a.Key] = map[string][]Obs{}
		r, ok := rss[a.Key]
		if !ok {
			continue
		}
		rep.Arms = append(rep.Arms, ArmInfo{arm: a, GoMemLimit: math.MaxInt64})
		for i, key := range []string{"rss_before", "rss_3s"} {
			o := v(r[i] * mib)
			if math.IsNaN(r[i]) {
				o = Obs{NA: true}
			}
			obs[a.Key][key] = []Obs{o}
		}
	}
	sr := collate(burstScenario, p, obs)
	for _, f := range sr.Figures {
		for k := range f.Arms {
			if _, ok := rss[k]; !ok {
				delete(f.Arms, k) // not in the report at all
			}
		}
	}
	rep.Scenarios = []ScenarioReport{sr}
	return rep
}

// The burst RSS target compares memctl's rise with plain Go's calling
// debug.FreeOSMemory at the trim's moment, 0.5% of the burst (5.12 MiB for
// 1 GiB) allowed over it; a report without that arm falls back to the
// fixed rule, 0.5% of the burst over the pre-burst RSS.
func TestBurstRSSTarget(t *testing.T) {
	floor := 0.005 * float64(defaultParams(false).Burst) / mib
	nan := math.NaN()
	for _, c := range []struct {
		name string
		rss  map[string][2]float64 // arm: before, 3 s after (MiB)
		met  *bool                 // nil: not judged
		want string                // in Target
	}{
		{"control +6, memctl +8: met",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 38}, "memctl-aa": {30, 38}, "freeos": {30, 36}},
			verdict(true), "plain Go's with debug.FreeOSMemory at the trim's moment"},
		{"control +6, memctl +12: missed",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 42}, "memctl-aa": {30, 38}, "freeos": {30, 36}},
			verdict(false), "A/A too"},
		{"control +6, A/A +12: missed",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 38}, "memctl-aa": {30, 42}, "freeos": {30, 36}},
			verdict(false), "A/A too"},
		{"at control + floor: met",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 36 + floor}, "memctl-aa": {30, 36 + floor}, "freeos": {30, 36}},
			verdict(true), "+ 0.5% of the burst (5.1 MiB)"},
		{"one page over control + floor: missed",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 36 + floor + 4096.0/mib}, "memctl-aa": {30, 36}, "freeos": {30, 36}},
			verdict(false), "+ 0.5% of the burst (5.1 MiB)"},
		{"no freeos arm, memctl +5: the fixed rule, met",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 35}, "memctl-aa": {30, 35}},
			verdict(true), "the fixed rule: the report has no plain + FreeOSMemory arm"},
		{"no freeos arm, memctl +8: the fixed rule, missed",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 38}, "memctl-aa": {30, 35}},
			verdict(false), "at most the pre-burst RSS + 0.5% of the burst (5.1 MiB)"},
		{"control NA 3 s after: not judged",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 38}, "memctl-aa": {30, 38}, "freeos": {30, nan}},
			nil, "FreeOSMemory"},
		{"memctl NA 3 s after: not judged",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, nan}, "memctl-aa": {30, 38}, "freeos": {30, 36}},
			nil, "FreeOSMemory"},
		{"no freeos arm, A/A NA: not judged",
			map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 35}, "memctl-aa": {nan, 35}},
			nil, "the fixed rule"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tg, ok := burstRSSTarget(burstReport(c.rss))
			require.True(t, ok)
			assert.Equal(t, "burst", tg.Scenario)
			assert.Contains(t, tg.Target, c.want)
			if c.met == nil {
				assert.Nil(t, tg.Met, tg.Measured)
				assert.Equal(t, "no RSS 3 s after the burst", tg.NotJudged)
				return
			}
			require.NotNil(t, tg.Met, tg.NotJudged)
			assert.Equal(t, *c.met, *tg.Met, tg.Measured)
			assert.Empty(t, tg.NotJudged)
		})
	}

	tg, _ := burstRSSTarget(burstReport(map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 38}, "memctl-aa": {31, 38.5}, "freeos": {30, 36.4}}))
	assert.Equal(t, "memctl 30 → 38 MiB (+8.0 MiB), A/A 31 → 39 MiB (+7.5 MiB), plain + FreeOSMemory 30 → 36 MiB (+6.4 MiB)", tg.Measured, "every arm's before → after")
	tg, _ = burstRSSTarget(burstReport(map[string][2]float64{"plain": {30, 1060}, "gomemlimit": {30, 1060}, "memctl": {30, 35}, "memctl-aa": {30, 35}}))
	assert.Equal(t, "memctl 30 → 35 MiB (+5.0 MiB), A/A 30 → 35 MiB (+5.0 MiB)", tg.Measured)

	_, ok := burstRSSTarget(&Report{Params: defaultParams(false)})
	assert.False(t, ok, "no burst scenario: no target")
}

func TestReadReport(t *testing.T) {
	rep := fakeReport(t, defaultParams(false))
	var js, want bytes.Buffer
	require.NoError(t, writeJSON(&js, rep))
	require.NoError(t, writeMarkdown(&want, rep))
	path := filepath.Join(t.TempDir(), "r.json")
	require.NoError(t, os.WriteFile(path, js.Bytes(), 0o644))
	got, err := readReport(path)
	require.NoError(t, err)
	var md bytes.Buffer
	require.NoError(t, writeMarkdown(&md, got))
	assert.Equal(t, want.String(), md.String(), "a saved report renders as the original")

	var out, errb bytes.Buffer
	assert.Equal(t, 0, cli([]string{"-from", path, "-svg", "off"}, &out, &errb), errb.String())
	assert.Equal(t, want.String(), out.String())

	for name, body := range map[string]string{
		"bad.json":      "{",
		"scenario.json": `{"scenarios":[{"name":"nope"}]}`,
		"figure.json":   `{"scenarios":[{"name":"burst","figures":[{"key":"nope"}]}]}`,
		"arms.json":     `{"arms":[]}`,
		"armkeys.json":  `{"arms":[{"key":"plain"},{"key":"gomemlimit"},{"key":"memctl"},{"key":"nope"}]}`,
	} {
		p := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		_, err := readReport(p)
		assert.ErrorContains(t, err, p, name)
	}
	_, err = readReport(filepath.Join(t.TempDir(), "missing.json"))
	assert.Error(t, err)
}

// A report written before the freeos arm reads back with its four arms,
// renders without the arm, and its burst RSS target is judged again by the
// fixed rule, which says so.
func TestReadReportBeforeFreeOS(t *testing.T) {
	rep := fakeReport(t, defaultParams(false))
	rep.Arms = slices.DeleteFunc(rep.Arms, func(a ArmInfo) bool { return a.Key == "freeos" })
	for _, s := range rep.Scenarios {
		for _, f := range s.Figures {
			delete(f.Arms, "freeos")
		}
	}
	old := "memctl's RSS 3 s after the burst at most the pre-burst RSS + 0.5% of the burst (5.1 MiB: runtime metadata a trim cannot return)"
	rep.Targets = []Target{{Scenario: "burst", Target: old, Measured: "memctl 24 → 27 MiB, A/A 24 → 27 MiB", Met: verdict(true)}}
	var js bytes.Buffer
	require.NoError(t, writeJSON(&js, rep))
	path := filepath.Join(t.TempDir(), "old.json")
	require.NoError(t, os.WriteFile(path, js.Bytes(), 0o644))
	got, err := readReport(path)
	require.NoError(t, err)
	require.Len(t, got.Arms, 4)
	var md bytes.Buffer
	require.NoError(t, writeMarkdown(&md, got))
	assert.Contains(t, md.String(), "arms interleaved (A B C D A B C D ...)")
	assert.Contains(t, md.String(), "| burst | plain | GOMEMLIMIT only | memctl | memctl (A/A) | A/A Δ |\n")
	assert.NotContains(t, md.String(), "| plain + FreeOSMemory |", "no such column or arm")
	assert.NotContains(t, md.String(), old, "the targets judged again")
	assert.Contains(t, md.String(), "| burst | memctl's RSS 3 s after the burst at most the pre-burst RSS + 0.5% of the burst (5.1 MiB); the fixed rule: the report has no plain + FreeOSMemory arm to compare with | memctl 24 → 27 MiB (+3.0 MiB), A/A 24 → 27 MiB (+3.0 MiB) | yes |")
	tg, ok := burstRSSTarget(got)
	require.True(t, ok)
	assert.Contains(t, tg.Target, "the fixed rule")
	require.NotNil(t, tg.Met)
	assert.True(t, *tg.Met, tg.Measured)
}
