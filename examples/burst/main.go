// Command burst is memctl's demo: the same 512 MiB burst in two child
// processes, one plain Go and one with memctl.Start and AfterBurst, and the
// RSS of each read from /proc/PID/status every 250 ms.
//
//	go run ./examples/burst
//
// The table gives RSS before the burst, its peak (VmHWM), RSS 1 s and 4 s
// after it, and RSS right after memctl's trim. It also draws RSS over time
// as an SVG (-svg PATH; default burst.svg). Where no cgroup shows a memory
// limit, memctl sets no GOMEMLIMIT; declare one:
//
//	MEMCTL_MEMORY_LIMIT=1GiB go run ./examples/burst -svg docs/burst.svg
//
// The memctl child runs with MEMCTL_PRESSURE=off, so that pressure from
// other processes cannot make it trim during the burst.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/plot"
	"github.com/memctl/memctl/internal/procfs"
)

const (
	liveBytes  = 20 << 20
	burstBytes = 512 << 20
	sampleStep = 250 * time.Millisecond
	after      = 5 // seconds of RSS after the burst
)

// rowsAt are the rows "RSS n s after": before the trim and well after it,
// never while it may be running.
var rowsAt = []time.Duration{time.Second, 4 * time.Second}

// armEnv names the arm in a child process; the parent sets it.
const armEnv = "BURST_DEMO_ARM" // not MEMCTL_*: memctl warns about those it does not read

func main() {
	if arm := os.Getenv(armEnv); arm != "" {
		exitIf(child(arm == "memctl"))
		return
	}
	svg := flag.String("svg", "burst.svg", "write RSS over time as an SVG to this `path`")
	flag.Parse()
	arms, err := run()
	exitIf(err)
	printTable(os.Stdout, arms)
	exitIf(writeSVG(*svg, arms))
	fmt.Printf("\nRSS over time drawn in %s\n", *svg)
}

func exitIf(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "burst:", err)
		os.Exit(1)
	}
}

// liveSet is the steady-state live heap of a child.
var liveSet [][]byte

// child runs one arm: it prints its GOMEMLIMIT and "ready" before the
// burst, "end" after it, and for the memctl arm "trimmed" when its trim has
// run and a "stats ..." line at its end.
func child(withMemctl bool) error {
	var ctl *memctl.Controller
	if withMemctl {
		var err error
		ctl, err = memctl.Start()
		if err != nil {
			return err
		}
		defer ctl.Close()
	}
	liveSet = burst.Alloc(liveBytes)
	fmt.Println("gomemlimit", debug.SetMemoryLimit(-1))
	fmt.Println("ready")
	time.Sleep(2 * sampleStep)
	b := burst.Alloc(burstBytes)
	runtime.KeepAlive(b) // all 512 MiB are live until here, then garbage
	var trims int64
	if ctl != nil {
		trims = ctl.Stats().Trim.Trims
		ctl.AfterBurst()
	}
	fmt.Println("end")
	start := time.Now()
	if ctl != nil {
		// Say when the trim has run, so that the parent reads RSS after it.
		for ctl.Stats().Trim.Trims == trims && time.Since(start) < after*time.Second {
			time.Sleep(5 * time.Millisecond)
		}
		fmt.Println("trimmed")
	}
	time.Sleep(after*time.Second + 2*sampleStep - time.Since(start))
	runtime.KeepAlive(liveSet)
	if ctl != nil {
		s := ctl.Stats().Trim
		fmt.Printf("stats %d trim(s) run, last took %v, released %d MiB\n", s.Trims, s.LastDuration.Round(time.Millisecond), s.TotalReleased>>20)
	}
	return nil
}

// armRun is one child process being observed.
type armRun struct {
	name    string
	cmd     *exec.Cmd
	samples []sample
	ready   time.Time // when before was read
	end     time.Time // when the child reported the burst's end and peak was read
	trimAt  time.Time // when trimmed was read
	before  int64
	peak    int64
	trimmed int64 // RSS right after the trim ran; -1 for none
	limit   int64 // the child's GOMEMLIMIT; math.MaxInt64 for none
	stats   string
	stderr  bytes.Buffer
	err     error
}

type sample struct {
	at  time.Time
	rss int64
}

// run starts both arms at once and observes them until they exit.
func run() ([]*armRun, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	arms := []*armRun{{name: "plain", trimmed: -1}, {name: "memctl", trimmed: -1}}
	var wg sync.WaitGroup
	for _, a := range arms {
		a.cmd = exec.Command(exe)
		a.cmd.Env = append(os.Environ(), armEnv+"="+a.name, "MEMCTL_PRESSURE=off")
		a.cmd.Stderr = &a.stderr
		out, err := a.cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := a.cmd.Start(); err != nil {
			return nil, err
		}
		wg.Go(func() { a.observe(out) })
	}
	wg.Wait()
	for _, a := range arms {
		if a.err != nil {
			return nil, fmt.Errorf("%s arm: %w\n%s", a.name, a.err, a.stderr.String())
		}
	}
	return arms, nil
}

// printTable writes the arms' figures as a table, arms as columns.
func printTable(w io.Writer, arms []*armRun) {
	fmt.Fprintf(w, "512 MiB burst, 20 MiB live, VmRSS read from /proc/PID/status every %v\n\n", sampleStep)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\t%s\t%s\t\n", arms[0].name, arms[1].name)
	row := func(label string, f func(*armRun) string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", label, f(arms[0]), f(arms[1]))
	}
	row("RSS before (MiB)", func(a *armRun) string { return mib(a.before) })
	row("peak RSS (MiB)", func(a *armRun) string { return mib(a.peak) })
	row(fmt.Sprintf("RSS %v after (MiB)", rowsAt[0]), func(a *armRun) string { return mib(a.at(rowsAt[0])) })
	row("RSS right after the trim (MiB)", func(a *armRun) string {
		if a.trimmed < 0 {
			return "-"
		}
		return mib(a.trimmed)
	})
	row(fmt.Sprintf("RSS %v after (MiB)", rowsAt[1]), func(a *armRun) string { return mib(a.at(rowsAt[1])) })
	tw.Flush()
	for _, a := range arms {
		if a.stats != "" {
			fmt.Fprintf(w, "\n%s process: %s\n", a.name, a.stats)
		}
		if a.stderr.Len() > 0 {
			fmt.Fprintf(w, "%s process logged: %s", a.name, a.stderr.String())
		}
	}
}

func mib(b int64) string {
	if b < 0 {
		return "?"
	}
	return strconv.FormatInt((b+(1<<19))>>20, 10)
}

// observe reads the child's VmRSS every sampleStep, and at the markers of
// its report lines, until it exits.
func (a *armRun) observe(out io.Reader) {
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	tick := time.NewTicker(sampleStep)
	defer tick.Stop()
	pid := a.cmd.Process.Pid
	for {
		var err error
		select {
		case now := <-tick.C:
			if rss, err := procfs.RSS(pid); err == nil { // else the child has exited
				a.samples = append(a.samples, sample{now, rss})
			}
		case line, ok := <-lines:
			switch {
			case !ok:
				a.err = cmp.Or(a.err, a.cmd.Wait())
				return
			case strings.HasPrefix(line, "gomemlimit "):
				a.limit, err = strconv.ParseInt(strings.TrimPrefix(line, "gomemlimit "), 10, 64)
			case line == "ready":
				a.before, err = procfs.RSS(pid)
				a.ready = time.Now()
			case line == "end":
				a.peak, err = procfs.ReadBytes(procfs.StatusPath(pid), "VmHWM")
				a.end = time.Now()
			case line == "trimmed":
				a.trimmed, err = procfs.RSS(pid)
				a.trimAt = time.Now()
			case strings.HasPrefix(line, "stats "):
				a.stats = strings.TrimPrefix(line, "stats ")
			}
		}
		a.err = cmp.Or(a.err, err)
	}
}

// at returns the first RSS sample taken d or more after the burst ended,
// or -1 when there is none.
func (a *armRun) at(d time.Duration) int64 {
	if a.end.IsZero() {
		return -1
	}
	for _, s := range a.samples {
		if !s.at.Before(a.end.Add(d)) {
			return s.rss
		}
	}
	return -1
}

// chart draws each arm's RSS in MiB against the seconds since its burst
// ended: the samples and the table's readings, so that every figure of the
// table is a point. The burst's end and the trim are marks, GOMEMLIMIT a
// line.
func chart(arms []*armRun) plot.Chart {
	c := plot.Chart{
		Title:  fmt.Sprintf("RSS of a Go process after a %d MiB burst (%d MiB live), read every %v", burstBytes>>20, liveBytes>>20, sampleStep),
		XLabel: "seconds since the burst ended",
		YLabel: "RSS (MiB)",
		Marks:  []plot.Mark{{Label: "burst ends", X: 0}},
	}
	for _, a := range arms {
		since := func(t time.Time) float64 { return t.Sub(a.end).Seconds() }
		inMiB := func(b int64) float64 { return float64(b) / (1 << 20) }
		s := plot.Series{Name: a.name}
		for _, r := range a.samples {
			s.Points = append(s.Points, plot.Point{X: since(r.at), Y: inMiB(r.rss)})
		}
		s.Points = append(s.Points,
			plot.Point{X: since(a.ready), Y: inMiB(a.before)},
			plot.Point{X: 0, Y: inMiB(a.peak)})
		if a.trimmed >= 0 {
			s.Points = append(s.Points, plot.Point{X: since(a.trimAt), Y: inMiB(a.trimmed)})
			c.Marks = append(c.Marks, plot.Mark{Label: a.name + " trimmed", X: since(a.trimAt)})
		}
		slices.SortStableFunc(s.Points, func(p, q plot.Point) int { return cmp.Compare(p.X, q.X) })
		c.Series = append(c.Series, s)
		if a.limit > 0 && a.limit < math.MaxInt64 {
			c.Lines = append(c.Lines, plot.Line{Label: "GOMEMLIMIT (" + a.name + ")", Y: inMiB(a.limit)})
		}
	}
	if len(c.Lines) == 2 && c.Lines[0].Y == c.Lines[1].Y {
		c.Lines = []plot.Line{{Label: "GOMEMLIMIT", Y: c.Lines[0].Y}}
	}
	if len(c.Lines) == 0 {
		c.Title += "; no GOMEMLIMIT"
	}
	return c
}

// writeSVG writes the arms' chart to the file at path.
func writeSVG(path string, arms []*armRun) error {
	c := chart(arms)
	return c.WriteFile(path)
}
