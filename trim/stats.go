package trim

import (
	"time"

	"github.com/memctl/memctl/internal/trimwire"
)

// Stats is a snapshot of a Trimmer's counters, from Trimmer.Stats. Bytes
// are int64, CPU and durations time.Duration.
type Stats struct {
	// Trims counts the trims run (at least one step ran), of every origin.
	Trims int64
	// Skipped counts the due or requested trims that did not run, of every
	// origin; the Skipped* fields split it by reason.
	Skipped int64
	// SkippedMinRelease: both estimates under Config.MinRelease.
	// SkippedCost: the Go estimate reached MinRelease but not what the
	// step's GC is worth (64 MiB per CPU-second of its estimated cost).
	// SkippedBudget: a request (kernel pressure, the death spiral) that
	// the 2% CPU budget did not allow yet. SkippedRunning: a request that
	// found a trim running, which answered it.
	SkippedMinRelease, SkippedCost, SkippedBudget, SkippedRunning int64
	// Debounced, Pressure, Spiral and ByName split Trims, Skipped, TotalCPU
	// and TotalReleased by who asked: the trim Delay after AfterBurst or
	// a detected burst, kernel memory pressure, the GC death-spiral
	// detector, and TrimNow.
	Debounced, Pressure, Spiral, ByName OriginStats
	// GoSkipped and CSkipped count the trims that ran without their Go or
	// their C heap step, that step's estimate being too low.
	GoSkipped, CSkipped int64
	// LastDuration is the wall time of the last trim.
	LastDuration time.Duration
	// LastCPU is the CPU the last trim was charged with: the GC and
	// scavenger CPU of runtime/metrics across it plus the calling thread's
	// CPU (Linux), at most the process's CPU across it, and at least 1 ms
	// (and, after a GC, the least that GC can cost). TotalCPU is its sum.
	LastCPU, TotalCPU time.Duration
	// Deferred counts the due trims the CPU budget held past the max wait.
	Deferred int64
	// EarlyStarts counts the trims started at Delay/2 because the CPU
	// cgroup was throttled (see Config.FixedDelay).
	EarlyStarts int64
	// LastReleased is the bytes the last trim released (the growth of
	// /memory/classes/heap/released:bytes across the Go step, plus the C
	// step's figure); TotalReleased is its sum.
	LastReleased, TotalReleased int64
	// Lazy reports that the Go runtime releases memory with MADV_FREE
	// (GODEBUG madvdontneed=0): released pages leave RSS only under memory
	// pressure. LazyReason says where the setting came from.
	Lazy       bool
	LazyReason string
	// LastLazy is the part of LastReleased left in RSS as LazyFree
	// (/proc/self/smaps_rollup), read only when Lazy; TotalLazy its sum.
	LastLazy, TotalLazy int64
	// LastEstimate is the releasable bytes (Go and C) estimated before the
	// last trim or skip, -1 unknown.
	LastEstimate int64
	// CHeapAllocator names the C heap step's allocator ("glibc", "none",
	// ...), "" when the step is off (Config.NoCHeap).
	CHeapAllocator string
	// CHeapErr is the error of the last C heap step, nil if it succeeded or
	// has not run; it matches ErrCHeapUnavailable when the step cannot run
	// in this process, which is not a failure.
	CHeapErr error
	// Pending reports whether a trim is scheduled.
	Pending bool
	// InFlight is the number of bursts begun (Begin) and not yet ended.
	InFlight int64
	// StaleBegins is the number of those begun more than the max wait ago
	// (a lost end func, most likely; the first is logged at WARN).
	StaleBegins int64
	// Misuse counts end funcs called more often than Begin (see
	// Config.Strict).
	Misuse int64
	// NoGC counts the Go steps that returned the free heap without a GC
	// (see Trimmer), among Trims.
	NoGC int64
	// AbortedGC, AbortedNoProgress, AbortedLimiter and AbortedLimitChanged
	// count the Go steps without a GC that stopped before their target:
	// a GC cycle started, a step released nothing, the GC CPU limiter was
	// on, or the program set GOMEMLIMIT meanwhile (its value is kept).
	AbortedGC, AbortedNoProgress, AbortedLimiter, AbortedLimitChanged int64
	// LastAbort is the last such step's reason: "gc", "no_progress",
	// "gc_cpu_limiter", "limit_changed", or "none" when it reached its
	// target ("" before the first).
	LastAbort string
	// Fallbacks counts the Go steps without a GC that released nothing
	// with nothing to explain it: that trim and every later one run
	// debug.FreeOSMemory instead.
	Fallbacks int64
}

// OriginStats counts the trims of one origin (see Stats.Debounced).
type OriginStats struct {
	Trims    int64         // trims run
	Skipped  int64         // trims the gate skipped, for any reason
	CPU      time.Duration // CPU charged (see Stats.LastCPU)
	Released int64         // bytes released
}

// origin says who asked for a trim; only originByName bypasses the gate.
type origin = trimwire.Origin

const (
	originDebounced = trimwire.Debounced
	originPressure  = trimwire.Pressure
	originSpiral    = trimwire.Spiral
	originByName    = trimwire.ByName
)

// of returns the counters of origin o.
func (s *Stats) of(o origin) *OriginStats {
	return [...]*OriginStats{&s.Debounced, &s.Pressure, &s.Spiral, &s.ByName}[o]
}

// skipReason says why a trim did not run.
type skipReason int

const (
	skipNone skipReason = iota
	skipMinRelease
	skipCost
	skipBudget
	skipRunning
	skipClosed // a nil or closed Trimmer; not counted
)

func (r skipReason) String() string {
	return [...]string{"none", "min_release", "cost", "budget", "running", "closed"}[r]
}

// skipped returns the counter of skips for r, nil for skipNone and
// skipClosed (not counted).
func (s *Stats) skipped(r skipReason) *int64 {
	return [...]*int64{nil, &s.SkippedMinRelease, &s.SkippedCost, &s.SkippedBudget, &s.SkippedRunning, nil}[r]
}

// abortReason says why the Go step without a GC stopped before its target.
type abortReason int

const (
	abortNone         abortReason = iota
	abortGC                       // a GC cycle started or ended during the step
	abortNoProgress               // a step released nothing
	abortLimiter                  // the GC CPU limiter was on: the allocation path releases nothing
	abortLimitChanged             // another writer set GOMEMLIMIT; its value is kept
)

func (r abortReason) String() string {
	return [...]string{"none", "gc", "no_progress", "gc_cpu_limiter", "limit_changed"}[r]
}

// countAbort counts a step without a GC that stopped for r.
func (s *Stats) countAbort(r abortReason) {
	s.LastAbort = r.String()
	if p := [...]*int64{nil, &s.AbortedGC, &s.AbortedNoProgress, &s.AbortedLimiter, &s.AbortedLimitChanged}[r]; p != nil {
		*p++
	}
}
