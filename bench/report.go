package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// Report is the result of a run of the harness; -json writes it as is.
type Report struct {
	Started   time.Time        `json:"started"`
	Seconds   float64          `json:"seconds"` // the run's wall time
	Machine   Machine          `json:"machine"`
	Quick     bool             `json:"quick"`
	Runs      int              `json:"runs"`
	Cgroup    CgroupInfo       `json:"cgroup"`
	Params    params           `json:"params"`
	Arms      []ArmInfo        `json:"arms"`
	Scenarios []ScenarioReport `json:"scenarios"`
	Targets   []Target         `json:"targets"`
}

// Machine describes where the run took place.
type Machine struct {
	Go         string `json:"go"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Kernel     string `json:"kernel,omitempty"`
	THP        string `json:"thp,omitempty"` // the system's THP mode
}

// CgroupInfo says whether the arms ran in child memory cgroups.
type CgroupInfo struct {
	Used       bool   `json:"used"`
	Version    int    `json:"version,omitempty"`
	LimitBytes int64  `json:"limit_bytes,omitempty"`
	Note       string `json:"note,omitempty"`
}

// ArmInfo is one arm and the GOMEMLIMIT its children ran with, in bytes
// (math.MaxInt64: none; -1: no child ran).
type ArmInfo struct {
	arm
	GoMemLimit int64 `json:"gomemlimit_bytes"`
}

// ScenarioReport is one scenario's table, and the traces of its charts.
type ScenarioReport struct {
	Name    string         `json:"name"`
	Title   string         `json:"title"`
	Figures []FigureReport `json:"figures"`
	Notes   []string       `json:"notes,omitempty"`
	// Traces are each arm's first run over time, by arm key (trace.go);
	// none in http or in a report written before they were kept.
	Traces map[string]Trace `json:"traces,omitempty"`
}

// FigureReport is one row: a figure summarized per arm (keyed by arm key).
type FigureReport struct {
	Key   string             `json:"key"`
	Label string             `json:"label"`
	Unit  unit               `json:"unit"`
	Arms  map[string]Summary `json:"arms"`
}

// Target is one target checked against the medians.
type Target struct {
	Scenario string `json:"scenario"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Met is null when the run could not judge the target; NotJudged then
	// says why.
	Met       *bool  `json:"met"`
	NotJudged string `json:"not_judged,omitempty"`
}

// notJudgedQuick is Target.NotJudged for a target one short run per arm
// cannot tell from noise.
const notJudgedQuick = "quick run"

// burstFloor is the share of the burst by which memctl's RSS rise may
// exceed freeos's (noise), or without freeos the whole rise allowed (the
// burst heap's runtime metadata, which no trim returns).
const burstFloor = 0.005

// writeJSON writes rep as indented JSON.
func writeJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// readReport reads a report writeJSON wrote to path, restores the units and
// titles from the scenario definitions and judges the targets again; an
// unknown scenario or figure is an error.
func readReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	for i, s := range rep.Scenarios {
		sc, ok := scenarioByName(s.Name)
		if !ok {
			return nil, fmt.Errorf("bench: %s: unknown scenario %q", path, s.Name)
		}
		for j, f := range s.Figures {
			k := slices.IndexFunc(sc.Figures, func(d figureDef) bool { return d.Key == f.Key })
			if k < 0 {
				return nil, fmt.Errorf("bench: %s: scenario %s: unknown figure %q", path, s.Name, f.Key)
			}
			rep.Scenarios[i].Figures[j].Unit = sc.Figures[k].Unit
		}
		rep.Scenarios[i].Title = sc.title(rep.Params)
	}
	if err := checkArms(rep.Arms); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	rep.Targets = targets(&rep)
	return &rep, nil
}

// checkArms checks that a report's arms are this harness's, in order, with
// or without freeos (a report written before it).
func checkArms(got []ArmInfo) error {
	var keys, want []string
	for _, a := range got {
		keys = append(keys, a.Key)
	}
	for _, a := range arms {
		want = append(want, a.Key)
	}
	before := slices.DeleteFunc(slices.Clone(want), func(k string) bool { return k == "freeos" })
	if slices.Equal(keys, want) || slices.Equal(keys, before) {
		return nil
	}
	return fmt.Errorf("arms %q, want %q (or %q, written before the freeos arm)", keys, want, before)
}

// writeMarkdown writes rep as Markdown.
func writeMarkdown(w io.Writer, rep *Report) error {
	var b strings.Builder
	m := rep.Machine
	fmt.Fprintf(&b, "%s %s/%s, %d CPUs (GOMAXPROCS %d)", m.Go, m.OS, m.Arch, m.CPUs, m.GOMAXPROCS)
	if m.Kernel != "" {
		fmt.Fprintf(&b, ", Linux %s", m.Kernel)
	}
	if m.THP != "" {
		fmt.Fprintf(&b, ", THP %s", m.THP)
	}
	mode := ""
	if rep.Quick {
		mode = " (-quick)"
	}
	round := strings.Join(strings.Split("ABCDEFGHIJ", "")[:min(len(rep.Arms), 10)], " ")
	fmt.Fprintf(&b, ". %d run(s) per arm%s, arms interleaved (%s %s ...); each cell is the median over the runs", rep.Runs, mode, round, round)
	if rep.Runs > 1 {
		b.WriteString(", with (min – max) where they differ")
	}
	fmt.Fprintf(&b, ". Started %s, took %s.\n\n", rep.Started.Format(time.RFC3339), (time.Duration(rep.Seconds) * time.Second).String())
	if rep.Cgroup.Used {
		fmt.Fprintf(&b, "Cgroups: each arm ran in its own child memory cgroup (v%d, limit %s MiB each).\n\n", rep.Cgroup.Version, mibs(rep.Cgroup.LimitBytes))
	} else {
		fmt.Fprintf(&b, "Cgroups: none; %s.\n\n", rep.Cgroup.Note)
	}

	row := func(cells ...string) { fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | ")) }
	row("arm", "what it runs", "GOMEMLIMIT (MiB)")
	row("---", "---", "---")
	for _, a := range rep.Arms {
		row(a.Label, a.Desc, formatMemLimit(a.GoMemLimit))
	}
	for _, s := range rep.Scenarios {
		fmt.Fprintf(&b, "\n### %s\n\n", s.Title)
		head := []string{s.Name}
		for _, a := range rep.Arms {
			head = append(head, a.Label)
		}
		row(append(head, "A/A Δ")...)
		row(slices.Repeat([]string{"---"}, len(rep.Arms)+2)...)
		for _, f := range s.Figures {
			cells := []string{f.Label}
			for _, a := range rep.Arms {
				cells = append(cells, formatCell(f.Unit, f.Arms[a.Key]))
			}
			row(append(cells, formatAA(f))...)
		}
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "\n%s\n", n)
		}
	}
	if len(rep.Targets) > 0 {
		b.WriteString("\n### Targets\n\n")
		row("scenario", "target", "measured (medians)", "met")
		row("---", "---", "---", "---")
		for _, t := range rep.Targets {
			met := "not judged"
			if t.NotJudged != "" {
				met += " (" + t.NotJudged + ")"
			}
			if t.Met != nil {
				met = map[bool]string{true: "yes", false: "**no**"}[*t.Met]
			}
			row(t.Scenario, t.Target, t.Measured, met)
		}
		if rep.Quick {
			b.WriteString("\nA -quick run judges only what one short run can show; the full run (`go run ./bench`) judges the rest.\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// formatMemLimit renders an arm's GOMEMLIMIT in MiB for the arms table.
func formatMemLimit(b int64) string {
	switch {
	case b < 0:
		return "– (not run)"
	case b == math.MaxInt64:
		return "none"
	}
	return mibs(b)
}

// formatAA renders the A/A column: relDiff of the memctl and A/A medians.
func formatAA(f FigureReport) string {
	d, ok := relDiff(f.Arms["memctl"].Median, f.Arms["memctl-aa"].Median)
	switch {
	case !ok:
		return "–"
	case math.IsInf(d, 1):
		return "∞"
	}
	return fmt.Sprintf("%.1f%%", d*100)
}

// figure returns the figure key of scenario name, if it ran.
func (rep *Report) figure(name, key string) (FigureReport, bool) {
	s, _ := rep.scenario(name)
	return find(s.Figures, func(f FigureReport) bool { return f.Key == key })
}

// scenario returns the scenario name, if it ran.
func (rep *Report) scenario(name string) (ScenarioReport, bool) {
	return find(rep.Scenarios, func(s ScenarioReport) bool { return s.Name == name })
}

// find returns the first element of xs that match accepts.
func find[T any](xs []T, match func(T) bool) (T, bool) {
	var zero T
	if i := slices.IndexFunc(xs, match); i >= 0 {
		return xs[i], true
	}
	return zero, false
}

// targets checks the targets against the report's medians; one whose
// scenario or figure did not run is left out.
func targets(rep *Report) []Target {
	var ts []Target
	if t, ok := burstRSSTarget(rep); ok {
		ts = append(ts, t)
	}
	judged := len(ts) // in a -quick run: one short run of each arm cannot judge the rest
	for _, target := range []func(*Report) (Target, bool){burstPlainTarget, burstAATarget} {
		if t, ok := target(rep); ok {
			ts = append(ts, t)
		}
	}
	ts = append(ts, ruleTargets(rep)...)
	for i := judged; rep.Quick && i < len(ts); i++ {
		ts[i].Met, ts[i].NotJudged = nil, notJudgedQuick
	}
	return ts
}

// verdict returns a pointer to v, for Target.Met.
func verdict(v bool) *bool { return &v }

// median returns arm's median of f (the zero Obs when it has none).
func median(f FigureReport, arm string) Obs { return f.Arms[arm].Median }

// medianCell renders arm's median of f in its unit.
func medianCell(f FigureReport, arm string) string { return formatObs(f.Unit, median(f, arm)) }

// burstRSSTarget checks that the RSS rise 3 s after the burst (of the
// medians) of memctl and its A/A is at most the freeos arm's plus
// burstFloor of the burst; without a freeos arm, at most burstFloor of the
// burst, and the target says so. Unjudged when a median is missing; false
// without the figures.
func burstRSSTarget(rep *Report) (Target, bool) {
	before, ok1 := rep.figure("burst", "rss_before")
	after, ok2 := rep.figure("burst", "rss_3s")
	if !ok1 || !ok2 {
		return Target{}, false
	}
	slack := burstFloor * float64(rep.Params.Burst)
	share := fmt.Sprintf("%.1f%% of the burst (%.1f MiB)", burstFloor*100, slack/(1<<20))
	rise := func(arm string) (float64, bool) {
		b, a := median(before, arm), median(after, arm)
		if b.NA || a.NA || b.Over || a.Over {
			return 0, false
		}
		return a.Value - b.Value, true
	}
	arrow := func(name, arm string) string {
		s := fmt.Sprintf("%s %s → %s MiB", name, medianCell(before, arm), medianCell(after, arm))
		if r, ok := rise(arm); ok {
			s += fmt.Sprintf(" (%+.1f MiB)", r/(1<<20))
		}
		return s
	}
	t := Target{Scenario: "burst"}
	var bound float64 // the largest rise allowed
	_, control := before.Arms["freeos"]
	_, controlAfter := after.Arms["freeos"]
	control = control && controlAfter
	m, okm := rise("memctl")
	aa, okaa := rise("memctl-aa")
	judged := okm && okaa
	if control {
		t.Target = "memctl's RSS rise 3 s after the burst at most plain Go's with debug.FreeOSMemory at the trim's moment + " + share + ", A/A too"
		t.Measured = strings.Join([]string{arrow("memctl", "memctl"), arrow("A/A", "memctl-aa"), arrow("plain + FreeOSMemory", "freeos")}, ", ")
		fo, okfo := rise("freeos")
		judged = judged && okfo
		bound = fo + slack
	} else {
		t.Target = "memctl's RSS 3 s after the burst at most the pre-burst RSS + " + share + "; the fixed rule: the report has no plain + FreeOSMemory arm to compare with"
		t.Measured = arrow("memctl", "memctl") + ", " + arrow("A/A", "memctl-aa")
		bound = slack
	}
	if judged {
		t.Met = verdict(m <= bound && aa <= bound)
	} else {
		t.NotJudged = "no RSS 3 s after the burst"
	}
	return t, true
}

// burstPlainTarget checks that plain Go is not back within 10% of its
// pre-burst RSS in 30 s (unjudged in a shorter window).
func burstPlainTarget(rep *Report) (Target, bool) {
	f, ok := rep.figure("burst", "back_within_10pct")
	if !ok {
		return Target{}, false
	}
	t := Target{
		Scenario: "burst",
		Target:   "plain Go not back within 10% in 30 s",
		Measured: "plain " + medianCell(f, "plain"),
	}
	if p := median(f, "plain"); p.Over && p.Value >= 30 {
		t.Met = verdict(true)
	} else if !p.NA && !p.Over {
		t.Met = verdict(p.Value > 30)
	} else {
		t.Measured += fmt.Sprintf(" (the %s window is shorter than 30 s)", secs(rep.Params.Window))
		t.NotJudged = "window shorter than 30 s"
	}
	return t, true
}

// burstAATarget checks that memctl and its A/A agree within 5% (relDiff) on
// every burst figure either has; one they cannot be compared on misses.
func burstAATarget(rep *Report) (Target, bool) {
	s, ok := rep.scenario("burst")
	if !ok {
		return Target{}, false
	}
	worst, worstLabel, bad := 0.0, "", []string{}
	for _, f := range s.Figures {
		m, aa := median(f, "memctl"), median(f, "memctl-aa")
		if m.NA && aa.NA {
			continue
		}
		d, ok := relDiff(m, aa)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: %s vs %s", f.Label, medianCell(f, "memctl"), medianCell(f, "memctl-aa")))
			continue
		}
		if d >= worst {
			worst, worstLabel = d, f.Label
		}
	}
	measured := fmt.Sprintf("largest difference %.1f%% (%s)", worst*100, worstLabel)
	if len(bad) > 0 {
		measured += "; not comparable: " + strings.Join(bad, ", ")
	}
	return Target{
		Scenario: "burst",
		Target:   "the A/A arms agree within 5% on every figure",
		Measured: measured,
		Met:      verdict(len(bad) == 0 && worst <= 0.05),
	}, true
}

// rule is a target that memctl and its A/A must each meet on the median of
// one figure: pass gets the arm's value and plain Go's median.
type rule struct {
	scenario, figure, target string
	measured                 string   // a format with a %s per arm of arms
	arms                     []string // their medians, in measured
	pass                     func(v float64, plain Obs) bool
}

var (
	aaArms      = []string{"memctl", "memctl-aa"}
	aaPlainArms = []string{"memctl", "memctl-aa", "plain"}
)

func atMost(x float64) func(float64, Obs) bool  { return func(v float64, _ Obs) bool { return v <= x } }
func atLeast(x float64) func(float64, Obs) bool { return func(v float64, _ Obs) bool { return v >= x } }

// rules are the targets judged this way, in the report's order.
var rules = []rule{
	{"cadence", "trim_share", "trims take at most 2% of wall time", "memctl %s, A/A %s", aaArms, atMost(0.02)},
	{"cadence", "mean_rss", "memctl's mean RSS below plain Go's", "memctl %s MiB, A/A %s MiB, plain %s MiB", aaPlainArms,
		func(v float64, plain Obs) bool { return !plain.NA && v < plain.Value }},
	{"http", "rps_vs_plain", "the budget middleware costs at most 2% of requests per second",
		"memctl/plain %s, A/A/plain %s, GOMEMLIMIT only/plain %s", []string{"memctl", "memctl-aa", "gomemlimit"}, atLeast(0.98)},
	{"load", "p99_vs_plain", "memctl's p99 latency within 10% of plain's (same round), A/A too", "memctl/plain %s, A/A/plain %s", aaArms, atMost(1.1)},
	{"load", "trim_cpu_share", trimCPUTarget, "memctl %s, A/A %s", aaArms, atMost(0.02)},
	// In load no natural GC cycle precedes the trim, so the trim runs the
	// GC that frees the burst; in load-gc natural cycles collect it first.
	{"load", "p99_trim_ratio", trimRatioTarget, "memctl %s, A/A %s", aaArms, atMost(1.3)},
	{"load-contended", "trim_cpu_share", trimCPUTarget, "memctl %s, A/A %s", aaArms, atMost(0.02)},
	{"load-contended", "bursts_back", burstsBackTarget, "memctl %s, A/A %s, plain %s", aaPlainArms, atLeast(0.9)},
	{"load-gc", "trim_cpu_share", trimCPUTarget, "memctl %s, A/A %s", aaArms, atMost(0.02)},
	{"load-gc", "p99_trim_ratio", trimRatioTarget, "memctl %s, A/A %s", aaArms, atMost(1.3)},
	{"load-gc", "gc_forced", "no forced GC cycle (the trims return the collected bursts without a GC)", "memctl %s, A/A %s", aaArms,
		func(v float64, _ Obs) bool { return v == 0 }},
	{"load-gc", "bursts_back", burstsBackTarget, "memctl %s, A/A %s, plain %s", aaPlainArms, atLeast(0.9)},
}

const (
	trimCPUTarget    = "trim CPU at most 2% of wall time"
	trimRatioTarget  = "p99 of requests overlapping a trim at most 1.3 × the others' (same run), A/A too"
	burstsBackTarget = "RSS 3.5 s after a burst below 1.2 × pre-burst for at least 90% of bursts"
)

// ruleTargets judges the rules whose figure is in the report.
func ruleTargets(rep *Report) []Target {
	var ts []Target
	for _, r := range rules {
		f, ok := rep.figure(r.scenario, r.figure)
		if !ok {
			continue
		}
		var cells []any
		for _, a := range r.arms {
			cells = append(cells, medianCell(f, a))
		}
		t := Target{Scenario: r.scenario, Target: r.target, Measured: fmt.Sprintf(r.measured, cells...)}
		if pl, ok := rep.figure(r.scenario, "p99_placebo_ratio"); ok && r.figure == "p99_trim_ratio" {
			t.Measured += fmt.Sprintf("; placebo windows %s, %s", medianCell(pl, "memctl"), medianCell(pl, "memctl-aa"))
		}
		m, aa, plain := median(f, "memctl"), median(f, "memctl-aa"), median(f, "plain")
		t.Met = verdict(!m.NA && !aa.NA && r.pass(m.Value, plain) && r.pass(aa.Value, plain))
		ts = append(ts, t)
	}
	return ts
}
