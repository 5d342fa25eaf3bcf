package main

import (
	"bytes"
	"errors"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestQuickRun runs the harness as `go run ./bench -quick` does, one run per
// arm, with this test binary as the scenario binary, and checks that every
// figure is present, that the memctl arm's RSS 3 s after the burst is below
// the plain arm's, that the burst RSS target (memctl's rise against plain
// Go's with debug.FreeOSMemory, same run) is met, and that no cgroup is
// left behind.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the quick run takes about 3 minutes")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory keeps RSS up after a trim; run without -race")
	}
	if _, err := os.Stat("/proc/self/clear_refs"); err != nil {
		t.Skipf("needs /proc/PID/clear_refs: %v", err)
	}
	removeLeftCgroups(t)
	defer abortOnSignal(os.Stderr)() // an interrupted go test leaves no arm's cgroup either
	cfg := defaultConfig(true)
	require.Equal(t, 1, cfg.Runs)
	var progress bytes.Buffer
	rep, err := run(cfg, &progress)
	t.Log("\n" + progress.String())
	require.NoError(t, err)
	var md bytes.Buffer
	require.NoError(t, writeMarkdown(&md, rep))
	t.Log("\n" + md.String())

	require.Len(t, rep.Scenarios, len(scenarios))
	for _, s := range rep.Scenarios {
		sc, _ := scenarioByName(s.Name)
		if sc.precheck != nil && sc.precheck() != nil {
			t.Logf("%s not run here: %v", s.Name, s.Notes)
			continue
		}
		require.Len(t, s.Figures, len(sc.Figures), s.Name)
		for _, f := range s.Figures {
			for _, a := range arms {
				sum := f.Arms[a.Key]
				if !sc.runs(a) {
					assert.True(t, sum.Median.NA, "%s does not run %s", s.Name, a.Key)
					continue
				}
				if s.Name == "burst" && f.Key == "rss_10s" {
					assert.True(t, sum.Median.NA, "10 s lies after the quick window")
					continue
				}
				if withinTrims[f.Key] && !a.memctl() {
					assert.True(t, sum.Median.NA, "%s %s %s: no trims to overlap", s.Name, f.Key, a.Key)
					continue
				}
				if withinTrims[f.Key] && s.Name != "load" {
					continue // a throttled quick window may hold no trim
				}
				if withinTrims[f.Key] && overlapping(s, a.Key) == 0 {
					// These figures exist only where a request overlapped a
					// trim, which the quick window does not ensure on a
					// loaded machine.
					assert.True(t, sum.Median.NA || f.Key == "p99_placebo_ratio", "%s %s %s: no request overlapped a trim", s.Name, f.Key, a.Key)
					t.Logf("%s %s: no request overlapped a trim (trims %v)", s.Name, a.Key, figureOf(s, "trims", a.Key))
					continue
				}
				assert.Equal(t, 1, sum.N(), "%s %s %s: one run", s.Name, f.Key, a.Key)
				assert.False(t, sum.Median.NA, "%s %s %s present", s.Name, f.Key, a.Key)
			}
		}
	}
	checkTraces(t, rep)

	rss3, ok := rep.figure("burst", "rss_3s")
	require.True(t, ok)
	plain, mc := rss3.Arms["plain"].Median.Value, rss3.Arms["memctl"].Median.Value
	assert.Less(t, mc, plain, "memctl arm's RSS 3 s after the burst is below the plain arm's")
	peak, _ := rep.figure("burst", "peak_rss")
	assert.Greater(t, peak.Arms["plain"].Median.Value, float64(cfg.Params.Burst), "the burst was resident")
	assert.Greater(t, plain, float64(cfg.Params.Burst)*3/4, "plain Go still holds the burst 3 s after")
	fo := rss3.Arms["freeos"].Median.Value
	assert.Less(t, fo, plain, "plain + FreeOSMemory's RSS 3 s after the burst is below plain Go's")
	tg, ok := burstRSSTarget(rep)
	require.True(t, ok)
	assert.NotContains(t, tg.Target, "fixed rule", "judged against the freeos arm")
	require.NotNil(t, tg.Met, "burst RSS target not judged: %s", tg.NotJudged)
	assert.True(t, *tg.Met, "burst RSS target: %s: %s", tg.Target, tg.Measured)

	trims, _ := rep.figure("cadence", "trims")
	assert.Zero(t, trims.Arms["plain"].Median.Value)
	assert.GreaterOrEqual(t, trims.Arms["memctl"].Median.Value, 1.0, "memctl trimmed in the cadence window")
	rps, _ := rep.figure("http", "rps")
	assert.Greater(t, rps.Arms["memctl"].Median.Value, 0.0)
	p99, _ := rep.figure("load", "p99")
	assert.Greater(t, p99.Arms["plain"].Median.Value, 0.0)
	back, _ := rep.figure("load", "bursts_back")
	// One burst in the quick window: the smoke run checks memctl against
	// plain Go in the same round; the 90% target is the full run's (a
	// loaded machine may postpone a quick run's one trim past 3.5 s).
	assert.Zero(t, back.Arms["plain"].Median.Value, "plain Go did not return the load scenario's burst within 3.5 s")
	if mc := back.Arms["memctl"].Median.Value; mc < 1 {
		t.Logf("memctl returned %.0f%% of the load scenario's bursts within 3.5 s in the quick window", 100*mc)
	}

	for _, a := range rep.Arms {
		assert.NotEqual(t, int64(-1), a.GoMemLimit, a.Key)
	}
	if rep.Cgroup.Used {
		assert.Empty(t, leftCgroups(t), "every arm's cgroup was removed")
		i := slices.IndexFunc(rep.Arms, func(a ArmInfo) bool { return a.Key == "gomemlimit" })
		require.GreaterOrEqual(t, i, 0)
		gml := rep.Arms[i].GoMemLimit
		// 0.9 of the limit less the few MiB the child holds outside the Go
		// runtime (limits.MemLimitConfig.NoHeadroom).
		ninety := int64(float64(rep.Cgroup.LimitBytes) * 0.9)
		assert.LessOrEqual(t, gml, ninety, "the GOMEMLIMIT arm read its cgroup's limit")
		assert.Greater(t, gml, ninety-32<<20, "the GOMEMLIMIT arm read its cgroup's limit")
	} else {
		t.Logf("the arms ran without cgroups: %s", rep.Cgroup.Note)
	}
}

// checkTraces checks that the report keeps a trace of each arm's first run
// in every scenario that ran but http, with p99 windows in the load
// scenarios, that each such scenario draws, and that burst's memctl arm
// trimmed.
func checkTraces(t *testing.T, rep *Report) {
	t.Helper()
	for _, s := range rep.Scenarios {
		sc, _ := scenarioByName(s.Name)
		if s.Name == "http" || len(s.Notes) > 0 && strings.HasPrefix(s.Notes[0], "Not run") {
			assert.Empty(t, s.Traces, s.Name)
			continue
		}
		for _, a := range arms {
			tr, ok := s.Traces[a.Key]
			assert.Equal(t, sc.runs(a), ok, "%s %s: a trace of each arm it runs", s.Name, a.Key)
			if ok {
				assert.NotEmpty(t, tr.RSS, "%s %s", s.Name, a.Key)
				assert.Equal(t, strings.HasPrefix(s.Name, "load"), len(tr.P99) > 0, "%s %s: p99 windows in the load scenarios", s.Name, a.Key)
			}
		}
		assert.NotEmpty(t, charts(rep, s), s.Name)
	}
	assert.NotEmpty(t, rep.Scenarios[0].Traces["memctl"].Trims, "the burst's trim")
}

// overlapping returns arm's median count of requests that overlapped a
// trim in scenario s (0 when not measured).
func overlapping(s ScenarioReport, arm string) float64 {
	return figureOf(s, "overlapping", arm).Value
}

// figureOf returns arm's median of figure key in scenario s.
func figureOf(s ScenarioReport, key, arm string) Obs {
	for _, f := range s.Figures {
		if f.Key == key {
			return f.Arms[arm].Median
		}
	}
	return Obs{NA: true}
}

// withinTrims are the load figures that split one arm's requests by the
// trims they overlap: not observed in an arm without trims.
var withinTrims = map[string]bool{"p99_trim": true, "p99_clear": true, "p99_trim_ratio": true, "p99_placebo_ratio": true}

// leftCgroups returns the memory and cpu cgroups that this process's
// harness made (their names hold its PID) and that are still there.
func leftCgroups(t *testing.T) []string {
	t.Helper()
	pid := strconv.Itoa(os.Getpid())
	var left []string
	if parent, err := cgrouptest.WritableParent(); err == nil {
		mem, err := filepath.Glob(filepath.Join(parent.Dir, "memctl-bench"+tagSuffix()+"-"+pid+"-*"))
		require.NoError(t, err)
		left = append(left, mem...)
	}
	cpu, err := filepath.Glob(filepath.Join(cpuquota.Root, "memctl-bench-cpu"+tagSuffix()+"-"+pid+"-*"))
	require.NoError(t, err)
	return append(left, cpu...)
}

// removeLeftCgroups removes, when the test ends, failing or not, every
// cgroup leftCgroups finds (killing what is still in it), and fails the
// test naming them: the harness removes its own.
func removeLeftCgroups(t *testing.T) {
	t.Cleanup(func() {
		left := leftCgroups(t)
		for _, dir := range left {
			assert.NoError(t, removeCgroup(dir))
		}
		assert.Empty(t, left, "the harness left these cgroups (removed now)")
	})
}

// removeCgroup kills every process in the cgroup dir and removes it,
// retrying until its processes have exited (exitTimeout at most).
func removeCgroup(dir string) error {
	deadline := time.Now().Add(exitTimeout)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		if b, rerr := os.ReadFile(filepath.Join(dir, "cgroup.procs")); rerr == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, perr := strconv.Atoi(f); perr == nil {
					if p, ferr := os.FindProcess(pid); ferr == nil {
						_ = p.Kill() // SIGKILL
					}
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
