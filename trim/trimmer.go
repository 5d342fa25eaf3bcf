package trim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcend"
)

const (
	// DefaultDelay is the quiet time after the last AfterBurst before the
	// trim runs. Two seconds is long enough for a run of back-to-back
	// requests to count as one burst and short enough that RSS comes down
	// before an operator or an autoscaler looks at it.
	DefaultDelay = 2 * time.Second

	// DefaultMaxWaitFactor sets the default max wait (see Config.MaxWait) to
	// this many delays: 20 s with the default delay. A server whose bursts
	// keep coming less than Delay apart, or overlap so that one is always
	// in flight, thus still trims, at most once every 20 s, instead of
	// postponing the trim for as long as the load lasts.
	DefaultMaxWaitFactor = 10

	// MinDelay is the shortest delay New accepts. While a trim is pending
	// the Trimmer wakes every Delay/20, so a shorter delay would wake it
	// more often than every 50 µs.
	MinDelay = time.Millisecond

	// MaxDelay is the longest delay New accepts: a day. By then the Go
	// runtime has returned a burst on its own (the forced GC every 2
	// minutes and the background scavenger), so a longer delay is a
	// mistake, such as MEMCTL_TRIM_DELAY=2562047h, not a setting.
	MaxDelay = 24 * time.Hour

	// DefaultMinRelease is the estimate of releasable bytes (see
	// Config.MinRelease) below which a step of a trim is skipped whatever
	// its cost: 8 MiB. The Go runtime holds a few MiB of free spans and
	// allocation headroom in normal operation, so below 8 MiB (four 2 MiB
	// huge pages) nothing worth a GC cycle is left. It is a floor and a
	// judgement, not a measured optimum; above it the Go step must also
	// pay for its GC (see ReleasePerCPUSecond).
	DefaultMinRelease int64 = 8 << 20

	// CPUShare is the share of one CPU's time that trims may use, over any
	// window: 2%. See Trimmer for the exact guarantee.
	CPUShare = 0.02

	// ticksPerDelay is how many times per Delay a pending Trimmer wakes to
	// look at the dirty flag; the trim fires at most Delay/ticksPerDelay
	// late.
	ticksPerDelay = 20

	// costFactor is 1/CPUShare: a trim that cost c of CPU makes the next
	// one wait c·costFactor from its start.
	costFactor = 50

	// ThrottledShare is the throttled time, as a share of the wall time
	// since a pending period began, from which the Trimmer takes its CPU
	// cgroup as throttled and starts the trim at half the delay (see
	// Trimmer): 10%. The kernel sums the throttled time over CPUs, so a
	// cgroup held off one CPU 10% of the time, or two CPUs 5%, reaches it.
	ThrottledShare = 0.10

	// cheapGC is the estimated GC cost (see ReleasePerCPUSecond) up to
	// which a GC is worth forcing for what it returns: 10 ms, a heap with
	// little to scan (1 GiB of 64 KiB objects: 0.7 to 2.2 ms). A burst no
	// GC has collected is trimmed with debug.FreeOSMemory rather than left
	// to a natural GC; in a process gone idle after a burst a GC has
	// collected, FreeOSMemory returns every free page, where the step
	// without a GC leaves its slack (see gcfree.go: 15 to 20 MiB over a
	// 30 MiB heap). A process still allocating (a whole GC cycle ran
	// since the burst's last mark) takes the step without a GC however
	// cheap the GC: a forced one stops the world twice under its load
	// (the load-gc scenario of bench/load.go counts the forced cycles).
	// A process that marks more often than the delay is trimmed at the
	// max wait, its last mark fresh: it still gets the cheap GC.
	cheapGC = 10 * time.Millisecond
)

const (
	stateIdle uint32 = iota
	statePending
	stateClosed
)

// Config configures a Trimmer; pass it to New. The zero Config is the
// default: a 2 s delay, a 20 s max wait, an 8 MiB threshold, the C heap step
// of DefaultCHeap, no logging, misuse counted rather than panicking. New
// copies it; changing a Config after New has no effect.
type Config struct {
	// Delay is how long after the last AfterBurst the trim runs, in
	// [MinDelay, MaxDelay]. The trim fires between Delay and Delay +
	// Delay/20 after the last call (plus the timer's scheduling latency),
	// or from Delay/2 on while the CPU cgroup is throttled (see Trimmer and
	// FixedDelay). To
	// turn trimming off, do not create a Trimmer (a nil *Trimmer does
	// nothing). New returns an error naming a negative value or one outside
	// that range. Default (0): DefaultDelay (2 s).
	Delay time.Duration

	// MaxWait bounds how long anything can push the trim back: a pending
	// trim runs at the latest MaxWait after the first AfterBurst or Begin of
	// its pending period (the clock is never restarted), even when calls
	// keep coming less than Delay apart and even while bursts marked with
	// Begin are in flight; only the CPU limit (see Trimmer) can defer it
	// further. It must be at least Delay and at most DefaultMaxWaitFactor ×
	// MaxDelay (240 h); New returns an error naming the value otherwise.
	// Default (0): DefaultMaxWaitFactor × Delay (20 s with the default
	// delay).
	MaxWait time.Duration

	// MinRelease is the floor, in bytes, below which a step of a trim
	// (debounced or requested) is skipped. Each step decides for itself:
	//
	//   - the Go step runs when the estimate of releasable Go heap bytes,
	//     read from runtime/metrics just before the trim, reaches the
	//     larger of MinRelease and what the step costs (the cost rule, see
	//     ReleasePerCPUSecond). The estimate and the cost follow the path
	//     the step will take (see Trimmer). Without a GC: the free heap
	//     (/memory/classes/heap/free:bytes) less the slack the pacer needs
	//     so that no GC starts, at DefaultScavengeCost per GiB. With a GC
	//     (debug.FreeOSMemory): /memory/classes/heap/free:bytes +
	//     /memory/classes/heap/objects:bytes − live, at the GC's cost.
	//     live is /gc/heap/live:bytes, what the last GC saw live: live
	//     heap is never counted as garbage. Only after a burst the program
	//     marked (AfterBurst, Begin, TrimNow) is a burst that the last GCs
	//     saw in flight its word's garbage: live is then the smaller of
	//     the last two GC ends' live heap and the floor before the burst
	//     (the live heap that two GCs saw steady while no trim was
	//     pending, so a heap built after New is live). For a burst the
	//     detector found, or a Request, memory allocated since the last GC
	//     (a heap that grew for good, or garbage) counts only when the GC
	//     that would find out is cheap (its cost under MinRelease's
	//     worth). When runtime/metrics cannot be read the step runs.
	//   - the C step runs when the C heap step's Retained reaches
	//     MinRelease, or is unknown (-1).
	//
	// A trim whose two steps are both skipped counts in Stats.Skipped (and
	// Stats.SkippedBy: SkipMinRelease below the floor, SkipCost below the
	// cost rule); one step skipped counts in Stats.GoSkipped or
	// Stats.CSkipped. A negative value (NeverSkip) means never skip, the
	// cost rule included. Default (0): DefaultMinRelease (8 MiB).
	MinRelease int64

	// CHeap is the C heap step that runs after the Go heap step of each
	// trim. Default (nil): DefaultCHeap(), unless NoCHeap is set.
	CHeap CHeap

	// NoCHeap turns the C heap step off: each trim runs the Go heap step
	// only. New returns an error when both NoCHeap and CHeap are set.
	// Default: false (the C heap step is on).
	NoCHeap bool

	// Logger is where the Trimmer logs: each trim and skip at DEBUG; at
	// INFO, once each, lazy release at New (see Stats.Lazy) and the first
	// trim the CPU limit deferred past the max wait; at WARN, once each, the
	// first misuse (see Stats.Misuse) and the first Begin open longer than
	// the max wait, and each C heap step failure other than
	// ErrCHeapUnavailable. Default (nil): logs nothing.
	Logger *slog.Logger

	// FixedDelay makes the trim wait the whole Delay even when the CPU
	// cgroup is throttled (see Trimmer). Default: false (a throttled
	// Trimmer starts its trims at Delay/2).
	FixedDelay bool

	// Strict makes misuse (an end func called more often than Begin) panic
	// with "trim: burst ended more often than begun" instead of being
	// counted and logged. It is meant for tests, which should fail on
	// misuse; a production service should not crash on it. Default: false.
	Strict bool

	// OnTrim, when set, is called after each trim and each skipped trim
	// (debounced, TrimNow or Request, for every SkipReason but SkipClosed),
	// once its counters are in Stats, on the goroutine that ran or asked
	// for it; before the next trim can start, except for a Request skipped
	// with SkipRunning, whose call runs while that trim does. It may call
	// Stats, must not call TrimNow (which would wait for it) and should be
	// short. The facade uses it to republish its
	// state record (memctl status -pid). Default (nil): nothing is called.
	OnTrim func()

	// HoldMemoryLimit, when set, is how the Go step without a GC (see
	// Trimmer) reaches GOMEMLIMIT's one writer: it calls fn, which lowers
	// GOMEMLIMIT for a moment and restores it exactly before returning,
	// while no other part of the program that owns GOMEMLIMIT (the limit
	// refresh, a death-spiral lift) writes it, and returns when fn does.
	// The facade passes limits.MemLimiter.Hold. A write by anything else
	// during the step (the program's own debug.SetMemoryLimit) is seen
	// and kept: the step stops (AbortLimitChanged). Default (nil): fn is
	// called directly.
	HoldMemoryLimit func(fn func())

	// Test hooks; nil means the real thing.
	goStep   func() int64 // the Go heap step; returns bytes released
	estimate func() int64 // Go heap releasable bytes, -1 if unknown
	// noGCStep and noGCEstimate replace releaseNoGC and releasableNoGC.
	noGCStep     func() (released int64, steps int, why AbortReason, broken bool)
	noGCEstimate func() int64
	cpuClock     func() time.Duration // CPU a trim is charged with, read before and after
	lazy         func() (bool, string)
	lazyFree     func() int64 // LazyFree bytes of the process, -1 if unknown
	// throttled returns the CPU cgroup's cumulative throttled time, or an
	// error (matching cgroupfs.ErrNoThrottleCounter when there is none);
	// fresh asks to find the cgroup again first.
	throttled func(fresh bool) (time.Duration, error)
	scan      func() int64 // scannable bytes at the last GC, -1 if unknown
}

// NeverSkip is a Config.MinRelease that makes every due trim run both its
// steps, however little they would release.
const NeverSkip int64 = -1

// Stats is a snapshot of a Trimmer's counters, from Trimmer.Stats.
type Stats struct {
	// Trims is the number of trims run (every origin: debounced, Request,
	// TrimNow) in which at least one step ran.
	Trims int64
	// Skipped is the number of due or requested trims that did not run:
	// both steps' estimates below what they must release (see
	// Config.MinRelease and ReleasePerCPUSecond), or, for a Request, the
	// CPU budget or a trim already running. SkippedBy splits it by reason
	// (indexed by SkipReason; SkipNone and SkipClosed stay 0).
	Skipped   int64
	SkippedBy [NumSkipReasons]int64
	// Origins splits Trims, Skipped, TotalCPU and TotalReleased by who
	// asked for the trim, indexed by Origin: Origins[OriginPressure] holds
	// the trims asked for on kernel memory pressure, apart from the
	// debounced ones in Origins[OriginDebounced].
	Origins [NumOrigins]OriginStats
	// GoSkipped and CSkipped count the trims that ran without their Go or
	// their C heap step, that step's estimate being below the threshold.
	GoSkipped, CSkipped int64
	// LastDuration is how long the last trim took (both steps), measured
	// with the monotonic clock.
	LastDuration time.Duration
	// LastCPU is the CPU time the last trim was charged with: the growth of
	// /cpu/classes/gc/total:cpu-seconds and
	// /cpu/classes/scavenge/total:cpu-seconds across it plus the calling
	// thread's own CPU time (CLOCK_THREAD_CPUTIME_ID, Linux only), which
	// holds the forced scavenge and the C heap step; but at most the
	// process's CPU time across it (CLOCK_PROCESS_CPUTIME_ID, Linux only),
	// since a CPU quota inflates the runtime's GC figures. It is at least
	// 1 ms, and when the Go step ran a GC at least the least that GC can cost
	// (an eighth of DefaultScanCost per scannable byte): a clock that reads
	// too little does not make a trim free for the 2% budget.
	LastCPU time.Duration
	// TotalCPU is the sum of LastCPU over all trims.
	TotalCPU time.Duration
	// Deferred counts the due trims that the CPU limit held past the max
	// wait (the first is logged at INFO).
	Deferred int64
	// EarlyStarts counts the trims that started before the whole delay
	// because the CPU cgroup was throttled while they were pending (see
	// Trimmer; the first is logged at INFO). Trims held to the max wait by
	// a burst in flight, or deferred by the CPU limit, are not counted.
	EarlyStarts int64
	// LastReleased is the bytes the last trim released: the growth of
	// /memory/classes/heap/released:bytes across the Go step, plus the C
	// heap step's own figure when it can tell.
	LastReleased int64
	// TotalReleased is the sum of LastReleased over all trims, in bytes.
	TotalReleased int64
	// Lazy reports that the Go runtime releases memory with MADV_FREE
	// (GODEBUG=madvdontneed=0, from the environment or a //go:debug
	// directive): released pages stay in RSS until the kernel needs the
	// memory, so RSS falls only under memory pressure. LazyReason says
	// where the setting came from.
	Lazy       bool
	LazyReason string
	// LastLazy is the part of LastReleased that stayed in RSS as LazyFree
	// (the growth of LazyFree in /proc/self/smaps_rollup across the Go
	// step), read only when Lazy; TotalLazy is its sum. LastReleased −
	// LastLazy left RSS at once.
	LastLazy, TotalLazy int64
	// LastEstimate is the estimate of releasable bytes (Go and C, as far as
	// known) made before the last trim or skip (see Config.MinRelease), or -1
	// if neither could be read.
	LastEstimate int64
	// CHeapAllocator is the C heap step's Allocator ("glibc", "none", ...),
	// or "" when the step is off (Config.NoCHeap).
	CHeapAllocator string
	// CHeapErr is the error of the last C heap step, nil if it succeeded or
	// has not run. It matches ErrCHeapUnavailable when the step cannot run
	// in this process; that is not a failure.
	CHeapErr error
	// Pending reports whether a trim is scheduled.
	Pending bool
	// InFlight is the number of bursts begun (Begin) and not yet ended.
	InFlight int64
	// StaleBegins is the number of bursts, among InFlight, begun more than
	// the max wait ago as far as the Trimmer can tell (it looks while a
	// trim is pending): most likely an end func that was never called. The
	// first is logged at WARN.
	StaleBegins int64
	// Misuse counts end funcs called more often than Begin (the first is
	// logged at WARN; see Config.Strict).
	Misuse int64
	// NoGC counts the Go steps that returned the free heap without a GC
	// (a GC cycle had collected the burst; see Trimmer), among Trims.
	NoGC int64
	// Aborts counts, by reason (indexed by AbortReason; AbortNone stays 0),
	// the Go steps without a GC that stopped before their target: a GC
	// cycle started, a step released nothing, the GC CPU limiter was on,
	// or another writer set GOMEMLIMIT. LastAbort is the last one's
	// reason (AbortNone when the last such step reached its target).
	Aborts    [NumAbortReasons]int64
	LastAbort AbortReason
	// Fallbacks counts the Go steps without a GC whose first step released
	// nothing with no GC and no limiter to explain it (a runtime that
	// does not release on the allocation path): that trim, and every later
	// one, ran debug.FreeOSMemory instead, within the same gate (logged
	// once at INFO).
	Fallbacks int64
}

// A Trimmer runs one trim Delay after the last burst ends: AfterBurst marks
// the end of a burst, and calls during the wait push the trim back, so a run
// of bursts gives one trim. A trim is the Go heap step followed by the C
// heap step (see CHeap); each is skipped when its own estimate shows too
// little to release (see Config.MinRelease and ReleasePerCPUSecond).
//
// The Go step takes one of two paths. When a GC cycle has ended since the
// burst's last mark (seen by a hook at GC end), or the burst detector saw
// a GC collect it, the garbage is already free heap: the step returns it
// without a GC, through a transient GOMEMLIMIT lowered in steps of
// StepBytes under mapped-ready memory and restored after (see gcfree.go,
// Config.HoldMemoryLimit; Stats.NoGC). Its estimate is the free heap less
// the slack the pacer needs so that no GC starts (about 3% of the heap
// and a few MiB), its cost DefaultScavengeCost per byte. It stops at a GC
// cycle, a step that released nothing, the GC CPU limiter, or another
// writer of GOMEMLIMIT (Stats.Aborts). Otherwise (no GC since the burst:
// an idle process right after it; TrimNow always) the step is
// debug.FreeOSMemory, a GC and then the scavenge, with the estimate and
// the cost rule of Config.MinRelease and ReleasePerCPUSecond. Automatic origins other than AfterBurst (kernel
// pressure, the death spiral) ask with Request, which passes the same
// gate: the estimate, the cost rule and the CPU limit below.
//
// No pattern of calls starves a trim: a pending trim runs at the latest
// MaxWait (see Config.MaxWait, 20 s by default) after the first AfterBurst or
// Begin of its pending period, whether calls keep coming or bursts marked
// with Begin overlap so that one is always in flight. Before that bound no
// trim starts while a burst is in flight.
//
// Trims are limited by the CPU they cause, not by their wall time, so a
// CPU-throttled container still trims. Each trim is charged with its CPU
// (see Stats.LastCPU), and the next trim of any origin but TrimNow starts
// no sooner than 50 times that charge after the start of the trim charged
// (a debounced trim waits for it; a Request is skipped, SkipBudget).
// Hence, over any window of W wall time, the CPU charged to the trims that
// start in it, debounced and requested together, is at most CPUShare (2%)
// of W plus the charge of one trim. A trim that this
// limit holds past the max wait is counted in Stats.Deferred.
//
// A throttled CPU cgroup starts the trim at half the delay. Under a CFS
// quota a trim takes many times its CPU time in wall time (about 20 times
// at a 10% quota shared with a busy loop, measured on this repository's
// test machine; 1.5 to 5 s for a trim of a 1 GiB heap, docs/benchmarks.md), so
// a trim started at Delay would bring RSS down long after it would on a
// free CPU. While a trim is
// pending, the Trimmer reads its cgroup's throttled time (cpu.stat: v1
// throttled_time, v2 throttled_usec) when the pending period begins and
// from Delay/2 on; when it grew by at least ThrottledShare (10%) of the wall
// time in between, the trim starts Delay/2 after the last call instead of
// Delay (counted in Stats.EarlyStarts when that made it start sooner, the
// first logged at INFO). The share is taken over the whole pending period
// and summed over CPUs, as the kernel counts it, so throttling at the
// start of a long period, or a little on each of many CPUs, counts too.
// Only the process's own cgroup is read, and only on Linux; without a
// counter (no cpu controller, another system) or with Config.FixedDelay,
// the trim waits the whole Delay; another read error (logged once at INFO)
// does the same. The max wait, bursts in flight and the CPU limit apply
// as always.
//
// While no trim is pending a Trimmer has no goroutine, timer or ticker. While
// one is pending, a timer wakes a short-lived goroutine every Delay/20.
//
// A Trimmer is safe for concurrent use. Create one with New; the zero
// Trimmer is not usable. All methods of a nil *Trimmer do nothing, so a
// program can leave trimming off by keeping a nil pointer.
type Trimmer struct {
	_ [64]byte // keep dirty on a cache line of its own: it is read on every call
	// dirty is set by AfterBurst and cleared by each tick; while it is set,
	// AfterBurst is one atomic load of a read-shared cache line.
	dirty atomic.Uint32
	_     [60]byte

	state atomic.Uint32 // stateIdle, statePending or stateClosed
	// since is when the current pending period started (the first
	// AfterBurst or Begin), as a clock reading (see clock); 0 when idle.
	since atomic.Int64
	// inflight counts the bursts begun and not ended, in two epochs: Begin
	// adds to inflight[epoch] and returns endFns[epoch]. The tick flips the
	// epoch at most once per max wait, only when the other epoch is empty;
	// a burst still counted in the old epoch one max wait after a flip was
	// begun more than a max wait ago.
	inflight [2]atomic.Int64
	epoch    atomic.Uint32
	misuse   atomic.Int64

	delay      time.Duration
	maxWait    time.Duration
	interval   time.Duration // delay / ticksPerDelay
	minRelease int64
	strict     bool
	cheap      CHeap
	log        *slog.Logger
	onTrim     func()
	hold       func(func())
	goStep     func() int64
	noGCStep   func() (int64, int, AbortReason, bool)
	noGCEst    func() int64
	estimate   func(marked bool) (est, sure int64) // see estimateGo
	readCPU    func() cpuMark
	lazyFree   func() int64
	throttled  func(fresh bool) (time.Duration, error)
	lazy       bool
	endFns     [2]func() // t.end0, t.end1, made once so Begin does not allocate
	tickFn     func()    // t.tick, made once
	base       time.Time // clock origin
	scan       func() int64
	logOnce    [7]atomic.Bool

	mu     sync.Mutex // guards the fields below; never held across a trim
	timer  *time.Timer
	armed  bool // timer is set and its tick has not started
	closed bool
	stats  Stats
	ticks  sync.WaitGroup // one count per armed timer and running tick

	run        sync.Mutex // serializes ticks and trims; guards the fields below
	quietSince int64      // latest tick that saw the dirty flag set; 0 when idle
	nextOK     int64      // earliest start of the next trim by the CPU limit
	lastFlip   int64      // last epoch flip
	deferred   bool       // this pending period was already counted in Deferred
	// progMarked: the program marked this pending period's burst
	// (AfterBurst, Begin), not only the detector. endsAtMark is the count
	// of GC ends when a tick last saw a mark; markCollected says that mark
	// was the detector's for the GC end that collected the burst.
	progMarked    bool
	endsAtMark    uint64
	markCollected bool
	// markSeen: a tick saw a mark in this pending period (reset when it
	// ends, so that a Request while idle does not read an old period's
	// marks).
	markSeen   bool
	noGCBroken bool          // the step without a GC released nothing: FreeOSMemory from now on
	gcOnly     bool          // a test's fake Go step and no fake step without a GC: the GC path only
	thr0       time.Duration // throttled time when the pending period began
	thrAt      int64         // when thr0 was read; 0 when unknown
	early      bool          // this pending period's trim starts at Delay/2
	served     bool          // a Request ran this pending period's trim
	scanCost   float64       // GC CPU per scannable byte, ns (see costOf)
	// decisions counts the trims decided on their estimate, run or
	// skipped (trimLocked), for the burst detector (AutoBurst).
	decisions atomic.Int64
	// det is the burst detector's mark (detected): 1 a burst in progress,
	// 2 the GC end that collected it; cleared by each tick.
	det atomic.Uint32

	gc    gcLive // the live heap at the last two GC ends (gate.go)
	gcSub *gcend.Subscription
}

// Indexes of Trimmer.logOnce.
const (
	onceMisuse = iota
	onceStale
	onceDeferred
	onceEarly
	onceThrottleErr
	onceBadOrigin
	onceNoGCBroken
)

// New returns a Trimmer configured by cfg (the zero Config is the
// default). The error names the invalid field and its value. New starts
// no goroutine or timer; it registers a hook at GC end (internal/gcend:
// one runtime/metrics read per GC cycle, the live heap the estimate uses,
// see Config.MinRelease) that Close removes.
func New(cfg Config) (*Trimmer, error) {
	c := cfg
	switch {
	case c.Delay == 0:
		c.Delay = DefaultDelay
	case c.Delay < MinDelay || c.Delay > MaxDelay:
		return nil, fmt.Errorf("trim: Config.Delay %v: want 0 (the default, %v) or at least %v and at most %v", c.Delay, DefaultDelay, MinDelay, MaxDelay)
	}
	switch {
	case c.MaxWait == 0:
		c.MaxWait = DefaultMaxWaitFactor * c.Delay // cannot overflow: Delay <= MaxDelay
	case c.MaxWait < 0 || c.MaxWait > DefaultMaxWaitFactor*MaxDelay:
		return nil, fmt.Errorf("trim: Config.MaxWait %v: want 0 (the default, %d delays) or at least the delay and at most %v", c.MaxWait, DefaultMaxWaitFactor, DefaultMaxWaitFactor*MaxDelay)
	case c.MaxWait < c.Delay:
		return nil, fmt.Errorf("trim: Config.MaxWait %v is shorter than the delay %v", c.MaxWait, c.Delay)
	}
	switch {
	case c.MinRelease == 0:
		c.MinRelease = DefaultMinRelease
	case c.MinRelease < 0:
		c.MinRelease = 0 // NeverSkip: every estimate reaches 0
	}
	switch {
	case c.NoCHeap && c.CHeap != nil:
		return nil, fmt.Errorf("trim: Config.NoCHeap is set together with Config.CHeap (%s): set one of them", c.CHeap.Allocator())
	case c.NoCHeap:
	case c.CHeap == nil:
		c.CHeap = DefaultCHeap()
	}
	t := &Trimmer{
		delay:      c.Delay,
		maxWait:    c.MaxWait,
		interval:   c.Delay / ticksPerDelay,
		minRelease: c.MinRelease,
		strict:     c.Strict,
		cheap:      c.CHeap,
		log:        c.Logger,
		onTrim:     c.OnTrim,
		hold:       c.HoldMemoryLimit,
		goStep:     c.goStep,
		noGCStep:   c.noGCStep,
		noGCEst:    c.noGCEstimate,
		readCPU:    readCPU,
		lazyFree:   c.lazyFree,
		throttled:  c.throttled,
		scan:       c.scan,
		scanCost:   float64(DefaultScanCost),
		base:       time.Now(),
	}
	if t.scan == nil {
		t.scan = scanBytes
	}
	switch {
	case c.FixedDelay:
		t.throttled = nil
	case t.throttled == nil:
		t.throttled = newThrottleReader()
	}
	if t.goStep == nil {
		t.goStep = freeOSMemory
	}
	t.gcOnly = c.goStep != nil && c.noGCStep == nil
	if t.noGCStep == nil {
		t.noGCStep = releaseNoGC
	}
	if t.noGCEst == nil {
		t.noGCEst = releasableNoGC
	}
	if t.hold == nil {
		t.hold = func(fn func()) { fn() }
	}
	t.estimate = t.estimateGo
	if c.estimate != nil {
		t.estimate = func(bool) (int64, int64) { v := c.estimate(); return v, v }
		if c.noGCEstimate == nil {
			t.noGCEst = c.estimate
		}
	}
	if c.cpuClock != nil {
		t.readCPU = func() cpuMark { v := c.cpuClock(); return cpuMark{gc: v, process: v} }
	}
	if t.lazyFree == nil {
		t.lazyFree = lazyFreeBytes
	}
	if c.lazy == nil {
		c.lazy = lazyRelease
	}
	lazy, why := c.lazy()
	t.lazy = lazy
	t.stats.Lazy, t.stats.LazyReason = lazy, why
	t.endFns = [2]func(){t.end0, t.end1}
	t.tickFn = t.tick
	t.watchGC()
	if t.cheap != nil {
		t.stats.CHeapAllocator = t.cheap.Allocator()
	}
	if lazy && t.log != nil {
		t.log.LogAttrs(context.Background(), slog.LevelInfo,
			"trim: the Go runtime releases memory lazily (MADV_FREE): RSS falls only under memory pressure",
			slog.String("setting", why))
	}
	return t, nil
}

// clock returns the monotonic time since t.base in nanoseconds, at least 1
// (0 means "not set" in the fields that hold clock readings).
func (t *Trimmer) clock(now time.Time) int64 { return max(int64(now.Sub(t.base)), 1) }

// addSat returns a+b, saturating at the int64 bounds.
func addSat(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return 1<<63 - 1
	case b < 0 && s > a:
		return -1 << 63
	}
	return s
}

// Delay returns the configured delay.
func (t *Trimmer) Delay() time.Duration {
	if t == nil {
		return 0
	}
	return t.delay
}

// MaxWait returns the configured max wait: the longest a pending trim waits
// for a quiet moment (see Config.MaxWait).
func (t *Trimmer) MaxWait() time.Duration {
	if t == nil {
		return 0
	}
	return t.maxWait
}

// AfterBurst marks the end of a burst: a trim runs Delay after the last call
// (between Delay and Delay + Delay/20, plus timer latency; Delay/2 while the
// CPU cgroup is throttled, see Trimmer), unless another
// call comes first, and at the latest MaxWait after the first call of the
// pending period. It allocates nothing and starts no goroutine. While a
// trim is pending it is one atomic load and takes no lock (under a
// nanosecond, see BenchmarkAfterBurst); the first call after the Trimmer
// went idle, and the first after each tick (every Delay/20), also do an
// atomic store and compare-and-swap, and the first after idle reads the
// clock and sets the timer under an uncontended mutex. After Close it does
// nothing. Safe for concurrent use.
func (t *Trimmer) AfterBurst() {
	if t == nil || t.dirty.Load() != 0 {
		return
	}
	t.mark()
}

// mark is the slow path of AfterBurst: set the flag and, if idle, arm. It
// is kept out of line so that AfterBurst, the fast path, is inlined at its
// call sites (go build -gcflags=-m).
//
//go:noinline
func (t *Trimmer) mark() {
	t.dirty.Store(1)
	t.pend()
}

// pend starts a pending period if the Trimmer is idle.
func (t *Trimmer) pend() {
	// Go atomics are sequentially consistent: either this CAS sees the
	// idle state stored by goIdle, or goIdle's reload sees dirty set (or a
	// burst in flight); the CAS lets only one of them arm.
	if t.state.CompareAndSwap(stateIdle, statePending) {
		t.since.Store(t.clock(time.Now()))
		t.arm(t.interval)
	}
}

// Begin marks the start of a burst and returns the func that ends it. No
// trim starts while a burst is in flight, up to the max wait (see
// Config.MaxWait); end calls AfterBurst, so a trim follows Delay after the last
// burst ends. Begin allocates nothing (it returns one of two funcs made at
// New) and, when a trim is already pending, takes no lock. end may be
// called from any goroutine, once. Calling end funcs more often in total
// than Begin is misuse: it is counted in Stats.Misuse and logged once at
// WARN, and panics only under Config.Strict. Safe for concurrent use.
func (t *Trimmer) Begin() (end func()) {
	if t == nil {
		return noop
	}
	e := t.epoch.Load() & 1
	t.inflight[e].Add(1)
	if t.state.Load() == stateIdle {
		t.pend()
	}
	return t.endFns[e]
}

func noop() {}

func (t *Trimmer) end0() { t.end(0) }
func (t *Trimmer) end1() { t.end(1) }

func (t *Trimmer) end(e int) {
	if t.inflight[e].Add(-1) < 0 {
		t.inflight[e].Add(1)
		t.reportMisuse()
		return
	}
	t.AfterBurst()
}

// reportMisuse counts an end called more often than Begin, logs the first
// one, and panics in strict mode.
func (t *Trimmer) reportMisuse() {
	n := t.misuse.Add(1)
	if t.strict {
		panic("trim: burst ended more often than begun")
	}
	if t.log != nil && t.logOnce[onceMisuse].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), slog.LevelWarn,
			"trim: burst ended more often than begun (an end func called twice?); counted in Stats.Misuse, logged once",
			slog.Int64("misuse", n))
	}
}

// inFlight returns the bursts in flight in both epochs.
func (t *Trimmer) inFlight() int64 { return t.inflight[0].Load() + t.inflight[1].Load() }

// arm sets the timer to tick after d, unless the Trimmer is closed.
func (t *Trimmer) arm(d time.Duration) {
	t.mu.Lock()
	if !t.closed {
		t.armed = true
		t.ticks.Add(1)
		if t.timer == nil {
			t.timer = time.AfterFunc(d, t.tickFn)
		} else {
			t.timer.Reset(d)
		}
	}
	t.mu.Unlock()
}

// tick runs in the timer's goroutine every interval while a trim is pending.
func (t *Trimmer) tick() {
	defer t.ticks.Done()
	t.mu.Lock()
	t.armed = false
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return
	}
	if !t.run.TryLock() {
		// A TrimNow is running in another goroutine: look again in a
		// tick rather than wait for it, so that Close never waits for a
		// TrimNow it does not own.
		t.arm(t.interval)
		return
	}
	t.mu.Lock()
	closed = t.closed
	t.mu.Unlock()
	if closed {
		t.run.Unlock()
		return
	}
	next, idle := t.step(time.Now())
	t.run.Unlock()
	if idle {
		t.goIdle()
	} else {
		t.arm(next)
	}
}

// step decides, at now, what a tick does: it returns idle true after a trim
// or skip; otherwise how long until the next tick. t.run must be held.
func (t *Trimmer) step(now time.Time) (next time.Duration, idle bool) {
	c := t.clock(now)
	if t.served {
		// A Request ran this pending period's trim sooner. Done, unless
		// AfterBurst came during or after it or a burst is in flight: then
		// a new period begins now.
		t.served = false
		prog, det := t.dirty.Swap(0) != 0, t.det.Swap(0)
		t.endMarks()
		if !prog && det == 0 && t.inFlight() == 0 {
			t.quietSince, t.deferred, t.early, t.thrAt = 0, false, false, 0
			t.since.Store(0)
			return 0, true
		}
		t.quietSince, t.deferred, t.early, t.thrAt = 0, false, false, 0
		t.since.Store(c)
		t.noteMark(prog, det)
	}
	// A call happened between the previous tick and now: count the quiet
	// time from now, the latest it can have been.
	if t.quietSince == 0 {
		t.beginThrottleWatch(c)
	}
	prog, det := t.dirty.Swap(0) != 0, t.det.Swap(0)
	if prog || det != 0 {
		t.noteMark(prog, det)
	}
	if prog || det != 0 || t.quietSince == 0 {
		t.quietSince = c
	}
	since := t.since.Load()
	if since == 0 {
		since = c
		t.since.Store(c)
	}
	t.checkStale(c)
	bound := addSat(since, int64(t.maxWait))
	half := addSat(t.quietSince, int64(t.delay/2))
	if !t.early && t.thrAt != 0 && c >= half {
		t.early = t.throttledSince(c)
	}
	full := min(addSat(t.quietSince, int64(t.delay)), bound)
	due := full
	if t.early {
		due = min(addSat(t.quietSince, int64(t.delay/2)), bound)
	}
	if c < bound && t.inFlight() > 0 {
		due = bound // the burst's end calls AfterBurst: look again each interval
	}
	if t.nextOK > due {
		if t.nextOK > bound && !t.deferred {
			t.deferred = true
			t.noteDeferred(time.Duration(t.nextOK - since))
		}
		due = t.nextOK
	}
	if c < due {
		return min(time.Duration(due-c), t.interval), false
	}
	// The early start decided this trim only if it runs before the whole
	// delay would have let it (a burst in flight or the CPU limit can hold
	// it to then or later).
	early := t.early && c < full
	t.quietSince, t.deferred, t.early, t.thrAt = 0, false, false, 0
	t.since.Store(0)
	if t.inFlight() > 0 {
		t.progMarked = true // held to the max wait by a Begin
	}
	t.trimLocked(OriginDebounced, false, early)
	t.progMarked = false
	t.endMarks()
	return 0, true
}

// noteMark records a tick's sight of a mark: the program's (prog) and
// the detector's (det: 1 in progress, 2 collected). t.run must be held.
func (t *Trimmer) noteMark(prog bool, det uint32) {
	t.endsAtMark = t.gc.ends.Load()
	t.markSeen = true
	t.markCollected = !prog && det == 2
	t.progMarked = t.progMarked || prog
}

// endMarks forgets the marks of a pending period that has ended.
// t.run must be held.
func (t *Trimmer) endMarks() { t.markSeen, t.markCollected = false, false }

// detected is the burst detector's mark of a burst in progress (see
// AutoBurst): as AfterBurst, but the burst is not the program's word that
// its memory is garbage (see Config.MinRelease).
func (t *Trimmer) detected() { t.detect(1) }

// detectedCollected is the detector's mark at the GC end that collected
// the burst: the Go step needs no GC.
func (t *Trimmer) detectedCollected() { t.detect(2) }

func (t *Trimmer) detect(kind uint32) {
	if t.state.Load() == stateClosed {
		return
	}
	t.det.Store(kind)
	t.pend()
}

// beginThrottleWatch reads the CPU cgroup's throttled time at c, the first
// tick of a pending period (finding the cgroup again: the process may have
// moved). t.run must be held.
func (t *Trimmer) beginThrottleWatch(c int64) {
	t.early, t.thrAt = false, 0
	if t.throttled == nil {
		return
	}
	if d, err := t.throttled(true); err == nil {
		t.thr0, t.thrAt = d, c
	} else {
		t.noteThrottleErr(err)
	}
}

// throttledSince reports whether the throttled time grew by at least
// ThrottledShare of the wall time since beginThrottleWatch. t.run must be
// held.
func (t *Trimmer) throttledSince(c int64) bool {
	d, err := t.throttled(false)
	if err != nil {
		t.noteThrottleErr(err)
		return false
	}
	if c <= t.thrAt {
		return false
	}
	return float64(d-t.thr0) >= ThrottledShare*float64(c-t.thrAt)
}

// noteThrottleErr logs, once at INFO, an error reading the throttled time
// other than the absence of a counter (no CPU cgroup here, a v2 cgroup
// without the cpu controller), which is quiet.
func (t *Trimmer) noteThrottleErr(err error) {
	if errors.Is(err, cgroupfs.ErrNoThrottleCounter) || t.log == nil || !t.logOnce[onceThrottleErr].CompareAndSwap(false, true) {
		return
	}
	t.log.LogAttrs(context.Background(), slog.LevelInfo,
		"trim: cannot read the CPU cgroup's throttled time: trims wait the whole delay while it fails; logged once",
		slog.Any("error", err))
}

// logEarly logs the first trim started at Delay/2 at INFO.
func (t *Trimmer) logEarly() {
	if t.log != nil && t.logOnce[onceEarly].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), slog.LevelInfo,
			"trim: the CPU cgroup is throttled: trims start at half the delay while it is; counted in Stats.EarlyStarts, logged once",
			slog.Duration("delay", t.delay), slog.Duration("start_after", t.delay/2))
	}
}

// noteDeferred counts a trim held past the max wait by the CPU limit and
// logs the first at INFO.
func (t *Trimmer) noteDeferred(wait time.Duration) {
	t.mu.Lock()
	t.stats.Deferred++
	last := t.stats.LastCPU
	t.mu.Unlock()
	if t.log != nil && t.logOnce[onceDeferred].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), slog.LevelInfo,
			"trim: deferred past the max wait by the 2% CPU limit; counted in Stats.Deferred, logged once",
			slog.Duration("max_wait", t.maxWait), slog.Duration("wait", wait.Round(time.Millisecond)),
			slog.Duration("last_trim_cpu", last))
	}
}

// checkStale flips the Begin epoch at most once per max wait, and reports
// the bursts of the old epoch still in flight one max wait after a flip.
// t.run must be held.
func (t *Trimmer) checkStale(c int64) {
	if t.lastFlip != 0 && c-t.lastFlip < int64(t.maxWait) {
		return
	}
	cur := t.epoch.Load() & 1
	old := t.inflight[cur^1].Load()
	if old <= 0 {
		t.epoch.Store(cur ^ 1)
		t.lastFlip = c
		t.mu.Lock()
		t.stats.StaleBegins = 0
		t.mu.Unlock()
		return
	}
	t.mu.Lock()
	t.stats.StaleBegins = old
	t.mu.Unlock()
	if t.log != nil && t.logOnce[onceStale].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), slog.LevelWarn,
			"trim: burst begun and not ended for longer than the max wait (a lost end func?); reported in Stats.StaleBegins, logged once",
			slog.Int64("stale_begins", old), slog.Duration("max_wait", t.maxWait))
	}
}

// goIdle leaves the pending state, and arms again if AfterBurst was called
// since the last tick (including during a trim). A burst still in flight
// does not keep the Trimmer pending: its end calls AfterBurst, and a lost
// end must not keep a timer running forever.
func (t *Trimmer) goIdle() {
	if !t.state.CompareAndSwap(statePending, stateIdle) {
		return // closed
	}
	if t.dirty.Load() != 0 || t.det.Load() != 0 {
		t.pend()
	}
}

// trimLocked runs the steps of a trim of origin o that have enough to
// release (all of them when force is set), charges it to the CPU limit and
// records it; early says the throttled start at Delay/2 decided it (counted
// in Stats.EarlyStarts when a step runs). t.run must be held.
func (t *Trimmer) trimLocked(o Origin, force, early bool) Result {
	t.decisions.Add(1)
	// The path of the Go step (see Trimmer): without a GC when a GC cycle
	// has run since the burst's last mark (see gcSinceMark), or one
	// collected a burst since the last decision (the detector saw it, or
	// the live heap fell by a quarter from its peak), unless the GC is
	// cheap and the process idle (cheapGC); TrimNow always runs
	// FreeOSMemory.
	gcSince := t.gcSinceMark() || t.markCollected || t.gc.collected(t.minRelease)
	// busy: a whole GC cycle ran since the burst's last mark, the process
	// allocates after it (GC ends during the burst's own allocation do
	// not count: a process idle after its burst is not busy).
	busy := t.markSeen && t.gc.ends.Load() >= t.endsAtMark+2
	// The program's word that the burst is garbage: a debounced trim or a
	// Request while one is pending, after the program's AfterBurst or
	// Begin (not only the detector's), and TrimNow.
	marked := o == OriginByName || ((o == OriginDebounced || t.state.Load() == statePending) && (t.progMarked || t.dirty.Load() != 0 || t.inFlight() > 0))
	goEst, scan, cost, need := t.gcPath(marked)
	if !marked && o == OriginDebounced && cost <= cheapGC {
		// A burst the detector saw and no GC has collected yet (one
		// large request's buffer, live at the GC that saw it): whether
		// it is garbage only a GC can tell, and a cheap GC (a heap with
		// little to scan) is worth asking. Its growth over the floor is
		// counted as the program's word would count it; an expensive
		// GC (a pointer-rich heap that only grew) still waits for a
		// natural one.
		goEst, scan, cost, need = t.gcPath(true)
	}
	noGC := false
	if !force && !t.noGCBroken && !t.gcOnly {
		if gcSince && (busy || cost > cheapGC) {
			noGC = true
		} else if !gcSince && cost > cheapGC {
			// No GC since the burst: its GC is worth running only when
			// it would return more than the path without one by what it
			// costs (see gcGain); when a GC already freed the burst (the
			// program marked it after), the free heap alone is returned.
			aEst := t.noGCEst()
			noGC = goEst >= 0 && aEst >= max(t.minRelease, 1) && (goEst < need || t.gcGain(goEst, aEst) < need)
		}
	}
	if noGC {
		goEst = t.noGCEst()
		cost, need = t.noGCCostOf(goEst)
	}
	cEst := int64(-1)
	if t.cheap != nil {
		cEst = t.cheap.Retained()
	}
	est := int64(-1)
	if goEst >= 0 || cEst >= 0 {
		est = max(goEst, 0) + max(cEst, 0)
	}
	runGo := force || goEst < 0 || goEst >= need
	runC := t.cheap != nil && (force || cEst < 0 || cEst >= t.minRelease)
	if !runGo && !runC {
		why := SkipCost
		if goEst < t.minRelease {
			why = SkipMinRelease
		}
		t.countSkip(o, why, est)
		if t.log != nil {
			t.log.LogAttrs(context.Background(), slog.LevelDebug, "trim: skipped",
				slog.String("origin", o.String()), slog.String("reason", why.String()),
				slog.Bool("no_gc", noGC),
				slog.Int64("go_estimate_bytes", goEst), slog.Int64("c_estimate_bytes", cEst),
				slog.Int64("need_bytes", need), slog.Duration("cost_estimate", cost),
				slog.Int64("min_release_bytes", t.minRelease))
		}
		t.gc.peak.Store(t.gc.last.Load()) // as after a trim: a burst collected before it is not one after it
		if t.onTrim != nil {
			t.onTrim()
		}
		return Result{Skip: why, Estimate: est, Need: need, Cost: cost, NoGC: noGC}
	}
	if o != OriginDebounced && o != OriginByName && t.state.Load() == statePending {
		// This trim is the pending one, run sooner: calls from now on
		// start a new pending period (see step).
		t.dirty.Store(0)
		t.det.Store(0)
		t.served = true
	}

	// Lock the thread so that its CPU clock, read before and after, covers
	// the forced scavenge and the C heap step (see trimCPU).
	runtime.LockOSThread()
	start := time.Now()
	cpu0 := t.readCPU()
	var lazy, released int64
	var cErr error
	var abort AbortReason
	ranNoGC, fellBack := false, false
	if runGo {
		lazy0 := int64(-1)
		if t.lazy {
			lazy0 = t.lazyFree()
		}
		if noGC {
			var broken bool
			t.hold(func() { released, _, abort, broken = t.noGCStep() })
			ranNoGC = true
			if broken {
				// The allocation path released nothing with no GC and no
				// limiter to explain it: this runtime does not behave as
				// measured. Today's step, within the same gate.
				t.noGCBroken, fellBack, ranNoGC, abort = true, true, false, AbortNone
				t.logNoGCBroken()
				var bEst, bNeed int64
				bEst, scan, _, bNeed = t.gcPath(marked)
				if bEst < 0 || bEst >= bNeed {
					released = t.goStep()
				} else {
					runGo = false
				}
			}
		} else {
			released = t.goStep()
		}
		if lazy0 >= 0 {
			if l := t.lazyFree(); l >= 0 {
				lazy = min(max(l-lazy0, 0), released)
			}
		}
	}
	if runC {
		var r int64
		if o, ok := t.cheap.(CHeapOver); ok {
			over := t.minRelease
			if force {
				over = NeverSkip
			}
			r, cErr = o.ReleaseOver(over)
		} else {
			r, cErr = t.cheap.Release()
		}
		if r > 0 {
			released += r
		}
	}
	cpu1 := t.readCPU()
	measured := cpu0.charge(cpu1)
	cpu := max(measured, minTrimCharge)
	gcRan := runGo && !ranNoGC
	if gcRan && scan > 0 {
		cpu = max(cpu, time.Duration(float64(scan)*minScanCost)) // the least its GC can cost
	}
	end := time.Now()
	runtime.UnlockOSThread()
	d := end.Sub(start)
	t.nextOK = addSat(t.clock(start), costFactor*min(int64(cpu), (1<<63-1)/costFactor))
	t.gc.peak.Store(t.gc.last.Load()) // a burst collected before this trim is not one after it
	if gcRan {
		if h, ok := readHeap(); ok {
			t.gc.floor.Store(h.live) // accurate: FreeOSMemory just ran a GC
			t.gc.peak.Store(h.live)  // its hook may run after the reset above
		}
		t.calibrate(t.scan(), measured)
	}

	t.mu.Lock()
	t.stats.Trims++
	ost := &t.stats.Origins[o]
	ost.Trims++
	ost.CPU += cpu
	ost.Released += released
	if early {
		t.stats.EarlyStarts++
	}
	if !runGo {
		t.stats.GoSkipped++
	}
	if t.cheap != nil && !runC {
		t.stats.CSkipped++
	}
	if ranNoGC {
		t.stats.NoGC++
		t.stats.LastAbort = abort
		if abort != AbortNone {
			t.stats.Aborts[abort]++
		}
	}
	if fellBack {
		t.stats.Fallbacks++
	}
	t.stats.LastDuration = d
	t.stats.LastCPU = cpu
	t.stats.TotalCPU += cpu
	t.stats.LastReleased = released
	t.stats.TotalReleased += released
	t.stats.LastLazy = lazy
	t.stats.TotalLazy += lazy
	t.stats.LastEstimate = est
	if runC {
		t.stats.CHeapErr = cErr
	}
	t.mu.Unlock()
	if early {
		t.logEarly()
	}

	if t.log != nil {
		ctx := context.Background()
		t.log.LogAttrs(ctx, slog.LevelDebug, "trim: done",
			slog.String("origin", o.String()),
			slog.Duration("took", d), slog.Duration("cpu", cpu),
			slog.Duration("gc_cpu", cpu1.gc-cpu0.gc), slog.Duration("thread_cpu", cpu1.thread-cpu0.thread),
			slog.Duration("process_cpu", cpu1.process-cpu0.process),
			slog.Int64("released_bytes", released), slog.Int64("lazy_bytes", lazy),
			slog.Bool("go_step", runGo), slog.Bool("no_gc", ranNoGC), slog.String("abort", abort.String()),
			slog.Bool("c_step", runC),
			slog.Int64("go_estimate_bytes", goEst), slog.Int64("c_estimate_bytes", cEst),
			slog.Int64("need_bytes", need), slog.Duration("cost_estimate", cost))
		if cErr != nil && !errors.Is(cErr, ErrCHeapUnavailable) {
			t.log.LogAttrs(ctx, slog.LevelWarn, "trim: C heap step failed",
				slog.String("allocator", t.stats.CHeapAllocator), slog.Any("error", cErr))
		}
	}
	if t.onTrim != nil {
		t.onTrim()
	}
	return Result{Ran: true, Estimate: est, Need: need, Cost: cost, Released: released, CPU: cpu, NoGC: ranNoGC, Abort: abort, cErr: cErr}
}

// gcPath returns the Go step's estimate when it runs a GC
// (debug.FreeOSMemory), the scannable bytes, the GC's estimated cost and
// the release it must be expected to give. marked says the program
// marked the burst (see estimateGo): otherwise memory allocated since the
// last GC, which may be a heap that grew for good, is counted only when
// the GC that would find out costs less than MinRelease is worth. t.run
// must be held.
func (t *Trimmer) gcPath(marked bool) (est, scan int64, cost time.Duration, need int64) {
	est, sure := t.estimate(marked)
	scan = t.scan()
	cost, need = t.costOf(scan)
	if !marked && need > t.minRelease && sure >= 0 {
		est = sure
	}
	return est, scan, cost, need
}

// gcSinceMark reports whether a GC cycle that began after the burst's
// last mark has ended. A tick records the count of GC ends when it sees
// the mark; the first GC end after it may close a cycle that began before
// the burst was dropped, and kept it live (the burst's own allocation
// starts cycles): that end counts only when its live heap is back near
// the floor from before the burst, closer to it than to the peak since
// the last trim (under floor + max(MinRelease, min(floor/4,
// (peak − floor)/2))), and otherwise the second end does, whose cycle
// began after the first ended. Without this an idle process whose last
// cycle straddled the drop took the path without a GC and kept its
// burst. t.run must be held.
func (t *Trimmer) gcSinceMark() bool {
	if !t.markSeen || t.dirty.Load() != 0 || t.det.Load() != 0 {
		return false // no mark in this period, or one no tick has seen yet
	}
	switch n := t.gc.ends.Load(); {
	case n >= t.endsAtMark+2:
		return true
	case n == t.endsAtMark+1:
		last, floor, peak := t.gc.last.Load(), t.gc.floor.Load(), t.gc.peak.Load()
		return last >= 0 && last < floor+max(t.minRelease, 1, min(floor/4, (peak-floor)/2))
	}
	return false
}

// gcGain returns what a GC would return over the path without one, given
// the two estimates: the difference, less the runway the pacer leaves
// before its next GC (/gc/heap/goal:bytes − /gc/heap/live:bytes), which a
// service under load fills with its steady garbage whether or not a GC
// runs now; a GC is forced only for garbage beyond it. t.run must be held.
func (t *Trimmer) gcGain(bEst, aEst int64) int64 {
	s := [...]metrics.Sample{{Name: "/gc/heap/goal:bytes"}, {Name: metricHeapLive}}
	metrics.Read(s[:])
	runway := int64(0)
	if s[0].Value.Kind() == metrics.KindUint64 && s[1].Value.Kind() == metrics.KindUint64 {
		runway = max(int64(min(s[0].Value.Uint64(), math.MaxInt64))-int64(min(s[1].Value.Uint64(), math.MaxInt64)), 0)
	}
	return bEst - aEst - runway
}

// logNoGCBroken logs, once at INFO, the fall back to FreeOSMemory.
func (t *Trimmer) logNoGCBroken() {
	if t.log != nil && t.logOnce[onceNoGCBroken].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), slog.LevelInfo,
			"trim: the Go runtime released nothing under a lowered GOMEMLIMIT; the Go step runs debug.FreeOSMemory (a GC) from now on; counted in Stats.Fallbacks, logged once",
			slog.String("go", runtime.Version()))
	}
}

// TrimNow runs both steps of a trim in the calling goroutine at once,
// ignoring the delay, bursts in flight, the thresholds, the cost rule and
// the CPU limit (but its CPU counts for the limit of the next trim of any
// origin). It is a forced trim for a caller who asks for one by name
// (OriginByName in Stats.Origins); nothing in memctl calls it on its own:
// automatic trims (kernel pressure, the death spiral) go through Request
// and its gate. It returns
// the bytes released, as in Stats.LastReleased, and the C heap step's error
// unless that matches ErrCHeapUnavailable (which is recorded in Stats only).
// It works after Close. It waits for a trim already running. Safe for
// concurrent use.
func (t *Trimmer) TrimNow() (released int64, err error) {
	if t == nil {
		return 0, nil
	}
	t.run.Lock()
	defer t.run.Unlock()
	r := t.trimLocked(OriginByName, true, false)
	released, err = r.Released, r.cErr
	if errors.Is(err, ErrCHeapUnavailable) {
		err = nil
	}
	return released, err
}

// Stats returns a snapshot of the Trimmer's counters. Safe for concurrent
// use; it does not wait for a running trim.
func (t *Trimmer) Stats() Stats {
	if t == nil {
		return Stats{}
	}
	t.mu.Lock()
	s := t.stats
	t.mu.Unlock()
	s.Pending = t.state.Load() == statePending
	s.InFlight = t.inFlight()
	s.Misuse = t.misuse.Load()
	return s
}

// Close stops a pending trim, waits for a running debounced trim to finish
// (not for a TrimNow running in another goroutine), and makes later
// AfterBurst calls do nothing. When it returns, the Trimmer has no
// goroutine and no timer. It is idempotent and always returns nil. Close
// and TrimNow must not be called from the Trimmer's logger or C heap step:
// they would wait for the trim that calls them.
func (t *Trimmer) Close() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		t.state.Store(stateClosed)
		t.dirty.Store(1) // AfterBurst takes its fast path from now on
		if t.armed && t.timer.Stop() {
			t.armed = false
			t.ticks.Done() // the tick that will not run
		}
	}
	t.mu.Unlock()
	t.gcSub.Stop()
	t.ticks.Wait()
	return nil
}

// quiet reports whether the Trimmer has nothing pending: not in the pending
// state and no timer armed. For tests.
func (t *Trimmer) quiet() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.armed && t.state.Load() != statePending
}
