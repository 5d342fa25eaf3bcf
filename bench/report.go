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
