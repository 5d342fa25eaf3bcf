package trim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/trim/cheap"
)

const (
	defaultDelay       = trimwire.DefaultDelay // Config.Delay's default, and its bounds:
	minDelay           = trimwire.MinDelay
	maxDelay           = trimwire.MaxDelay
	neverSkip    int64 = -1 // a Config.MinRelease that never skips a step

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
	// Delay is how long after the last AfterBurst the trim runs (up to Delay/20
	// later; Delay/2 under CPU throttling), from 1 ms to 24 h. Default: 2 s.
	Delay time.Duration

	// MaxWait bounds how long calls push a pending trim back: it runs at the
	// latest MaxWait after the first call of its pending period, unless the CPU
	// budget defers it. In [Delay, 240 h]. Default: 10 × Delay.
	MaxWait time.Duration

	// MinRelease is the estimate of releasable bytes under which a step is
	// skipped (the Go step also needs 64 MiB per CPU-second of its GC; an
	// unknown C estimate runs). A negative value never skips. Default: 8 MiB.
	MinRelease int64

	// NoCHeap turns the C heap step (package cheap) off. Default: false.
	NoCHeap bool

	// Logger gets trims and skips at DEBUG, notes at INFO, and the first
	// misuse, first stale Begin and C step failures at WARN. Default: nil, no
	// logging.
	Logger *slog.Logger

	// FixedDelay waits the whole Delay even under CPU throttling. Default:
	// false.
	FixedDelay bool

	// Strict makes misuse panic instead of being counted; for tests. Default:
	// false.
	Strict bool
}

// A Trimmer runs one trim Delay after the last burst ends; calls during the
// wait push it back, so a run of bursts gives one trim, at the latest
// Config.MaxWait after the first. A trim is the Go heap step (with no GC when
// one has collected the burst, else debug.FreeOSMemory), then the C heap step
// (package cheap), each skipped when its estimate is under MinRelease.
//
// Trims of every origin share one CPU budget of 2%: the next starts no sooner
// than 50 times the last one's CPU after its start. While the CPU cgroup is
// throttled (throttled time growing by 10% of the wall time), a trim starts at
// Delay/2.
//
// While no trim is pending it has no goroutine or timer. It is safe for
// concurrent use; all methods of a nil *Trimmer do nothing.
type Trimmer struct {
	_     [64]byte      // dirty has a cache line of its own: every call reads it
	dirty atomic.Uint32 // set by AfterBurst, cleared by each tick
	_     [60]byte

	state     atomic.Uint32   // stateIdle, statePending or stateClosed
	since     atomic.Int64    // when the pending period started (clock), 0 when idle
	inflight  [2]atomic.Int64 // bursts begun and not ended, per Begin epoch (see checkStale)
	epoch     atomic.Uint32
	misuse    atomic.Int64
	det       atomic.Uint32 // the burst detector's mark: 1 in progress, 2 collected; cleared by each tick
	decisions atomic.Int64  // trims decided on their estimate, for the detector
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

	mu              sync.Mutex // guards the fields below; never held across a trim
	timer           *time.Timer
	armed           bool // timer is set and its tick has not started
	closed          bool
	stats           Stats
	ticks           sync.WaitGroup // one count per armed timer and running tick
	cDecided, cLeft int64          // trim decisions; the C estimate the last one left (-1 unknown)

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

// cHeap is the C heap step of a trim (*cheap.Step); safe for concurrent use.
type cHeap interface {
	// Allocator names the allocator that owns malloc ("none": unavailable).
	Allocator() string
	// Retained returns what a release can return, in bytes, -1 unknown.
	Retained() int64
	// ReleaseOver releases each allocator whose estimate reaches min
	// (every one for a negative min) and returns the bytes released.
	ReleaseOver(min int64) (released int64, err error)
}

// deps are what a Trimmer reads and runs; tests replace them.
type deps struct {
	goStep    func() int64 // the Go step with a GC; bytes released
	noGCStep  func() (released int64, steps int, why abortReason, broken bool)
	noGCEst   func() int64                                    // releasable without a GC, -1 unknown
	estimate  func(t *Trimmer, marked bool) (est, sure int64) // see estimateGo
	scan      func() int64                                    // scannable bytes at the last GC, -1 unknown
	readCPU   func(start bool) cpuMark                        // the clocks a trim is charged by
	lazy      func() (bool, string)                           // lazyFrom on the environment and the build
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
	lazy:     func() (bool, string) { return lazyFrom(os.Getenv("GODEBUG"), buildGODEBUG()) },
	lazyFree: lazyFreeBytes, throttle: newThrottleReader,
	cheap: func() cHeap { return cheap.Detect() }, hold: gomemlimit.Do,
	heapFloor: func() int64 { return readSample().Live },
}

// New returns a Trimmer configured by cfg, or an error naming the invalid field
// and its value. It starts no goroutine (it reads runtime/metrics at GC ends).
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
	t.endFns = [2]func(){func() { t.end(0) }, func() { t.end(1) }}
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

func (c *Config) fill() error {
	switch {
	case c.Delay == 0:
		c.Delay = defaultDelay
	case c.Delay < minDelay || c.Delay > maxDelay:
		return fmt.Errorf("trim: Config.Delay %v: want 0 (the default, %v) or at least %v and at most %v", c.Delay, defaultDelay, minDelay, maxDelay)
	}
	switch {
	case c.MaxWait == 0:
		c.MaxWait = maxWaitFactor * c.Delay // cannot overflow: Delay <= maxDelay
	case c.MaxWait < 0 || c.MaxWait > maxWaitFactor*maxDelay:
		return fmt.Errorf("trim: Config.MaxWait %v: want 0 (the default, %d delays) or at least the delay and at most %v", c.MaxWait, maxWaitFactor, maxWaitFactor*maxDelay)
	case c.MaxWait < c.Delay:
		return fmt.Errorf("trim: Config.MaxWait %v is shorter than the delay %v", c.MaxWait, c.Delay)
	}
	switch {
	case c.MinRelease == 0:
		c.MinRelease = defaultMinRelease
	case c.MinRelease < 0:
		c.MinRelease = 0 // neverSkip: every estimate reaches 0
	}
	return nil
}

// clock returns the monotonic ns since t.base, at least 1 (0 means unset).
func (t *Trimmer) clock(now time.Time) int64 { return max(int64(now.Sub(t.base)), 1) }

// Delay returns the configured delay (see Config.Delay).
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

// AfterBurst marks the end of a burst (see Trimmer). It allocates nothing;
// while a trim is pending it is one atomic load. After Close it does nothing.
func (t *Trimmer) AfterBurst() {
	if t == nil || t.dirty.Load() != 0 {
		return
	}
	t.mark()
}

// mark is AfterBurst's slow path, out of line so that AfterBurst inlines.
//
//go:noinline
func (t *Trimmer) mark() {
	t.dirty.Store(1)
	t.pend()
}

// pend starts a pending period if idle. Atomics are sequentially consistent:
// this CAS sees goIdle's store or goIdle's reload sees dirty; one arms.
func (t *Trimmer) pend() {
	if t.state.CompareAndSwap(stateIdle, statePending) {
		t.since.Store(t.clock(time.Now()))
		t.arm(t.interval)
	}
}

// Begin marks a burst in flight, which no trim starts under (up to MaxWait),
// and returns the func that ends it and calls AfterBurst: call it once; more
// end calls than Begins are misuse (Stats.Misuse). It allocates nothing.
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

func (t *Trimmer) end(e int) {
	// Marked before the count falls: a tick in between sees the mark (quiet
	// from now), never a burst gone unmarked (a trim at once).
	t.AfterBurst()
	if t.inflight[e].Add(-1) < 0 {
		t.inflight[e].Add(1)
		t.reportMisuse()
	}
}

func (t *Trimmer) reportMisuse() {
	n := t.misuse.Add(1)
	if t.strict {
		panic("trim: burst ended more often than begun")
	}
	t.logOnceAt(onceMisuse, slog.LevelWarn,
		"trim: burst ended more often than begun (an end func called twice?); counted in Stats.Misuse, logged once",
		slog.Int64("misuse", n))
}

func (t *Trimmer) logOnceAt(i int, level slog.Level, msg string, attrs ...slog.Attr) {
	if t.log != nil && t.logOnce[i].CompareAndSwap(false, true) {
		t.log.LogAttrs(context.Background(), level, msg, attrs...)
	}
}

func (t *Trimmer) inFlight() int64 { return t.inflight[0].Load() + t.inflight[1].Load() }

// TrimNow runs both steps of a trim in the calling goroutine, now, bypassing
// the delay, bursts in flight, the estimates and the CPU budget (its CPU still
// counts). It waits for a running trim, works after Close, and returns the
// bytes released and any C step error but cheap.ErrUnavailable.
func (t *Trimmer) TrimNow() (released int64, err error) {
	if t == nil {
		return 0, nil
	}
	t.run.Lock()
	defer t.run.Unlock()
	r := t.trimLocked(originByName, false)
	if errors.Is(r.cErr, cheap.ErrUnavailable) {
		return r.released, nil
	}
	return r.released, r.cErr
}

// Stats returns a snapshot of the Trimmer's counters; it does not wait for a
// running trim.
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

// Close drops a pending trim, waits for a running debounced one (not a
// TrimNow), and makes later calls but TrimNow and Stats do nothing. Idempotent;
// it returns nil. Do not call it from the Trimmer's logger.
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

// notify calls the facade's hook (trimwire.OnTrim).
func (t *Trimmer) notify() {
	if fn := t.onTrim.Load(); fn != nil {
		(*fn)()
	}
}

func init() {
	trimwire.Request = func(t any, o trimwire.Origin) bool {
		tr, _ := t.(*Trimmer)
		return tr.request(o).ran
	}
	trimwire.OnTrim = func(t any, fn func()) {
		if tr, _ := t.(*Trimmer); tr != nil {
			tr.onTrim.Store(&fn)
		}
	}
	trimwire.StartAutoBurst = func(t any, cfg any) (trimwire.AutoBurst, error) {
		tr, _ := t.(*Trimmer)
		c, _ := cfg.(AutoBurstConfig)
		a, err := startAutoBurst(tr, c)
		if a == nil {
			return nil, err
		}
		return a, err
	}
}
