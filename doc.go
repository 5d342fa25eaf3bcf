// Package memctl keeps a pure-Go service's memory bounded and predictable on
// Linux. One call at the top of main:
//
//	func main() {
//		ctl, err := memctl.Start()
//		if err != nil {
//			slog.Warn("memctl", "error", err) // parts that failed were skipped
//		}
//		defer ctl.Close()
//		...
//		// after a burst of work (a big query, an import, a cache rebuild):
//		memctl.AfterBurst()
//	}
//
// Start switches transparent huge pages (THP) off for the process
// (prctl PR_SET_THP_DISABLE, package thp), sets GOMEMLIMIT from the cgroup
// memory limit (package limits: v1, or v2's memory.max and memory.high,
// less the memory outside the Go runtime, never under a 64 MiB floor, and
// re-read at the end of a GC cycle at most every 10 s, so a resized pod is
// followed without a goroutine) and starts a trimmer
// that returns freed memory to the OS two seconds after the last burst ends
// (debug.FreeOSMemory, and the C heap of the allocator that owns malloc;
// package trim). It logs one INFO line through log/slog that says what it
// decided. Package limits also has per-request memory budgets that refuse
// the request that would exceed its share with a resource_exhausted error.
//
// Why: a Go process that served a 1 GiB burst keeps about 1 GiB of RSS for
// minutes, because freed pages go back to the OS only through the background
// scavenger; THP can back sparse heap regions with whole 2 MiB pages; and
// without GOMEMLIMIT the garbage collector does not know the container's
// limit. examples/burst shows the first effect on this machine.
//
// # Environment
//
// The operator wins: these variables override Start's options, and the Go
// and glibc ones are never overridden by memctl.
//
//	MEMCTL=off                         memctl does nothing at all
//	MEMCTL_THP=keep|disable|except-advised
//	                                   the THP flag (default disable;
//	                                   except-advised needs Linux 6.18)
//	MEMCTL_TRIM_DELAY=2s|off           trim delay after the last burst
//	MEMCTL_ARENA_MAX=2|off             glibc arena cap (cgo, glibc only)
//	GOMEMLIMIT                         set by the operator: left as it is
//	AUTOMEMLIMIT=0.9|off               ratio of the cgroup limit, or off
//	MEMCTL_REFRESH=10s|off             least time between two re-reads of
//	                                   the cgroup limit, at GC end
//	MEMCTL_GOMEMLIMIT_FLOOR=64MiB      smallest GOMEMLIMIT memctl sets
//	MALLOC_ARENA_MAX, GLIBC_TUNABLES   an arena cap set by the operator:
//	                                   memctl sets none
//
// An invalid value switches its part off and is reported in Start's error;
// it is not guessed at.
//
// GOMEMLIMIT follows the cgroup limit: it is re-read at the end of a GC
// cycle at most every MEMCTL_REFRESH (no goroutine, no timer), so a pod
// resized in place gets a new GOMEMLIMIT within about that long of
// allocating, and Controller.Refresh re-reads it on demand. No cgroup, or
// one without a limit, is normal: the startup line says "no cgroup memory
// limit" and why, at INFO. A limit of 0 or under the process's RSS is a
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
