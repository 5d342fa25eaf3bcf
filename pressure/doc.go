// Package pressure sees memory trouble coming and acts on it. Start runs a
// Monitor, Subscribe tells the service of each event, Close stops it;
// memctl.Start runs one unless MEMCTL_PRESSURE=off.
//
// At each GC end, with no goroutine or timer, the death-spiral detector looks
// for a live heap near GOMEMLIMIT with the GC taking much of the CPU; on one it
// logs a WARN, publishes KindSpiral, sheds large work in the limits pools and
// lifts GOMEMLIMIT. The kernel watcher, one goroutine blocked in poll(2) on the
// kernel's memory pressure signal (PSI, memory.events, v1's pressure_level,
// systemd's), asks for a trim, or cancels the largest request when anonymous
// memory is the problem, and publishes KindKernel. The rules are Config's
// fields and docs/pressure.md; figures in docs/benchmarks.md.
package pressure
