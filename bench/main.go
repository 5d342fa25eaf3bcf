// Command bench is memctl's A/B harness: it runs the same scenarios in up to
// five arms, each a child process of this same binary, and prints a Markdown
// table per scenario with the arms as columns (or JSON with -json).
// docs/benchmarks.md describes each figure and target and holds the last
// results.
//
//	go run ./bench                 # full run, 5 runs per arm: about 85 minutes on 2 cores
//	go run ./bench -quick          # 1 run per arm, short windows: about 3 minutes
//	go run ./bench -json > out.json
//	go run ./bench -from out.json  # the saved report as Markdown
//	go run ./bench -runs 3 -json -svg docs/bench > docs/bench/report.json  # docs/benchmarks.md's run
//
// Arms: plain Go (defaults); GOMEMLIMIT only (limits.SetGoMemLimit alone);
// memctl (memctl.Start with defaults, AfterBurst after each burst); an A/A
// arm identical to memctl, whose distance from it is the noise floor; and,
// in burst only, plain + FreeOSMemory (debug.FreeOSMemory one trim delay
// after each burst). An arm a scenario does not run shows "–". Arms run
// interleaved (A B C D E A B C D E ...), -runs times each (default 5); each
// figure is the median over the runs, with the min and max. Where it can
// (root, a writable memory cgroup), the harness runs each child in a child
// memory cgroup of its own with the same limit (-cgroup-limit, default
// 2 GiB), so that the GOMEMLIMIT arms have a limit to read, and says
// whether it did. Its cgroups (tagged with MEMCTL_BENCH_TAG when set) are
// removed when each arm ends, failing or not, and on SIGINT or SIGTERM,
// which stop the running arms before the harness exits (status 130). The
// arms' environment is the harness's less GOMEMLIMIT, AUTOMEMLIMIT and
// MEMCTL*.
//
// Scenarios (-scenarios, default all):
//
//   - burst: 20 MiB live, one 1 GiB burst, then idle for -window (default
//     30 s): RSS before, at its peak, 3 s and 10 s after, and the time until
//     it is back within 10%, read from /proc/PID/status every 50 ms.
//   - cadence: 20 MiB live and a 64 MiB burst every 2.1 s for -cadence-for
//     (default 60 s), the worst spacing for the 2 s trim delay: trims, their
//     share of wall time, mean and peak RSS.
//   - http: a loopback net/http server whose handler charges 32 KiB to its
//     request's budget, behind limits.Pool's middleware in the memctl arms;
//     -requests requests over 8 connections: throughput and latency.
//   - load (plain, memctl and A/A only): a server holding 1 GiB live, an
//     open-loop load generator at 200 requests/s, a 512 MiB burst every 10 s
//     for 62 s, each arm in a 4 GiB memory cgroup: latency, trims and their
//     CPU, RSS after the bursts.
//   - load-contended: the same server in a cgroup v1 cpu child with a 10%
//     quota shared with a busy loop, at 50 requests/s; it needs root and the
//     cgroup v1 cpu controller, else the report says it did not run.
//   - load-gc: the load server with GOGC=10, 256 MiB live and 256 KiB of
//     garbage per request, so that natural GC cycles collect each burst
//     before its trim; adds forced GC cycles to the figures.
//
// Charts (-svg DIR, default "."; "off" or "" writes none; DIR is made if
// missing): bench-SCENARIO.svg, each arm's RSS over time, and for the load
// scenarios bench-SCENARIO-p99.svg, the p99 latency per 2 s, both from each
// arm's first run, whose samples the report keeps so that -from redraws
// them; http has none.
//
// The figures are specific to the machine; compare arms within one run.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

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
	return drawCharts(cfg.SVGDir, rep, stderr)
}

// drawCharts writes rep's charts into dir ("": none) and returns the exit
// status.
func drawCharts(dir string, rep *Report, stderr io.Writer) int {
	if dir == "" {
		return 0
	}
	paths, err := writeSVGs(dir, rep)
	for _, p := range paths {
		fmt.Fprintln(stderr, "bench: wrote", p)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if len(paths) == 0 {
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
	var mu sync.Mutex
	var stopped, aborting bool
	go func() {
		sig, ok := <-sigs
		mu.Lock()
		if !ok || stopped {
			mu.Unlock()
			return
		}
		aborting = true
		mu.Unlock()
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
		ab := aborting
		mu.Unlock()
		if !ab {
			close(sigs) // ends the goroutine; nothing sends on sigs after signal.Stop
			return
		}
		for { // the abort exits the process
			time.Sleep(time.Minute)
		}
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
	cfg := defaultConfig(*quick)
	if *runs < 0 {
		return config{}, false, fmt.Errorf("bench: -runs %d: want at least 1", *runs)
	} else if *runs > 0 {
		cfg.Runs = *runs
	}
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
	for _, d := range []struct {
		name string
		v    time.Duration
		dst  *time.Duration
	}{{"-window", *window, &cfg.Params.Window}, {"-cadence-for", *cadenceFor, &cfg.Params.CadenceFor}} {
		switch {
		case d.v < 0:
			return config{}, false, fmt.Errorf("bench: %s %v: want a positive duration", d.name, d.v)
		case d.v > 0:
			*d.dst = d.v
		}
	}
	if *requests < 0 {
		return config{}, false, fmt.Errorf("bench: -requests %d: want a positive count", *requests)
	} else if *requests > 0 {
		cfg.Params.Requests = *requests
	}
	if *trimDelay < 0 {
		return config{}, false, fmt.Errorf("bench: -trim-delay %v: want a positive duration", *trimDelay)
	}
	cfg.Params.TrimDelay = *trimDelay
	cfg.From = *from
	if *svg != "off" {
		cfg.SVGDir = *svg
	}
	return cfg, *asJSON, nil
}
