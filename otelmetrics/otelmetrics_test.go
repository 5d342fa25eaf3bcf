package otelmetrics

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/metrictable"
	"github.com/memctl/memctl/limits"
)

var sink []byte

// collect reads every metric of the reader, by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// points returns the int64 data points of m (gauge or sum) by their
// attribute set, and whether m is a monotonic sum.
func points(t *testing.T, m metricdata.Metrics) (map[attribute.Distinct]metricdata.DataPoint[int64], bool) {
	t.Helper()
	out := map[attribute.Distinct]metricdata.DataPoint[int64]{}
	var dps []metricdata.DataPoint[int64]
	mono := false
	switch d := m.Data.(type) {
	case metricdata.Gauge[int64]:
		dps = d.DataPoints
	case metricdata.Sum[int64]:
		dps, mono = d.DataPoints, d.IsMonotonic
		assert.Equal(t, metricdata.CumulativeTemporality, d.Temporality, m.Name)
	default:
		t.Fatalf("%s: data %T, want int64 gauge or sum", m.Name, m.Data)
	}
	for _, dp := range dps {
		out[dp.Attributes.Equivalent()] = dp
	}
	return out, mono
}

func one(t *testing.T, got map[string]metricdata.Metrics, name string, attrs ...attribute.KeyValue) (int64, bool) {
	t.Helper()
	m, ok := got[name]
	require.True(t, ok, "%s not collected", name)
	dps, mono := points(t, m)
	set := attribute.NewSet(attrs...)
	dp, ok := dps[set.Equivalent()]
	require.True(t, ok, "%s%v: no data point; have %v", name, attrs, dps)
	return dp.Value, mono
}

func TestInstrumentsReadBack(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	for _, k := range []string{"MEMCTL", "MEMCTL_TRIM_DELAY", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_BUDGETS"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	// No trim between collect and Stats from other processes' PSI, nor
	// from a burst the detector finds at a later GC end.
	t.Setenv("MEMCTL_PRESSURE", "off")
	t.Setenv("MEMCTL_AUTOBURST", "off")
	discard := slog.New(slog.DiscardHandler)
	ctl, err := memctl.Start(memctl.WithLogger(discard), memctl.WithTrimDelay(10*time.Millisecond))
	require.NoError(t, err)
	defer ctl.Close()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "api", Limit: 64 << 20, Logger: discard})
	require.NoError(t, err)
	defer pool.Close()
	acct, err := pool.Open("req-1", 2<<20)
	require.NoError(t, err)
	defer acct.Close()
	require.NoError(t, acct.Grow(1<<20))
	require.ErrorIs(t, acct.Grow(4<<20), limits.ErrResourceExhausted, "over the request's budget")
	defer acct.Shrink(1 << 20)

	// One burst and its trim (or skip).
	for range 4 {
		sink = make([]byte, 16<<20)
	}
	sink = nil
	ctl.AfterBurst()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s := ctl.Stats().Trim
		if s.Trims+s.Skipped > 0 {
			break
		}
		require.False(t, time.Now().After(deadline), "no trim in 20 s")
	}
	debug.SetMemoryLimit(3 << 30)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	reg, err := Register(mp, ctl, Pool{Name: "api", Pool: pool})
	require.NoError(t, err)

	got := collect(t, reader)
	st, rep, ps := ctl.Stats(), ctl.Report(), pool.Stats()
	v, mono := one(t, got, "memctl.gomemlimit")
	assert.Equal(t, int64(3<<30), v, "GOMEMLIMIT now")
	assert.False(t, mono)
	assert.Equal(t, "By", got["memctl.gomemlimit"].Unit)
	v, _ = one(t, got, "memctl.enabled")
	assert.Equal(t, int64(1), v)
	v, _ = one(t, got, "memctl.gomemlimit.info", attribute.String("source", rep.MemLimit.Source.String()))
	assert.Equal(t, int64(1), v)
	v, mono = one(t, got, "memctl.trims")
	assert.Equal(t, st.Trim.Trims, v)
	assert.True(t, mono, "a counter")
	v, _ = one(t, got, "memctl.trims.skipped")
	assert.Equal(t, st.Trim.Skipped, v)
	assert.Positive(t, st.Trim.Trims+st.Trim.Skipped)
	v, _ = one(t, got, "memctl.trim.released")
	assert.Equal(t, st.Trim.TotalReleased, v)
	v, _ = one(t, got, "memctl.thp.info", attribute.String("state", rep.THPState.String()),
		attribute.String("policy", rep.THPPolicy.String()), attribute.String("system", cmpOr(rep.THPSystem, "unknown")))
	assert.Equal(t, int64(1), v)
	d, ok := got["memctl.trim.delay"].Data.(metricdata.Gauge[float64])
	require.True(t, ok, "trim delay: a float gauge")
	require.Len(t, d.DataPoints, 1)
	assert.Equal(t, 0.01, d.DataPoints[0].Value)
	assert.Equal(t, "s", got["memctl.trim.delay"].Unit)

	api := attribute.String("pool", "api")
	v, _ = one(t, got, "memctl.budget.in_use", api)
	assert.Equal(t, ps.Used, v)
	assert.GreaterOrEqual(t, v, int64(1<<20))
	v, _ = one(t, got, "memctl.budget.limit", api)
	assert.Equal(t, int64(64<<20), v)
	v, mono = one(t, got, "memctl.budget.refusals", api, attribute.String("scope", "account"))
	assert.Equal(t, int64(1), v, "the refused Grow")
	assert.True(t, mono)
	v, _ = one(t, got, "memctl.budget.refusals", api, attribute.String("scope", "pool"))
	assert.Zero(t, v)
	_, _ = one(t, got, "memctl.budget.unguarded")
	v, _ = one(t, got, "memctl.budget.in_flight", api)
	assert.Equal(t, ps.InFlight, v)
	assert.Equal(t, int64(1), v, "req-1 is open")
	v, mono = one(t, got, "memctl.budget.request_peaks", api, attribute.String("le", "+Inf"))
	assert.Equal(t, ps.Peaks.Count, v)
	assert.True(t, mono)
	v, _ = one(t, got, "memctl.trims.origin", attribute.String("origin", "debounced"))
	assert.Equal(t, st.Trim.Debounced.Trims, v)
	var skipped int64
	for _, r := range []string{"min_release", "cost", "budget", "running"} {
		v, _ = one(t, got, "memctl.trims.skipped_reason", attribute.String("reason", r))
		skipped += v
	}
	assert.Equal(t, st.Trim.Skipped, skipped, "the reasons add up to the skips")
	for _, h := range st.CHeaps {
		v, _ = one(t, got, "memctl.c_allocator.info", attribute.String("allocator", h.Allocator),
			attribute.String("object", metrictable.ObjectLabel(&h)), attribute.String("prefix", h.Prefix), attribute.Bool("owner", h.OwnsMalloc), attribute.Bool("trimmed", h.Trimmed))
		assert.Equal(t, int64(1), v)
	}

	// Nothing outside the tables, and what always exists is there.
	names := map[string]bool{}
	for _, in := range metrictable.Metrics {
		names[in.OTel] = true
	}
	for n := range got {
		assert.True(t, names[n], "%s is not in the table", n)
	}
	for _, n := range []string{"memctl.trim.pending", "memctl.bursts_in_flight", "memctl.misuse", "memctl.trim.cpu",
		"memctl.pressure.events", "memctl.gc.death_spiral", "memctl.gc.cpu_share", "memctl.budget.peak", "memctl.heap_pressure"} {
		assert.Contains(t, got, n)
	}

	// The counters move between collections: the callback reads afresh.
	require.ErrorIs(t, acct.Grow(8<<20), limits.ErrResourceExhausted)
	v, _ = one(t, collect(t, reader), "memctl.budget.refusals", api, attribute.String("scope", "account"))
	assert.Equal(t, int64(2), v)
	acct2, err := pool.Open("req-2", 8<<20)
	require.NoError(t, err)
	require.NoError(t, acct2.Grow(3<<20))
	acct2.Shrink(3 << 20)
	acct2.Close()
	got = collect(t, reader)
	v, _ = one(t, got, "memctl.budget.request_peaks", api, attribute.String("le", "+Inf"))
	assert.Equal(t, int64(1), v, "req-2's peak, recorded when it closed")
	v, _ = one(t, got, "memctl.budget.request_peaks", api, attribute.String("le", strconv.FormatInt(4<<20, 10)))
	assert.Equal(t, int64(1), v, "3 MiB is at or under the 4 MiB bound")
	v, _ = one(t, got, "memctl.budget.request_peaks", api, attribute.String("le", strconv.FormatInt(2<<20, 10)))
	assert.Zero(t, v, "and over the 2 MiB bound")

	require.NoError(t, reg.Unregister())
	assert.Empty(t, collect(t, reader), "nothing observed after Unregister")
}

// With no controller (the auto package's case), GOMEMLIMIT and the misuse
// count are observed and memctl.enabled is 0.
func TestNilController(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	debug.SetMemoryLimit(1 << 30)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	reg, err := Register(mp, nil)
	require.NoError(t, err)
	defer reg.Unregister()
	got := collect(t, reader)
	v, _ := one(t, got, "memctl.enabled")
	assert.Zero(t, v)
	v, _ = one(t, got, "memctl.gomemlimit")
	assert.Equal(t, int64(1<<30), v)
	assert.NotContains(t, got, "memctl.gomemlimit.info")
	assert.NotContains(t, got, "memctl.budget.in_use", "no pool given")
}

func TestRegisterErrors(t *testing.T) {
	mp := sdkmetric.NewMeterProvider()
	defer mp.Shutdown(context.Background())
	pool, err := limits.NewPool(limits.PoolConfig{Name: "a", Limit: 1 << 20, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	for _, tc := range []struct {
		pools []Pool
		want  string
	}{
		{[]Pool{{Name: "b", Pool: pool}}, `pool "b" is named "a"`},
		{[]Pool{{Name: "a", Pool: pool}, {Pool: pool}}, `two pools named "a"`},
		{[]Pool{{Name: "a"}}, `pool "a" is nil`},
	} {
		_, err := Register(mp, nil, tc.pools...)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// The package doc lists every instrument of the table, and no other.
func TestDocListsTable(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var doc, table []string
	for _, m := range regexp.MustCompile(`(?m)^//\t(memctl\.[a-z_.]+)`).FindAllStringSubmatch(string(b), -1) {
		doc = append(doc, m[1])
	}
	for _, in := range metrictable.Metrics {
		table = append(table, in.OTel)
	}
	slices.Sort(doc)
	slices.Sort(table)
	assert.Equal(t, table, doc)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
