package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQuickRun runs the harness as `go run ./bench -quick` does, one run per
// arm, with this test binary as the scenario binary, and checks that every
// figure is present, that the memctl arm's RSS 3 s after the burst is below
// the plain arm's, and that no cgroup is left behind.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the quick run takes about 2 minutes")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory keeps RSS up after a trim; run without -race")
	}
	if _, err := os.Stat("/proc/self/clear_refs"); err != nil {
		t.Skipf("needs /proc/PID/clear_refs: %v", err)
	}
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
				assert.Equal(t, 1, sum.N(), "%s %s %s: one run", s.Name, f.Key, a.Key)
				assert.False(t, sum.Median.NA, "%s %s %s present", s.Name, f.Key, a.Key)
			}
		}
	}
	rss3, ok := rep.figure("burst", "rss_3s")
	require.True(t, ok)
	plain, mc := rss3.Arms["plain"].Median.Value, rss3.Arms["memctl"].Median.Value
	assert.Less(t, mc, plain, "memctl arm's RSS 3 s after the burst is below the plain arm's")
	peak, _ := rep.figure("burst", "peak_rss")
	assert.Greater(t, peak.Arms["plain"].Median.Value, float64(cfg.Params.Burst), "the burst was resident")
	assert.Greater(t, plain, float64(cfg.Params.Burst)*3/4, "plain Go still holds the burst 3 s after")

	trims, _ := rep.figure("cadence", "trims")
	assert.Zero(t, trims.Arms["plain"].Median.Value)
	assert.GreaterOrEqual(t, trims.Arms["memctl"].Median.Value, 1.0, "memctl trimmed in the cadence window")
	rps, _ := rep.figure("http", "rps")
	assert.Greater(t, rps.Arms["memctl"].Median.Value, 0.0)
	p99, _ := rep.figure("load", "p99")
	assert.Greater(t, p99.Arms["plain"].Median.Value, 0.0)
	back, _ := rep.figure("load", "bursts_back")
	assert.Equal(t, 1.0, back.Arms["memctl"].Median.Value, "memctl returned the load scenario's burst within 3.5 s")
	assert.Zero(t, back.Arms["plain"].Median.Value, "plain Go did not")

	for _, a := range rep.Arms {
		assert.NotEqual(t, int64(-1), a.GoMemLimit, a.Key)
	}
	if rep.Cgroup.Used {
		parent, err := cgroupfs.WritableParent()
		require.NoError(t, err)
		left, _ := filepath.Glob(filepath.Join(parent.Dir, "memctl-bench-*"))
		var ours []string
		for _, d := range left {
			if strings.Contains(filepath.Base(d), "-"+strconv.Itoa(os.Getpid())+"-") {
				ours = append(ours, d)
			}
		}
		cpuLeft, _ := filepath.Glob(filepath.Join(cpuquota.Root, "memctl-bench-cpu*-"+strconv.Itoa(os.Getpid())+"-*"))
		ours = append(ours, cpuLeft...)
		assert.Empty(t, ours, "every arm's cgroup was removed")
		gml := rep.Arms[1].GoMemLimit
		// 0.9 of the limit less the few MiB the child holds outside the Go
		// runtime (limits.MemLimitConfig.NoHeadroom).
		ninety := int64(float64(rep.Cgroup.LimitBytes) * 0.9)
		assert.LessOrEqual(t, gml, ninety, "the GOMEMLIMIT arm read its cgroup's limit")
		assert.Greater(t, gml, ninety-32<<20, "the GOMEMLIMIT arm read its cgroup's limit")
	} else {
		t.Logf("the arms ran without cgroups: %s", rep.Cgroup.Note)
	}
}

// withinTrims are the load figures that split one arm's requests by the
// trims they overlap: not observed in an arm without trims.
var withinTrims = map[string]bool{"p99_trim": true, "p99_clear": true, "p99_trim_ratio": true, "p99_placebo_ratio": true}
