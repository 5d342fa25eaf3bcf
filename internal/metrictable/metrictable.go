// Package metrictable is the one table of the metrics memctl exports: the
// nested modules metrics (Prometheus) and otelmetrics (OpenTelemetry) both
// walk Metrics, so a new metric is one entry here. It uses only the
// standard library and memctl's packages: the module gains no dependency.
package metrictable

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// Kind is what a metric is.
type Kind uint8

const (
	Gauge   Kind = iota // a value that goes up and down
	Counter             // a cumulative, monotonic sum
	// Histogram is a pool's request peaks (Metric.Peaks); in OpenTelemetry
	// (no asynchronous histogram) an Int64 counter of cumulative counts,
	// one series per bound (attribute le, "+Inf" for all).
	Histogram
)

// Scope is what a metric is read for. Pool and Process metrics exist only
// when a pool is given.
type Scope uint8

const (
	Controller Scope = iota // read once per collection, controller or not
	Pool                    // read once per pool; its first label is PoolLabel
	Process                 // read once, from the first pool's Stats (whole process)
)

// PoolLabel is the first label of a Pool metric: limits.Pool.Name.
const PoolLabel = "pool"

// Label is a variable label of a metric.
type Label struct {
	Name string
	// Bool: the values are "true" and "false" (OpenTelemetry bool attributes).
	Bool bool
}

// Emit records one series of a metric: its value and the values of its
// labels, in the order of Metric.Labels.
type Emit func(v float64, labels ...string)

// Metric is one entry of the table.
type Metric struct {
	// Prom is the Prometheus name: memctl_ prefix, base unit suffix
	// (_bytes, _seconds), _total for a counter, _info for a gauge of 1
	// whose labels carry a state.
	Prom string
	OTel string // the OpenTelemetry instrument name: dots, no unit
	Unit string // the OpenTelemetry (UCUM) unit: By, s, 1, or a {annotation}
	Help string // the description, the same in both
	Kind Kind
	// Float: the OpenTelemetry instrument is Float64; otherwise Int64.
	Float  bool
	Scope  Scope
	Labels []Label // the labels in Read's order
	// Read emits each series from s, leaving out a figure that does not
	// exist (never a sentinel). Nil for a Histogram.
	Read func(s *Snapshot, emit Emit)
	// Peaks returns a Histogram's histogram (a Pool metric whose only
	// label is PoolLabel); nil for the others.
	Peaks func(s *Snapshot) *limits.PeakHistogram
}

// Snapshot is what one collection reads.
type Snapshot struct {
	// Live: a controller was given; without one Report is zero and Stats
	// holds the process's figures.
	Live   bool
	Stats  memctl.Stats
	Report memctl.Report
	// Pool and PoolName are the pool being read, for Pool and Process
	// metrics.
	Pool     limits.PoolStats
	PoolName string
}

// NamedPool is a pool to collect and the name its metrics carry.
type NamedPool struct {
	Name string
	Pool *limits.Pool
}

// CheckPools gives each pool of pools with no Name its own (Pool.Name). It
// returns an error, begun with pkg, for a nil Pool, a Name other than the
// pool's own, and two pools of one name.
func CheckPools(pkg string, pools []NamedPool) error {
	seen := map[string]bool{}
	for i, p := range pools {
		switch {
		case p.Pool == nil:
			return fmt.Errorf("%s: pool %q is nil", pkg, p.Name)
		case p.Name == "":
			pools[i].Name = p.Pool.Name()
		case p.Name != p.Pool.Name():
			return fmt.Errorf("%s: pool %q is named %q in its errors and Stats: one name per pool (set PoolConfig.Name to %q, or leave Pool.Name empty)", pkg, p.Name, p.Pool.Name(), p.Name)
		}
		if seen[pools[i].Name] {
			return fmt.Errorf("%s: two pools named %q: name each with PoolConfig.Name", pkg, pools[i].Name)
		}
		seen[pools[i].Name] = true
	}
	return nil
}

// Walk reads ctl's Stats and Report once (ctl may be nil), and each pool's
// Stats, and calls visit for each metric to collect, by its index in
// Metrics, with the snapshot to read it from: the Controller metrics, each
// pool's Pool metrics, and the Process metrics from the first pool.
func Walk(ctl *memctl.Controller, pools []NamedPool, visit func(i int, s *Snapshot)) {
	s := Snapshot{Live: ctl != nil, Stats: ctl.Stats()}
	if ctl != nil {
		s.Report = ctl.Report()
	}
	scope := func(scope Scope) {
		for i, m := range Metrics {
			if m.Scope == scope {
				visit(i, &s)
			}
		}
	}
	scope(Controller)
	for i, p := range pools {
		s.Pool, s.PoolName = p.Pool.Stats(), p.Name
		scope(Pool)
		if i == 0 {
			scope(Process)
		}
	}
}

// Bucket is one bucket of a peak histogram: its upper bound in bytes and
// the number of peaks at or under it (cumulative).
type Bucket struct {
	Bound int64
	N     uint64
}

// PeakBuckets is the number of bounded buckets of a limits.PeakHistogram.
const PeakBuckets = len(limits.PeakHistogram{}.Counts) - 1

// Buckets returns h's buckets, cumulative, bounds limits.PeakBucketBound(0)
// to (PeakBuckets-1), and the count of all peaks (those above the last bound
// included); a negative count reads as 0.
func Buckets(h *limits.PeakHistogram) (b [PeakBuckets]Bucket, count uint64) {
	var n uint64
	for i := range b {
		n += uint64(max(h.Counts[i], 0))
		b[i] = Bucket{Bound: limits.PeakBucketBound(i), N: n}
	}
	return b, uint64(max(h.Count, 0))
}

// ObjectLabel is the object label of h: its path made valid UTF-8, with
// " (namespace N)" for a dlmopen namespace (one path may load in two).
func ObjectLabel(h *cheap.Heap) string {
	s := strings.ToValidUTF8(h.Library, "\uFFFD")
	if h.Namespace != 0 {
		s += " (namespace " + strconv.FormatInt(h.Namespace, 10) + ")"
	}
	return s
}

// Metrics is the table: controller, C allocator, pool and process metrics.
var Metrics = slices.Concat(controllerMetrics, heapMetrics, pooled(poolMetrics), processMetrics)

// controllerMetrics are read from Controller.Stats and Report.
var controllerMetrics = []Metric{
	gauge("memctl_enabled", "memctl.enabled", "1", "1 when memctl.Start ran and MEMCTL did not switch memctl off.",
		func(s *Snapshot) (float64, bool) { return boolValue(s.Live && !s.Report.Off), true }),
	gauge("memctl_gomemlimit_bytes", "memctl.gomemlimit", "By", "GOMEMLIMIT now, in bytes (debug.SetMemoryLimit); left out when no limit is set.",
		func(s *Snapshot) (float64, bool) {
			return float64(s.Stats.GoMemLimit), s.Stats.GoMemLimit != math.MaxInt64
		}),
	{Prom: "memctl_gomemlimit_info", OTel: "memctl.gomemlimit.info", Unit: "1", Labels: labels("source"),
		Help: "1, with source: where the limit behind GOMEMLIMIT came from (none, cgroup v1, cgroup v2, system or env).",
		Read: func(s *Snapshot, emit Emit) {
			if s.Live {
				emit(1, s.Report.MemLimit.Source.String())
			}
		}},
	gauge("memctl_memory_limit_bytes", "memctl.memory_limit", "By", "The memory limit GOMEMLIMIT was derived from (cgroup or system), in bytes; left out when none was found.",
		func(s *Snapshot) (float64, bool) {
			return float64(s.Report.MemLimit.MemoryLimit), s.Live && s.Report.MemLimit.MemoryLimit > 0
		}),
	floats(gauge("memctl_trim_delay_seconds", "memctl.trim.delay", "s", "How long after the last burst the trim runs, in seconds; 0 when trimming is off.",
		func(s *Snapshot) (float64, bool) { return s.Report.TrimDelay.Seconds(), s.Live })),
	counter("memctl_trims_total", "memctl.trims", "{trim}", "Trims run.",
		func(s *Snapshot) int64 { return s.Stats.Trim.Trims }),
	counter("memctl_trims_skipped_total", "memctl.trims.skipped", "{trim}", "Trims skipped by the gate, every origin and reason.",
		func(s *Snapshot) int64 { return s.Stats.Trim.Skipped }),
	counter("memctl_trim_released_bytes_total", "memctl.trim.released", "By", "Bytes the trims released to the OS (Go heap and C heap).",
		func(s *Snapshot) int64 { return s.Stats.Trim.TotalReleased }),
	floats(gauge("memctl_trim_last_duration_seconds", "memctl.trim.last_duration", "s", "Wall time of the last trim, in seconds; left out before the first.",
		func(s *Snapshot) (float64, bool) { return s.Stats.Trim.LastDuration.Seconds(), s.Stats.Trim.Trims > 0 })),
	gauge("memctl_trim_pending", "memctl.trim.pending", "1", "1 while a trim is scheduled.",
		func(s *Snapshot) (float64, bool) { return boolValue(s.Stats.Trim.Pending), s.Live }),
	gauge("memctl_bursts_in_flight", "memctl.bursts_in_flight", "{burst}", "Bursts begun (memctl.Begin) and not yet ended.",
		func(s *Snapshot) (float64, bool) { return float64(s.Stats.Trim.InFlight), s.Live }),
	{Prom: "memctl_thp_info", OTel: "memctl.thp.info", Unit: "1", Labels: labels("state", "policy", "system"),
		Help: "1, with the process's THP state (PR_GET_THP_DISABLE), the policy memctl applied, and the system mode.",
		Read: func(s *Snapshot, emit Emit) {
			if s.Live {
				r := &s.Report
				emit(1, r.THPState.String(), r.THPPolicy.String(), cmp.Or(r.THPSystem, "unknown"))
			}
		}},
	{Prom: "memctl_c_heap_in_use_bytes", OTel: "memctl.c_heap.in_use", Unit: "By", Labels: labels("allocator"),
		Help: "Bytes in live C heap blocks, as the allocator that owns malloc reports them; left out when it does not.",
		Read: func(s *Snapshot, emit Emit) {
			if h := s.Stats.CHeap; h.InUse >= 0 {
				emit(float64(h.InUse), h.Allocator)
			}
		}},
	{Prom: "memctl_c_heap_retained_bytes", OTel: "memctl.c_heap.retained", Unit: "By", Labels: labels("allocator"),
		Help: "Bytes the C allocator holds that no live block uses; left out when it does not report them.",
		Read: func(s *Snapshot, emit Emit) {
			if h := s.Stats.CHeap; h.Retained >= 0 {
				emit(float64(h.Retained), h.Allocator)
			}
		}},
	counter("memctl_misuse_total", "memctl.misuse", "{call}", "Misuse: AfterBurst or Begin with no live controller, Start while another was live, an end of Begin called twice.",
		func(s *Snapshot) int64 { return s.Stats.Misuse }),
	{Prom: "memctl_trim_cpu_seconds_total", OTel: "memctl.trim.cpu", Unit: "s", Kind: Counter, Float: true,
		Help: "CPU time the trims caused (GC and scavenger CPU plus the calling thread's, at most the process's), in seconds: what the 2% rate limit counts.",
		Read: func(s *Snapshot, emit Emit) { emit(s.Stats.Trim.TotalCPU.Seconds()) }},
	counter("memctl_trim_lazy_released_bytes_total", "memctl.trim.lazy_released", "By", "Bytes the trims released lazily (GODEBUG=madvdontneed=0: MADV_FREE, RSS falls only under memory pressure).",
		func(s *Snapshot) int64 { return s.Stats.Trim.TotalLazy }),
	counter("memctl_trims_deferred_total", "memctl.trims.deferred", "{trim}", "Trims the CPU rate limit deferred past the max wait.",
		func(s *Snapshot) int64 { return s.Stats.Trim.Deferred }),
	counter("memctl_trims_early_total", "memctl.trims.early", "{trim}", "Trims started at half the delay because the CPU cgroup was throttled (its cpu.stat throttled time grew by 10% of the wall time or more while the trim waited).",
		func(s *Snapshot) int64 { return s.Stats.Trim.EarlyStarts }),
	counter("memctl_trims_no_gc_total", "memctl.trims.no_gc", "{trim}", "Trims whose Go step returned the free heap without a GC (a GC cycle had collected the burst; a transient GOMEMLIMIT).",
		func(s *Snapshot) int64 { return s.Stats.Trim.NoGC }),
	byLabel("memctl_trims_no_gc_aborted_total", "memctl.trims.no_gc.aborted", "{trim}", "reason", "Go steps without a GC that stopped before their target, by reason: gc (a GC cycle started), no_progress (a step released nothing), gc_cpu_limiter, limit_changed (the program set GOMEMLIMIT).",
		func(s *Snapshot) []named {
			t := &s.Stats.Trim
			return []named{{"gc", t.AbortedGC}, {"no_progress", t.AbortedNoProgress}, {"gc_cpu_limiter", t.AbortedLimiter}, {"limit_changed", t.AbortedLimitChanged}}
		}),
	byLabel("memctl_pressure_events_total", "memctl.pressure.events", "{event}", "kind", "Pressure events: kind spiral counts GC death-spiral episodes, kind kernel the kernel memory-pressure signals (PSI, cgroup v1 pressure level, systemd).",
		func(s *Snapshot) []named {
			if !s.Live {
				return nil
			}
			return []named{{"spiral", s.Stats.Pressure.Spirals}, {"kernel", s.Stats.Pressure.Signals}}
		}),
	counter("memctl_pressure_left_to_kernel_total", "memctl.pressure.left_to_kernel", "{signal}", "Kernel pressure signals not acted on because the cgroup's memory was mostly reclaimable page cache (memory.stat).",
		func(s *Snapshot) int64 { return s.Stats.Pressure.LeftToKernel }),
	gauge("memctl_gc_death_spiral", "memctl.gc.death_spiral", "1", "1 during a GC death-spiral episode.",
		func(s *Snapshot) (float64, bool) { return boolValue(s.Stats.Pressure.InSpiral), s.Live }),
	floats(gauge("memctl_gc_cpu_share", "memctl.gc.cpu_share", "1", "The GC's share of the CPU over the death-spiral detector's window, at the last GC end (0 to 1).",
		func(s *Snapshot) (float64, bool) { return s.Stats.Pressure.GCShare, s.Live })),
	gauge("memctl_gomemlimit_lifted_bytes", "memctl.gomemlimit.lifted", "By", "Bytes a death-spiral lift adds to GOMEMLIMIT now; 0 when it is not lifted.",
		func(s *Snapshot) (float64, bool) { return float64(s.Stats.Pressure.Lifted), s.Live }),
	byLabel("memctl_cgroup_memory_events_total", "memctl.cgroup.memory_events", "{event}", "event", "The cgroup v2 memory.events counters (low, high, max, oom, oom_kill, oom_group_kill); left out on cgroup v1 and where the kernel does not write the counter.",
		func(s *Snapshot) []named {
			e := &s.Stats.Pressure.MemoryEvents
			return []named{{"low", e.Low}, {"high", e.High}, {"max", e.Max}, {"oom", e.OOM}, {"oom_kill", e.OOMKill}, {"oom_group_kill", e.OOMGroupKill}}
		}),
	byOrigin("memctl_trims_origin_total", "memctl.trims.origin", "{trim}", "Trims run, by who asked: debounced (after AfterBurst), pressure (kernel memory pressure), spiral (GC death spiral), by_name (TrimNow).",
		func(o *trim.OriginStats) float64 { return float64(o.Trims) }),
	byOrigin("memctl_trims_origin_skipped_total", "memctl.trims.origin.skipped", "{trim}", "Trims skipped by the gate (too little to release for their cost, the 2% CPU budget, a trim running), by who asked.",
		func(o *trim.OriginStats) float64 { return float64(o.Skipped) }),
	floats(byOrigin("memctl_trim_origin_cpu_seconds_total", "memctl.trim.origin.cpu", "s", "CPU time charged to the trims, in seconds, by who asked; all origins share the one 2% budget.",
		func(o *trim.OriginStats) float64 { return o.CPU.Seconds() })),
	byLabel("memctl_trims_skipped_reason_total", "memctl.trims.skipped_reason", "{trim}", "reason", "Trims skipped, by reason: min_release (estimate under MinRelease), cost (not worth its GC), budget (2% CPU budget), running (another trim answered).",
		func(s *Snapshot) []named {
			t := &s.Stats.Trim
			return []named{{"min_release", t.SkippedMinRelease}, {"cost", t.SkippedCost}, {"budget", t.SkippedBudget}, {"running", t.SkippedRunning}}
		}),
}

// heapMetrics are read from Stats.CHeaps, one series per C allocator.
var heapMetrics = []Metric{
	{Prom: "memctl_c_allocator_info", OTel: "memctl.c_allocator.info", Unit: "1",
		Labels: append(labels("allocator", "object", "prefix"), Label{Name: "owner", Bool: true}, Label{Name: "trimmed", Bool: true}),
		Help:   "1 for every C allocator found in the process: owner is true for the one that owns malloc, trimmed false for one present that memctl cannot reach (a static, hidden copy).",
		Read: func(s *Snapshot, emit Emit) {
			for i := range s.Stats.CHeaps {
				h := &s.Stats.CHeaps[i]
				emit(1, h.Allocator, ObjectLabel(h), h.Prefix, strconv.FormatBool(h.OwnsMalloc), strconv.FormatBool(h.Trimmed))
			}
		}},
	perHeap(Gauge, "memctl_c_allocator_retained_bytes", "memctl.c_allocator.retained", "By", "Bytes the allocator holds that no live block uses; left out when it does not tell.",
		func(h *cheap.Heap) (float64, bool) { return float64(h.Retained), h.Retained >= 0 }),
	perHeap(Gauge, "memctl_c_allocator_resident_bytes", "memctl.c_allocator.resident", "By", "The allocator's resident bytes by its own account; left out when it does not tell.",
		func(h *cheap.Heap) (float64, bool) { return float64(h.Resident), h.Resident >= 0 }),
	perHeap(Counter, "memctl_c_allocator_released_bytes_total", "memctl.c_allocator.released", "By", "Bytes the trims released from the allocator, by its own account (glibc does not count them).",
		func(h *cheap.Heap) (float64, bool) { return float64(h.TotalReleased), true }),
	perHeap(Counter, "memctl_c_allocator_releases_total", "memctl.c_allocator.releases", "{release}", "Trims that released the allocator.",
		func(h *cheap.Heap) (float64, bool) { return float64(h.Releases), true }),
	perHeap(Counter, "memctl_c_allocator_release_failures_total", "memctl.c_allocator.release_failures", "{release}", "Trims whose release call of the allocator returned an error (not counted in releases).",
		func(h *cheap.Heap) (float64, bool) { return float64(h.Failures), true }),
	floats(perHeap(Gauge, "memctl_c_allocator_last_max_slice_seconds", "memctl.c_allocator.last_max_slice", "s", "The longest single call of the allocator's last release, in seconds: the longest memctl held one of its locks; left out before the first.",
		func(h *cheap.Heap) (float64, bool) { return h.LastMaxSlice.Seconds(), h.Releases > 0 })),
}

// poolMetrics are read from limits.Pool.Stats, one series per pool.
var poolMetrics = []Metric{
	gauge("memctl_budget_limit_bytes", "memctl.budget.limit", "By", "The budget pool's limit, in bytes; left out when it has none.",
		func(s *Snapshot) (float64, bool) {
			return float64(s.Pool.Limit), s.Pool.Limit > 0 && s.Pool.Limit != limits.Unlimited
		}),
	gauge("memctl_budget_in_use_bytes", "memctl.budget.in_use", "By", "Bytes the pool's accounts hold, including the chunks they reserved.",
		func(s *Snapshot) (float64, bool) { return float64(s.Pool.Used), true }),
	gauge("memctl_budget_peak_bytes", "memctl.budget.peak", "By", "The highest in-use bytes since the pool was made.",
		func(s *Snapshot) (float64, bool) { return float64(s.Pool.Peak), true }),
	byLabel("memctl_budget_refusals_total", "memctl.budget.refusals", "{call}", "scope", "Grow calls refused with resource_exhausted, by scope: account (the request's own budget), pool (the pool was full), heap_pressure, shedding (a GC death spiral).",
		func(s *Snapshot) []named {
			r := &s.Pool.RefusedBy
			return []named{{"account", r.Account}, {"pool", r.Pool}, {"heap_pressure", r.HeapPressure}, {"shedding", r.Shedding}}
		}),
	counter("memctl_budget_canceled_total", "memctl.budget.canceled", "{request}", "Request contexts canceled under heap pressure.",
		func(s *Snapshot) int64 { return s.Pool.Canceled }),
	counter("memctl_budget_misuse_total", "memctl.budget.misuse", "{call}", "Shrink calls below zero or of a negative size.",
		func(s *Snapshot) int64 { return s.Pool.Misuse }),
	gauge("memctl_heap_pressure", "memctl.heap_pressure", "1", "1 while the live heap is above the pool's heap threshold (end of the last GC).",
		func(s *Snapshot) (float64, bool) { return boolValue(s.Pool.UnderHeapPressure), true }),
	counter("memctl_budget_observed_total", "memctl.budget.observed", "{call}", "Grows that would have been refused, let through by MEMCTL_BUDGETS=observe or off.",
		func(s *Snapshot) int64 { return s.Pool.Observed }),
	counter("memctl_budget_leaked_accounts_total", "memctl.budget.leaked_accounts", "{account}", "Accounts closed with bytes still grown.",
		func(s *Snapshot) int64 { return s.Pool.Leaked }),
	counter("memctl_budget_leaked_bytes_total", "memctl.budget.leaked", "By", "Bytes still grown in accounts when they were closed.",
		func(s *Snapshot) int64 { return s.Pool.LeakedBytes }),
	gauge("memctl_budget_in_flight", "memctl.budget.in_flight", "{request}", "Top-level accounts open in the pool: requests, RPCs and jobs in progress.",
		func(s *Snapshot) (float64, bool) { return float64(s.Pool.InFlight), true }),
	counter("memctl_budget_undercharged_total", "memctl.budget.undercharged", "{cycle}", "GC cycles at whose end, with requests in flight, the live heap beyond its baseline was more than the pool's charge ratio (PoolConfig.ChargeRatio, default 4) times what its accounts held: the charges look too small.",
		func(s *Snapshot) int64 { return s.Pool.Undercharged }),
	gauge("memctl_budget_heap_baseline_bytes", "memctl.budget.heap_baseline", "By", "The live heap, in bytes, that the charge check takes as the service's own; left out before the first GC cycle or with the check off.",
		func(s *Snapshot) (float64, bool) { return float64(s.Pool.HeapBaseline), s.Pool.HeapBaseline >= 0 }),
	{Prom: "memctl_budget_request_peak_bytes", OTel: "memctl.budget.request_peaks", Unit: "{request}", Kind: Histogram,
		Help:  "The peaks of the pool's requests, in bytes: what each request, RPC or job reached or asked for (a refused Grow counts), recorded when it ends, in every budget mode; counted by upper bound le, 64 KiB to 64 GiB by powers of two (a sum, where there is one, leaves out peaks above the last bound).",
		Peaks: func(s *Snapshot) *limits.PeakHistogram { return &s.Pool.Peaks }},
}

// processMetrics are read from the first pool's Stats (whole process).
var processMetrics = []Metric{{Prom: "memctl_budget_unguarded_total", OTel: "memctl.budget.unguarded", Unit: "{call}", Kind: Counter, Scope: Process,
	Help: "limits.Grow calls on a context with no account (a handler outside the budget middleware), in the whole process.",
	Read: func(s *Snapshot, emit Emit) { emit(float64(s.Pool.Unguarded)) }}}

// gauge is a gauge of one series; ok false leaves it out.
func gauge(prom, otel, unit, help string, read func(*Snapshot) (v float64, ok bool)) Metric {
	return Metric{Prom: prom, OTel: otel, Unit: unit, Help: help, Kind: Gauge,
		Read: func(s *Snapshot, emit Emit) {
			if v, ok := read(s); ok {
				emit(v)
			}
		}}
}

// counter is a counter of one series, always there.
func counter(prom, otel, unit, help string, read func(*Snapshot) int64) Metric {
	return Metric{Prom: prom, OTel: otel, Unit: unit, Help: help, Kind: Counter,
		Read: func(s *Snapshot, emit Emit) { emit(float64(read(s))) }}
}

// perHeap is a metric of one series per C allocator; ok false leaves one out.
func perHeap(kind Kind, prom, otel, unit, help string, read func(*cheap.Heap) (v float64, ok bool)) Metric {
	return Metric{Prom: prom, OTel: otel, Unit: unit, Help: help, Kind: kind, Labels: labels("allocator", "object", "prefix"),
		Read: func(s *Snapshot, emit Emit) {
			for i := range s.Stats.CHeaps {
				h := &s.Stats.CHeaps[i]
				if v, ok := read(h); ok {
					emit(v, h.Allocator, ObjectLabel(h), h.Prefix)
				}
			}
		}}
}

// floats marks m's values as having a fraction.
func floats(m Metric) Metric {
	m.Float = true
	return m
}

// pooled makes ms Pool metrics: PoolLabel first, its value the pool's name.
func pooled(ms []Metric) []Metric {
	out := slices.Clone(ms)
	for i, m := range out {
		out[i].Scope = Pool
		out[i].Labels = append([]Label{{Name: PoolLabel}}, m.Labels...)
		if m.Read != nil {
			out[i].Read = func(s *Snapshot, emit Emit) {
				m.Read(s, func(v float64, labels ...string) { emit(v, append([]string{s.PoolName}, labels...)...) })
			}
		}
	}
	return out
}

func labels(names ...string) []Label {
	out := make([]Label, len(names))
	for i, n := range names {
		out[i] = Label{Name: n}
	}
	return out
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// named is a value and the label value that names it.
type named struct {
	label string
	v     int64
}

// byLabel is a counter of one series per value read returns, labelled
// label with the value's name; a negative value (not known) is left out.
func byLabel(prom, otel, unit, label, help string, read func(*Snapshot) []named) Metric {
	return Metric{Prom: prom, OTel: otel, Unit: unit, Help: help, Kind: Counter, Labels: labels(label),
		Read: func(s *Snapshot, emit Emit) {
			for _, n := range read(s) {
				if n.v >= 0 {
					emit(float64(n.v), n.label)
				}
			}
		}}
}

// byOrigin is a counter of one series per trim origin, labelled origin.
func byOrigin(prom, otel, unit, help string, read func(*trim.OriginStats) float64) Metric {
	return Metric{Prom: prom, OTel: otel, Unit: unit, Help: help, Kind: Counter, Labels: labels("origin"),
		Read: func(s *Snapshot, emit Emit) {
			t := &s.Stats.Trim
			for label, o := range map[string]*trim.OriginStats{"debounced": &t.Debounced, "pressure": &t.Pressure, "spiral": &t.Spiral, "by_name": &t.ByName} {
				emit(read(o), label)
			}
		}}
}
