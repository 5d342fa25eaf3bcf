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

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"

	"github.com/memctl/memctl/internal/relief"
)

// Defaults of Config. The GC share: the runtime's GC CPU limiter caps the
// GC at half the CPU (runtime/mgclimit.go). The PSI trigger is systemd's
// default (MemoryPressureThresholdSec=, systemd.resource-control(5)); a 2 s
// window is also the one an unprivileged process may arm (Linux 6.5 and
// later accept only multiples of 2 s without CAP_SYS_RESOURCE).
const (
	defaultWindow      = 10 * time.Second
	defaultGCShare     = 0.5
	defaultLiveRatio   = 0.9
	defaultLiftStep    = 0.1
	defaultLiftFor     = time.Minute
	defaultMinInterval = 2 * time.Second
	defaultStall       = 200 * time.Millisecond
	defaultStallWindow = 2 * time.Second
)

// Config configures Start. The zero value is the default.
type Config struct {
	// Logger receives the WARNs. Default: slog.Default().
	Logger *slog.Logger

	// SpiralOff turns the death-spiral detector off. Default: false.
	SpiralOff bool
	// Window is the span of the GC's CPU share, in [1s, 10m]; an episode
	// can begin once a quarter of it has been seen. Default: 10 s.
	Window time.Duration
	// GCShare is the GC's CPU share over Window that makes an episode (or the
	// GC CPU limiter engaging), in (0.0, 1.0]. Default: 0.5.
	GCShare float64
	// LiveRatio is the share of GOMEMLIMIT the live heap (the median of 8 GC
	// ends) must reach, in (0.0, 1.0]; no GOMEMLIMIT, no episode. Default: 0.9.
	LiveRatio float64
	// LiftOff turns off the lift: LiftStep more GOMEMLIMIT, up to the cgroup
	// limit, for LiftFor and not again within it, where memctl set GOMEMLIMIT
	// from the cgroup (never over the operator's). Default: false.
	LiftOff bool
	// LiftStep is a lift's share of GOMEMLIMIT, in (0.0, 1.0]. Default: 0.1.
	LiftStep float64
	// LiftFor is how long a lift lasts, in [1s, 1h]. Default: 1 minute.
	LiftFor time.Duration

	// Watch selects the kernel source: "auto" (or ""), "off", "systemd"
	// ($MEMORY_PRESSURE_WATCH), "cgroup" or "system" (/proc/pressure/memory).
	// Default: "auto".
	Watch string
	// MinInterval is the least time between two actions on kernel signals,
	// in [100ms, 1m]; signals in between are coalesced. Default: 2 s.
	MinInterval time.Duration
	// Stall and StallWindow are the PSI trigger: a "some" stall of Stall, in
	// (0, StallWindow], within StallWindow, in [500ms, 10s]. Default: 200 ms in
	// 2 s.
	Stall, StallWindow time.Duration
}

var watches = []string{"auto", "off", "systemd", "cgroup", "system"}

// Kind is the kind of an Event.
type Kind int

const (
	KindSpiral    Kind = iota + 1 // a GC death-spiral episode began
	KindSpiralEnd                 // the episode ended
	KindKernel                    // the kernel signalled pressure and the watcher acted
)

// String returns "spiral", "spiral end" or "kernel".
func (k Kind) String() string {
	if k >= KindSpiral && k <= KindKernel {
		return [...]string{"spiral", "spiral end", "kernel"}[k-KindSpiral]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one thing a subscriber is told. Bytes are int64.
type Event struct {
	Kind Kind
	Time time.Time
	// KindSpiral and KindSpiralEnd: the GC's CPU share over Span, in [0, 1],
	// the live heap the rule compared, GOMEMLIMIT, the GC CPU limiter engaged.
	GCShare        float64
	Span           time.Duration
	LiveHeap       int64
	HeapGoal       int64
	GoMemLimit     int64
	LimiterEngaged bool
	// KindKernel: the source, the signals answered, and the memory's makeup in
	// bytes (-1 unknown; Own: this process's anonymous memory, host-wide only).
	Source  string
	Signals int64
	Makeup  struct {
		Anon, Cache, Own int64
		From             string
	}
}

// Stats is a snapshot of a Monitor's counters.
type Stats struct {
	// Source is the kernel source watched, "" when none.
	Source   string
	Spirals  int64 // episodes
	InSpiral bool  // an episode is in progress
	// The figures of the last GC end.
	GCShare  float64
	LiveHeap int64
	GCCycles int64
	Lifts    int64 // GOMEMLIMIT lifts
	Lifted   int64 // bytes added now
	// Signals counts kernel signals, Acted the actions (at most one per
	// MinInterval); LeftToKernel the signals left to the kernel (mostly page
	// cache), CancelsHeld the actions without a cancel.
	Signals      int64
	Acted        int64
	LeftToKernel int64
	CancelsHeld  int64
	// Unexplained counts PSI events the stall since the trigger was armed did
	// not explain, ignored (in neither Signals nor Acted) unless it does a
	// trigger window later.
	Unexplained int64
	Dropped     int64 // events not delivered to a full subscriber channel
	// MemoryEvents are the cgroup v2 memory.events counters
	// (admin-guide/cgroup-v2.rst), read by Stats; -1 when absent.
	MemoryEvents struct {
		Low, High, Max, OOM, OOMKill, OOMGroupKill int64
	}
}

// deps are what a Monitor acts through; tests replace them.
type deps struct {
	getenv  func(string) string
	trim    func() bool                                 // a trim through the trimmer's gate
	cancel  func() int                                  // cancel the largest request
	shed    func(on bool)                               // shed large work in the pools
	lift    func(extra int64) (from, to int64, ok bool) // GOMEMLIMIT's owner
	ceiling func() int64                                // the highest lift, 0: none
	makeup  func() (makeup, error)                      // nil: the source's own
}

var realDeps = deps{getenv: os.Getenv, trim: relief.Trim, cancel: relief.CancelLargest, shed: relief.Shed,
	lift: gomemlimit.Lift, ceiling: gomemlimit.Ceiling}

// Monitor runs the death-spiral detector and the kernel watcher. Its methods
// are safe for concurrent use; a nil *Monitor does nothing.
type Monitor struct {
	cfg    Config
	deps   deps
	log    *slog.Logger
	events string         // memory.events path, "" when not cgroup v2
	cg     cgroupfs.Limit // the process's memory cgroup, read once by Start
	cgErr  error

	subMu sync.Mutex
	subs  []chan Event // under subMu

	spiral    *spiral
	gcSub     *gcend.Subscription
	actMu     sync.Mutex  // serializes episode actions and lifts
	applied   bool        // episode state the actions were taken for
	liftTimer *time.Timer // the lift in progress, nil: none
	liftEnded time.Time   // when the last lift ended
	epMu      sync.Mutex  // orders episodes.Add against Close's Wait
	episodes  sync.WaitGroup

	watch *watcher

	spirals, lifts, lifted  atomic.Int64
	signals, acted, dropped atomic.Int64
	leftToKernel, held      atomic.Int64
	unexplained             atomic.Int64
	inSpiral                atomic.Bool
	lastShare               atomic.Uint64 // float64 bits
	lastLive, lastCycles    atomic.Int64
	closeOnce               sync.Once
	closed                  atomic.Bool
}

// ErrNoSource is matched (errors.Is) by Start's error when no kernel
// pressure source can be watched; it also matches errors.ErrUnsupported.
var ErrNoSource = fmt.Errorf("pressure: no kernel memory pressure source: %w", errors.ErrUnsupported)

// Start validates cfg and starts the detector and the watcher. An invalid cfg
// is an error and a nil Monitor. When the watcher cannot start, the Monitor
// runs the detector alone and the error says why (ErrNoSource: nothing to
// watch). Close the Monitor when done.
func Start(cfg Config) (*Monitor, error) { return start(cfg, realDeps) }

func start(cfg Config, d deps) (*Monitor, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	m := &Monitor{cfg: cfg, deps: d, log: cfg.Logger}
	if m.cg, m.cgErr = cgroupfs.Of(0); m.cgErr == nil && m.cg.Version == 2 {
		m.events = m.cg.Dir + "/memory.events"
	}
	if !cfg.SpiralOff {
		m.spiral = newSpiral(cfg.Window, cfg.GCShare, cfg.LiveRatio)
		m.gcSub = gcend.Subscribe(m.gcEnd)
	}
	var err error
	if cfg.Watch != "off" {
		m.watch, err = startWatcher(m)
	}
	return m, err
}

func (c *Config) fill() error {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	var errs []error
	dur := func(name string, p *time.Duration, def, lo, hi time.Duration) {
		if *p == 0 {
			*p = def
		}
		if *p < lo || *p > hi {
			errs = append(errs, fmt.Errorf("pressure: Config.%s %v is not in [%v, %v]", name, *p, lo, hi))
		}
	}
	ratio := func(name string, p *float64, def float64) {
		if *p == 0 {
			*p = def
		}
		if !(*p > 0 && *p <= 1) { // also NaN
			errs = append(errs, fmt.Errorf("pressure: Config.%s %v is not in (0.0, 1.0]", name, *p))
		}
	}
	dur("Window", &c.Window, defaultWindow, time.Second, 10*time.Minute)
	ratio("GCShare", &c.GCShare, defaultGCShare)
	ratio("LiveRatio", &c.LiveRatio, defaultLiveRatio)
	ratio("LiftStep", &c.LiftStep, defaultLiftStep)
	dur("LiftFor", &c.LiftFor, defaultLiftFor, time.Second, time.Hour)
	dur("MinInterval", &c.MinInterval, defaultMinInterval, 100*time.Millisecond, time.Minute)
	dur("StallWindow", &c.StallWindow, defaultStallWindow, 500*time.Millisecond, 10*time.Second)
	dur("Stall", &c.Stall, defaultStall, time.Microsecond, c.StallWindow)
	c.Watch = cmp.Or(c.Watch, "auto")
	if !slices.Contains(watches, c.Watch) {
		errs = append(errs, fmt.Errorf("pressure: Config.Watch %q is not one of %q", c.Watch, watches))
	}
	return errors.Join(errs...)
}

// Source names the kernel source watched ("host-wide PSI ..." for the host's),
// "" when none.
func (m *Monitor) Source() string {
	if m == nil || m.watch == nil {
		return ""
	}
	return m.watch.name
}

// SourceNote says why the process's own cgroup is not watched when the source
// is the host-wide PSI or memory.events ("read-only cgroup mount", "PSI trigger
// refused: ..."); "" otherwise.
func (m *Monitor) SourceNote() string {
	if m == nil || m.watch == nil {
		return ""
	}
	return m.watch.note
}

// Subscribe returns a channel of every event from now on, with room for buf (at
// least 1); an event that does not fit is dropped (Stats.Dropped). cancel, or
// Close, closes it; on a nil or closed Monitor it is closed at once.
func (m *Monitor) Subscribe(buf int) (events <-chan Event, cancel func()) {
	ch := make(chan Event, max(buf, 1))
	if m == nil {
		close(ch)
		return ch, func() {}
	}
	m.subMu.Lock()
	defer m.subMu.Unlock()
	if m.closed.Load() {
		close(ch)
		return ch, func() {}
	}
	m.subs = append(m.subs, ch)
	return ch, func() { m.unsubscribe(ch) }
}

// unsubscribe closes ch unless Close or an earlier cancel did.
func (m *Monitor) unsubscribe(ch chan Event) {
	m.subMu.Lock()
	defer m.subMu.Unlock()
	if i := slices.Index(m.subs, ch); i >= 0 {
		m.subs = slices.Delete(m.subs, i, i+1)
		close(ch)
	}
}

// publish sends e to every subscriber without blocking. Sends and closes
// are both under subMu, so a send never hits a closed channel.
func (m *Monitor) publish(e Event) {
	m.subMu.Lock()
	defer m.subMu.Unlock()
	for _, ch := range m.subs {
		select {
		case ch <- e:
		default:
			m.dropped.Add(1)
		}
	}
}

// Stats returns the counters and reads memory.events (cgroup v2).
func (m *Monitor) Stats() Stats {
	s := m.Counters()
	if m != nil && m.events != "" {
		if e, err := cgroupfs.ReadEvents(m.events); err == nil {
			s.MemoryEvents = e
		}
	}
	return s
}

// Counters returns Stats without memory.events (all -1): atomic loads only.
func (m *Monitor) Counters() Stats {
	s := Stats{}
	s.MemoryEvents = cgroupfs.Events{Low: -1, High: -1, Max: -1, OOM: -1, OOMKill: -1, OOMGroupKill: -1}
	if m == nil {
		return s
	}
	s.Source, s.Spirals, s.InSpiral = m.Source(), m.spirals.Load(), m.inSpiral.Load()
	s.GCShare, s.LiveHeap = math.Float64frombits(m.lastShare.Load()), m.lastLive.Load()
	s.GCCycles, s.Lifts, s.Lifted = m.lastCycles.Load(), m.lifts.Load(), m.lifted.Load()
	s.Signals, s.Acted, s.LeftToKernel = m.signals.Load(), m.acted.Load(), m.leftToKernel.Load()
	s.CancelsHeld, s.Unexplained, s.Dropped = m.held.Load(), m.unexplained.Load(), m.dropped.Load()
	return s
}

// Close removes the GC-end hook, stops the watcher, waits for actions in
// flight, ends shedding and a lift, and closes the subscribers' channels.
// Idempotent; returns nil.
func (m *Monitor) Close() error {
	if m == nil {
		return nil
	}
	m.closeOnce.Do(func() {
		m.epMu.Lock()
		m.closed.Store(true)
		m.epMu.Unlock()
		m.gcSub.Stop()
		if m.watch != nil {
			m.watch.close()
		}
		m.episodes.Wait()
		m.actMu.Lock()
		if m.applied {
			m.deps.shed(false)
		}
		m.applied = false
		m.endLiftLocked("monitor closed")
		m.actMu.Unlock()
		m.subMu.Lock()
		for _, ch := range m.subs {
			close(ch)
		}
		m.subs = nil
		m.subMu.Unlock()
	})
	return nil
}

var bg = context.Background()
