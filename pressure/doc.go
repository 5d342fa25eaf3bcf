// Package pressure sees memory trouble coming and says so: the GC death
// spiral, detected at the end of each garbage-collection cycle, and memory
// pressure announced by the kernel, watched by one goroutine blocked in
// poll(2). A Monitor runs both; Start makes one and Close stops it.
//
// # GC death spiral
//
// A Go program whose live heap sits just under GOMEMLIMIT collects almost
// without pause: measured here (2 cores, Go 1.26.8; see
// TestDeathSpiralChild), a live heap of pointer-holding objects at 98% of a
// 200 MiB GOMEMLIMIT with steady churn spends about 60% of the available
// CPU in the GC, against 13-24% with 20 MiB live. At the end of each GC cycle
// (internal/gcend: no goroutine, no timer, nothing while the process does
// not allocate) the Monitor reads runtime/metrics: the GC's share of the
// available CPU over a sliding window (/cpu/classes/gc/total:cpu-seconds
// against /cpu/classes/total:cpu-seconds, which is GOMAXPROCS times wall
// time), the GC CPU limiter (/gc/limiter/last-enabled:gc-cycle) and the
// live heap (/gc/heap/live:bytes) against GOMEMLIMIT. An episode begins
// when the live heap is at least Config.LiveRatio of GOMEMLIMIT and, over
// the window, the GC's share is at least Config.GCShare or the runtime's
// GC CPU limiter engaged (it engages only when the GC would take more than
// half the CPU, runtime/mgclimit.go). It logs one WARN with the figures,
// publishes a KindSpiral event, and takes the actions Config switches on:
// Shed (refuse new large work) and a bounded, timed lift of GOMEMLIMIT.
// The check costs 0.5 to 1.4 µs per GC end and allocates nothing
// (go test ./pressure -run XXX -bench GCEndCheck, on this 2-core machine):
// at most 0.07% of one CPU at 500 cycles a second.
//
// # Kernel memory pressure
//
// The watcher uses the first of these that applies: systemd's memory
// pressure protocol ($MEMORY_PRESSURE_WATCH, $MEMORY_PRESSURE_WRITE; see
// https://systemd.io/MEMORY_PRESSURE/), the cgroup's PSI trigger (cgroup v2
// memory.pressure), the cgroup v1 memory.pressure_level through
// cgroup.event_control and an eventfd, and the system-wide PSI trigger on
// /proc/pressure/memory (Documentation/accounting/psi.rst). Its goroutine
// blocks in poll(2) with no timeout while nothing happens; after it acts it
// ignores the source for Config.MinInterval (the poll then has a timeout:
// that is the only timer, and only under pressure), so that the v1 `low`
// level, which fires hundreds of times a second at a cgroup's limit (2,523
// signals in 10.5 s gave 11 actions at a 1 s interval here; see
// TestV1LevelRateLimited), gives one action per interval. To act is to
// call Config.Trim, then Config.CancelLargest, and to publish a KindKernel
// event.
//
// # Subscription
//
// Subscribe returns a channel, not a callback: the detector runs on the
// runtime's cleanup goroutine, where a callback that blocks would hold up
// every later GC-end hook and cleanup in the process; a channel send that
// drops when the buffer is full cannot. Dropped events are counted in
// Stats.Dropped.
//
// # Construction
//
// Config is a struct whose zero value is the default, as in limits and the
// standard library; the facade (package memctl) fills in the funcs that
// act on the other parts, which this package does not import.
package pressure
