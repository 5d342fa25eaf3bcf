package memctl

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/limits"
)

// childResize runs Start with no options, keeps about 32 MiB live and makes
// garbage, and prints GOMEMLIMIT and the wall time (Unix ns) every 20 ms
// until it is killed.
func childResize() {
	ctl, err := Start()
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer ctl.Close()
	live := make([][]byte, 32)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	last := time.Now()
	for i := 0; ; i++ {
		live[i%len(live)] = make([]byte, 1<<20) // the old one is garbage
		if i%16 == 0 {
			time.Sleep(time.Millisecond)
		}
		if time.Since(last) > 20*time.Millisecond {
			fmt.Printf("GOMEMLIMIT=%d %d\n", debug.SetMemoryLimit(-1), time.Now().UnixNano())
			last = time.Now()
		}
	}
}

// TestResizeFollowedAtGCEnd: a real cgroup's limit lowered from 512 to 256
// MiB while the child allocates; the child's Start (no options,
// MEMCTL_REFRESH=1s to keep the test short; the default is 10 s) re-reads
// it at a GC end and sets GOMEMLIMIT under 256 MiB within about one
// interval (limits.MemLimitConfig.Refresh: "a process that allocates
// follows a changed limit within about Refresh"; operatorFollowBound is
// the same contract for the default 10 s), counted in the child's own
// running time: the time its lines show it did not run is added to the
// bound, and a child that did not run for more than the interval around
// the write skips (a loaded 2-core machine).
func TestResizeFollowedAtGCEnd(t *testing.T) {
	g := cgrouptest.New(t, 512<<20)
	const (
		interval = time.Second
		period   = 20 * time.Millisecond // the child's report period
	)
	cmd := childtest.Command(t, "resize", []string{"MEMCTL", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_GOMEMLIMIT_FLOOR"}, "MEMCTL_REFRESH=1s")
	g.Wrap(cmd)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	type line struct {
		limit int64
		at    time.Time // the child's clock when it printed
	}
	lines := make(chan line, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "GOMEMLIMIT="); ok {
				var n, at int64
				if _, err := fmt.Sscan(v, &n, &at); err == nil {
					lines <- line{n, time.Unix(0, at)}
				}
			}
		}
	}()
	next := func(within time.Duration) (line, bool) {
		select {
		case l, ok := <-lines:
			return l, ok
		case <-time.After(within):
			return line{}, false
		}
	}
	first, ok := next(10 * time.Second)
	require.True(t, ok, "the child reports GOMEMLIMIT")
	assert.LessOrEqual(t, first.limit, int64(483183820))
	assert.Greater(t, first.limit, int64(400<<20), "0.9 of 512 MiB less a few MiB")

	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	lowered := time.Now() // before the write: the child may follow before WriteFile returns
	require.NoError(t, os.WriteFile(filepath.Join(g.Dir, file), []byte(strconv.Itoa(256<<20)), 0))
	// stalled is the time the child's lines show it did not run its loop
	// since the write: each gap between two lines after it (the first from
	// the write), less the report period.
	var stalled, longest time.Duration
	got, prev := first, first
	for got.limit > 256<<20 {
		l, ok := next(10 * interval)
		require.True(t, ok, "the child still reports; GOMEMLIMIT %d", got.limit)
		if l.at.After(lowered) {
			gap := l.at.Sub(later(prev.at, lowered)) // from the write on only
			stalled += max(gap-period, 0)
			longest = max(longest, gap)
		}
		got, prev = l, l
	}
	took := got.at.Sub(lowered) // on the child's clock: the parent's own delays in reading are not counted
	t.Logf("GOMEMLIMIT %d -> %d, %v after the limit was lowered (interval %v); the child did not run for %v of it (longest gap between its lines %v)",
		first.limit, got.limit, took, interval, stalled, longest)
	assert.LessOrEqual(t, got.limit, int64(241591910))
	assert.Greater(t, got.limit, int64(200<<20))
	if stalled > interval {
		t.Skipf("the child did not run for %v of the %v it took to follow (longest gap between its lines %v, report period %v), more than the %v interval: a loaded machine; the follow time not judged",
			stalled, took, longest, period, interval)
	}
	// One interval (the contract), plus one for the time to the next GC
	// end and the report period, plus the time the child did not run.
	assert.Less(t, took, 2*interval+stalled, "followed within about one interval of the child's running time")
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func TestParseRefresh(t *testing.T) {
	for v, want := range map[string]time.Duration{"off": -1, "OFF": -1, "0": -1, "0s": -1, "10s": 10 * time.Second, "250ms": 250 * time.Millisecond} {
		d, err := parseRefresh(v)
		require.NoError(t, err, v)
		assert.Equal(t, want, d, v)
	}
	for _, v := range []string{"-1s", "10", "soon", "1 s"} {
		d, err := parseRefresh(v)
		require.Error(t, err, v)
		assert.Equal(t, time.Duration(-1), d, "a bad value turns the refresh off")
		assert.Contains(t, err.Error(), "MEMCTL_REFRESH")
	}
}

func TestParseFloor(t *testing.T) {
	for v, want := range map[string]int64{"64MiB": 64 << 20, "64mib": 64 << 20, "1GiB": 1 << 30, "67108864": 67108864,
		"100B": 100, "512 KiB": 512 << 10, "1TiB": 1 << 40} {
		n, err := parseFloor(v)
		require.NoError(t, err, v)
		assert.Equal(t, want, n, v)
	}
	for _, v := range []string{"0", "-1MiB", "64MB", "lots", "MiB", "9999999TiB", "1.5GiB", strconv.FormatUint(math.MaxUint64, 10)} {
		_, err := parseFloor(v)
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), "MEMCTL_GOMEMLIMIT_FLOOR")
	}
}

// TestStartMemLimitSwitches: MEMCTL_REFRESH and MEMCTL_GOMEMLIMIT_FLOOR
// reach the limiter, a bad one is reported, and Controller.Refresh works
// with and without a limiter.
func TestStartMemLimitSwitches(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	for _, k := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL"} {
		t.Setenv(k, "")
	}
	var failed []error
	fail := func(err error) { failed = append(failed, err) }

	t.Setenv("MEMCTL_REFRESH", "off")
	lim, _, _ := startMemLimit(limits.MemLimitConfig{}, fail)
	assert.Zero(t, lim.Interval())
	lim.Close()
	t.Setenv("MEMCTL_REFRESH", "3s")
	lim, _, _ = startMemLimit(limits.MemLimitConfig{}, fail)
	assert.Equal(t, 3*time.Second, lim.Interval())
	lim.Close()
	t.Setenv("MEMCTL_REFRESH", "soon")
	lim, _, _ = startMemLimit(limits.MemLimitConfig{Refresh: time.Hour}, fail)
	assert.Zero(t, lim.Interval(), "a bad MEMCTL_REFRESH turns the refresh off")
	lim.Close()
	require.Len(t, failed, 1)
	assert.ErrorContains(t, failed[0], "MEMCTL_REFRESH")

	t.Setenv("MEMCTL_REFRESH", "")
	debug.SetMemoryLimit(123 << 20)
	t.Setenv("MEMCTL_GOMEMLIMIT_FLOOR", "lots")
	lim, ml, err := startMemLimit(limits.MemLimitConfig{}, fail)
	require.ErrorContains(t, err, "MEMCTL_GOMEMLIMIT_FLOOR")
	assert.Nil(t, lim)
	assert.Equal(t, int64(123<<20), ml.GoMemLimit)
	assert.Equal(t, int64(123<<20), debug.SetMemoryLimit(-1), "a bad floor leaves GOMEMLIMIT alone")

	// Controller.Refresh without a limiter (MEMCTL=off) changes nothing.
	t.Setenv("MEMCTL_GOMEMLIMIT_FLOOR", "")
	t.Setenv("MEMCTL", "off")
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	d, err := ctl.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(123<<20), d.GoMemLimit)
	require.NoError(t, ctl.Close())
	var nilCtl *Controller
	d, err = nilCtl.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(123<<20), d.GoMemLimit)
}

// TestControllerRefresh: Controller.Refresh re-reads the real cgroup limit
// at once.
func TestControllerRefresh(t *testing.T) {
	g := cgrouptest.New(t, 512<<20)
	cmd := childtest.Command(t, "refresh", []string{"MEMCTL", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_REFRESH", "MEMCTL_GOMEMLIMIT_FLOOR"}, "MEMCTL_CHILD_CGROUP="+g.Dir, fmt.Sprintf("MEMCTL_CHILD_VERSION=%d", g.Version))
	g.Wrap(cmd)
	r := childtest.Report(t, cmd)
	before := childtest.RequireInt(t, r, "BEFORE")
	after := childtest.RequireInt(t, r, "AFTER")
	assert.Greater(t, before, int64(400<<20))
	assert.LessOrEqual(t, after, int64(241591910), "Refresh read the lowered limit")
	assert.Equal(t, r["AFTER"], r["READBACK"])
	assert.Equal(t, "<nil>", r["ERR"])
}

// childRefresh lowers its own cgroup's limit to 256 MiB and calls
// Controller.Refresh.
func childRefresh() {
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer ctl.Close()
	childtest.Say("BEFORE", debug.SetMemoryLimit(-1))
	file := "memory.limit_in_bytes"
	if os.Getenv("MEMCTL_CHILD_VERSION") == "2" {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(os.Getenv("MEMCTL_CHILD_CGROUP"), file), []byte(strconv.Itoa(256<<20)), 0); err != nil {
		childtest.Fail("%v", err)
	}
	d, err := ctl.Refresh()
	childtest.Say("AFTER", d.GoMemLimit)
	childtest.Say("ERR", err)
	childtest.Say("READBACK", debug.SetMemoryLimit(-1))
}

// TestStartFloorInCgroup: MEMCTL_GOMEMLIMIT_FLOOR reaches Start's limiter
// in a real cgroup: 250 MiB over 0.9 of 256 MiB gives GOMEMLIMIT 250 MiB,
// one WARN that the GC will run often, and no error.
func TestStartFloorInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	r, recs := runStart(t, g, "MEMCTL_GOMEMLIMIT_FLOOR=250MiB")
	assert.Equal(t, "<nil>", r["ERR"])
	assert.Equal(t, strconv.Itoa(250<<20), r["GOMEMLIMIT"])
	var warns []string
	for _, rec := range recs {
		if rec["level"] == "WARN" {
			warns = append(warns, fmt.Sprint(rec["error"]))
		}
	}
	require.Len(t, warns, 1, "%v", recs)
	assert.Contains(t, warns[0], "the GC will run often")

	r, recs = runStart(t, g, "MEMCTL_GOMEMLIMIT_FLOOR=lots")
	assert.Contains(t, r["ERR"], "MEMCTL_GOMEMLIMIT_FLOOR")
	assert.Equal(t, strconv.FormatInt(math.MaxInt64, 10), r["GOMEMLIMIT"], "a bad floor leaves GOMEMLIMIT alone")
	_, line := infoLines(recs)
	assert.Contains(t, line["gomemlimit_reason"], "bad MEMCTL_GOMEMLIMIT_FLOOR")
}

// BenchmarkCurrentMemLimit: reading the limit in force allocates nothing
// (issue 32 item 3), beside debug.SetMemoryLimit(-1), the simple way to
// read GOMEMLIMIT alone, in the same run.
func BenchmarkCurrentMemLimit(b *testing.B) {
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(b, err)
	defer ctl.Close()
	b.Run("CurrentMemLimit", func(b *testing.B) {
		b.ReportAllocs()
		var n int64
		for b.Loop() {
			n += CurrentMemLimit().GoMemLimit
		}
		_ = n
	})
	b.Run("SetMemoryLimit(-1)", func(b *testing.B) {
		b.ReportAllocs()
		var n int64
		for b.Loop() {
			n += debug.SetMemoryLimit(-1)
		}
		_ = n
	})
}

// TestCurrentMemLimitAllocatesNothing is the benchmark's promise as a test.
func TestCurrentMemLimitAllocatesNothing(t *testing.T) {
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer ctl.Close()
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = CurrentMemLimit() }))
}

func init() { moreChildren["pool-resize"] = childPoolResize }

// childPoolResize runs Start and a pool with defaults, as a service does,
// and reports GOMEMLIMIT and the pool's limit every 20 ms while it
// allocates garbage (so that GC cycles end).
func childPoolResize() {
	ctl, err := Start()
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer ctl.Close()
	p, err := limits.NewPool(limits.PoolConfig{})
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer p.Close()
	live := make([][]byte, 32)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	last := time.Now()
	for i := 0; ; i++ {
		live[i%len(live)] = make([]byte, 1<<20)
		if i%16 == 0 {
			time.Sleep(time.Millisecond)
		}
		if time.Since(last) > 20*time.Millisecond {
			// Reported only when no refresh came between the two reads.
			if g, l := debug.SetMemoryLimit(-1), p.Stats().Limit; g == debug.SetMemoryLimit(-1) {
				fmt.Printf("GOMEMLIMIT=%d POOL=%d\n", g, l)
			}
			last = time.Now()
		}
	}
}

// Input (issue 27, items 4 and 6; OpenTelemetry Collector #15580): a real
// v1 cgroup lowered from 256 to 128 MiB; GOMEMLIMIT followed and the
// default pool stayed at 113.8 MiB, all of the new GOMEMLIMIT. The pool
// made with defaults now logs its limit and where it came from, and
// follows GOMEMLIMIT: in the report where GOMEMLIMIT first shows the new
// limit, the pool's limit is already half of it (DefaultPoolRatio).
// MEMCTL_REFRESH=1s keeps the test short (the default is 10 s).
func TestPoolFollowsResizeInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	cmd := childtest.Command(t, "pool-resize", []string{"MEMCTL", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_GOMEMLIMIT_FLOOR", "MEMCTL_BUDGETS"}, "MEMCTL_REFRESH=1s")
	g.Wrap(cmd)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	type report struct{ gml, pool int64 }
	lines := make(chan report, 4096)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r report
			if _, err := fmt.Sscanf(sc.Text(), "GOMEMLIMIT=%d POOL=%d", &r.gml, &r.pool); err == nil {
				lines <- r
			}
		}
	}()
	next := func(within time.Duration) (report, bool) {
		select {
		case r, ok := <-lines:
			return r, ok
		case <-time.After(within):
			return report{}, false
		}
	}
	first, ok := next(10 * time.Second)
	require.True(t, ok, "the child reports; stderr: %s", stderr.String())
	assert.Greater(t, first.gml, int64(200<<20), "0.9 of 256 MiB less a few MiB")
	assert.Equal(t, first.gml/2, first.pool, "half of GOMEMLIMIT")
	// The report is on stdout, the log on stderr: wait for the line.
	made := stderr.waitLine(t, "limits: pool made", 10*time.Second)
	t.Logf("%s", made)
	assert.Contains(t, made, fmt.Sprintf("limit=%.1fMiB ", float64(first.pool)/(1<<20)))
	assert.Contains(t, made, "limit_source=\"half of GOMEMLIMIT")

	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	require.NoError(t, os.WriteFile(filepath.Join(g.Dir, file), []byte(strconv.Itoa(128<<20)), 0))
	lowered := time.Now()
	r := first
	for r.gml > 128<<20 {
		r, ok = next(20 * time.Second)
		require.True(t, ok, "the child still reports; last %+v; stderr: %s", r, stderr.String())
	}
	took := time.Since(lowered)
	t.Logf("GOMEMLIMIT %d -> %d, pool %d -> %d, %v after the limit was lowered", first.gml, r.gml, first.pool, r.pool, took)
	assert.Equal(t, r.gml/2, r.pool, "the pool follows in the same refresh")
	stderr.waitLine(t, "limits: pool limit follows GOMEMLIMIT", 10*time.Second)
}

// syncBuffer is a bytes.Buffer safe for the writer (the child's stderr
// copier) and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// waitLine waits up to within for a line holding sub and returns the last
// such line; it fails the test, showing what arrived, if none does.
func (s *syncBuffer) waitLine(t *testing.T, sub string, within time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		line := ""
		for _, l := range strings.Split(s.String(), "\n") {
			if strings.Contains(l, sub) {
				line = l
			}
		}
		if line != "" {
			return line
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line with %q on stderr within %v; stderr:\n%s", sub, within, s.String())
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
