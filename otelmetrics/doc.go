// Package otelmetrics exports memctl's decisions and counters as
// OpenTelemetry instruments: the same figures as the Prometheus collector of
// package github.com/memctl/memctl/metrics, for services that use the OTel
// SDK. Use one or the other.
//
//	ctl, _ := memctl.Start()
//	defer ctl.Close()
//	pool, _ := limits.NewPool(limits.PoolConfig{Name: "http"})
//	reg, err := otelmetrics.Register(otel.GetMeterProvider(), ctl, otelmetrics.Pool{Name: "http", Pool: pool})
//	if err != nil {
//		...
//	}
//	defer reg.Unregister()
//
// It is a module of its own, so that only a program that imports it pulls
// in go.opentelemetry.io/otel/metric. Every instrument is asynchronous: one
// callback reads Controller.Stats, Controller.Report and limits.Pool.Stats
// once per collection. A figure that does not exist (no GOMEMLIMIT, no trim
// yet) is not observed rather than given a sentinel value.
//
// # Instruments
//
// Both packages walk one table, with the same help text. Names follow the
// OpenTelemetry conventions (dots, the unit in the unit field: By, s, 1); an
// SDK Prometheus exporter turns memctl.trims, a counter, into
// memctl_trims_total.
//
//	memctl.enabled                   gauge    1 when Start ran and MEMCTL did not switch memctl off
//	memctl.gomemlimit                gauge    By, GOMEMLIMIT now
//	memctl.gomemlimit.info           gauge    1, attribute source
//	memctl.memory_limit              gauge    By, the limit GOMEMLIMIT was derived from
//	memctl.trim.delay                gauge    s, 0 when trimming is off
//	memctl.trims                     counter  trims run
//	memctl.trims.skipped             counter  trims skipped by the gate (every origin and reason)
//	memctl.trim.released             counter  By, released by the trims
//	memctl.trim.last_duration        gauge    s, wall time of the last trim
//	memctl.trim.pending              gauge    1 while a trim is scheduled
//	memctl.bursts_in_flight          gauge    bursts begun and not yet ended
//	memctl.thp.info                  gauge    1, attributes state, policy, system
//	memctl.c_heap.in_use             gauge    By, attribute allocator
//	memctl.c_heap.retained           gauge    By, attribute allocator
//	memctl.misuse                    counter  wiring mistakes and ends of Begin called twice
//	memctl.trim.cpu                  counter  s, CPU the trims caused
//	memctl.trim.lazy_released        counter  By, released lazily (MADV_FREE)
//	memctl.trims.deferred            counter  trims the CPU rate limit deferred
//	memctl.trims.early               counter  trims started early: CPU cgroup throttled
//	memctl.trims.no_gc               counter  trims whose Go step returned the free heap without a GC
//	memctl.trims.no_gc.aborted       counter  such steps stopped early, attribute reason: gc, no_progress, gc_cpu_limiter, limit_changed
//	memctl.pressure.events           counter  attribute kind: spiral, kernel
//	memctl.gc.death_spiral           gauge    1 during a death-spiral episode
//	memctl.gc.cpu_share              gauge    1, the GC's CPU share (0 to 1)
//	memctl.gomemlimit.lifted         gauge    By, a death-spiral lift
//	memctl.cgroup.memory_events      counter  attribute event (cgroup v2 memory.events)
//	memctl.pressure.left_to_kernel   counter  kernel signals left to the kernel: mostly page cache
//	memctl.trims.origin              counter  trims run, attribute origin: debounced, pressure, spiral, by_name
//	memctl.trims.origin.skipped      counter  trims skipped, attribute origin
//	memctl.trim.origin.cpu           counter  s, trim CPU, attribute origin
//	memctl.trims.skipped_reason      counter  trims skipped, attribute reason: min_release, cost, budget, running
//
// and per C allocator found (attributes allocator, object, prefix):
//
//	memctl.c_allocator.info          gauge    1, attributes owner, trimmed
//	memctl.c_allocator.retained      gauge    By
//	memctl.c_allocator.resident      gauge    By
//	memctl.c_allocator.released      counter  By
//	memctl.c_allocator.releases      counter
//	memctl.c_allocator.release_failures counter
//	memctl.c_allocator.last_max_slice gauge   s, the longest single call of its last release
//
// and per pool, with attribute pool:
//
//	memctl.budget.limit              gauge    By
//	memctl.budget.in_use             gauge    By
//	memctl.budget.peak               gauge    By
//	memctl.budget.refusals           counter  attribute scope: account, pool, heap_pressure, shedding
//	memctl.budget.canceled           counter
//	memctl.budget.misuse             counter
//	memctl.heap_pressure             gauge    1 while the live heap is above the pool's threshold
//	memctl.budget.observed           counter
//	memctl.budget.leaked_accounts    counter
//	memctl.budget.leaked             counter  By
//	memctl.budget.in_flight          gauge    requests, RPCs and jobs in progress
//	memctl.budget.undercharged       counter  GC cycles at which the charges looked too small
//	memctl.budget.heap_baseline      gauge    By
//	memctl.budget.request_peaks      counter  cumulative per-request peaks, attribute le (bytes, or +Inf)
//
// and once for the process when a pool is given:
//
//	memctl.budget.unguarded          counter  limits.Grow calls with no account in the context
package otelmetrics
