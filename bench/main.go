// Command bench is memctl's A/B harness: it runs each scenario (burst,
// cadence, http, load, load-contended, load-gc) in up to five arms (plain
// Go; GOMEMLIMIT only; memctl; an A/A copy of memctl, the noise floor; and
// in burst plain Go with debug.FreeOSMemory one trim delay after the
// burst), each a child process of this binary, -runs times interleaved, and
// prints a Markdown table per scenario: the median of each figure, with the
// min and max (JSON with -json). docs/benchmarks.md describes the
// scenarios, arms, figures and targets, and holds the last results.
//
//	go run ./bench                 # full run, 5 runs per arm
//	go run ./bench -quick          # 1 run per arm, short windows
//	go run ./bench -from out.json  # a saved -json report as Markdown
//	go run ./bench -runs 3 -json -svg docs/bench > docs/bench/report.json  # docs/benchmarks.md's run
//
// Where it can (root, a writable memory cgroup), each child runs in a
// memory cgroup of its own (-cgroup-limit), tagged with MEMCTL_BENCH_TAG
// when set and removed when its arm ends, or on SIGINT or SIGTERM, which
// stop the arms and exit with status 130. The arms' environment is the
// harness's less GOMEMLIMIT, AUTOMEMLIMIT and MEMCTL*. -svg DIR draws each
// arm's RSS over time (bench-SCENARIO.svg) and the load scenarios' p99
// (bench-SCENARIO-p99.svg) from each arm's first run.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/memctl/memctl/internal/bytesize"
)

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec))
	}
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli parses args, runs the harness and writes the report to stdout; it
// returns the exit status (2 for bad flags).
func cli(args []string, stdout, stderr io.Writer) int {
	cfg, asJSON, err := parseFlags(args, stderr)
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(stderr, err)
		return 2
	}
	if cfg.SVGDir != "" {
		if err := checkSVGDir(cfg.SVGDir); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	var rep *Report
	if cfg.From != "" {
		rep, err = readReport(cfg.From)
	} else {
		stop := abortOnSignal(stderr)
		rep, err = run(cfg, stderr)
		stop()
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if asJSON {
		err = writeJSON(stdout, rep)
	} else {
		err = writeMarkdown(stdout, rep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if cfg.SVGDir == "" {
		return 0
	}
	paths, err := writeSVGs(cfg.SVGDir, rep)
	for _, p := range paths {
		fmt.Fprintln(stderr, "bench: wrote", p)
	}
	switch {
	case err != nil:
		fmt.Fprintln(stderr, err)
		return 1
	case len(paths) == 0:
		fmt.Fprintln(stderr, "bench: -svg: no scenario of the report has traces (http has none; a report written before they were kept has none): no chart written")
	}
	return 0
}

// abortOnSignal makes SIGINT and SIGTERM abort the running arms and exit
// 130; stop undoes it. Once an abort began, stop does not return, so that
// the run it ended cannot exit with its own status first.
func abortOnSignal(stderr io.Writer) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var mu sync.Mutex // an abort holds it until the process exits
	stopped := false
	go func() {
		sig := <-sigs
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		fmt.Fprintf(stderr, "bench: %v: stopping the running arms and removing their cgroups\n", sig)
		if err := abortRunning(); err != nil {
			fmt.Fprintln(stderr, err)
		}
		os.Exit(130)
	}()
	return func() {
		signal.Stop(sigs)
		mu.Lock()
		stopped = true
		mu.Unlock()
		close(sigs) // ends the goroutine; nothing sends on sigs after signal.Stop
	}
}

// parseFlags turns the command line into a config; the other flags
// override -quick's defaults.
func parseFlags(args []string, stderr io.Writer) (config, bool, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "1 run per arm, a 3.5 s burst window, a 5 s cadence window (bursts 2.5 s apart), 10,000 requests, one burst per load scenario: about 3 minutes on 2 cores")
	runs := fs.Int("runs", 0, "runs per arm (default 5, or 1 with -quick)")
	asJSON := fs.Bool("json", false, "write the report as JSON instead of Markdown")
	scens := fs.String("scenarios", scenarioNames(), "comma-separated scenarios to run")
	limit := fs.String("cgroup-limit", "2GiB", "memory limit of each arm's child cgroup (bytes, or with KiB, MiB, GiB); 0 runs without cgroups")
	window := fs.Duration("window", 0, "burst: how long RSS is observed after the burst (default 30s, or 3.5s with -quick)")
	cadenceFor := fs.Duration("cadence-for", 0, "cadence: length of the window (default 60s, or 5s with -quick)")
	requests := fs.Int("requests", 0, "http: measured requests per run (default 100000, or 10000 with -quick)")
	trimDelay := fs.Duration("trim-delay", 0, "the memctl arms' trim delay (default memctl's, 2s)")
	from := fs.String("from", "", "do not run: read a report written by -json from this file and write it again (as Markdown without -json; its targets judged again), and its charts (-svg)")
	svg := fs.String("svg", ".", "write one SVG chart per scenario (bench-SCENARIO.svg; bench-SCENARIO-p99.svg too for the load scenarios) into this directory, made if missing; \"\" or off: none")
	if err := fs.Parse(args); err != nil {
		return config{}, false, err
	}
	if fs.NArg() > 0 {
		return config{}, false, fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	for _, f := range []struct {
		name     string
		negative bool
		value    any
	}{
		{"-runs", *runs < 0, *runs}, {"-requests", *requests < 0, *requests},
		{"-window", *window < 0, *window}, {"-cadence-for", *cadenceFor < 0, *cadenceFor}, {"-trim-delay", *trimDelay < 0, *trimDelay},
	} {
		if f.negative {
			return config{}, false, fmt.Errorf("bench: %s %v: want a positive value", f.name, f.value)
		}
	}
	cfg := defaultConfig(*quick)
	cfg.Runs = cmp.Or(*runs, cfg.Runs)
	cfg.Scenarios = nil
	for _, s := range strings.Split(*scens, ",") {
		s = strings.TrimSpace(s)
		if _, ok := scenarioByName(s); !ok {
			return config{}, false, fmt.Errorf("bench: -scenarios: unknown scenario %q (want %s)", s, scenarioNames())
		}
		cfg.Scenarios = append(cfg.Scenarios, s)
	}
	l, err := bytesize.Parse(*limit)
	if err != nil {
		return config{}, false, fmt.Errorf("-cgroup-limit: %w", err)
	}
	cfg.CgroupLimit = l
	cfg.Params.Window = cmp.Or(*window, cfg.Params.Window)
	cfg.Params.CadenceFor = cmp.Or(*cadenceFor, cfg.Params.CadenceFor)
	cfg.Params.Requests = cmp.Or(*requests, cfg.Params.Requests)
	cfg.Params.TrimDelay = *trimDelay
	cfg.From = *from
	if *svg != "off" {
		cfg.SVGDir = *svg
	}
	return cfg, *asJSON, nil
}
