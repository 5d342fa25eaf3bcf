package otelmetrics

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// ScopeName is the instrumentation scope (the meter's name).
const ScopeName = "github.com/memctl/memctl/otelmetrics"

// Pool is a budget pool for Register. Name is the value of the pool
// attribute; it must be the pool's own name (PoolConfig.Name,
// limits.Pool.Name), so that a pool has one name in its errors, its Stats
// and its metrics, and unique among the pools of one Register. Default: ""
// (means Pool.Name()).
type Pool struct {
	Name string
	Pool *limits.Pool
}

// snapshot is what one collection reads.
type snapshot struct {
	live   bool
	stats  memctl.Stats
	report memctl.Report
	pool   limits.PoolStats // for the pool table
}

// observe records one value with attributes; a read func calls it once per
// series, or not at all for a figure that does not exist.
type observe func(v float64, attrs ...attribute.KeyValue)

// instrument is one entry of a table.
type instrument struct {
	name, unit, desc string
	counter, float   bool
	prom             string // the Prometheus metric of package metrics it mirrors
	read             func(s *snapshot, o observe)
}

func gauge(name, unit, prom, desc string, read func(s *snapshot) (float64, bool)) instrument {
	return instrument{name: name, unit: unit, desc: desc, prom: prom, read: func(s *snapshot, o observe) {
		if v, ok := read(s); ok {
			o(v)
		}
	}}
}

func count(name, unit, prom, desc string, read func(s *snapshot) int64) instrument {
	return instrument{name: name, unit: unit, desc: desc, prom: prom, counter: true,
		read: func(s *snapshot, o observe) { o(float64(read(s))) }}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// controllerInstruments are read from Controller.Stats and Report at each
// collection. To add one, add an entry (and its peer in package metrics).
var controllerInstruments = []instrument{
	gauge("memctl.enabled", "1", "memctl_enabled", "1 when memctl.Start ran and MEMCTL did not switch memctl off.",
		func(s *snapshot) (float64, bool) { return boolValue(s.live && !s.report.Off), true }),
	gauge("memctl.gomemlimit", "By", "memctl_gomemlimit_bytes", "GOMEMLIMIT now (debug.SetMemoryLimit); not observed when no limit is set.",
		func(s *snapshot) (float64, bool) {
			return float64(s.stats.GoMemLimit), s.stats.GoMemLimit != math.MaxInt64
		}),
	{name: "memctl.gomemlimit.info", unit: "1", prom: "memctl_gomemlimit_info",
		desc: "1, with the source of the limit behind GOMEMLIMIT: none, cgroup v1, cgroup v2, system or env.",
		read: func(s *snapshot, o observe) {
			if s.live {
				o(1, attribute.String("source", s.report.MemLimit.Source.String()))
			}
		}},
	gauge("memctl.memory_limit", "By", "memctl_memory_limit_bytes", "The memory limit GOMEMLIMIT was derived from (cgroup or system); not observed when none was found.",
		func(s *snapshot) (float64, bool) {
			return float64(s.report.MemLimit.MemoryLimit), s.live && s.report.MemLimit.MemoryLimit > 0
		}),
	{name: "memctl.trim.delay", unit: "s", float: true, prom: "memctl_trim_delay_seconds",
		desc: "How long after the last burst the trim runs; 0 when trimming is off.",
		read: func(s *snapshot, o observe) {
			if s.live {
				o(s.report.TrimDelay.Seconds())
			}
		}},
	count("memctl.trims", "{trim}", "memctl_trims_total", "Trims run.", func(s *snapshot) int64 { return s.stats.Trim.Trims }),
	count("memctl.trims.skipped", "{trim}", "memctl_trims_skipped_total", "Due trims skipped because too little could be released.",
		func(s *snapshot) int64 { return s.stats.Trim.Skipped }),
	count("memctl.trim.released", "By", "memctl_trim_released_bytes_total", "Bytes the trims released to the OS (Go heap and C heap).",
		func(s *snapshot) int64 { return s.stats.Trim.TotalReleased }),
	{name: "memctl.trim.last_duration", unit: "s", float: true, prom: "memctl_trim_last_duration_seconds",
		desc: "Wall time of the last trim; not observed before the first.",
		read: func(s *snapshot, o observe) {
			if s.stats.Trim.Trims > 0 {
				o(s.stats.Trim.LastDuration.Seconds())
			}
		}},
	gauge("memctl.trim.pending", "1", "memctl_trim_pending", "1 while a trim is scheduled.",
		func(s *snapshot) (float64, bool) { return boolValue(s.stats.Trim.Pending), s.live }),
	gauge("memctl.bursts_in_flight", "{burst}", "memctl_bursts_in_flight", "Bursts begun (memctl.Begin) and not yet ended.",
		func(s *snapshot) (float64, bool) { return float64(s.stats.Trim.InFlight), s.live }),
	{name: "memctl.thp.info", unit: "1", prom: "memctl_thp_info",
		desc: "1, with the process's THP state (PR_GET_THP_DISABLE), the policy memctl applied, and the system mode.",
		read: func(s *snapshot, o observe) {
			if !s.live {
				return
			}
			r := s.report
			sys := r.THPSystem
			if sys == "" {
				sys = "unknown"
			}
			o(1, attribute.String("state", r.THPState.String()), attribute.String("policy", r.THPPolicy.String()), attribute.String("system", sys))
		}},
	{name: "memctl.c_heap.in_use", unit: "By", prom: "memctl_c_heap_in_use_bytes",
		desc: "Bytes in live C heap blocks, as the allocator that owns malloc reports them.",
		read: func(s *snapshot, o observe) {
			if h := s.stats.CHeap; h.InUse >= 0 {
				o(float64(h.InUse), attribute.String("allocator", h.Allocator))
			}
		}},
	{name: "memctl.c_heap.retained", unit: "By", prom: "memctl_c_heap_retained_bytes",
		desc: "Bytes the C allocator holds that no live block uses.",
		read: func(s *snapshot, o observe) {
			if h := s.stats.CHeap; h.Retained >= 0 {
				o(float64(h.Retained), attribute.String("allocator", h.Allocator))
			}
		}},
	count("memctl.misuse", "{call}", "memctl_misuse_total", "Misuse: AfterBurst or Begin with no live controller, Start while another was live, an end of Begin called twice.",
		func(s *snapshot) int64 { return s.stats.Misuse }),
	{name: "memctl.trim.cpu", unit: "s", float: true, counter: true, prom: "memctl_trim_cpu_seconds_total",
		desc: "CPU time the trims caused (GC and scavenger CPU plus the calling thread's, at most the process's): what the 2% rate limit counts.",
		read: func(s *snapshot, o observe) { o(s.stats.Trim.TotalCPU.Seconds()) }},
	count("memctl.trim.lazy_released", "By", "memctl_trim_lazy_released_bytes_total", "Bytes the trims released lazily (GODEBUG=madvdontneed=0).",
		func(s *snapshot) int64 { return s.stats.Trim.TotalLazy }),
	count("memctl.trims.deferred", "{trim}", "memctl_trims_deferred_total", "Trims the CPU rate limit deferred past the max wait.",
		func(s *snapshot) int64 { return s.stats.Trim.Deferred }),
	count("memctl.trims.early", "{trim}", "memctl_trims_early_total", "Trims started at half the delay because the CPU cgroup was throttled.",
		func(s *snapshot) int64 { return s.stats.Trim.EarlyStarts }),
	count("memctl.trims.no_gc", "{trim}", "memctl_trims_no_gc_total", "Trims whose Go step returned the free heap without a GC (a transient GOMEMLIMIT).",
		func(s *snapshot) int64 { return s.stats.Trim.NoGC }),
	{name: "memctl.trims.no_gc.aborted", unit: "{trim}", counter: true, prom: "memctl_trims_no_gc_aborted_total",
		desc: "Go steps without a GC that stopped before their target, by reason (attribute reason): gc, no_progress, gc_cpu_limiter, limit_changed.",
		read: func(s *snapshot, o observe) {
			t := &s.stats.Trim
			for _, r := range []struct {
				label string
				n     int64
			}{{"gc", t.AbortedGC}, {"no_progress", t.AbortedNoProgress}, {"gc_cpu_limiter", t.AbortedLimiter}, {"limit_changed", t.AbortedLimitChanged}} {
				o(float64(r.n), attribute.String("reason", r.label))
			}
		}},
	{name: "memctl.pressure.events", unit: "{event}", counter: true, prom: "memctl_pressure_events_total",
		desc: "Pressure events: kind spiral counts GC death-spiral episodes, kind kernel the kernel memory-pressure signals.",
		read: func(s *snapshot, o observe) {
			if s.live {
				o(float64(s.stats.Pressure.Spirals), attribute.String("kind", "spiral"))
				o(float64(s.stats.Pressure.Signals), attribute.String("kind", "kernel"))
			}
		}},
	gauge("memctl.gc.death_spiral", "1", "memctl_gc_death_spiral", "1 during a GC death-spiral episode.",
		func(s *snapshot) (float64, bool) { return boolValue(s.stats.Pressure.InSpiral), s.live }),
	{name: "memctl.gc.cpu_share", unit: "1", float: true, prom: "memctl_gc_cpu_share",
		desc: "The GC's share of the CPU over the death-spiral detector's window, at the last GC end (0 to 1).",
		read: func(s *snapshot, o observe) {
			if s.live {
				o(s.stats.Pressure.GCShare)
			}
		}},
	gauge("memctl.gomemlimit.lifted", "By", "memctl_gomemlimit_lifted_bytes", "Bytes a death-spiral lift adds to GOMEMLIMIT now; 0 when it is not lifted.",
		func(s *snapshot) (float64, bool) { return float64(s.stats.Pressure.Lifted), s.live }),
	{name: "memctl.cgroup.memory_events", unit: "{event}", counter: true, prom: "memctl_cgroup_memory_events_total",
		desc: "The cgroup v2 memory.events counters; not observed on cgroup v1 and where the kernel does not write the counter.",
		read: func(s *snapshot, o observe) {
			e := s.stats.Pressure.MemoryEvents
			for _, ev := range []struct {
				key string
				v   int64
			}{{"low", e.Low}, {"high", e.High}, {"max", e.Max}, {"oom", e.OOM}, {"oom_kill", e.OOMKill}, {"oom_group_kill", e.OOMGroupKill}} {
				if ev.v >= 0 {
					o(float64(ev.v), attribute.String("event", ev.key))
				}
			}
		}},
	{name: "memctl.pressure.left_to_kernel", unit: "{signal}", counter: true, prom: "memctl_pressure_left_to_kernel_total",
		desc: "Kernel pressure signals not acted on because the cgroup's memory was mostly reclaimable page cache (memory.stat).",
		read: func(s *snapshot, o observe) {
			if s.live {
				o(float64(s.stats.Pressure.LeftToKernel))
			}
		}},
	{name: "memctl.trims.origin", unit: "{trim}", counter: true, prom: "memctl_trims_origin_total",
		desc: "Trims run, by who asked (attribute origin): debounced, pressure, spiral, by_name (TrimNow).",
		read: func(s *snapshot, o observe) {
			for _, og := range trimOrigins(&s.stats.Trim) {
				st := og.stats
				o(float64(st.Trims), attribute.String("origin", og.label))
			}
		}},
	{name: "memctl.trims.origin.skipped", unit: "{trim}", counter: true, prom: "memctl_trims_origin_skipped_total",
		desc: "Trims skipped by the gate (too little to release for their cost, the 2% CPU budget, a trim running), by who asked (attribute origin).",
		read: func(s *snapshot, o observe) {
			for _, og := range trimOrigins(&s.stats.Trim) {
				st := og.stats
				o(float64(st.Skipped), attribute.String("origin", og.label))
			}
		}},
	{name: "memctl.trim.origin.cpu", unit: "s", float: true, counter: true, prom: "memctl_trim_origin_cpu_seconds_total",
		desc: "CPU time charged to the trims, by who asked (attribute origin); all origins share the one 2% budget.",
		read: func(s *snapshot, o observe) {
			for _, og := range trimOrigins(&s.stats.Trim) {
				st := og.stats
				o(st.CPU.Seconds(), attribute.String("origin", og.label))
			}
		}},
	{name: "memctl.trims.skipped_reason", unit: "{trim}", counter: true, prom: "memctl_trims_skipped_reason_total",
		desc: "Trims skipped, by reason (attribute reason): min_release, cost, budget, running.",
		read: func(s *snapshot, o observe) {
			t := &s.stats.Trim
			for _, r := range []struct {
				label string
				n     int64
			}{{"min_release", t.SkippedMinRelease}, {"cost", t.SkippedCost}, {"budget", t.SkippedBudget}, {"running", t.SkippedRunning}} {
				o(float64(r.n), attribute.String("reason", r.label))
			}
		}},
	heapInstrument("memctl.c_allocator.info", "1", false, false, "memctl_c_allocator_info",
		"1 for every C allocator found in the process, with attributes allocator, object, prefix, owner (it owns malloc) and trimmed (false: present, memctl cannot reach it).",
		func(h *cheap.Heap) (float64, []attribute.KeyValue, bool) {
			return 1, []attribute.KeyValue{attribute.Bool("owner", h.OwnsMalloc), attribute.Bool("trimmed", h.Trimmed)}, true
		}),
	heapInstrument("memctl.c_allocator.retained", "By", false, false, "memctl_c_allocator_retained_bytes",
		"Bytes the allocator holds that no live block uses; not observed when it does not tell.",
		func(h *cheap.Heap) (float64, []attribute.KeyValue, bool) {
			return float64(h.Retained), nil, h.Retained >= 0
		}),
	heapInstrument("memctl.c_allocator.resident", "By", false, false, "memctl_c_allocator_resident_bytes",
		"The allocator's resident bytes by its own account; not observed when it does not tell.",
		func(h *cheap.Heap) (float64, []attribute.KeyValue, bool) {
			return float64(h.Resident), nil, h.Resident >= 0
		}),
	heapInstrument("memctl.c_allocator.released", "By", false, true, "memctl_c_allocator_released_bytes_total",
		"Bytes the trims released from the allocator, by its own account (glibc does not count them).",
		func(h *cheap.Heap) (float64, []attribute.KeyValue, bool) { return float64(h.TotalReleased), nil, true }),
	heapInstrument("memctl.c_allocator.releases", "{release}", false, true, "memctl_c_allocator_releases_total",
		"Trims that released the allocator.",
		func(h *cheap.Heap) (float64, []attribute.KeyValue, bool) { return float64(h.Releases), nil, true }),
	heapInstrument("memctl.c_allocator.release_failures", "{release}", false, true, "memctl_c_allocator_release_failures_total",
		"Trims whose release call of the allocator returned an error (not counted in releases).",
		func(h *cheap.Heap) (float64, []attribute.KeyValue, bool) { return float64(h.Failures), nil, true }),
	heapInstrument("memctl.c_allocator.last_max_slice", "s", true, false, "memctl_c_allocator_last_max_slice_seconds",
		"The longest single call of the allocator's last release: the longest memctl held one of its locks; not observed before the first.",
		func(h *cheap.Heap) (float64, []attribute.KeyValue, bool) {
			return h.LastMaxSlice.Seconds(), nil, h.Releases > 0
		}),
}

// objectAttr is the object attribute of h: its path made UTF-8 (OTLP
// strings must be), with " (namespace N)" after it for an object of a
// dlmopen namespace (the same path can be loaded in two), as the
// Prometheus collector's object label.
func objectAttr(h *cheap.Heap) string {
	s := strings.ToValidUTF8(h.Library, "\uFFFD")
	if h.Namespace != 0 {
		s += " (namespace " + strconv.FormatInt(h.Namespace, 10) + ")"
	}
	return s
}

// heapInstrument is an instrument with one observation per C allocator of
// memctl.Stats.CHeaps, with attributes allocator, object and prefix first.
func heapInstrument(name, unit string, float, counter bool, prom, desc string, read func(*cheap.Heap) (float64, []attribute.KeyValue, bool)) instrument {
	return instrument{name: name, unit: unit, float: float, counter: counter, prom: prom, desc: desc,
		read: func(s *snapshot, o observe) {
			for i := range s.stats.CHeaps {
				h := &s.stats.CHeaps[i]
				v, attrs, ok := read(h)
				if ok {
					o(v, append([]attribute.KeyValue{attribute.String("allocator", h.Allocator), attribute.String("object", objectAttr(h)), attribute.String("prefix", h.Prefix)}, attrs...)...)
				}
			}
		}}
}

// poolInstruments are read from limits.Pool.Stats at each collection, one
// series per pool (attribute pool, added by the callback).
var poolInstruments = []instrument{
	gauge("memctl.budget.limit", "By", "memctl_budget_limit_bytes", "The budget pool's limit; not observed when it has none.",
		func(s *snapshot) (float64, bool) {
			return float64(s.pool.Limit), s.pool.Limit > 0 && s.pool.Limit != limits.Unlimited
		}),
	gauge("memctl.budget.in_use", "By", "memctl_budget_in_use_bytes", "Bytes the pool's accounts hold, including the chunks they reserved.",
		func(s *snapshot) (float64, bool) { return float64(s.pool.Used), true }),
	gauge("memctl.budget.peak", "By", "memctl_budget_peak_bytes", "The highest in-use bytes since the pool was made.",
		func(s *snapshot) (float64, bool) { return float64(s.pool.Peak), true }),
	{name: "memctl.budget.refusals", unit: "{call}", counter: true, prom: "memctl_budget_refusals_total",
		desc: "Grow calls refused with resource_exhausted, by scope: account, pool, heap_pressure, shedding.",
		read: func(s *snapshot, o observe) {
			r := s.pool.RefusedBy
			o(float64(r.Account), attribute.String("scope", "account"))
			o(float64(r.Pool), attribute.String("scope", "pool"))
			o(float64(r.HeapPressure), attribute.String("scope", "heap_pressure"))
			o(float64(r.Shedding), attribute.String("scope", "shedding"))
		}},
	count("memctl.budget.canceled", "{request}", "memctl_budget_canceled_total", "Request contexts canceled under heap pressure.",
		func(s *snapshot) int64 { return s.pool.Canceled }),
	count("memctl.budget.misuse", "{call}", "memctl_budget_misuse_total", "Shrink calls below zero or of a negative size.",
		func(s *snapshot) int64 { return s.pool.Misuse }),
	gauge("memctl.heap_pressure", "1", "memctl_heap_pressure", "1 while the live heap is above the pool's heap threshold (end of the last GC).",
		func(s *snapshot) (float64, bool) { return boolValue(s.pool.UnderHeapPressure), true }),
	count("memctl.budget.observed", "{call}", "memctl_budget_observed_total", "Grows that would have been refused, let through by MEMCTL_BUDGETS=observe or off.",
		func(s *snapshot) int64 { return s.pool.Observed }),
	count("memctl.budget.leaked_accounts", "{account}", "memctl_budget_leaked_accounts_total", "Accounts closed with bytes still grown.",
		func(s *snapshot) int64 { return s.pool.Leaked }),
	count("memctl.budget.leaked", "By", "memctl_budget_leaked_bytes_total", "Bytes still grown in accounts when they were closed.",
		func(s *snapshot) int64 { return s.pool.LeakedBytes }),
	gauge("memctl.budget.in_flight", "{request}", "memctl_budget_in_flight", "Top-level accounts open in the pool: requests, RPCs and jobs in progress.",
		func(s *snapshot) (float64, bool) { return float64(s.pool.InFlight), true }),
	count("memctl.budget.undercharged", "{cycle}", "memctl_budget_undercharged_total", "GC cycles at whose end, with requests in flight, the live heap beyond its baseline was more than the pool's charge ratio times what its accounts held: the charges look too small.",
		func(s *snapshot) int64 { return s.pool.Undercharged }),
	gauge("memctl.budget.heap_baseline", "By", "memctl_budget_heap_baseline_bytes", "The live heap that the charge check takes as the service's own; not observed before the first GC cycle or with the check off.",
		func(s *snapshot) (float64, bool) { return float64(s.pool.HeapBaseline), s.pool.HeapBaseline >= 0 }),
	{name: "memctl.budget.request_peaks", unit: "{request}", counter: true, prom: "memctl_budget_request_peak_bytes",
		desc: "Per-request peaks (what each asked for), in every mode, as cumulative counts by upper bound in bytes (attribute le, \"+Inf\" for all): the Prometheus histogram memctl_budget_request_peak_bytes as counters, since the OpenTelemetry API has no asynchronous histogram. The data to size budgets (docs/sizing.md).",
		read: func(s *snapshot, o observe) {
			h := &s.pool.Peaks
			var n int64
			for i := 0; i < limits.PeakBuckets; i++ {
				n += max(h.Counts[i], 0)
				o(float64(n), attribute.String("le", strconv.FormatInt(limits.PeakBucketBound(i), 10)))
			}
			o(float64(max(h.Count, 0)), attribute.String("le", "+Inf"))
		}},
}

// processInstruments are read once per collection from the first pool's
// Stats: they count for the whole process.
var processInstruments = []instrument{
	count("memctl.budget.unguarded", "{call}", "memctl_budget_unguarded_total", "limits.Grow calls on a context with no account, in the whole process.",
		func(s *snapshot) int64 { return s.pool.Unguarded }),
}

// Register creates memctl's instruments on a meter of mp (ScopeName) and
// registers the one callback that observes them for ctl (the controller
// memctl.Start returned) and pools. A nil ctl is allowed (for example when
// the auto package started memctl): then GOMEMLIMIT, the C heap and the
// misuse count are observed and memctl.enabled is 0. Call Unregister on
// the result to stop. It returns an error for a pool with an empty or
// repeated name or a nil Pool, and the meter's errors. Safe for concurrent
// use; the callback is safe to run concurrently with the service.
func Register(mp metric.MeterProvider, ctl *memctl.Controller, pools ...Pool) (metric.Registration, error) {
	seen := map[string]bool{}
	pools = append([]Pool(nil), pools...)
	for i, p := range pools {
		switch {
		case p.Pool == nil:
			return nil, fmt.Errorf("otelmetrics: pool %q is nil", p.Name)
		case p.Name == "":
			pools[i].Name = p.Pool.Name()
		case p.Name != p.Pool.Name():
			return nil, fmt.Errorf("otelmetrics: pool %q is named %q in its errors and Stats: one name per pool (set PoolConfig.Name to %q, or leave Pool.Name empty)", p.Name, p.Pool.Name(), p.Name)
		}
		if seen[pools[i].Name] {
			return nil, fmt.Errorf("otelmetrics: two pools named %q: name each with PoolConfig.Name", pools[i].Name)
		}
		seen[pools[i].Name] = true
	}
	m := mp.Meter(ScopeName)
	ctlObs, err := create(m, controllerInstruments)
	if err != nil {
		return nil, err
	}
	all := append([]metric.Observable(nil), ctlObs...)
	var poolObs, procObs []metric.Observable
	if len(pools) > 0 {
		if poolObs, err = create(m, poolInstruments); err != nil {
			return nil, err
		}
		if procObs, err = create(m, processInstruments); err != nil {
			return nil, err
		}
		all = append(append(all, poolObs...), procObs...)
	}
	return m.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		s := snapshot{live: ctl != nil, stats: ctl.Stats()}
		if ctl != nil {
			s.report = ctl.Report()
		}
		emit(ob, controllerInstruments, ctlObs, &s)
		for i, p := range pools {
			s.pool = p.Pool.Stats()
			emit(ob, poolInstruments, poolObs, &s, attribute.String("pool", p.Name))
			if i == 0 {
				emit(ob, processInstruments, procObs, &s)
			}
		}
		return nil
	}, all...)
}

// create makes the observable instruments of table on m.
func create(m metric.Meter, table []instrument) ([]metric.Observable, error) {
	obs := make([]metric.Observable, len(table))
	for i, in := range table {
		var err error
		switch {
		case in.float && in.counter:
			obs[i], err = m.Float64ObservableCounter(in.name, metric.WithUnit(in.unit), metric.WithDescription(in.desc))
		case in.float:
			obs[i], err = m.Float64ObservableGauge(in.name, metric.WithUnit(in.unit), metric.WithDescription(in.desc))
		case in.counter:
			obs[i], err = m.Int64ObservableCounter(in.name, metric.WithUnit(in.unit), metric.WithDescription(in.desc))
		default:
			obs[i], err = m.Int64ObservableGauge(in.name, metric.WithUnit(in.unit), metric.WithDescription(in.desc))
		}
		if err != nil {
			return nil, fmt.Errorf("otelmetrics: %s: %w", in.name, err)
		}
	}
	return obs, nil
}

// emit observes each instrument of table, with fixed attributes first.
func emit(ob metric.Observer, table []instrument, obs []metric.Observable, s *snapshot, fixed ...attribute.KeyValue) {
	for i, in := range table {
		o := func(v float64, attrs ...attribute.KeyValue) {
			opt := metric.WithAttributes(append(append([]attribute.KeyValue(nil), fixed...), attrs...)...)
			switch x := obs[i].(type) {
			case metric.Float64Observable:
				ob.ObserveFloat64(x, v, opt)
			case metric.Int64Observable:
				ob.ObserveInt64(x, int64(v), opt)
			}
		}
		in.read(s, o)
	}
}

// trimOrigins labels t's counters by origin.
func trimOrigins(t *trim.Stats) []struct {
	label string
	stats trim.OriginStats
} {
	return []struct {
		label string
		stats trim.OriginStats
	}{{"debounced", t.Debounced}, {"pressure", t.Pressure}, {"spiral", t.Spiral}, {"by_name", t.ByName}}
}
