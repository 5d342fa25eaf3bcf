package trim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DefaultDelay is the quiet time after the last AfterBurst before the
	// trim runs. Two seconds is long enough for a run of back-to-back
	// requests to count as one burst and short enough that RSS comes down
	// before an operator or an autoscaler looks at it.
	DefaultDelay = 2 * time.Second

	// DefaultMaxWaitFactor sets the default max wait (see WithMaxWait) to
	// this many delays: 20 s with the default delay. A server whose bursts
	// keep coming less than Delay apart thus still trims, at most once
	// every 20 s, instead of postponing the trim for as long as the load
	// lasts.
	DefaultMaxWaitFactor = 10

	// MinDelay is the shortest delay New accepts. While a trim is pending
	// the Trimmer wakes every Delay/20, so a shorter delay would wake it
	// more often than every 50 µs.
	MinDelay = time.Millisecond

	// DefaultMinRelease is the estimate of releasable bytes (see
	// WithMinRelease) below which a due trim is skipped: 8 MiB. A trim
	// forces a full GC (measured on this repository's test machine: 0.7 to
	// 2.7 ms with 20 MiB live and nothing to release, against 20 to 50 ms to
	// release a 256 MiB burst, see TestTrimRSS), and the Go runtime holds a
	// few MiB of free spans and allocation headroom in normal operation, so
	// below 8 MiB (four 2 MiB huge pages) the GC costs more than the pages
	// are worth. It is a judgement, not a measured optimum.
	DefaultMinRelease int64 = 8 << 20

	// ticksPerDelay is how many times per Delay a pending Trimmer wakes to
	// look at the dirty flag; the trim fires at most Delay/ticksPerDelay
	// late.
	ticksPerDelay = 20

	// rateFactor is how many times as long as the last trim took the
	// Trimmer waits, from that trim's end, before it starts another:
	// 1/(1+49) = 2% of wall time at most.
	rateFactor = 49
)

const (
	stateIdle uint32 = iota
	statePending
	stateClosed
)

// Option configures a Trimmer; pass options to New.
type Option func(*config) error

type config struct {
	delay      time.Duration
	maxWait    time.Duration // -1: DefaultMaxWaitFactor delays
	minRelease int64
	cheap      CHeap
	logger     *slog.Logger

	// Test hooks; nil means the real thing.
	goStep   func() int64 // the Go heap step; returns bytes released
	estimate func() int64 // releasable bytes, -1 if unknown
}

// WithDelay sets how long after the last AfterBurst the trim runs, in
// [MinDelay, ∞). The trim fires between delay and delay + delay/20 after
// the last call (plus the timer's scheduling latency). New returns an error
// for a delay below MinDelay; to turn trimming off, do not create a Trimmer
// (a nil *Trimmer does nothing). Default: DefaultDelay (2 s).
func WithDelay(delay time.Duration) Option {
	return func(c *config) error {
		if delay < MinDelay {
			return fmt.Errorf("trim: delay %v: want at least %v", delay, MinDelay)
		}
		c.delay = delay
		return nil
	}
}

// WithMaxWait bounds how long a stream of AfterBurst calls can push the
// trim back: a pending trim runs at the latest maxWait after the first
// AfterBurst that made it pending, even when calls keep coming less than
// Delay apart. Bursts marked in flight with Begin still hold every trim
// off. 0 means no bound (a pure debounce); otherwise maxWait must be at
// least the delay, and New returns an error when it is not.
// Default: DefaultMaxWaitFactor × the delay (20 s with the default delay).
func WithMaxWait(maxWait time.Duration) Option {
	return func(c *config) error {
		if maxWait < 0 {
			return fmt.Errorf("trim: max wait %v: want 0 (no bound) or at least the delay", maxWait)
		}
		c.maxWait = maxWait
		return nil
	}
}

// WithMinRelease sets the threshold, in bytes (>= 0), below which a due
// trim is skipped and counted in Stats.Skipped. The Trimmer compares it
// with an estimate of the bytes a trim would release, read from
// runtime/metrics just before the trim:
//
//	/memory/classes/heap/free:bytes
//	+ /memory/classes/heap/objects:bytes − live
//	+ the C heap step's Retained (when it can tell)
//
// where live is the smaller of /gc/heap/live:bytes and the live heap that
// the Trimmer read right after its previous trim (or at New). The smaller of
// the two is used because a GC that ran during a burst counts the burst's
// objects as live until the next GC; the estimate therefore errs on the side
// of trimming. When runtime/metrics cannot be read the trim runs. 0 means
// never skip. New returns an error for a negative value.
// Default: DefaultMinRelease (8 MiB).
func WithMinRelease(bytes int64) Option {
	return func(c *config) error {
		if bytes < 0 {
			return fmt.Errorf("trim: min release %d bytes: want >= 0", bytes)
		}
		c.minRelease = bytes
		return nil
	}
}

// WithCHeap sets the C heap step that runs after the Go heap step of each
// trim. nil turns the C heap step off. Default: DefaultCHeap().
func WithCHeap(h CHeap) Option {
	return func(c *config) error {
		c.cheap = h
		return nil
	}
}

// WithLogger sets where the Trimmer logs: each trim and skip at DEBUG, a C
// heap step failure other than ErrCHeapUnavailable at WARN. nil (the
// default) logs nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.logger = l
		return nil
	}
}

// Stats is a snapshot of a Trimmer's counters, from Trimmer.Stats.
type Stats struct {
	// Trims is the number of trims run (debounced and TrimNow).
	Trims int64
	// Skipped is the number of due trims skipped because the estimate of
	// releasable bytes was below the threshold (see WithMinRelease).
	Skipped int64
	// LastDuration is how long the last trim took (both steps), measured
	// with the monotonic clock.
	LastDuration time.Duration
	// LastReleased is the bytes the last trim released: the growth of
	// /memory/classes/heap/released:bytes across debug.FreeOSMemory, plus
	// the C heap step's own figure when it can tell.
	LastReleased int64
	// TotalReleased is the sum of LastReleased over all trims, in bytes.
	TotalReleased int64
	// LastEstimate is the estimate of releasable bytes made before the last
	// trim or skip (see WithMinRelease), or -1 if runtime/metrics could not
	// be read.
	LastEstimate int64
	// CHeapAllocator is the C heap step's Allocator ("glibc", "none", ...),
	// or "" when the step is off (WithCHeap(nil)).
	CHeapAllocator string
	// CHeapErr is the error of the last C heap step, nil if it succeeded or
	// has not run. It matches ErrCHeapUnavailable when the step cannot run
	// in this process; that is not a failure.
	CHeapErr error
	// Pending reports whether a trim is scheduled.
	Pending bool
	// InFlight is the number of bursts begun (Begin) and not yet ended.
	InFlight int64
}

// A Trimmer runs one trim Delay after the last burst ends: AfterBurst marks
// the end of a burst, and calls during the wait push the trim back, so a run
// of bursts gives one trim; a stream of calls that never pauses for Delay
// pushes it back at most MaxWait (see WithMaxWait). A trim is debug.FreeOSMemory followed by the C
// heap step (see CHeap). It does not run while a burst marked with Begin is
// in flight, it is skipped when too little would be released (see
// WithMinRelease), and trims take at most 2% of wall time: after a trim that
// took d, the next one starts no sooner than 49·d after its end.
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

	state    atomic.Uint32 // stateIdle, statePending or stateClosed
	inflight atomic.Int64  // bursts begun and not ended

	delay      time.Duration
	maxWait    time.Duration // 0: no bound
	interval   time.Duration // delay / ticksPerDelay
	minRelease int64
	cheap      CHeap
	log        *slog.Logger
	goStep     func() int64
	estimate   func() int64
	endFn      func() // t.end, made once so Begin does not allocate
	tickFn     func() // t.tick, made once

	mu     sync.Mutex // guards the fields below; never held across a trim
	timer  *time.Timer
	armed  bool // timer is set and its tick has not started
	closed bool
	stats  Stats
	ticks  sync.WaitGroup // one count per armed timer and running tick

	run        sync.Mutex // serializes ticks and trims; guards the fields below
	quietSince time.Time  // latest tick that saw the dirty flag set; zero when idle
	firstTick  time.Time  // first tick of the pending period; zero when idle
	lastEnd    time.Time  // end of the last trim
	lastDur    time.Duration
	liveFloor  int64 // /gc/heap/live:bytes right after the last trim (or at New)
}

// New returns a Trimmer configured by opts. The error names the bad option
// value; New starts nothing.
func New(opts ...Option) (*Trimmer, error) {
	c := config{delay: DefaultDelay, maxWait: -1, minRelease: DefaultMinRelease, cheap: DefaultCHeap()}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	switch {
	case c.maxWait < 0:
		c.maxWait = DefaultMaxWaitFactor * c.delay
	case c.maxWait > 0 && c.maxWait < c.delay:
		return nil, fmt.Errorf("trim: max wait %v is shorter than the delay %v", c.maxWait, c.delay)
	}
	t := &Trimmer{
		delay:      c.delay,
		maxWait:    c.maxWait,
		interval:   c.delay / ticksPerDelay,
		minRelease: c.minRelease,
		cheap:      c.cheap,
		log:        c.logger,
		goStep:     c.goStep,
		estimate:   c.estimate,
	}
	if t.goStep == nil {
		t.goStep = freeOSMemory
	}
	if t.estimate == nil {
		t.estimate = t.estimateReleasable
	}
	t.endFn = t.end
	t.tickFn = t.tick
	if h, ok := readHeap(); ok {
		t.liveFloor = h.live
	}
	if t.cheap != nil {
		t.stats.CHeapAllocator = t.cheap.Allocator()
	}
	return t, nil
}

// Delay returns the configured delay.
func (t *Trimmer) Delay() time.Duration {
	if t == nil {
		return 0
	}
	return t.delay
}

// AfterBurst marks the end of a burst: a trim runs Delay after the last call
// (between Delay and Delay + Delay/20, plus timer latency), unless another
// call comes first, and at the latest MaxWait after the first call of the
// run. It allocates nothing and starts no goroutine. While a
// trim is pending it is one atomic load and takes no lock (under a
// nanosecond, see BenchmarkAfterBurst); the first call after the Trimmer
// went idle, and the first after each tick (every Delay/20), also do an
// atomic store and compare-and-swap, and the first after idle sets the timer
// under an uncontended mutex. After Close it does nothing. Safe for
// concurrent use.
func (t *Trimmer) AfterBurst() {
	if t == nil || t.dirty.Load() != 0 {
		return
	}
	t.mark()
}

// mark is the slow path of AfterBurst: set the flag and, if idle, arm.
func (t *Trimmer) mark() {
	t.dirty.Store(1)
	// Go atomics are sequentially consistent: either this CAS sees the
	// idle state stored by goIdle, or goIdle's reload sees dirty set; the
	// CAS lets only one of them arm.
	if t.state.CompareAndSwap(stateIdle, statePending) {
		t.arm(t.interval)
	}
}

// Begin marks the start of a burst and returns the func that ends it. No
// trim starts while a burst is in flight; end calls AfterBurst, so a trim
// follows Delay after the last burst ends. Begin allocates nothing (every
// call returns the same func). end may be called from any goroutine; calling
// it more often in total than Begin panics with "trim: burst ended more
// often than begun".
func (t *Trimmer) Begin() (end func()) {
	if t == nil {
		return noop
	}
	t.inflight.Add(1)
	return t.endFn
}

func noop() {}

func (t *Trimmer) end() {
	if t.inflight.Add(-1) < 0 {
		t.inflight.Add(1)
		panic("trim: burst ended more often than begun")
	}
	t.AfterBurst()
}

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
// or skip, or when a burst is in flight; otherwise how long until the next
// tick. t.run must be held.
func (t *Trimmer) step(now time.Time) (next time.Duration, idle bool) {
	// A call happened between the previous tick and now: count the quiet
	// time from now, the latest it can have been.
	if t.dirty.Swap(0) != 0 || t.quietSince.IsZero() {
		t.quietSince = now
	}
	if t.firstTick.IsZero() {
		t.firstTick = now
	}
	if t.inflight.Load() > 0 {
		// The burst's end calls AfterBurst, which arms again.
		t.quietSince, t.firstTick = time.Time{}, time.Time{}
		return 0, true
	}
	due := t.quietSince.Add(t.delay)
	if t.maxWait > 0 {
		if latest := t.firstTick.Add(t.maxWait); latest.Before(due) {
			due = latest
		}
	}
	if !t.lastEnd.IsZero() {
		if ok := t.lastEnd.Add(rateFactor * t.lastDur); ok.After(due) {
			due = ok
		}
	}
	if wait := due.Sub(now); wait > 0 {
		return min(wait, t.interval), false
	}
	t.quietSince, t.firstTick = time.Time{}, time.Time{}
	est := t.estimate()
	if est >= 0 && est < t.minRelease {
		t.mu.Lock()
		t.stats.Skipped++
		t.stats.LastEstimate = est
		t.mu.Unlock()
		if t.log != nil {
			t.log.LogAttrs(context.Background(), slog.LevelDebug, "trim: skipped",
				slog.Int64("estimate_bytes", est), slog.Int64("min_release_bytes", t.minRelease))
		}
		return 0, true
	}
	t.trimLocked(est)
	return 0, true
}

// goIdle leaves the pending state, and arms again if AfterBurst was called
// since the last tick (including during a trim).
func (t *Trimmer) goIdle() {
	if !t.state.CompareAndSwap(statePending, stateIdle) {
		return // closed
	}
	if t.dirty.Load() != 0 && t.state.CompareAndSwap(stateIdle, statePending) {
		t.arm(t.interval)
	}
}

// trimLocked runs both steps of a trim and records it. t.run must be held.
func (t *Trimmer) trimLocked(est int64) (released int64, cErr error) {
	start := time.Now()
	released = t.goStep()
	if t.cheap != nil {
		var r int64
		r, cErr = t.cheap.Release()
		if r > 0 {
			released += r
		}
	}
	end := time.Now()
	d := end.Sub(start)
	t.lastEnd, t.lastDur = end, d
	if h, ok := readHeap(); ok {
		t.liveFloor = h.live // accurate: FreeOSMemory just ran a GC
	}

	t.mu.Lock()
	t.stats.Trims++
	t.stats.LastDuration = d
	t.stats.LastReleased = released
	t.stats.TotalReleased += released
	t.stats.LastEstimate = est
	t.stats.CHeapErr = cErr
	t.mu.Unlock()

	if t.log != nil {
		ctx := context.Background()
		t.log.LogAttrs(ctx, slog.LevelDebug, "trim: done",
			slog.Duration("took", d), slog.Int64("released_bytes", released),
			slog.Int64("estimate_bytes", est))
		if cErr != nil && !errors.Is(cErr, ErrCHeapUnavailable) {
			t.log.LogAttrs(ctx, slog.LevelWarn, "trim: C heap step failed",
				slog.String("allocator", t.stats.CHeapAllocator), slog.Any("error", cErr))
		}
	}
	return released, cErr
}

// TrimNow runs a trim in the calling goroutine at once, ignoring the delay,
// bursts in flight, the threshold and the rate limit (but a trim it runs
// counts for the rate limit of the next debounced one). It returns the bytes
// released, as in Stats.LastReleased, and the C heap step's error unless
// that matches ErrCHeapUnavailable (which is recorded in Stats only). It
// works after Close. It waits for a trim already running. Safe for
// concurrent use.
func (t *Trimmer) TrimNow() (released int64, err error) {
	if t == nil {
		return 0, nil
	}
	t.run.Lock()
	defer t.run.Unlock()
	released, err = t.trimLocked(t.estimate())
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
	s.InFlight = t.inflight.Load()
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
