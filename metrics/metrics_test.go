package metrics

import (
	"context"
	"log/slog"
	"math"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/metrictable"
	"github.com/memctl/memctl/internal/thpflag"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// start runs memctl.Start in this process with a short trim delay, no
// GOMEMLIMIT decision (AUTOMEMLIMIT=off) and no automatic trims, and restores GOMEMLIMIT and the
// THP flag afterwards.
func start(t *testing.T) *memctl.Controller {
	t.Helper()
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_ARENA_MAX", "GOMEMLIMIT"} {
		t.Setenv(k, "")
	}
	t.Setenv("AUTOMEMLIMIT", "off")
	// No trims but the test's own: none on another process's PSI, none
	// from a burst the detector finds in the test's allocations (the tests
	// count trims exactly).
	t.Setenv("MEMCTL_PRESSURE", "off")
	t.Setenv("MEMCTL_AUTOBURST", "off")
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	if st, err := thp.Process(); err == nil {
		t.Cleanup(func() { restoreTHP(st) })
	}
	ctl, err := memctl.Start(memctl.WithLogger(slog.New(slog.DiscardHandler)),
		memctl.WithTrimDelay(10*time.Millisecond), memctl.WithTrim(trim.Config{MinRelease: -1}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctl.Close() })
	return ctl
}

func restoreTHP(s thp.State) {
	switch s {
	case thp.StateEnabled:
		_ = thpflag.Set(thpflag.Enabled)
	case thp.StateDisabled:
		_ = thpflag.Set(thpflag.Disabled)
	case thp.StateDisabledExceptAdvised:
		_ = thpflag.Set(thpflag.DisabledExceptAdvised)
	}
}

// gather registers c in a fresh pedantic registry (which checks that every
// metric matches its description) and returns the families by name.
func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	require.True(t, ok, "%s not in the scrape", name)
	for _, m := range mf.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("%s: no series with labels %v", name, labels)
	return 0
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func TestLint(t *testing.T) {
	ctl := start(t)
	pool, err := limits.NewPool(limits.PoolConfig{Name: "http", Limit: 1 << 20})
	require.NoError(t, err)
	defer pool.Close()
	c, err := newCollector(ctl, Pool{Name: "http", Pool: pool})
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems, "names, units and help by the Prometheus conventions")
}

// The package doc lists every metric of the table, and no other.
func TestDocListsTable(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var doc, table []string
	for _, m := range regexp.MustCompile(`(?m)^//\t(memctl_[a-z_]+)`).FindAllStringSubmatch(string(b), -1) {
		doc = append(doc, m[1])
	}
	for _, m := range metrictable.Metrics {
		table = append(table, m.Prom)
	}
	slices.Sort(doc)
	slices.Sort(table)
	assert.Equal(t, table, doc)
}

// The scrape follows the controller: a real trim after a real burst shows
// in memctl_trims_total and memctl_trim_released_bytes_total.
func TestControllerMetricsFollowTrims(t *testing.T) {
	ctl := start(t)
	c, err := newCollector(ctl)
	require.NoError(t, err)

	mfs := gather(t, c)
	assert.Equal(t, 1.0, value(t, mfs, "memctl_enabled"))
	assert.Equal(t, 0.0, value(t, mfs, "memctl_trims_total"))
	assert.Equal(t, 0.01, value(t, mfs, "memctl_trim_delay_seconds"))
	assert.Equal(t, 1.0, value(t, mfs, "memctl_gomemlimit_info", "source", "env"), "AUTOMEMLIMIT=off: the operator's choice")
	assert.NotContains(t, mfs, "memctl_gomemlimit_bytes", "no GOMEMLIMIT: absent, not MaxInt64")
	assert.NotContains(t, mfs, "memctl_trim_last_duration_seconds", "no trim yet")
	st, err := thp.Process()
	require.NoError(t, err)
	assert.Equal(t, 1.0, value(t, mfs, "memctl_thp_info", "state", st.String(), "policy", ctl.Report().THPPolicy.String()))

	work(32 << 20)
	memctl.AfterBurst()
	for deadline := time.Now().Add(20 * time.Second); ctl.Stats().Trim.Trims == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	want := ctl.Stats().Trim
	require.Equal(t, int64(1), want.Trims)

	mfs = gather(t, c)
	assert.Equal(t, 1.0, value(t, mfs, "memctl_trims_total"))
	assert.Equal(t, float64(want.TotalReleased), value(t, mfs, "memctl_trim_released_bytes_total"))
	assert.Greater(t, value(t, mfs, "memctl_trim_released_bytes_total"), 0.0, "the trim released the burst")
	assert.Equal(t, want.LastDuration.Seconds(), value(t, mfs, "memctl_trim_last_duration_seconds"))
	assert.Equal(t, want.TotalCPU.Seconds(), value(t, mfs, "memctl_trim_cpu_seconds_total"))
	assert.Equal(t, float64(want.EarlyStarts), value(t, mfs, "memctl_trims_early_total"))
	assert.Greater(t, value(t, mfs, "memctl_trim_cpu_seconds_total"), 0.0, "a trim costs CPU, and the rate limit counts it")
	// By origin and reason, apart: the debounced trim is not a pressure trim.
	assert.Equal(t, 1.0, value(t, mfs, "memctl_trims_origin_total", "origin", "debounced"))
	for o, ost := range map[string]trim.OriginStats{"debounced": want.Debounced, "pressure": want.Pressure, "spiral": want.Spiral, "by_name": want.ByName} {
		assert.Equal(t, float64(ost.Trims), value(t, mfs, "memctl_trims_origin_total", "origin", o))
		assert.Equal(t, float64(ost.Skipped), value(t, mfs, "memctl_trims_origin_skipped_total", "origin", o))
		assert.Equal(t, ost.CPU.Seconds(), value(t, mfs, "memctl_trim_origin_cpu_seconds_total", "origin", o))
	}
	assert.Equal(t, 0.0, value(t, mfs, "memctl_trims_origin_total", "origin", "pressure"))
	assert.Equal(t, want.TotalCPU.Seconds(), value(t, mfs, "memctl_trim_origin_cpu_seconds_total", "origin", "debounced"))
	for r, n := range map[string]int64{"min_release": want.SkippedMinRelease, "cost": want.SkippedCost, "budget": want.SkippedBudget, "running": want.SkippedRunning} {
		assert.Equal(t, float64(n), value(t, mfs, "memctl_trims_skipped_reason_total", "reason", r))
	}
	ps := ctl.Stats().Pressure
	assert.Equal(t, float64(ps.LeftToKernel), value(t, mfs, "memctl_pressure_left_to_kernel_total"))
	assert.Equal(t, float64(ps.Signals), value(t, mfs, "memctl_pressure_events_total", "kind", "kernel"))
	assert.Equal(t, float64(ps.Spirals), value(t, mfs, "memctl_pressure_events_total", "kind", "spiral"))

	debug.SetMemoryLimit(300 << 20)
	mfs = gather(t, c)
	assert.Equal(t, float64(300<<20), value(t, mfs, "memctl_gomemlimit_bytes"))
}

// Refusals and bytes in use come from the pool, one series per pool.
func TestPoolMetrics(t *testing.T) {
	prev := debug.SetMemoryLimit(math.MaxInt64) // pool b: no GOMEMLIMIT, no limit
	defer debug.SetMemoryLimit(prev)
	a, err := limits.NewPool(limits.PoolConfig{Name: "a", Limit: 1 << 20, HeapPressure: -1})
	require.NoError(t, err)
	defer a.Close()
	b, err := limits.NewPool(limits.PoolConfig{Name: "b", Limit: limits.Unlimited, HeapPressure: -1})
	require.NoError(t, err)
	defer b.Close()
	c, err := newCollector(nil, Pool{Name: "a", Pool: a}, Pool{Pool: b})
	require.NoError(t, err)

	acct, err := a.Open("req", limits.Unlimited)
	require.NoError(t, err)
	require.NoError(t, acct.Grow(100<<10))
	assert.ErrorIs(t, acct.Grow(2<<20), limits.ErrResourceExhausted)
	assert.ErrorIs(t, acct.Grow(2<<20), limits.ErrResourceExhausted)

	mfs := gather(t, c)
	assert.Equal(t, 2.0, value(t, mfs, "memctl_budget_refusals_total", "pool", "a", "scope", "pool"), "the pool was full")
	assert.Equal(t, 0.0, value(t, mfs, "memctl_budget_refusals_total", "pool", "a", "scope", "account"))
	assert.Equal(t, 0.0, value(t, mfs, "memctl_budget_refusals_total", "pool", "b", "scope", "pool"))
	assert.Equal(t, float64(a.Stats().Used), value(t, mfs, "memctl_budget_in_use_bytes", "pool", "a"))
	assert.GreaterOrEqual(t, value(t, mfs, "memctl_budget_in_use_bytes", "pool", "a"), float64(100<<10))
	assert.Equal(t, float64(1<<20), value(t, mfs, "memctl_budget_limit_bytes", "pool", "a"))
	assert.Len(t, mfs["memctl_budget_limit_bytes"].GetMetric(), 1, "pool b has no limit (Unlimited): absent, not MaxInt64")
	assert.Equal(t, 0.0, value(t, mfs, "memctl_enabled"), "no controller given")
	before := value(t, mfs, "memctl_budget_unguarded_total")
	require.NoError(t, limits.Grow(context.Background(), 1), "a Grow with no account in the context")
	assert.Equal(t, before+1, value(t, gather(t, c), "memctl_budget_unguarded_total"), "counted once for the process")
	assert.Len(t, gather(t, c)["memctl_budget_unguarded_total"].GetMetric(), 1, "one series, not one per pool")
	assert.Equal(t, 1.0, value(t, mfs, "memctl_budget_in_flight", "pool", "a"))
	acct.Close()
	mfs = gather(t, c)
	assert.Equal(t, 0.0, value(t, mfs, "memctl_budget_in_use_bytes", "pool", "a"))
	assert.Equal(t, 0.0, value(t, mfs, "memctl_budget_in_flight", "pool", "a"))
	assert.Equal(t, 0.0, value(t, mfs, "memctl_budget_undercharged_total", "pool", "a"))
}

// The peak histogram: one per pool, with the pool's buckets, cumulative,
// as limits.PeakHistogram counts them; the request refused at 2 MiB asked
// for 2 MiB + 100 KiB and is counted there.
func TestPeakHistogramMetric(t *testing.T) {
	p, err := limits.NewPool(limits.PoolConfig{Name: "jobs", Limit: 256 << 20, HeapPressure: -1})
	require.NoError(t, err)
	defer p.Close()
	for _, n := range []int64{0, 100 << 10, 1 << 20, 3 << 20} {
		require.NoError(t, p.Do(context.Background(), limits.WorkConfig{Limit: 2 << 20}, func(ctx context.Context) error {
			if err := limits.Grow(ctx, n); err != nil {
				return nil // refused: counted at what it asked for
			}
			limits.Shrink(ctx, n)
			return nil
		}))
	}
	c, err := newCollector(nil, Pool{Pool: p})
	require.NoError(t, err)
	mfs := gather(t, c)
	mf := mfs["memctl_budget_request_peak_bytes"]
	require.NotNil(t, mf)
	require.Len(t, mf.GetMetric(), 1)
	m := mf.GetMetric()[0]
	assert.Equal(t, "jobs", m.GetLabel()[0].GetValue())
	h := m.GetHistogram()
	assert.Equal(t, uint64(4), h.GetSampleCount())
	assert.Equal(t, float64(100<<10+1<<20+3<<20), h.GetSampleSum())
	got := map[float64]uint64{}
	for _, b := range h.GetBucket() {
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	assert.Len(t, got, metrictable.PeakBuckets)
	assert.Equal(t, uint64(1), got[64<<10])
	assert.Equal(t, uint64(2), got[128<<10])
	assert.Equal(t, uint64(3), got[1<<20])
	assert.Equal(t, uint64(3), got[2<<20])
	assert.Equal(t, uint64(4), got[4<<20])
	assert.Equal(t, uint64(4), got[64<<30])
}

// The charge check's counter follows PoolStats.Undercharged, from a real
// heap: a job that holds 64 MiB and charges 64 KiB of it, through real GC
// cycles.
func TestUnderchargedMetric(t *testing.T) {
	prev := debug.SetMemoryLimit(math.MaxInt64)
	defer debug.SetMemoryLimit(prev)
	p, err := limits.NewPool(limits.PoolConfig{Name: "jobs", Limit: 1 << 30})
	require.NoError(t, err)
	defer p.Close()
	c, err := newCollector(nil, Pool{Pool: p})
	require.NoError(t, err)
	runtime.GC()
	runtime.GC() // the baseline, nothing in flight
	var rows [][]byte
	require.NoError(t, p.Do(context.Background(), limits.WorkConfig{Limit: 1 << 30}, func(ctx context.Context) error {
		for range 64 {
			rows = append(rows, make([]byte, 1<<20))
			if err := limits.Grow(ctx, 1<<10); err != nil {
				return err
			}
			runtime.GC()
		}
		defer limits.Shrink(ctx, 64<<10)
		assert.Eventually(t, func() bool { runtime.GC(); return p.Stats().Undercharged > 0 }, 10*time.Second, time.Millisecond)
		return nil
	}))
	runtime.KeepAlive(rows)
	mfs := gather(t, c)
	assert.Equal(t, float64(p.Stats().Undercharged), value(t, mfs, "memctl_budget_undercharged_total", "pool", "jobs"))
	assert.Positive(t, value(t, mfs, "memctl_budget_undercharged_total", "pool", "jobs"))
	assert.GreaterOrEqual(t, value(t, mfs, "memctl_budget_heap_baseline_bytes", "pool", "jobs"), 0.0)
}

// work allocates n bytes in 1 MiB pieces, every page touched; all of it is
// garbage when it returns.
func work(n int) int {
	var sum int
	for range n >> 20 {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		sum += int(b[len(b)-4096])
	}
	return sum
}

func TestBadPools(t *testing.T) {
	p, err := limits.NewPool(limits.PoolConfig{HeapPressure: -1})
	require.NoError(t, err)
	defer p.Close()
	q, err := limits.NewPool(limits.PoolConfig{HeapPressure: -1})
	require.NoError(t, err)
	defer q.Close()
	for _, pools := range [][]Pool{
		{{Name: "x", Pool: p}}, // p is named "pool": one name per pool
		{{Pool: p}, {Pool: q}}, // two pools named "pool"
		{{Pool: p}, {Name: "pool", Pool: p}},
		{{Name: "x"}},
	} {
		_, err := newCollector(nil, pools...)
		assert.Error(t, err, "%v", pools)
	}
	_, err = newCollector(nil, Pool{Pool: p})
	assert.NoError(t, err, "an empty Name is the pool's own")
	reg := prometheus.NewRegistry()
	_, err = Register(reg, nil)
	require.NoError(t, err)
	_, err = Register(reg, nil)
	assert.Error(t, err, "a second collector with the same metrics")
}

// TestCAllocatorMetrics: one series per allocator found, labelled with its
// object; the owner of malloc is marked.
func TestCAllocatorMetrics(t *testing.T) {
	ctl := start(t)
	hs := ctl.Stats().CHeaps
	if len(hs) == 0 {
		t.Skip("no C allocator found (cgo off or not Linux)")
	}
	c, err := newCollector(ctl)
	require.NoError(t, err)
	mfs := gather(t, c)
	h := hs[0]
	assert.Equal(t, 1.0, value(t, mfs, "memctl_c_allocator_info", "allocator", h.Allocator, "object", h.Library, "owner", "true", "trimmed", "true"))
	_, err = cheap.Detect().Release()
	require.NoError(t, err)
	mfs = gather(t, c)
	assert.GreaterOrEqual(t, value(t, mfs, "memctl_c_allocator_releases_total", "allocator", h.Allocator, "object", h.Library), 1.0)
	assert.Greater(t, value(t, mfs, "memctl_c_allocator_last_max_slice_seconds", "allocator", h.Allocator, "object", h.Library), 0.0)
}
