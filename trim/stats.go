package trim

import (
	"time"

	"github.com/memctl/memctl/internal/trimwire"
)

// Stats is a snapshot of a Trimmer's counters. Bytes are int64.
type Stats struct {
	Trims   int64 // trims run (at least one step ran)
	Skipped int64 // due or requested trims not run, split by reason below
	// By reason: both estimates under MinRelease; the Go estimate under its
	// GC's worth; a request the CPU budget did not allow yet; one a running
	// trim took.
	SkippedMinRelease, SkippedCost, SkippedBudget, SkippedRunning int64
	// Debounced, Pressure, Spiral and ByName split the trims by origin: a
	// burst, kernel memory pressure, a death spiral, TrimNow.
	Debounced, Pressure, Spiral, ByName OriginStats
	GoSkipped, CSkipped                 int64         // trims run without their Go or C step
	LastDuration                        time.Duration // wall time of the last trim
	// LastCPU is the CPU the last trim was charged (GC, scavenger and the
	// calling thread; at least 1 ms); TotalCPU its sum.
	LastCPU, TotalCPU           time.Duration
	Deferred                    int64 // due trims the CPU budget held past the max wait
	EarlyStarts                 int64 // trims started at Delay/2 under CPU throttling
	LastReleased, TotalReleased int64 // bytes the last trim released; their sum
	// Lazy reports that released pages leave RSS only under pressure
	// (MADV_FREE, GODEBUG madvdontneed=0); LazyReason says why.
	Lazy       bool
	LazyReason string
	// LastLazy is the part of it still in RSS as LazyFree (when Lazy);
	// TotalLazy its sum.
	LastLazy, TotalLazy int64
	// LastEstimate is the releasable bytes estimated before the last trim or
	// skip, -1 unknown.
	LastEstimate   int64
	CHeapAllocator string // the C step's allocator; "" when the step is off
	// CHeapErr is the last C step's error, nil if none; one matching
	// cheap.ErrUnavailable means the step cannot run here.
	CHeapErr    error
	Pending     bool  // a trim is scheduled
	InFlight    int64 // bursts begun and not yet ended
	StaleBegins int64 // of those, begun over MaxWait ago (the first logged at WARN)
	Misuse      int64 // end funcs called more often than Begin
	NoGC        int64 // Go steps that returned the free heap without a GC
	// The Go steps without a GC that stopped short because a GC cycle started,
	// a step released nothing, the GC CPU limiter was on, or the program set
	// GOMEMLIMIT (which is kept).
	AbortedGC, AbortedNoProgress, AbortedLimiter, AbortedLimitChanged int64
	// LastAbort is the last one's reason ("gc", "no_progress",
	// "gc_cpu_limiter", "limit_changed"), "none" when it reached its target.
	LastAbort string
	// Fallbacks counts the unexplained Go steps without a GC that released
	// nothing; later trims use debug.FreeOSMemory.
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
