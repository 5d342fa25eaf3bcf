// Package pressure sees memory trouble coming and acts on it. Start runs a
// Monitor; Subscribe tells the service of each event; Close stops it. The
// zero Config is the default, and memctl.Start runs one unless
// MEMCTL_PRESSURE=off.
//
// The death-spiral detector runs at the end of each GC cycle (no
// goroutine, no timer). An episode begins when the live heap is near
// GOMEMLIMIT (the median of the last 8 GC ends at least Config.LiveRatio
// of it, or GOMEMLIMIT, not GOGC, setting the heap goal with at most
// (1 − LiveRatio) × GOMEMLIMIT of runway) and, over Config.Window, the GC
// takes at least Config.GCShare of the available CPU or the runtime's GC
// CPU limiter engaged. It logs one WARN, publishes KindSpiral, sheds large
// work in the limits pools (their Grows past PoolConfig.ShedSize are
// refused with resource_exhausted) and lifts GOMEMLIMIT for Config.LiftFor
// when memctl set it from the cgroup limit.
//
// The kernel watcher is one goroutine blocked in poll(2) on the first
// source that applies: systemd's memory pressure protocol
// ($MEMORY_PRESSURE_WATCH, https://systemd.io/MEMORY_PRESSURE/), the
// cgroup's PSI trigger (v2 memory.pressure), cgroup v2 memory.events where
// the trigger is refused (read-only mount, nsdelegate), the cgroup v1
// memory.pressure_level, then the host-wide PSI (/proc/pressure/memory;
// Monitor.SourceNote says why the cgroup's own could not be used). After
// it acts it ignores the source for Config.MinInterval. A PSI event that
// the stall since the trigger was armed does not explain is ignored
// (Stats.Unexplained) and looked at once more a trigger window later (the
// kernel sends at most one event per window). On each signal it reads what the memory is made of
// (memory.stat or /proc/meminfo): a cgroup's memory mostly page cache is
// left to the kernel (Stats.LeftToKernel); otherwise it asks for a trim
// through the trimmer's gate, cancels the largest request in the pools
// when anonymous memory is the problem (and, host-wide, mostly this
// process's; else Stats.CancelsHeld), and publishes KindKernel.
//
// Sources: Documentation/accounting/psi.rst, admin-guide/cgroup-v2.rst and
// cgroup-v1/memory.rst; figures in docs/benchmarks.md.
package pressure
