package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeLoadReport is a report of the three load scenarios with the given
// medians per arm (one run each).
func fakeLoadReport(figs map[string]map[string]float64) *Report {
	p := defaultParams(false)
	rep := &Report{Params: p}
	for _, s := range []scenario{loadScenarioPlain, loadScenarioContended, loadScenarioGC} {
		obs := map[string]map[string][]Obs{}
		for _, a := range arms {
			obs[a.Key] = map[string][]Obs{}
			if !s.runs(a) {
				continue
			}
			for k, v := range figs[a.Key] {
				obs[a.Key][k] = []Obs{{Value: v}}
			}
		}
		s.derive(obs)
		rep.Scenarios = append(rep.Scenarios, collate(s, p, obs))
	}
	return rep
}

func TestLoadTargets(t *testing.T) {
	good := map[string]map[string]float64{
		"plain":     {"p99": 0.010, "trim_cpu_share": 0, "bursts_back": 0.5, "gc_forced": 3},
		"memctl":    {"p99": 0.0105, "trim_cpu_share": 0.012, "bursts_back": 1, "p99_trim_ratio": 1.3, "p99_placebo_ratio": 0.9, "gc_forced": 0},
		"memctl-aa": {"p99": 0.0108, "trim_cpu_share": 0.011, "bursts_back": 0.9, "p99_trim_ratio": 0.8, "p99_placebo_ratio": 1.1, "gc_forced": 0},
	}
	ts := ruleTargets(fakeLoadReport(good))
	// load: p99 vs plain, trim CPU, overlap; load-contended: trim CPU,
	// bursts back; load-gc: trim CPU, overlap, forced cycles, bursts back.
	require.Len(t, ts, 9)
	for _, tg := range ts {
		require.NotNil(t, tg.Met)
		assert.True(t, *tg.Met, "%s: %s: %s", tg.Scenario, tg.Target, tg.Measured)
	}
	assert.Equal(t, "memctl/plain 1.050, A/A/plain 1.080", ts[0].Measured)
	assert.Equal(t, "memctl 1.300, A/A 0.800; placebo windows 0.900, 1.100", ts[2].Measured)

	bad := map[string]map[string]float64{
		"plain":     {"p99": 0.010, "trim_cpu_share": 0, "bursts_back": 0},
		"memctl":    {"p99": 0.0112, "trim_cpu_share": 0.021, "bursts_back": 0.83, "p99_trim_ratio": 1.31, "gc_forced": 1},
		"memctl-aa": {"p99": 0.0100, "trim_cpu_share": 0.01, "bursts_back": 1, "p99_trim_ratio": 1.0, "gc_forced": 0},
	}
	for _, tg := range ruleTargets(fakeLoadReport(bad)) {
		require.NotNil(t, tg.Met)
		assert.False(t, *tg.Met, "%s: %s: %s", tg.Scenario, tg.Target, tg.Measured)
	}
}

// The load scenarios do not run the GOMEMLIMIT-only arm, and their tables
// say so with "–".
func TestLoadArms(t *testing.T) {
	for _, s := range []scenario{loadScenarioPlain, loadScenarioContended, loadScenarioGC} {
		var got []string
		for _, a := range arms {
			if s.runs(a) {
				got = append(got, a.Key)
			}
		}
		assert.Equal(t, []string{"plain", "memctl", "memctl-aa"}, got)
	}
	rep := fakeLoadReport(map[string]map[string]float64{"plain": {"p99": 1}})
	f, ok := rep.figure("load", "p99")
	require.True(t, ok)
	assert.True(t, f.Arms["gomemlimit"].Median.NA)
	assert.True(t, f.Arms["freeos"].Median.NA)
	assert.Equal(t, 1.0, f.Arms["plain"].Median.Value)
}

// The burst scenario runs every arm; cadence and http run all but freeos,
// burst's control; only the load scenarios' cgroups take their own limit.
func TestScenarioArms(t *testing.T) {
	ran := func(s scenario) []string {
		var got []string
		for _, a := range arms {
			if s.runs(a) {
				got = append(got, a.Key)
			}
		}
		return got
	}
	assert.Equal(t, []string{"plain", "gomemlimit", "memctl", "memctl-aa", "freeos"}, ran(burstScenario))
	for _, s := range []scenario{cadenceScenario, httpScenario} {
		assert.Equal(t, []string{"plain", "gomemlimit", "memctl", "memctl-aa"}, ran(s), s.Name)
		assert.Nil(t, s.cgroupLimit, s.Name)
	}
	assert.Nil(t, burstScenario.cgroupLimit)
	for _, s := range []scenario{loadScenarioPlain, loadScenarioContended, loadScenarioGC} {
		require.NotNil(t, s.cgroupLimit, s.Name)
		assert.Equal(t, int64(4<<30), s.cgroupLimit(defaultParams(false)), s.Name)
	}
}

func TestOpenLoop(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%10 == 0 {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	lat, failed, _ := openLoop(srv.URL, 200, 500*time.Millisecond, 5*time.Second, 100)
	require.Len(t, lat, 100, "rate × duration requests")
	assert.Equal(t, int64(100), n.Load(), "each sent once")
	assert.Equal(t, 10, failed, "every 10th answered 503")
	assert.Equal(t, 10, countEqual(lat, 5), "a failed request counts the timeout")
	for _, l := range lat {
		assert.Positive(t, l)
	}

	// Open loop: a server slower than the rate does not slow the sender;
	// requests over the in-flight cap fail at once. The server holds each
	// request 1.5 s, so all 20 sends (200 ms of them) are made before a
	// slot frees even when the sender's timers run 1 s late on a loaded
	// machine (with 300 ms, 110 ms late freed one). A sender that waited
	// for a slot (a closed loop of 5) would fail none: 15 failed at once,
	// with 5 held in flight, is what shows it did not wait. No wall-clock
	// ceiling on the whole call: it adds nothing to that, and on a loaded
	// machine it measured the scheduler.
	const hold = 1500 * time.Millisecond
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(hold)
	}))
	defer slow.Close()
	lat, failed, _ = openLoop(slow.URL, 100, 200*time.Millisecond, 5*time.Second, 5)
	require.Len(t, lat, 20)
	assert.Equal(t, 15, failed, "5 in flight, 15 over the cap: the sender did not wait for a slot")
	slices.Sort(lat)
	assert.GreaterOrEqual(t, lat[0], hold.Seconds())
}

func countEqual(xs []float64, v float64) int {
	n := 0
	for _, x := range xs {
		if x == v {
			n++
		}
	}
	return n
}

// TestCPUCgroup makes the contended scenario's cgroup, puts a process in
// it, reads its quota back and removes it.
func TestCPUCgroup(t *testing.T) {
	cpuquota.SkipUnlessAvailable(t)
	name := "memctl-bench-cpu-test-" + strconv.Itoa(os.Getpid())
	g, err := cpuquota.New(name, 10000, 100000)
	require.NoError(t, err)
	defer func() { _ = g.Remove() }()
	b, err := os.ReadFile(filepath.Join(g.Dir, "cpu.cfs_quota_us"))
	require.NoError(t, err)
	assert.Equal(t, "10000", strings.TrimSpace(string(b)))
	sleep := exec.Command("sleep", "30")
	require.NoError(t, sleep.Start())
	defer func() { _ = sleep.Process.Kill(); _ = sleep.Wait() }()
	require.NoError(t, g.Add(sleep.Process.Pid))
	require.NoError(t, g.StartBusy())
	b, err = os.ReadFile(filepath.Join(g.Dir, "cgroup.procs"))
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(string(b)), strconv.Itoa(sleep.Process.Pid))
	assert.Len(t, strings.Fields(string(b)), 2, "the process and the busy loop")
	require.NoError(t, g.Remove())
	_, err = os.Stat(g.Dir)
	assert.True(t, os.IsNotExist(err), "the cgroup is gone")
	assert.NoError(t, sleep.Process.Signal(syscall.Signal(0)), "the process moved out lives on")
}

func TestOverlapFigures(t *testing.T) {
	start := time.Unix(1000, 0)
	lat := make([]float64, 1000)
	for i := range lat {
		lat[i] = 0.010
		if i >= 199 && i <= 210 {
			lat[i] = 0.050
		}
	}
	trim := []span{{start.Add(2 * time.Second).UnixNano(), start.Add(2100 * time.Millisecond).UnixNano()}}
	in, out, ratio, n := overlapFigures(lat, start, 100, trim, nil)
	assert.Equal(t, 0.050, in.Value)
	assert.Equal(t, 0.010, out.Value)
	assert.InDelta(t, 5.0, ratio.Value, 1e-9)
	// Due from 1.99 s (its 50 ms reach into the trim) through 2.1 s: 199 to
	// 210; those due before 1.99 s end before the trim starts.
	assert.Equal(t, 12.0, n.Value)

	// The placebo: the same window half a period later holds no slow
	// request, and the requests of the real trim are left out: a ratio of 1.
	end := start.Add(10 * time.Second).UnixNano() // 1,000 requests at 100/s
	_, _, placebo, _ := overlapFigures(lat, start, 100, shiftSpans(trim, 5*time.Second, start.UnixNano(), end), trim)
	assert.Equal(t, 1.0, placebo.Value)

	// A trim in the second half: its window half a period later is past
	// the last request, so the placebo window is half a period earlier.
	late := []span{{start.Add(7 * time.Second).UnixNano(), start.Add(7100 * time.Millisecond).UnixNano()}}
	moved := shiftSpans(late, 5*time.Second, start.UnixNano(), end)
	assert.Equal(t, start.Add(2*time.Second).UnixNano(), moved[0][0])
	_, _, placebo, _ = overlapFigures(lat, start, 100, moved, late)
	assert.False(t, placebo.NA, "the placebo window lies among the requests")
	// A trim in the middle of a short run: neither a half period later nor
	// earlier fits, a quarter period does.
	mid := []span{{start.Add(5 * time.Second).UnixNano(), start.Add(5100 * time.Millisecond).UnixNano()}}
	moved = shiftSpans(mid, 6*time.Second, start.UnixNano(), end)
	assert.Equal(t, start.Add(8*time.Second).UnixNano(), moved[0][0])

	// No trim, or every request overlapping: not observed.
	in, _, ratio, n = overlapFigures(lat, start, 100, nil, nil)
	assert.True(t, in.NA && ratio.NA)
	assert.Zero(t, n.Value)
	all := []span{{start.UnixNano(), start.Add(time.Minute).UnixNano()}}
	_, _, ratio, n = overlapFigures(lat, start, 100, all, nil)
	assert.True(t, ratio.NA)
	assert.Equal(t, 1000.0, n.Value)
}
