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
// https://systemd.io/MEMORY_PRESSURE/; a decoded trigger for a PSI file
// gets its terminating NUL when it lacks one, and a value that is no PSI
// trigger is a WARN naming the variable, then the next source), the
// cgroup's PSI trigger (cgroup v2 memory.pressure), cgroup v2
// memory.events (read-only, polled for the kernel's change notification,
// its high, max, oom and oom_kill counters: for a read-only cgroup mount
// where memory.pressure cannot be opened for writing, and inside a
// container on a hierarchy mounted with nsdelegate, as systemd mounts it
// on every Kubernetes node, where the kernel refuses the trigger on the
// cgroup namespace root's memory.pressure with EPERM; SourceNote then says
// which, as pressure_note in memctl's startup line. memory.events signals
// only at memory.high or memory.max, with no earlier warning: nothing else
// of its own cgroup can be watched there without writing or a timer, as
// memory.pressure without a trigger always polls readable and
// cgroup.events carries only populated and frozen. Measured in the v2
// suite (TestV2PressureTrimInContainer, internal/v2vm): a trim within 3 s of
// the first max event in a 256 MiB container), the cgroup v1
// memory.pressure_level through cgroup.event_control and an eventfd, and
// the system-wide PSI trigger on /proc/pressure/memory
// (Documentation/accounting/psi.rst). The last is the whole host's
// pressure, not the container's: it is named "host-wide PSI", and
// Monitor.SourceNote (in memctl's startup line, after the pressure source) says why
// the cgroup's own signal could not be used: a read-only cgroup mount (the
// Docker and Kubernetes default: EROFS), no memory controller, no limit. Its goroutine
// blocks in poll(2) with no timeout while nothing happens; after it acts it
// ignores the source for Config.MinInterval (the poll then has a timeout:
// that is the only timer, and only under pressure), so that the v1 `low`
// level, which fires hundreds of times a second at a cgroup's limit (2,523
// signals in 10.5 s gave 11 actions at a 1 s interval here; see
// TestV1LevelRateLimited), gives one action per interval.
//
// It acts only on the pressure the process can relieve. On each signal it
// reads what the memory under pressure is made of (Makeup): the watched
// cgroup's memory.stat, anonymous memory ("anon", v1 "total_rss") against
// reclaimable page cache ("active_file" + "inactive_file"), or
// /proc/meminfo for host-wide PSI. While a cgroup's page cache is at least
// its anonymous memory, the kernel is reclaiming cache at the limit, which
// is its job and no fault of the Go heap: the signal is left to the
// kernel (Stats.LeftToKernel). Otherwise it calls Config.Trim, which the
// facade routes through the trimmer's one gate (trim.Trimmer.Request: no
// trim with too little to release for its cost, none past the 2% CPU
// budget), then Config.CancelLargest only when anonymous memory is the
// problem (a host-wide signal with mostly cache, or whose anonymous
// memory is mostly not this process's, asks for the trim alone,
// Stats.CancelsHeld), and publishes a KindKernel event. Measured here
// (TestNeighbourPageCacheCostsNothing, TestPageCacheAtLimitCostsNothing):
// a neighbour's page cache and a cgroup filled with page cache cost a
// service with memctl no more CPU than its control with
// MEMCTL_PRESSURE=off, while its own 180 MiB of garbage at its cgroup's
// limit is trimmed at the first signal (TestOwnGarbagePressureTrims).
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
