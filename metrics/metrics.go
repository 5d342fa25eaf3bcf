package metrics

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// Pool is a budget pool for the collector.
type Pool struct {
	// Name is the value of the pool label. It must be the pool's own name
	// (PoolConfig.Name, limits.Pool.Name), so that a pool has one name in
	// its errors, its Stats and its metrics; the names must be unique among
	// the pools of one collector. Default: "" (means Pool.Name()).
	Name string
	Pool *limits.Pool
}

// Collector is a prometheus.Collector for one memctl controller and any
// number of budget pools. It is safe for concurrent use.
type Collector struct {
	ctl       *memctl.Controller
	pools     []Pool
	ctlDescs  []*prometheus.Desc
	heapDescs []*prometheus.Desc
	poolDescs []*prometheus.Desc
	procDescs []*prometheus.Desc
	peakDesc  *prometheus.Desc
}

// peakBounds are the upper bounds of memctl_budget_request_peak_bytes, in
// bytes: limits.PeakBucketBound(0) to (limits.PeakBuckets-1), 64 KiB to
// 64 GiB by powers of two.
var peakBounds = func() []float64 {
	b := make([]float64, limits.PeakBuckets)
	for i := range b {
		b[i] = float64(limits.PeakBucketBound(i))
	}
	return b
}()

// controller is what one scrape reads from the controller.
type controller struct {
	live   bool // a controller was given
	stats  memctl.Stats
	report memctl.Report
}

// metric is one entry of a table: a name, its help, its type, the names of
// its variable labels, and how to read it (ok false leaves it out of the
// scrape; labels holds the values of the variable labels).
type metric[T any] struct {
	name   string
	help   string
	kind   prometheus.ValueType
	labels []string
	read   func(s *T) (v float64, labels []string, ok bool)
}

func gauge[T any](name, help string, read func(*T) (float64, bool)) metric[T] {
	return metric[T]{name: name, help: help, kind: prometheus.GaugeValue,
		read: func(s *T) (float64, []string, bool) { v, ok := read(s); return v, nil, ok }}
}

func counter[T any](name, help string, read func(*T) int64) metric[T] {
	return metric[T]{name: name, help: help, kind: prometheus.CounterValue,
		read: func(s *T) (float64, []string, bool) { return float64(read(s)), nil, true }}
}

// pressureEvents is memctl_pressure_events_total for one kind of event.
func pressureEvents(kind string, read func(*pressure.Stats) int64) metric[controller] {
	return metric[controller]{name: "memctl_pressure_events_total", kind: prometheus.CounterValue, labels: []string{"kind"},
		help: "Pressure events: kind spiral counts GC death-spiral episodes, kind kernel the kernel memory-pressure signals (PSI, cgroup v1 pressure level, systemd).",
		read: func(c *controller) (float64, []string, bool) {
			return float64(read(&c.stats.Pressure)), []string{kind}, c.live
		}}
}

// refusals is memctl_budget_refusals_total for one scope: what refused the
// Grow (limits.RefusedBy).
func refusals(scope string, read func(*limits.RefusedBy) int64) metric[limits.PoolStats] {
	return metric[limits.PoolStats]{name: "memctl_budget_refusals_total", kind: prometheus.CounterValue, labels: []string{"scope"},
		help: "Grow calls refused with resource_exhausted, by scope: account (the request's own budget), pool (the pool was full), heap_pressure, shedding (a GC death spiral).",
		read: func(s *limits.PoolStats) (float64, []string, bool) {
			return float64(read(&s.RefusedBy)), []string{scope}, true
		}}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// memoryEvents are the cgroup v2 memory.events counters, by their key.
var memoryEvents = []struct {
	key  string
	read func(s *pressure.Stats) int64
}{
	{"low", func(s *pressure.Stats) int64 { return s.MemoryEvents.Low }},
	{"high", func(s *pressure.Stats) int64 { return s.MemoryEvents.High }},
	{"max", func(s *pressure.Stats) int64 { return s.MemoryEvents.Max }},
	{"oom", func(s *pressure.Stats) int64 { return s.MemoryEvents.OOM }},
	{"oom_kill", func(s *pressure.Stats) int64 { return s.MemoryEvents.OOMKill }},
	{"oom_group_kill", func(s *pressure.Stats) int64 { return s.MemoryEvents.OOMGroupKill }},
}

// controllerMetrics are read from Controller.Stats and Report at each
// scrape. To add one, add an entry.
var controllerMetrics = []metric[controller]{
	gauge("memctl_enabled", "1 when memctl.Start ran and MEMCTL did not switch memctl off.",
		func(c *controller) (float64, bool) { return boolValue(c.live && !c.report.Off), true }),
	gauge("memctl_gomemlimit_bytes", "GOMEMLIMIT now, in bytes (debug.SetMemoryLimit); absent when no limit is set.",
		func(c *controller) (float64, bool) {
			return float64(c.stats.GoMemLimit), c.stats.GoMemLimit != math.MaxInt64
		}),
	{name: "memctl_gomemlimit_info", kind: prometheus.GaugeValue, labels: []string{"source"},
		help: "1, labelled with where the limit behind GOMEMLIMIT came from: none, cgroup v1, cgroup v2, system or env.",
		read: func(c *controller) (float64, []string, bool) {
			return 1, []string{c.report.MemLimit.Source.String()}, c.live
		}},
	gauge("memctl_memory_limit_bytes", "The memory limit GOMEMLIMIT was derived from (cgroup or system), in bytes; absent when none was found.",
		func(c *controller) (float64, bool) {
			return float64(c.report.MemLimit.MemoryLimit), c.live && c.report.MemLimit.MemoryLimit > 0
		}),
	gauge("memctl_trim_delay_seconds", "How long after the last burst the trim runs, in seconds; 0 when trimming is off.",
		func(c *controller) (float64, bool) { return c.report.TrimDelay.Seconds(), c.live }),
	counter("memctl_trims_total", "Trims run.",
		func(c *controller) int64 { return c.stats.Trim.Trims }),
	counter("memctl_trims_skipped_total", "Trims skipped by the gate, every origin and reason (see memctl_trims_skipped_reason_total).",
		func(c *controller) int64 { return c.stats.Trim.Skipped }),
	counter("memctl_trim_released_bytes_total", "Bytes the trims released to the OS (Go heap and C heap).",
		func(c *controller) int64 { return c.stats.Trim.TotalReleased }),
	gauge("memctl_trim_last_duration_seconds", "Wall time of the last trim, in seconds; absent before the first.",
		func(c *controller) (float64, bool) {
			return c.stats.Trim.LastDuration.Seconds(), c.stats.Trim.Trims > 0
		}),
	gauge("memctl_trim_pending", "1 while a trim is scheduled.",
		func(c *controller) (float64, bool) { return boolValue(c.stats.Trim.Pending), c.live }),
	gauge("memctl_bursts_in_flight", "Bursts begun (memctl.Begin) and not yet ended.",
		func(c *controller) (float64, bool) { return float64(c.stats.Trim.InFlight), c.live }),
	{name: "memctl_thp_info", kind: prometheus.GaugeValue, labels: []string{"state", "policy", "system"},
		help: "1, labelled with the process's THP state (PR_GET_THP_DISABLE), the policy memctl applied, and the system mode.",
		read: func(c *controller) (float64, []string, bool) {
			r := c.report
			sys := r.THPSystem
			if sys == "" {
				sys = "unknown"
			}
			return 1, []string{r.THPState.String(), r.THPPolicy.String(), sys}, c.live
		}},
	{name: "memctl_c_heap_in_use_bytes", kind: prometheus.GaugeValue, labels: []string{"allocator"},
		help: "Bytes in live C heap blocks, as the allocator that owns malloc reports them; absent when it does not.",
		read: func(c *controller) (float64, []string, bool) {
			h := c.stats.CHeap
			return float64(h.InUse), []string{h.Allocator}, h.InUse >= 0
		}},
	{name: "memctl_c_heap_retained_bytes", kind: prometheus.GaugeValue, labels: []string{"allocator"},
		help: "Bytes the C allocator holds that no live block uses; absent when it does not report them.",
		read: func(c *controller) (float64, []string, bool) {
			h := c.stats.CHeap
			return float64(h.Retained), []string{h.Allocator}, h.Retained >= 0
		}},
	counter("memctl_misuse_total", "Misuse: AfterBurst or Begin with no live controller, Start while another was live, an end of Begin called twice.",
		func(c *controller) int64 { return c.stats.Misuse }),
	{name: "memctl_trim_cpu_seconds_total", kind: prometheus.CounterValue,
		help: "CPU time the trims caused (GC and scavenger CPU plus the calling thread's, at most the process's), in seconds: what the 2% rate limit counts.",
		read: func(c *controller) (float64, []string, bool) { return c.stats.Trim.TotalCPU.Seconds(), nil, true }},
	counter("memctl_trim_lazy_released_bytes_total", "Bytes the trims released lazily (GODEBUG=madvdontneed=0: MADV_FREE, RSS falls only under memory pressure).",
		func(c *controller) int64 { return c.stats.Trim.TotalLazy }),
	counter("memctl_trims_deferred_total", "Trims the CPU rate limit deferred past the max wait.",
		func(c *controller) int64 { return c.stats.Trim.Deferred }),
	counter("memctl_trims_early_total", "Trims started at half the delay because the CPU cgroup was throttled (its cpu.stat throttled time grew by 10% of the wall time or more while the trim waited).",
		func(c *controller) int64 { return c.stats.Trim.EarlyStarts }),
	counter("memctl_trims_no_gc_total", "Trims whose Go step returned the free heap without a GC (a GC cycle had collected the burst; a transient GOMEMLIMIT).",
		func(c *controller) int64 { return c.stats.Trim.NoGC }),
	pressureEvents("spiral", func(s *pressure.Stats) int64 { return s.Spirals }),
	pressureEvents("kernel", func(s *pressure.Stats) int64 { return s.Signals }),
	counter("memctl_pressure_left_to_kernel_total", "Kernel pressure signals not acted on because the cgroup's memory was mostly reclaimable page cache (memory.stat).",
		func(c *controller) int64 { return c.stats.Pressure.LeftToKernel }),
	gauge("memctl_gc_death_spiral", "1 during a GC death-spiral episode.",
		func(c *controller) (float64, bool) { return boolValue(c.stats.Pressure.InSpiral), c.live }),
	gauge("memctl_gc_cpu_share", "The GC's share of the CPU over the death-spiral detector's window, at the last GC end (0 to 1).",
		func(c *controller) (float64, bool) { return c.stats.Pressure.GCShare, c.live }),
	gauge("memctl_gomemlimit_lifted_bytes", "Bytes a death-spiral lift adds to GOMEMLIMIT now; 0 when it is not lifted.",
		func(c *controller) (float64, bool) { return float64(c.stats.Pressure.Lifted), c.live }),
}

// trimOrigins, trimSkips and trimAborts label trim.Stats' fields by origin,
// skip reason and abort reason.
var (
	trimOrigins = []struct {
		label string
		of    func(*trim.Stats) *trim.OriginStats
	}{
		{"debounced", func(s *trim.Stats) *trim.OriginStats { return &s.Debounced }},
		{"pressure", func(s *trim.Stats) *trim.OriginStats { return &s.Pressure }},
		{"spiral", func(s *trim.Stats) *trim.OriginStats { return &s.Spiral }},
		{"by_name", func(s *trim.Stats) *trim.OriginStats { return &s.ByName }},
	}
	trimSkips = []struct {
		label string
		of    func(*trim.Stats) int64
	}{
		{"min_release", func(s *trim.Stats) int64 { return s.SkippedMinRelease }},
		{"cost", func(s *trim.Stats) int64 { return s.SkippedCost }},
		{"budget", func(s *trim.Stats) int64 { return s.SkippedBudget }},
		{"running", func(s *trim.Stats) int64 { return s.SkippedRunning }},
	}
	trimAborts = []struct {
		label string
		of    func(*trim.Stats) int64
	}{
		{"gc", func(s *trim.Stats) int64 { return s.AbortedGC }},
		{"no_progress", func(s *trim.Stats) int64 { return s.AbortedNoProgress }},
		{"gc_cpu_limiter", func(s *trim.Stats) int64 { return s.AbortedLimiter }},
		{"limit_changed", func(s *trim.Stats) int64 { return s.AbortedLimitChanged }},
	}
)

func init() {
	for _, og := range trimOrigins {
		lv, o := []string{og.label}, og.of
		controllerMetrics = append(controllerMetrics,
			metric[controller]{name: "memctl_trims_origin_total", kind: prometheus.CounterValue, labels: []string{"origin"},
				help: "Trims run, by who asked: debounced (after AfterBurst), pressure (kernel memory pressure), spiral (GC death spiral), by_name (TrimNow).",
				read: func(c *controller) (float64, []string, bool) { return float64(o(&c.stats.Trim).Trims), lv, true }},
			metric[controller]{name: "memctl_trims_origin_skipped_total", kind: prometheus.CounterValue, labels: []string{"origin"},
				help: "Trims skipped by the gate (too little to release for their cost, the 2% CPU budget, a trim running), by who asked.",
				read: func(c *controller) (float64, []string, bool) {
					return float64(o(&c.stats.Trim).Skipped), lv, true
				}},
			metric[controller]{name: "memctl_trim_origin_cpu_seconds_total", kind: prometheus.CounterValue, labels: []string{"origin"},
				help: "CPU time charged to the trims, in seconds, by who asked; all origins share the one 2% budget.",
				read: func(c *controller) (float64, []string, bool) { return o(&c.stats.Trim).CPU.Seconds(), lv, true }})
	}
	for _, sk := range trimSkips {
		lv, r := []string{sk.label}, sk.of
		controllerMetrics = append(controllerMetrics, metric[controller]{
			name: "memctl_trims_skipped_reason_total", kind: prometheus.CounterValue, labels: []string{"reason"},
			help: "Trims skipped, by reason: min_release (estimate under MinRelease), cost (not worth its GC), budget (2% CPU budget), running (another trim answered).",
			read: func(c *controller) (float64, []string, bool) { return float64(r(&c.stats.Trim)), lv, true }})
	}
	for _, ab := range trimAborts {
		lv, r := []string{ab.label}, ab.of
		controllerMetrics = append(controllerMetrics, metric[controller]{
			name: "memctl_trims_no_gc_aborted_total", kind: prometheus.CounterValue, labels: []string{"reason"},
			help: "Go steps without a GC that stopped before their target, by reason: gc (a GC cycle started), no_progress (a step released nothing), gc_cpu_limiter, limit_changed (the program set GOMEMLIMIT).",
			read: func(c *controller) (float64, []string, bool) { return float64(r(&c.stats.Trim)), lv, true }})
	}
	for _, e := range memoryEvents {
		controllerMetrics = append(controllerMetrics, metric[controller]{
			name: "memctl_cgroup_memory_events_total", kind: prometheus.CounterValue, labels: []string{"event"},
			help: "The cgroup v2 memory.events counters (low, high, max, oom, oom_kill, oom_group_kill); absent on cgroup v1 and where the kernel does not write the counter.",
			read: func(c *controller) (float64, []string, bool) {
				v := e.read(&c.stats.Pressure)
				return float64(v), []string{e.key}, v >= 0
			}})
	}
}

// heapMetrics are read from memctl.Stats.CHeaps at each scrape, one series
// per allocator (labels allocator, object, prefix; object is the path as
// objectLabel makes it). To add one, add an entry.
var heapMetrics = []metric[cheap.Heap]{
	{name: "memctl_c_allocator_info", kind: prometheus.GaugeValue, labels: []string{"owner", "trimmed"},
		help: "1 for every C allocator found in the process: owner is true for the one that owns malloc, trimmed false for one present that memctl cannot reach (a static, hidden copy).",
		read: func(h *cheap.Heap) (float64, []string, bool) {
			return 1, []string{strconv.FormatBool(h.OwnsMalloc), strconv.FormatBool(h.Trimmed)}, true
		}},
	gauge("memctl_c_allocator_retained_bytes", "Bytes the allocator holds that no live block uses; absent when it does not tell.",
		func(h *cheap.Heap) (float64, bool) { return float64(h.Retained), h.Retained >= 0 }),
	gauge("memctl_c_allocator_resident_bytes", "The allocator's resident bytes by its own account; absent when it does not tell.",
		func(h *cheap.Heap) (float64, bool) { return float64(h.Resident), h.Resident >= 0 }),
	counter("memctl_c_allocator_released_bytes_total", "Bytes the trims released from the allocator, by its own account (glibc does not count them).",
		func(h *cheap.Heap) int64 { return h.TotalReleased }),
	counter("memctl_c_allocator_releases_total", "Trims that released the allocator.",
		func(h *cheap.Heap) int64 { return h.Releases }),
	counter("memctl_c_allocator_release_failures_total", "Trims whose release call of the allocator returned an error (not counted in releases).",
		func(h *cheap.Heap) int64 { return h.Failures }),
	gauge("memctl_c_allocator_last_max_slice_seconds", "The longest single call of the allocator's last release, in seconds: the longest memctl held one of its locks; absent before the first.",
		func(h *cheap.Heap) (float64, bool) { return h.LastMaxSlice.Seconds(), h.Releases > 0 }),
}

// poolMetrics are read from limits.Pool.Stats at each scrape, one series
// per pool (label pool). To add one, add an entry.
var poolMetrics = []metric[limits.PoolStats]{
	gauge("memctl_budget_limit_bytes", "The budget pool's limit, in bytes; absent when it has none.",
		func(s *limits.PoolStats) (float64, bool) {
			return float64(s.Limit), s.Limit > 0 && s.Limit != limits.Unlimited
		}),
	gauge("memctl_budget_in_use_bytes", "Bytes the pool's accounts hold, including the chunks they reserved.",
		func(s *limits.PoolStats) (float64, bool) { return float64(s.Used), true }),
	gauge("memctl_budget_peak_bytes", "The highest in-use bytes since the pool was made.",
		func(s *limits.PoolStats) (float64, bool) { return float64(s.Peak), true }),
	refusals("account", func(r *limits.RefusedBy) int64 { return r.Account }),
	refusals("pool", func(r *limits.RefusedBy) int64 { return r.Pool }),
	refusals("heap_pressure", func(r *limits.RefusedBy) int64 { return r.HeapPressure }),
	refusals("shedding", func(r *limits.RefusedBy) int64 { return r.Shedding }),
	counter("memctl_budget_canceled_total", "Request contexts canceled under heap pressure.",
		func(s *limits.PoolStats) int64 { return s.Canceled }),
	counter("memctl_budget_misuse_total", "Shrink calls below zero or of a negative size.",
		func(s *limits.PoolStats) int64 { return s.Misuse }),
	gauge("memctl_heap_pressure", "1 while the live heap is above the pool's heap threshold (end of the last GC).",
		func(s *limits.PoolStats) (float64, bool) { return boolValue(s.UnderHeapPressure), true }),
	counter("memctl_budget_observed_total", "Grows that would have been refused, let through by MEMCTL_BUDGETS=observe or off.",
		func(s *limits.PoolStats) int64 { return s.Observed }),
	counter("memctl_budget_leaked_accounts_total", "Accounts closed with bytes still grown.",
		func(s *limits.PoolStats) int64 { return s.Leaked }),
	counter("memctl_budget_leaked_bytes_total", "Bytes still grown in accounts when they were closed.",
		func(s *limits.PoolStats) int64 { return s.LeakedBytes }),
	gauge("memctl_budget_in_flight", "Top-level accounts open in the pool: requests, RPCs and jobs in progress.",
		func(s *limits.PoolStats) (float64, bool) { return float64(s.InFlight), true }),
	counter("memctl_budget_undercharged_total", "GC cycles at whose end, with requests in flight, the live heap beyond its baseline was more than the pool's charge ratio (PoolConfig.ChargeRatio, default 4) times what its accounts held: the charges look too small.",
		func(s *limits.PoolStats) int64 { return s.Undercharged }),
	gauge("memctl_budget_heap_baseline_bytes", "The live heap, in bytes, that the charge check takes as the service's own; absent before the first GC cycle or with the check off.",
		func(s *limits.PoolStats) (float64, bool) { return float64(s.HeapBaseline), s.HeapBaseline >= 0 }),
}

// peakHelp is the help of memctl_budget_request_peak_bytes.
const peakHelp = "The peaks of the pool's requests, in bytes: what each request, RPC or job reached or asked for (a refused Grow counts), recorded when it ends, in every budget mode (the sum leaves out peaks above the last bound, 64 GiB)."

// processMetrics are read once per scrape from the first pool's Stats: they
// count for the whole process, not per pool.
var processMetrics = []metric[limits.PoolStats]{
	counter("memctl_budget_unguarded_total", "limits.Grow calls on a context with no account (a handler outside the budget middleware), in the whole process.",
		func(s *limits.PoolStats) int64 { return s.Unguarded }),
}

// NewCollector returns a collector for ctl (the controller memctl.Start
// returned) and pools. A nil ctl is allowed (for example when the auto
// package started memctl): the scrape then has GOMEMLIMIT, the C heap and
// the misuse count, and memctl_enabled is 0. It returns an error for a nil
// Pool, a Name other than the pool's own, and two pools of the same name
// (name them with PoolConfig.Name).
func NewCollector(ctl *memctl.Controller, pools ...Pool) (*Collector, error) {
	seen := map[string]bool{}
	pools = append([]Pool(nil), pools...)
	for i, p := range pools {
		switch {
		case p.Pool == nil:
			return nil, fmt.Errorf("metrics: pool %q is nil", p.Name)
		case p.Name == "":
			pools[i].Name = p.Pool.Name()
		case p.Name != p.Pool.Name():
			return nil, fmt.Errorf("metrics: pool %q is named %q in its errors and Stats: one name per pool (set PoolConfig.Name to %q, or leave Pool.Name empty)", p.Name, p.Pool.Name(), p.Name)
		}
		if seen[pools[i].Name] {
			return nil, fmt.Errorf("metrics: two pools named %q: name each with PoolConfig.Name", pools[i].Name)
		}
		seen[pools[i].Name] = true
	}
	c := &Collector{ctl: ctl, pools: pools}
	for _, m := range controllerMetrics {
		c.ctlDescs = append(c.ctlDescs, prometheus.NewDesc(m.name, m.help, m.labels, nil))
	}
	for _, m := range heapMetrics {
		c.heapDescs = append(c.heapDescs, prometheus.NewDesc(m.name, m.help, append([]string{"allocator", "object", "prefix"}, m.labels...), nil))
	}
	for _, m := range poolMetrics {
		c.poolDescs = append(c.poolDescs, prometheus.NewDesc(m.name, m.help, append([]string{"pool"}, m.labels...), nil))
	}
	c.peakDesc = prometheus.NewDesc("memctl_budget_request_peak_bytes", peakHelp, []string{"pool"}, nil)
	if len(pools) > 0 {
		for _, m := range processMetrics {
			c.procDescs = append(c.procDescs, prometheus.NewDesc(m.name, m.help, m.labels, nil))
		}
	}
	return c, nil
}

// Register makes a collector with NewCollector and registers it with reg
// (prometheus.DefaultRegisterer, or a registry of the caller's). It returns
// NewCollector's error, or reg.Register's (for example when a collector
// with the same metrics is already registered).
func Register(reg prometheus.Registerer, ctl *memctl.Controller, pools ...Pool) (*Collector, error) {
	c, err := NewCollector(ctl, pools...)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return c, nil
}

// Describe sends the descriptions of every metric the collector can
// export; part of prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.ctlDescs {
		ch <- d
	}
	for _, d := range c.poolDescs {
		ch <- d
	}
	for _, d := range c.heapDescs {
		ch <- d
	}
	for _, d := range c.procDescs {
		ch <- d
	}
	if len(c.pools) > 0 {
		ch <- c.peakDesc
	}
}

// Collect reads the controller's and the pools' statistics once and sends
// the metrics; part of prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	snap := controller{live: c.ctl != nil, stats: c.ctl.Stats()}
	if c.ctl != nil {
		snap.report = c.ctl.Report()
	}
	emit(ch, controllerMetrics, c.ctlDescs, &snap)
	for i := range snap.stats.CHeaps {
		h := &snap.stats.CHeaps[i]
		emit(ch, heapMetrics, c.heapDescs, h, h.Allocator, objectLabel(h), h.Prefix)
	}
	for i, p := range c.pools {
		st := p.Pool.Stats()
		emit(ch, poolMetrics, c.poolDescs, &st, p.Name)
		ch <- peakHistogram(c.peakDesc, &st.Peaks, p.Name)
		if i == 0 {
			emit(ch, processMetrics, c.procDescs, &st)
		}
	}
}

// objectLabel is the object label of h: its path made UTF-8 (a label value
// must be, else the whole scrape fails; a path need not be), with
// " (namespace N)" after it for an object of a dlmopen namespace (the same
// path can be loaded in two, and two series must not have the same
// labels).
func objectLabel(h *cheap.Heap) string {
	s := strings.ToValidUTF8(h.Library, "\uFFFD")
	if h.Namespace != 0 {
		s += " (namespace " + strconv.FormatInt(h.Namespace, 10) + ")"
	}
	return s
}

func emit[T any](ch chan<- prometheus.Metric, table []metric[T], descs []*prometheus.Desc, s *T, fixed ...string) {
	for i, m := range table {
		v, labels, ok := m.read(s)
		if !ok {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descs[i], m.kind, v, append(append([]string(nil), fixed...), labels...)...)
	}
}

// peakHistogram is memctl_budget_request_peak_bytes for one pool: the
// cumulative counts of limits.PeakHistogram at each bound.
func peakHistogram(desc *prometheus.Desc, h *limits.PeakHistogram, pool string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(peakBounds))
	var n uint64
	for i, b := range peakBounds {
		n += uint64(max(h.Counts[i], 0))
		buckets[b] = n
	}
	return prometheus.MustNewConstHistogram(desc, uint64(max(h.Count, 0)), float64(h.Sum), buckets, pool)
}
