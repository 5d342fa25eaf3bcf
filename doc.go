// Package memctl keeps a pure-Go service's memory bounded and predictable on
// Linux: no OOM kill at the pod's limit, no RSS left at its peak after a
// burst. A blank import in main's package runs Start with its defaults:
//
//	import _ "github.com/memctl/memctl/auto"
//
// For per-request budgets (package limits) or options, call Start at the top of
// main instead:
//
//	func main() {
//		ctl, _ := memctl.Start() // logs what it decided; see Start for the error
//		defer ctl.Close()
//		...
//		// after a burst of work (a big query, an import, a cache rebuild):
//		memctl.AfterBurst()
//	}
//
// With its defaults, Start:
//
//   - switches transparent huge pages off for the process, except in advised
//     regions (package thp, WithTHP);
//   - sets GOMEMLIMIT from the cgroup memory limit, less what the cgroup is
//     charged outside the Go runtime, and follows the limit (package limits,
//     WithMemLimit, docs/gomemlimit.md);
//   - returns freed memory to the OS, from the Go heap and every C heap, two
//     seconds after a burst ends (detected at GC end, or marked with AfterBurst
//     or Begin), within 2% of a CPU (package trim, WithTrim, docs/bursts.md);
//   - acts on a GC death spiral and on kernel memory pressure (package
//     pressure, WithPressure).
//
// Controller.Report says what Start decided and Controller.Stats what it did
// since; Handler serves both, `memctl status -pid PID` reads them from outside
// the process, and the modules metrics and otelmetrics export them
// (docs/observing.md).
//
// # Environment
//
// The operator wins: the environment overrides Start's options, and memctl
// never overrides GODEBUG, MALLOC_ARENA_MAX or GLIBC_TUNABLES, nor an
// operator's GOMEMLIMIT except while it is above the cgroup's hard limit
// (MEMCTL_KEEP_GOMEMLIMIT). MEMCTL=off makes memctl do nothing; the other
// switches are named on the option they override and listed in
// docs/environment.md. Every switch reads on/off, yes/no and the
// strconv.ParseBool spellings, any case; empty is unset. An invalid value is
// logged at WARN, returned in Start's error, and fails safe: its part is off,
// GOMEMLIMIT is left as it was, budgets stay enforced. An unknown MEMCTL_*
// variable is logged at WARN, naming the closest one.
//
// # Wiring mistakes
//
// AfterBurst or Begin with no live controller does nothing and logs one WARN
// through slog.Default. Start while an earlier controller is live (a second
// Start, or Start beside the auto package) logs one WARN; the newest live
// controller serves AfterBurst and Begin. Both are counted in Stats.Misuse.
//
// # Platforms
//
// Linux first. Elsewhere everything compiles, the Linux-only parts return
// errors that match errors.ErrUnsupported, and Start logs them and carries on.
// cgo is optional: with CGO_ENABLED=0 the C heap step reports that it is
// unavailable.
package memctl
