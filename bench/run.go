package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/thp"
)

// config is one run of the harness.
type config struct {
	Runs      int  // runs per arm and scenario
	Quick     bool // -quick (recorded in the report)
	Scenarios []string
	// CgroupLimit is each arm's cgroup memory limit in bytes; 0: no cgroups.
	CgroupLimit int64
	Params      params
	From        string // a saved -json report to render instead of running
	SVGDir      string // where the charts go (svg.go); "": none
}

// defaultConfig is the full run, or with quick the short one.
func defaultConfig(quick bool) config {
	c := config{Runs: 5, Quick: quick, CgroupLimit: 2 << 30, Params: defaultParams(quick)}
	if quick {
		c.Runs = 1
	}
	for _, s := range scenarios {
		c.Scenarios = append(c.Scenarios, s.Name)
	}
	return c
}

// run runs every scenario of cfg, arms interleaved, and returns the report.
func run(cfg config, progress io.Writer) (*Report, error) {
	if cfg.Runs < 1 {
		return nil, fmt.Errorf("bench: runs %d: want at least 1", cfg.Runs)
	}
	var scens []scenario
	for _, name := range cfg.Scenarios {
		s, ok := scenarioByName(name)
		if !ok {
			return nil, fmt.Errorf("bench: unknown scenario %q (want %s)", name, scenarioNames())
		}
		scens = append(scens, s)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep := &Report{
		Started: time.Now().UTC().Truncate(time.Second),
		Machine: machine(),
		Quick:   cfg.Quick,
		Runs:    cfg.Runs,
		Params:  cfg.Params,
	}
	var parent *cgrouptest.Parent
	rep.Cgroup.Note = "cgroups off (-cgroup-limit 0)"
	if cfg.CgroupLimit > 0 {
		if parent, err = cgrouptest.WritableParent(); err != nil {
			rep.Cgroup.Note = "no child memory cgroup could be made here (" + err.Error() + ")"
		} else {
			rep.Cgroup = CgroupInfo{Used: true, Version: parent.Version, LimitBytes: cfg.CgroupLimit}
		}
	}
	if !rep.Cgroup.Used {
		rep.Cgroup.Note += ": the arms ran without a memory limit, so the GOMEMLIMIT arms set none"
	}
	memLimits := make(map[string]int64)
	start := time.Now()
	for _, s := range scens {
		if s.precheck != nil {
			if err := s.precheck(); err != nil {
				fmt.Fprintf(progress, "bench: %s not run: %v\n", s.Name, err)
				rep.Scenarios = append(rep.Scenarios, ScenarioReport{Name: s.Name, Title: s.title(cfg.Params), Notes: []string{"Not run: " + err.Error() + "."}})
				continue
			}
		}
		sr, err := runScenario(exe, s, cfg, parent, memLimits, progress)
		if err != nil {
			return nil, err
		}
		rep.Scenarios = append(rep.Scenarios, sr)
	}
	for _, a := range arms {
		ml, ok := memLimits[a.Key]
		if !ok {
			ml = -1
		}
		rep.Arms = append(rep.Arms, ArmInfo{arm: a, GoMemLimit: ml})
	}
	rep.Targets = targets(rep)
	rep.Seconds = math.Round(time.Since(start).Seconds())
	return rep, nil
}

// runScenario runs the arms of s cfg.Runs times, interleaved, and returns
// its table; memLimits gets each arm's GOMEMLIMIT from its first scenario.
func runScenario(exe string, s scenario, cfg config, parent *cgrouptest.Parent, memLimits map[string]int64, progress io.Writer) (ScenarioReport, error) {
	obs := make(map[string]map[string][]Obs) // arm -> figure -> runs
	traces := make(map[string]Trace)
	for _, a := range arms {
		obs[a.Key] = make(map[string][]Obs)
	}
	for i := range cfg.Runs {
		for _, a := range arms {
			if !s.runs(a) {
				continue
			}
			t0 := time.Now()
			figs, res, tr, err := runOne(exe, s, a, cfg, parent, i)
			if err != nil {
				return ScenarioReport{}, err
			}
			if _, seen := memLimits[a.Key]; !seen {
				// The first scenario's: the load scenarios' cgroups are larger.
				memLimits[a.Key] = res.GoMemLimit
			}
			for _, f := range s.Figures {
				o, ok := figs[f.Key]
				if !ok { // not observed in this run, or derived below
					o = Obs{NA: true}
				}
				obs[a.Key][f.Key] = append(obs[a.Key][f.Key], o)
			}
			if i == 0 && len(tr.RSS) > 0 {
				traces[a.Key] = tr
			}
			fmt.Fprintf(progress, "bench: %s run %d/%d %-10s %5.1fs  %s\n", s.Name, i+1, cfg.Runs, a.Key, time.Since(t0).Seconds(), brief(s, figs))
		}
	}
	if s.derive != nil {
		s.derive(obs)
	}
	sr := collate(s, cfg.Params, obs)
	if len(traces) > 0 {
		sr.Traces = traces
	}
	return sr, nil
}

// runOne runs arm a of scenario s once, in a cgroup when parent is not nil.
func runOne(exe string, s scenario, a arm, cfg config, parent *cgrouptest.Parent, run int) (figs map[string]Obs, res childResult, tr Trace, err error) {
	spec := s.Name + "/" + a.Key
	limit := cfg.CgroupLimit
	if s.cgroupLimit != nil {
		limit = max(limit, s.cgroupLimit(cfg.Params))
	}
	pr, err := startArm(exe, spec, cfg.Params, parent, fmt.Sprintf("memctl-bench%s-%d-%s-%s-%d", tagSuffix(), os.Getpid(), s.Name, a.Key, run), limit)
	if err != nil {
		return nil, childResult{}, tr, err
	}
	defer func() {
		err = errors.Join(err, pr.abort()) // after an error, retries what is left
		pr.untrack()
	}()
	figs, tr = s.observe(pr, cfg.Params)
	if res = pr.finish(); pr.fail != nil {
		return nil, res, tr, pr.fail
	}
	for k, v := range res.Extra {
		figs[k] = Obs{Value: v}
	}
	tr.complete(res)
	return figs, res, tr, nil
}

// startArm starts the arm, in a new cgroup name under a non-nil parent,
// tracked for abortRunning; after an interrupt it starts nothing.
func startArm(exe, spec string, p params, parent *cgrouptest.Parent, name string, limit int64) (*proc, error) {
	running.Lock()
	defer running.Unlock()
	if running.stopped {
		return nil, fmt.Errorf("bench: %s not started: interrupted", spec)
	}
	var cg *cgrouptest.Child
	if parent != nil {
		var err error
		if cg, err = parent.NewChild(name, limit); err != nil {
			return nil, fmt.Errorf("bench: cgroup for %s: %w", spec, err)
		}
	}
	pr, err := startProc(exe, spec, p, cg)
	if err != nil {
		if cg != nil {
			err = errors.Join(err, cg.Remove())
		}
		return nil, err
	}
	running.procs[pr] = true
	return pr, nil
}

// deriveRatio adds figure to, per arm and run: the arm's figure from over
// the plain arm's in the same round, so that the machine's drift cancels.
func deriveRatio(obs map[string]map[string][]Obs, from, to string) {
	plain := obs["plain"][from]
	for _, a := range arms {
		runs := obs[a.Key][from]
		out := make([]Obs, len(runs))
		for i, o := range runs {
			if i >= len(plain) || plain[i].NA || o.NA || plain[i].Value == 0 {
				out[i] = Obs{NA: true}
				continue
			}
			out[i] = Obs{Value: o.Value / plain[i].Value}
		}
		obs[a.Key][to] = out
	}
}

// collate summarizes each figure of each arm.
func collate(s scenario, p params, obs map[string]map[string][]Obs) ScenarioReport {
	sr := ScenarioReport{Name: s.Name, Title: s.title(p)}
	for _, f := range s.Figures {
		fr := FigureReport{Key: f.Key, Label: f.Label, Unit: f.Unit, Arms: make(map[string]Summary)}
		for _, a := range arms {
			fr.Arms[a.Key] = summarize(obs[a.Key][f.Key])
		}
		sr.Figures = append(sr.Figures, fr)
	}
	if s.Name == "burst" && p.Window < 10*time.Second {
		sr.Notes = append(sr.Notes, fmt.Sprintf("–: after the %s observation window.", secs(p.Window)))
	}
	return sr
}

// brief is a progress line's summary of one run's figures.
func brief(s scenario, figs map[string]Obs) string {
	var parts []string
	for _, f := range s.Figures {
		if o, ok := figs[f.Key]; ok {
			parts = append(parts, f.Key+"="+formatObs(f.Unit, o))
		}
	}
	return strings.Join(parts, " ")
}

// machine describes where the harness runs.
func machine() Machine {
	m := Machine{Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if s, err := thp.System(); err == nil {
		m.THP = string(s.Enabled)
	}
	return m
}
