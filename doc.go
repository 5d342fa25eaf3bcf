// Package memctl keeps a pure-Go service's memory bounded and predictable on
// Linux. The one-line answer to a pod OOM-killed at its limit, or to RSS
// that stays at its peak after a burst, is a blank import in main's
// package, which runs Start with its defaults:
//
//	import _ "github.com/memctl/memctl/auto"
//
// For per-request budgets (package limits) or options, call Start at the
// top of main instead:
//
//	func main() {
//		// Start logs what it decided (one short INFO line, the details at
//		// DEBUG) and each part it skipped (WARN); its error joins those,
//		// for tests and strict callers.
//		ctl, _ := memctl.Start()
//		defer ctl.Close()
//		...
//		// after a burst of work (a big query, an import, a cache rebuild):
//		memctl.AfterBurst()
//	}
//
// Start switches transparent huge pages (THP) off for the process except
// in regions it advises with MADV_HUGEPAGE (prctl PR_SET_THP_DISABLE with
// PR_THP_DISABLE_EXCEPT_ADVISED on Linux 6.18 and later, the whole flag
// before; package thp; the flag is inherited by child processes, whose
// advised regions keep their huge pages, and an operator's GLIBC_TUNABLES
// glibc.malloc.hugetlb=1 is kept), sets GOMEMLIMIT from the cgroup
// memory limit (package limits: v1, or v2's memory.max with memory.high as
// a target, less what the cgroup is charged outside the Go runtime, never
// under a 64 MiB floor, and
// re-read at the end of a GC cycle at most every 10 s and when a limit
// file is written, so a resized pod is followed within 10 s, idle or not) and starts a trimmer that returns freed
// memory to the OS two seconds after the last burst ends (debug.FreeOSMemory,
// and the C heap of the allocator that owns malloc; package trim). It finds
// the bursts itself: at the end of each GC cycle a live heap at twice its
// recent floor (and 32 MiB over it) is a burst in progress, and the trim
// comes two seconds after the last GC cycle that saw it (trim.AutoBurstConfig; no
// goroutine or timer while idle), with the GC that finds out whether the
// burst died when that GC fits in the trims' CPU budget (2% of a CPU). The
// same rule finds a burst of free C memory (glibc, jemalloc, tcmalloc; not
// mimalloc), looked at on GC ends at most once a second: in a process that
// allocates nothing in Go, at the runtime's forced GC 2 minutes at the
// latest after the burst. AfterBurst and Begin mark bursts the
// detector cannot see (garbage that no GC cycle found live) and set the
// trim's time exactly. It logs one short INFO line through log/slog that
// says what it decided, the details at DEBUG. Package limits also has per-request memory budgets that refuse
// the request that would exceed its share with a resource_exhausted error.
//
// Start also watches for trouble (package pressure): at the end of each GC
// cycle it checks for a GC death spiral (the GC taking 50% or more of the
// CPU over 10 s with the live heap at 90% or more of GOMEMLIMIT, or with
// GOMEMLIMIT pacing the GC with less runway than that), logs one
// WARN per episode and, when GOMEMLIMIT came from the cgroup, lifts it by
// 10% (never above the cgroup limit, kept by the refresh) for a minute; and
// one goroutine blocked in poll(2) waits for the kernel's memory pressure
// signal (PSI, the cgroup v1 pressure level, or systemd's
// $MEMORY_PRESSURE_WATCH) and, at most every 2 s, when the memory under
// pressure is mostly anonymous rather than page cache, asks for a trim
// through the trimmer's one gate (the trim gate of package trim: skipped when too
// little would be released for its GC, charged to the same 2% CPU budget).
// Controller.Subscribe delivers both as events. WithPressure configures it.
//
// Why: a Go process that served a 1 GiB burst keeps about 1 GiB of RSS for
// minutes, because freed pages go back to the OS only through the background
// scavenger; THP can back sparse heap regions with whole 2 MiB pages; and
// without GOMEMLIMIT the garbage collector does not know the container's
// limit. examples/burst shows the first effect on this machine.
//
// # Seeing what it decided
//
// Controller.Report says what Start decided and Controller.Stats what it
// did since; Handler serves both as JSON at a /debug/memctl of the
// service's choosing. The same document, the state record, is published
// where `memctl status -pid PID` reads it from outside the process (a
// sealed memfd, replaced whole when a decision changes: at Start, after
// each trim, when GOMEMLIMIT or the pools change, at Close; never on a
// timer or a hot path). The nested modules metrics and otelmetrics export
// the figures to Prometheus and OpenTelemetry.
//
// # Configuration
//
// Start takes functional options, because nearly every caller passes none:
// memctl.Start() is the whole setup. The parts (packages trim, limits,
// pressure) take config structs whose zero value is the default, as
// net/http.Server, tls.Config and slog.HandlerOptions do: every setting and
// its default is a documented field in one place, and a struct is a value
// that can be built, copied and printed. Each option of Start that
// configures a part takes that part's struct: WithTrim(trim.Config),
// WithMemLimit(limits.MemLimitConfig), WithPressure(pressure.Config).
// WithTrimDelay is the one shortcut, for the common knob; the trim delay
// comes from MEMCTL_TRIM_DELAY when it is set, otherwise from the last of
// WithTrimDelay and a non-zero trim.Config.Delay of WithTrim.
//
// # Environment
//
// The operator wins: these variables override Start's options, and the Go
// and glibc ones are never overridden by memctl, with one exception: an
// operator's GOMEMLIMIT above the cgroup's hard limit, which cannot take
// effect before the OOM killer, is replaced while it is above it
// (MEMCTL_KEEP_GOMEMLIMIT=on keeps it).
//
//	MEMCTL=on|off                      off: memctl does nothing at all
//	MEMCTL_THP=keep|disable|except-advised|on|off
//	                                   the THP flag, inherited by child
//	                                   processes (default except-advised
//	                                   on Linux 6.18 and later, disable
//	                                   before; on is the default, off is
//	                                   keep: memctl leaves the flag alone)
//	MEMCTL_TRIM_DELAY=2s|on|off        trim delay after the last burst
//	                                   (1ms to 24h; 0 is off, on is 2s)
//	MEMCTL_AUTOBURST=on|off            burst detection at GC end (default
//	                                   on; off: only AfterBurst and Begin
//	                                   start trims)
//	MEMCTL_ARENA_MAX=2|on|off          glibc arena cap (cgo, glibc only;
//	                                   0 is off, on is 2)
//	GOMEMLIMIT                         set by the operator: left as it is,
//	                                   unless above the cgroup's hard
//	                                   limit (after a resize down): then
//	                                   memctl sets its own value, with a
//	                                   WARN, until the limit rises above
//	                                   it again
//	MEMCTL_KEEP_GOMEMLIMIT=on|off      keep the operator's GOMEMLIMIT even
//	                                   above the hard limit (default off)
//	AUTOMEMLIMIT=0.9|off               ratio of the cgroup limit, or off
//	MEMCTL_REFRESH=10s|off             least time between two re-reads of
//	                                   the cgroup limit, at GC end
//	MEMCTL_GOMEMLIMIT_FLOOR=64MiB      smallest GOMEMLIMIT memctl sets
//	MEMCTL_MEMORY_LIMIT=512MiB         the container's limit where no
//	                                   cgroup shows one (bytes, as the
//	                                   downward API writes limits.memory,
//	                                   or a size); AWS Lambda's
//	                                   AWS_LAMBDA_FUNCTION_MEMORY_SIZE
//	                                   is read the same way
//	MEMCTL_PRESSURE=on|off             the death-spiral detector and the
//	                                   kernel memory-pressure watcher
//	MEMCTL_BUDGETS=enforce|observe|off per-request budgets (package limits)
//	MALLOC_ARENA_MAX, GLIBC_TUNABLES   an arena cap set by the operator:
//	                                   memctl sets none
//
// A MEMCTL_* variable that memctl does not read (a typo such as
// MEMCTL_TRIMDELAY or MEMCTL_BUDGET) is logged at WARN once per Start,
// naming the closest one it reads; it is not an error. MEMCTL_TEST_* and
// MEMCTL_BENCH_* are left to memctl's own tests and harness.
//
// One grammar for every switch: "on" and "off", "yes" and "no", and the
// strconv.ParseBool spellings (1, t, true; 0, f, false), in any case, with
// surrounding space ignored; an empty value means unset. "off" always means
// that memctl's part does nothing. An invalid value is not guessed at: it is
// logged at WARN, returned in Start's error, and fails safe, starting no
// action and lifting no limit: an action's part is off (an invalid MEMCTL
// switches all of memctl off; likewise THP, the trim, the arena cap, the
// refresh and the pressure watch), GOMEMLIMIT is left as it was, and
// budgets (MEMCTL_BUDGETS, package limits) stay enforced. The options
// follow the same rule: WithTrimDelay(0) is off, and WithTrimDelay(-1s) or
// a delay below 1ms is invalid.
//
// # Wiring mistakes
//
// AfterBurst or Begin with no live controller (Start not called, or its
// controller closed) does nothing and logs one WARN through slog.Default
// on the first call. Start while an earlier controller is live (a second
// Start, or Start beside the auto package) logs one WARN; the newest
// controller serves AfterBurst and Begin, and when it is closed the latest
// earlier controller still live serves them again. Both are counted in
// Stats.Misuse.
//
// # GOMEMLIMIT
//
// GOMEMLIMIT follows the cgroup limit: it is re-read at the end of a GC
// cycle at most every MEMCTL_REFRESH, at once when a limit file
// (memory.max, memory.high, memory.limit_in_bytes) is written (inotify:
// no wake-up while idle; where inotify is not available, a timer wakes at
// most every MEMCTL_REFRESH while a cgroup limit is followed), and on
// kernel memory pressure, so a pod resized in place gets a new GOMEMLIMIT
// within that long, idle or throttled, and Controller.Refresh re-reads it
// on demand. No cgroup, or one without a limit, is normal: the startup
// line says gomemlimit=none and "no memory limit found" at INFO, and why at
// DEBUG. A limit of 0 or under the process's RSS is a
// malformed file (WARN, GOMEMLIMIT unchanged); a small one is applied with
// the floor and a WARN that the GC will run often.
//
// Importing github.com/memctl/memctl/auto for its side effect runs Start at
// init with these defaults.
//
// # Platforms
//
// Linux first. Elsewhere everything compiles, the Linux-only parts return
// errors that match errors.ErrUnsupported, and Start logs them and carries
// on. cgo is optional: with CGO_ENABLED=0 the C heap step reports that it is
// unavailable.
package memctl
