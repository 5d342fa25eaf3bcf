// Package metrics exports memctl's decisions and counters to Prometheus.
// It is a module of its own, so that only a program that imports it pulls
// in github.com/prometheus/client_golang.
//
//	ctl, _ := memctl.Start()
//	defer ctl.Close()
//	pool, _ := limits.NewPool(limits.PoolConfig{Name: "http"})
//	if _, err := metrics.Register(prometheus.DefaultRegisterer, ctl, metrics.Pool{Pool: pool}); err != nil {
//		...
//	}
//	http.Handle("/metrics", promhttp.Handler())
//
// The collector reads Controller.Stats, Controller.Report and
// limits.Pool.Stats at each scrape; it keeps no state, starts no goroutine,
// and is safe for concurrent use.
//
// # Metrics
//
// Names follow the Prometheus conventions. A figure that does not exist
// (no GOMEMLIMIT, no trim yet, a C heap figure the allocator does not
// report) is left out of the scrape rather than given a sentinel value.
//
//	memctl_enabled                            gauge    1 when Start ran and MEMCTL did not switch memctl off
//	memctl_gomemlimit_bytes                   gauge    GOMEMLIMIT now; absent when none is set
//	memctl_gomemlimit_info{source}            gauge    1; source: none, cgroup v1, cgroup v2, system, env
//	memctl_memory_limit_bytes                 gauge    the memory limit GOMEMLIMIT was derived from; absent when none was found
//	memctl_trim_delay_seconds                 gauge    the trim delay; 0 when trimming is off
//	memctl_trims_total                        counter  trims run
//	memctl_trims_skipped_total                counter  due or requested trims skipped (every origin and reason)
//	memctl_trims_origin_total{origin}         counter  trims run, by origin: debounced, pressure, spiral, by_name (TrimNow)
//	memctl_trims_origin_skipped_total{origin} counter  trims skipped, by origin
//	memctl_trim_origin_cpu_seconds_total{origin} counter CPU charged to the trims, by origin
//	memctl_trims_skipped_reason_total{reason} counter  trims skipped, by reason: min_release, cost, budget, running
//	memctl_pressure_left_to_kernel_total      counter  kernel signals not acted on: the cgroup's memory was mostly page cache
//	memctl_trim_released_bytes_total          counter  bytes the trims released (Go heap and C heap)
//	memctl_trim_last_duration_seconds         gauge    wall time of the last trim; absent before the first
//	memctl_trim_pending                       gauge    1 while a trim is scheduled
//	memctl_bursts_in_flight                   gauge    bursts begun (Begin) and not yet ended
//	memctl_thp_info{state,policy,system}      gauge    1; the process's THP state, the policy applied, the system mode
//	memctl_c_heap_in_use_bytes{allocator}     gauge    bytes in live C heap blocks
//	memctl_c_heap_retained_bytes{allocator}   gauge    bytes the C allocator holds that no live block uses
//	memctl_c_allocator_info{allocator,object,prefix,owner,trimmed}  gauge  1 for every allocator found in the process (memctl.Stats.CHeaps)
//	memctl_c_allocator_retained_bytes{allocator,object,prefix}       gauge  bytes that allocator holds that no live block uses
//	memctl_c_allocator_resident_bytes{allocator,object,prefix}       gauge  its resident bytes, by its own account
//	memctl_c_allocator_released_bytes_total{allocator,object,prefix} counter bytes the trims released from it, by its own account
//	memctl_c_allocator_releases_total{allocator,object,prefix}       counter trims that released it
//	memctl_c_allocator_release_failures_total{allocator,object,prefix} counter trims whose release call of it returned an error
//	memctl_c_allocator_last_max_slice_seconds{allocator,object,prefix} gauge the longest single call of its last release (the longest memctl held one of its locks)
//	memctl_misuse_total                       counter  misuse: wiring mistakes, an end of Begin called twice (memctl.Stats.Misuse)
//	memctl_trim_cpu_seconds_total             counter  CPU the trims caused: what the 2% rate limit counts
//	memctl_trim_lazy_released_bytes_total     counter  bytes released lazily (GODEBUG=madvdontneed=0)
//	memctl_trims_deferred_total               counter  trims the CPU rate limit deferred past the max wait
//	memctl_trims_early_total                  counter  trims started at half the delay: the CPU cgroup was throttled
//	memctl_trims_no_gc_total                  counter  trims whose Go step returned the free heap without a GC
//	memctl_trims_no_gc_aborted_total{reason}  counter  such steps stopped early: gc, no_progress, gc_cpu_limiter, limit_changed
//	memctl_pressure_events_total{kind}        counter  kind spiral: GC death-spiral episodes; kind kernel: kernel pressure signals
//	memctl_gc_death_spiral                    gauge    1 during a death-spiral episode
//	memctl_gc_cpu_share                       gauge    the GC's CPU share over the detector's window (0 to 1)
//	memctl_gomemlimit_lifted_bytes            gauge    bytes a death-spiral lift adds to GOMEMLIMIT now
//	memctl_cgroup_memory_events_total{event}  counter  cgroup v2 memory.events (low, high, max, oom, oom_kill, oom_group_kill)
//
// and per budget pool, labelled pool with the pool's name (PoolConfig.Name,
// the first element of the scope of its errors: one name per pool):
//
//	memctl_budget_limit_bytes                 gauge    the pool's limit; absent when it has none
//	memctl_budget_in_use_bytes                gauge    bytes the pool's accounts hold (with their reserved chunks)
//	memctl_budget_peak_bytes                  gauge    the highest in-use bytes since the pool was made
//	memctl_budget_refusals_total{scope}       counter  Grow calls refused with resource_exhausted; scope account, pool, heap_pressure, shedding
//	memctl_budget_canceled_total              counter  request contexts canceled under heap pressure
//	memctl_budget_misuse_total                counter  Shrink calls below zero or of a negative size
//	memctl_heap_pressure                      gauge    1 while the live heap is above the pool's heap threshold
//	memctl_budget_observed_total              counter  refusals let through by MEMCTL_BUDGETS=observe or off
//	memctl_budget_leaked_accounts_total       counter  accounts closed with bytes still grown
//	memctl_budget_leaked_bytes_total          counter  bytes still grown in accounts when they were closed
//	memctl_budget_in_flight                   gauge    top-level accounts open: requests, RPCs and jobs in progress
//	memctl_budget_request_peak_bytes          histogram per-request peaks (what each asked for), in every mode: the data to size budgets (docs/sizing.md)
//	memctl_budget_undercharged_total          counter  GC cycles at whose end the live heap far exceeded what the accounts held: charges too small
//	memctl_budget_heap_baseline_bytes         gauge    the live heap the charge check takes as the service's own; absent before the first GC
//
// and, once for the process when a pool is given:
//
//	memctl_budget_unguarded_total             counter  limits.Grow calls with no account in the context
//
// The memctl_c_allocator_ families have one series per allocator found
// (object is the file that holds its code).
package metrics
