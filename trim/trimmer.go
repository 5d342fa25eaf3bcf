package trim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/trim/cheap"
)

const (
	// DefaultDelay is the default Config.Delay, and Start's: 2 s, long
	// enough that back-to-back requests of one burst give one trim, short
	// enough that RSS is back down within about three seconds.
	DefaultDelay = 2 * time.Second
	// MinDelay is the shortest Config.Delay New accepts.
	MinDelay = time.Millisecond
	// MaxDelay is the longest Config.Delay New accepts: a day. By then the
	// runtime has returned a burst on its own (its forced GC every 2
	// minutes and the scavenger).
	MaxDelay = 24 * time.Hour
	// NeverSkip is a Config.MinRelease that makes every due trim run both
	// its steps, however little they would release.
	NeverSkip int64 = -1

	maxWaitFactor           = 10      // the default max wait, in delays
	defaultMinRelease int64 = 8 << 20 // four 2 MiB huge pages: below it nothing worth a GC is left
	cpuShare                = 0.02    // the share of one CPU trims may use
	costFactor              = 50      // 1/cpuShare
	ticksPerDelay           = 20      // a pending Trimmer wakes every Delay/20
	throttledShare          = 0.10    // throttled time per wall time that starts a trim at Delay/2
)

// Config configures a Trimmer; pass it to New, which copies it. The zero
// Config is the default.
type Config struct {
	// Delay is how long after the last AfterBurst the trim runs, in
	// [MinDelay, MaxDelay]: between Delay and Delay + Delay/20 after it,
	// or from Delay/2 on while the CPU cgroup is throttled. Default: 2 s.
	Delay time.Duration

	// MaxWait bounds how long calls can push a pending trim back: it runs
	// at the latest MaxWait after the first AfterBurst or Begin of its
	// pending period, even while bursts overlap; only the CPU budget can
	// defer it further. At least Delay, at most 240 h. Default: 10 × Delay.
	MaxWait time.Duration

	// MinRelease is the estimate of releasable bytes below which a step
	// of a trim is skipped: the Go step also needs 64 MiB per CPU-second
	// its GC is estimated to cost (2 ns per scannable byte until a trim
	// measures it), the C step runs when its allocators' estimate is
	// unknown. Live heap is never counted as garbage. NeverSkip (any
	// negative value) never skips. Default: 8 MiB.
	MinRelease int64

	// NoCHeap turns the C heap step (package cheap) off. Default: false.
	NoCHeap bool

	// Logger gets each trim and skip at DEBUG, one-time notes at INFO,
	// the first misuse, the first stale Begin and C step failures at WARN.
	// Default: nil, no logging.
	Logger *slog.Logger

	// FixedDelay makes a trim wait the whole Delay even while the CPU
	// cgroup is throttled. Default: false.
	FixedDelay bool

	// Strict makes misuse (an end func called more often than Begin)
	// panic instead of being counted and logged once; for tests.
	// Default: false.
	Strict bool
}

// A Trimmer runs one trim Delay after the last burst ends: AfterBurst marks
// the end of a burst, and calls during the wait push the trim back, so a
// run of bursts gives one trim, at the latest Config.MaxWait after the
// first. A trim is the Go heap step, then the C heap step; each is skipped
// when its own estimate shows too little to release (Config.MinRelease).
//
// The Go step returns the free heap without a GC (a transient GOMEMLIMIT
// lowered under what the runtime holds, Stats.NoGC) when a GC cycle has
// already collected the burst, and is debug.FreeOSMemory otherwise.
//
// Trims of every origin share one CPU budget: the next trim starts no
// sooner than 50 times the last one's CPU after its start, so over any
// window W the trims that start in it use at most 2% of W plus one trim.
// While the CPU cgroup is throttled (its throttled time growing by 10% of
// the wall time), a trim starts at Delay/2.
//
// While no trim is pending a Trimmer has no goroutine or timer. It is safe
// for concurrent use; all methods of a nil *Trimmer do nothing.
type Trimmer struct {
	_ [64]byte // keep dirty on a cache line of its own: it is read on every call
	// dirty is set by AfterBurst and cleared by each tick.
	dirty atomic.Uint32
	_     [60]byte

	state atomic.Uint32 // stateIdle, statePending or stateClosed
	// since is when the pending period started (clock), 0 when idle.
	since atomic.Int64
	// inflight counts the bursts begun and not ended in two epochs; a
	// burst still in the old epoch one max wait after a flip is stale.
	inflight [2]atomic.Int64
	epoch    atomic.Uint32
	misuse   atomic.Int64
	// det is the burst detector's mark (1 in progress, 2 collected),
	// cleared by each tick; decisions counts the trims decided on their
	// estimate, for the detector.
	det       atomic.Uint32
	decisions atomic.Int64
	onTrim    atomic.Pointer[func()]

	deps
	delay, maxWait, interval time.Duration
	minRelease               int64
	strict, lazy             bool
	cheap                    cHeap
	log                      *slog.Logger
	throttled                func(fresh bool) (time.Duration, error) // nil: FixedDelay
	endFns                   [2]func()                               // made once so Begin does not allocate
	tickFn                   func()
	base                     time.Time // clock origin
	logOnce                  [7]atomic.Bool

	mu     sync.Mutex // guards the fields below; never held across a trim
	timer  *time.Timer
	armed  bool // timer is set and its tick has not started
	closed bool
	stats  Stats
	ticks  sync.WaitGroup // one count per armed timer and running tick
	// cDecided counts the trim decisions and cLeft is the C step's
	// estimate the last one left (-1 unknown), for the C heap's bursts.
	cDecided, cLeft int64

	run sync.Mutex // serializes ticks and trims; guards sched
	sched

	gc    gcLive // the live heap at the last GC ends
	gcSub *gcend.Subscription
}

const (
	stateIdle uint32 = iota
	statePending
	stateClosed
)

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

// deps are what a Trimmer reads and runs; tests replace them.
type deps struct {
	goStep    func() int64 // the Go step with a GC; bytes released
	noGCStep  func() (released int64, steps int, why abortReason, broken bool)
	noGCEst   func() int64                                    // releasable without a GC, -1 unknown
	estimate  func(t *Trimmer, marked bool) (est, sure int64) // see estimateGo
	scan      func() int64                                    // scannable bytes at the last GC, -1 unknown
	readCPU   func(start bool) cpuMark                        // the clocks a trim is charged by
	lazy      func() (bool, string)                           // lazyRelease
	lazyFree  func() int64                                    // LazyFree bytes, -1 unknown
	throttle  func() func(fresh bool) (time.Duration, error)  // a CPU cgroup throttled-time reader
	cheap     func() cHeap                                    // the C heap step
	hold      func(fn func())                                 // GOMEMLIMIT's one writer held around fn
	gcOnly    bool                                            // no path without a GC
	heapFloor func() int64                                    // the live heap at New
}

var realDeps = deps{
	goStep: freeOSMemory, noGCStep: releaseNoGC, noGCEst: releasableNoGC,
	estimate: (*Trimmer).estimateGo, scan: scanBytes, readCPU: readCPU,
	lazy: lazyRelease, lazyFree: lazyFreeBytes, throttle: newThrottleReader,
	cheap: func() cHeap { return cheap.Detect() }, hold: gomemlimit.Do,
	heapFloor: func() int64 { return readSample().Live },
}

// New returns a Trimmer configured by cfg, or an error naming the invalid
// field and its value. It starts no goroutine or timer; it subscribes to
// GC ends (one runtime/metrics read per cycle), which Close ends.
func New(cfg Config) (*Trimmer, error) { return newTrimmer(cfg, realDeps) }

func newTrimmer(c Config, d deps) (*Trimmer, error) {
	if err := c.fill(); err != nil {
		return nil, err
	}
	t := &Trimmer{deps: d, delay: c.Delay, maxWait: c.MaxWait, interval: c.Delay / ticksPerDelay,
		minRelease: c.MinRelease, strict: c.Strict, log: c.Logger, base: time.Now()}
	t.scanCost = float64(defaultScanCost)
	if !c.FixedDelay {
		t.throttled = d.throttle()
	}
	if !c.NoCHeap {
		t.cheap = d.cheap()
		t.stats.CHeapAllocator = t.cheap.Allocator()
	}
	t.lazy, t.stats.LazyReason = d.lazy()
	t.stats.Lazy = t.lazy
	t.endFns = [2]func(){t.end0, t.end1}
	t.tickFn = t.tick
	t.gc.last.Store(-1)
	t.gc.prev.Store(-1)
	t.gc.floor.Store(d.heapFloor())
	t.gcSub = gcend.Subscribe(func(s *gcend.Sample) bool { return t.atGCEnd(s.Live) })
	if t.lazy && t.log != nil {
		t.log.LogAttrs(context.Background(), slog.LevelInfo,
			"trim: the Go runtime releases memory lazily (MADV_FREE): RSS falls only under memory pressure",
			slog.String("setting", t.stats.LazyReason))
	}
	return t, nil
}

// fill checks c and sets its defaults.
func (c *Config) fill() error {
	switch {
	case c.Delay == 0:
		c.Delay = DefaultDelay
	case c.Delay < MinDelay || c.Delay > MaxDelay:
		return fmt.Errorf("trim: Config.Delay %v: want 0 (the default, %v) or at least %v and at most %v", c.Delay, DefaultDelay, MinDelay, MaxDelay)
	}
	switch {
	case c.MaxWait == 0:
		c.MaxWait = maxWaitFactor * c.Delay // cannot overflow: Delay <= MaxDelay
	case c.MaxWait < 0 || c.MaxWait > maxWaitFactor*MaxDelay:
		return fmt.Errorf("trim: Config.MaxWait %v: want 0 (the default, %d delays) or at least the delay and at most %v", c.MaxWait, maxWaitFactor, maxWaitFactor*MaxDelay)
	case c.MaxWait < c.Delay:
		return fmt.Errorf("trim: Config.MaxWait %v is shorter than the delay %v", c.MaxWait, c.Delay)
	}
	switch {
	case c.MinRelease == 0:
		c.MinRelease = defaultMinRelease
	case c.MinRelease < 0:
		c.MinRelease = 0 // NeverSkip: every estimate reaches 0
	}
	return nil
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

// MaxWait returns the configured max wait (see Config.MaxWait).
func (t *Trimmer) MaxWait() time.Duration {
	if t == nil {
		return 0
	}
	return t.maxWait
}

// AfterBurst marks the end of a burst: a trim runs Delay after the last
// call unless another call comes first, and at the latest MaxWait after
// the first call of the pending period. While a trim is pending it is one
// atomic load; it allocates nothing and starts no goroutine. After Close
// it does nothing. Safe for concurrent use.
func (t *Trimmer) AfterBurst() {
	if t == nil || t.dirty.Load() != 0 {
		return
	}
	t.mark()
}

// mark is the slow path of AfterBurst, kept out of line so that AfterBurst
// is inlined at its call sites.
//
//go:noinline
func (t *Trimmer) mark() {
	t.dirty.Store(1)
	t.pend()
}

// pend starts a pending period if the Trimmer is idle. Go atomics are
// sequentially consistent: either this CAS sees the idle state stored by
// goIdle, or goIdle's reload sees dirty set; only one of them arms.
func (t *Trimmer) pend() {
	if t.state.CompareAndSwap(stateIdle, statePending) {
		t.since.Store(t.clock(time.Now()))
		t.arm(t.interval)
	}
}

// Begin marks the start of a burst and returns the func that ends it, which
// calls AfterBurst. No trim starts while a burst is in flight, up to the
// max wait. end may be called from any goroutine, once; calling end funcs
// more often than Begin is misuse (Stats.Misuse, see Config.Strict). Begin
// allocates nothing. Safe for concurrent use.
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
	t.logOnceAt(onceMisuse, slog.LevelWarn,
		"trim: burst ended more often than begun (an end func called twice?); counted in Stats.Misuse, logged once",
		slog.Int64("misuse", n))
}

// logOnceAt logs msg at level the first time it is called with i.
func (t *Trimmer) logOnceAt(i int, level slog.Level, msg string, attrs ...slog.Attr) {
	if t.log != nil && t.logOnce[i].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), level, msg, attrs...)
	}
}

// inFlight returns the bursts in flight in both epochs.
func (t *Trimmer) inFlight() int64 { return t.inflight[0].Load() + t.inflight[1].Load() }

// TrimNow runs both steps of a trim in the calling goroutine at once,
// ignoring the delay, bursts in flight, the estimates and the CPU budget
// (its CPU still counts against the next trim). It is the only trim that
// bypasses the gate; nothing in memctl calls it on its own. It returns the
// bytes released and the C step's error, unless that matches
// ErrCHeapUnavailable. It waits for a running trim and works after Close.
// Safe for concurrent use.
func (t *Trimmer) TrimNow() (released int64, err error) {
	if t == nil {
		return 0, nil
	}
	t.run.Lock()
	defer t.run.Unlock()
	r := t.trimLocked(originByName, false)
	if errors.Is(r.cErr, ErrCHeapUnavailable) {
		return r.released, nil
	}
	return r.released, r.cErr
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

// Close drops a pending trim, waits for a running debounced one (not for
// a TrimNow in another goroutine), and makes later calls do nothing but
// TrimNow and Stats. When it returns the Trimmer has no goroutine and no
// timer. It is idempotent and returns nil. Do not call it from the
// Trimmer's logger.
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

// notify calls the facade's hook (trimwire.OnTrim), if any.
func (t *Trimmer) notify() {
	if fn := t.onTrim.Load(); fn != nil {
		(*fn)()
	}
}
