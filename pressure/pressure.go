package pressure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcend"
)

// Defaults of Config.
const (
	// DefaultWindow is the span over which the GC's CPU share is measured:
	// long enough that one slow cycle or a start-up burst does not count,
	// short enough that a spiral is reported within seconds (the issue's
	// figure; golang/go#58106 reports spirals that last hours).
	DefaultWindow = 10 * time.Second
	// DefaultGCShare is the GC's share of the available CPU over the window
	// that counts as a spiral: the GC CPU limiter's own cap is 50%
	// (runtime/mgclimit.go), and a spiral measured here reaches 60-67%
	// against 13-24% in the 20 MiB-live control (TestDeathSpiralChild).
	// The share includes the GC's idle-priority mark workers, which run
	// on Ps the program leaves idle: with one busy goroutine on 2 cores,
	// they are a third of the spiral's GC time (0.59 in all, 0.39 without
	// /cpu/classes/gc/mark/idle). That CPU is spent all the same, and
	// counts against a container's CPU quota.
	DefaultGCShare = 0.5
	// DefaultLiveRatio is the share of GOMEMLIMIT the live heap must reach:
	// the same 90% at which limits pools see heap pressure
	// (limits.DefaultHeapPressure). A GC that is busy with a live heap far
	// under the limit is a GOGC matter, not a spiral.
	DefaultLiveRatio = 0.9
	// DefaultLiftStep is the share of GOMEMLIMIT added by a lift: 10%, which
	// takes a limit at 90% of the cgroup's to 99% at most.
	DefaultLiftStep = 0.1
	// DefaultLiftFor is how long a lift lasts; TiDB lifts its limit for a
	// minute after a limit-triggered GC.
	DefaultLiftFor = time.Minute
	// DefaultMinInterval is the least time between two actions on kernel
	// signals: the window of the default PSI trigger, so that a sustained
	// stall gives one trim per window at most.
	DefaultMinInterval = 2 * time.Second
	// DefaultStall and DefaultStallWindow are the PSI trigger: "some" tasks
	// stalled on memory for 200 ms within 2 s, systemd's default
	// (MemoryPressureThresholdSec=, systemd.resource-control(5)). A 2 s
	// window is also the one an unprivileged process may use (Linux 6.5
	// and later accept only multiples of 2 s without CAP_SYS_RESOURCE).
	DefaultStall       = 200 * time.Millisecond
	DefaultStallWindow = 2 * time.Second
)

// Watch selects the kernel pressure source.
type Watch int

const (
	// WatchAuto picks the first that applies: systemd's protocol when
	// $MEMORY_PRESSURE_WATCH is set, the cgroup (v2 memory.pressure, v1
	// memory.pressure_level), then /proc/pressure/memory.
	WatchAuto Watch = iota
	// WatchOff runs no watcher.
	WatchOff
	// WatchSystemd uses only $MEMORY_PRESSURE_WATCH.
	WatchSystemd
	// WatchCgroup uses only the process's memory cgroup.
	WatchCgroup
	// WatchSystem uses only the system-wide /proc/pressure/memory.
	WatchSystem
)

// Config configures Start. The zero value is the default: the death-spiral
// detector on with no lift and no shedding, the kernel watcher on the first
// source that applies, acting at most every 2 s.
type Config struct {
	// Logger receives the WARN of each episode and the INFO of its end.
	// Default: slog.Default().
	Logger *slog.Logger

	// SpiralOff turns the death-spiral detector off. Default: false.
	SpiralOff bool
	// Window is the span of the GC CPU share, in [1s, 10m]. An episode can
	// begin once a quarter of it has been seen. Default: DefaultWindow (10 s).
	Window time.Duration
	// GCShare is the GC's share of the available CPU over Window that makes
	// an episode, in (0.0, 1.0]. Default: DefaultGCShare (0.5).
	GCShare float64
	// LiveRatio is the share of GOMEMLIMIT that the live heap (the median
	// of /gc/heap/live over the last 8 GC ends) must reach, in (0.0, 1.0].
	// Without GOMEMLIMIT there is no episode.
	// Default: DefaultLiveRatio (0.9).
	LiveRatio float64
	// Shed is called with true when an episode begins and false when it
	// ends (in that order, from a goroutine of the Monitor), so that the
	// service refuses new large work (limits pools: refuse large Grows with
	// resource_exhausted, HTTP 429) rather than slowing every request.
	// Trade-off: requests are refused that would have succeeded slowly.
	// Default: nil (nothing is shed).
	Shed func(on bool)
	// LiftOff turns the GOMEMLIMIT lift off even when LiftCeiling is set.
	// Default: false.
	LiftOff bool
	// LiftCeiling is the highest GOMEMLIMIT a lift may set, in bytes: the
	// cgroup memory limit (package memctl sets it when it derived
	// GOMEMLIMIT from the cgroup). 0 turns lifting off. A lift raises GOMEMLIMIT by
	// LiftStep of its value, at most to LiftCeiling, for LiftFor, then
	// restores it (unless something else changed GOMEMLIMIT meanwhile), and
	// does not lift again for LiftFor after. It never lifts when the
	// operator set GOMEMLIMIT in the environment. Trade-off: the GC gets
	// room and the CPU back, but non-heap memory then has less headroom
	// under the cgroup limit, so a lift can turn a slow process into an
	// OOM-killed one if the heap keeps growing. Default: 0 (off).
	LiftCeiling int64
	// Lift, when set, is how a lift is applied instead of
	// debug.SetMemoryLimit: it adds extra bytes to the GOMEMLIMIT that its
	// owner sets (extra 0 ends the lift) and returns GOMEMLIMIT before and
	// after, and false when it changed nothing. Package memctl passes
	// limits.MemLimiter.Lift, so that the GOMEMLIMIT refresh keeps the lift
	// and does not take it for the program's own change. Default: nil.
	Lift func(extra int64) (from, to int64, ok bool)
	// LiftStep is the share of GOMEMLIMIT a lift adds, in (0.0, 1.0].
	// Default: DefaultLiftStep (0.1).
	LiftStep float64
	// LiftFor is how long a lift lasts, in [1s, 1h].
	// Default: DefaultLiftFor (1 minute).
	LiftFor time.Duration

	// Watch selects the kernel pressure source. Default: WatchAuto.
	Watch Watch
	// Trim is called on a kernel signal that the process can relieve (see
	// Makeup.Anonymous; for host-wide PSI on every signal), in the
	// watcher's goroutine, to return freed memory. It must pass the gate of
	// every trim: the facade passes the trimmer's
	// Request(trim.OriginPressure), which skips a trim with too little to
	// release or past the 2% CPU budget, never a forced TrimNow.
	// Default: nil.
	Trim func()
	// CancelLargest is called after Trim on a kernel signal whose memory
	// is mostly anonymous (Makeup.Anonymous: more anonymous memory than
	// reclaimable page cache, for host-wide PSI in /proc/meminfo), to
	// cancel the largest request in flight; never when the makeup could
	// not be read, and for host-wide PSI only when this process holds at
	// least half of the host's anonymous memory (RssAnon in
	// /proc/self/status against AnonPages: a neighbour's anonymous memory
	// is not relieved by a cancel here); see Stats.CancelsHeld.
	// Default: nil.
	CancelLargest func()
	// MinInterval is the least time between two actions on kernel signals,
	// in [100ms, 1m]; signals in between are counted and coalesced.
	// Default: DefaultMinInterval (2 s).
	MinInterval time.Duration
	// Stall and StallWindow are the PSI trigger ("some" stall of Stall
	// within StallWindow), with StallWindow in [500ms, 10s] (the kernel's
	// range) and Stall in (0, StallWindow]. Windows that are not a multiple
	// of 2 s need CAP_SYS_RESOURCE. Default: DefaultStall (200 ms) and
	// DefaultStallWindow (2 s).
	Stall, StallWindow time.Duration

	// makeup replaces the reading of what the memory under pressure is
	// made of; for tests (export_test.go).
	makeup func() (Makeup, error)
}

// Kind is the kind of an Event.
type Kind int

const (
	// KindSpiral: a GC death-spiral episode began.
	KindSpiral Kind = iota + 1
	// KindSpiralEnd: the episode ended.
	KindSpiralEnd
	// KindKernel: the kernel signalled memory pressure and the watcher acted.
	KindKernel
)

// String returns "spiral", "spiral end" or "kernel".
func (k Kind) String() string {
	switch k {
	case KindSpiral:
		return "spiral"
	case KindSpiralEnd:
		return "spiral end"
	case KindKernel:
		return "kernel"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one thing a subscriber is told.
type Event struct {
	Kind Kind
	Time time.Time
	// GCShare is the GC's share of the available CPU over Span, in [0, 1];
	// GoMemLimit is in bytes at the GC end that decided; LiveHeap is the
	// live heap the rule compared with it, in bytes: for KindSpiral the
	// median of the last 8 GC ends (at least LiveRatio × GoMemLimit; one
	// GC end's figure swings by tens of MiB, as it counts what was
	// allocated during the mark), for KindSpiralEnd the last GC end's;
	// LimiterEngaged is true when the GC CPU limiter engaged within Span
	// (KindSpiral, KindSpiralEnd).
	GCShare        float64
	Span           time.Duration
	LiveHeap       int64
	GoMemLimit     int64
	LimiterEngaged bool
	// Source names the kernel source and Signals counts the kernel signals
	// this action answers (KindKernel; more than one when they were
	// coalesced during MinInterval).
	Source  string
	Signals int64
	// Makeup is what the memory under pressure was made of when the
	// watcher acted (KindKernel): anonymous memory and reclaimable page
	// cache, -1 when unknown.
	Makeup Makeup
}

// MemoryEvents are the cgroup v2 memory.events counters (see the kernel's
// Documentation/admin-guide/cgroup-v2.rst); -1 for a counter the kernel
// does not have, and all -1 outside a cgroup v2 memory cgroup.
type MemoryEvents struct {
	Low, High, Max, OOM, OOMKill, OOMGroupKill int64
}

// Stats is a snapshot of a Monitor's counters.
type Stats struct {
	// Source is the kernel source watched, "" when none.
	Source string
	// Spirals counts death-spiral episodes; InSpiral is true during one.
	Spirals  int64
	InSpiral bool
	// GCShare, LiveHeap (bytes) and GCCycles are the figures of the last GC
	// end the detector saw.
	GCShare  float64
	LiveHeap int64
	GCCycles int64
	// Lifts counts GOMEMLIMIT lifts; Lifted is the bytes GOMEMLIMIT is
	// lifted by now, 0 when it is not.
	Lifts  int64
	Lifted int64
	// Signals counts kernel signals, Acted the actions taken on them (at
	// most one per MinInterval; each asks for a trim through its gate).
	Signals int64
	Acted   int64
	// LeftToKernel counts the times the watcher did not act on a cgroup's
	// signal because its memory was mostly reclaimable page cache (see
	// Makeup.Anonymous): the kernel reclaiming cache at the limit, which
	// neither a trim nor a cancel relieves. CancelsHeld counts signals
	// acted on without CancelLargest: host-wide ones for the same reason
	// or because the host's anonymous memory is mostly not this process's,
	// and any whose makeup could not be read (a memory.stat or
	// /proc/meminfo unreadable, malformed or lacking a line; one WARN
	// names the file).
	LeftToKernel int64
	CancelsHeld  int64
	// Dropped counts events not delivered because a subscriber's channel
	// was full.
	Dropped int64
	// MemoryEvents are the cgroup's memory.events counters, read by Stats.
	MemoryEvents MemoryEvents
}

// Monitor runs the death-spiral detector and the kernel watcher. Its
// methods are safe for concurrent use; a nil *Monitor does nothing.
type Monitor struct {
	cfg    Config
	log    *slog.Logger
	events string // memory.events path, "" when not cgroup v2

	subMu sync.Mutex
	subs  atomic.Pointer[[]*subscriber]

	spiral   *spiral
	gcSub    *gcend.Subscription
	actMu    sync.Mutex // serializes episode actions and lifts
	applied  bool       // episode state the actions were taken for
	lift     lift
	epMu     sync.Mutex // orders episodes.Add against Close's Wait
	episodes sync.WaitGroup

	watch *watcher

	spirals, lifts, lifted  atomic.Int64
	signals, acted, dropped atomic.Int64
	leftToKernel, held      atomic.Int64
	inSpiral                atomic.Bool
	lastShare               atomic.Uint64 // float64 bits
	lastLive, lastCycles    atomic.Int64
	closeOnce               sync.Once
	closed                  atomic.Bool
}

type subscriber struct {
	ch   chan Event
	once sync.Once
}

// ErrNoSource is matched (errors.Is) by Start's error when no kernel
// pressure source can be watched here; it also matches
// errors.ErrUnsupported. The detector runs all the same.
var ErrNoSource = fmt.Errorf("pressure: no kernel memory pressure source: %w", errors.ErrUnsupported)

// Start validates cfg, installs the detector's GC-end hook and starts the
// watcher's goroutine. An invalid cfg is an error and nothing is started
// (nil Monitor). When the watcher cannot start (no source, a file that
// cannot be opened), the Monitor is returned with the detector running and
// an error that says why (matching ErrNoSource when there was nothing to
// watch). Close the Monitor when done.
func Start(cfg Config) (*Monitor, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	m := &Monitor{cfg: cfg, log: cfg.Logger}
	m.subs.Store(new([]*subscriber))
	if l, err := cgroupfs.Of(0); err == nil && l.Version == 2 {
		m.events = l.Dir + "/memory.events"
	}
	if !cfg.SpiralOff {
		m.spiral = newSpiral(cfg.Window, cfg.GCShare, cfg.LiveRatio)
		m.gcSub = gcend.Subscribe(m.gcEnd)
	}
	var err error
	if cfg.Watch != WatchOff {
		m.watch, err = startWatcher(m, os.Getenv)
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
	dur("Window", &c.Window, DefaultWindow, time.Second, 10*time.Minute)
	ratio("GCShare", &c.GCShare, DefaultGCShare)
	ratio("LiveRatio", &c.LiveRatio, DefaultLiveRatio)
	ratio("LiftStep", &c.LiftStep, DefaultLiftStep)
	dur("LiftFor", &c.LiftFor, DefaultLiftFor, time.Second, time.Hour)
	if c.LiftCeiling < 0 {
		errs = append(errs, fmt.Errorf("pressure: Config.LiftCeiling %d is negative", c.LiftCeiling))
	}
	dur("MinInterval", &c.MinInterval, DefaultMinInterval, 100*time.Millisecond, time.Minute)
	dur("StallWindow", &c.StallWindow, DefaultStallWindow, 500*time.Millisecond, 10*time.Second)
	dur("Stall", &c.Stall, DefaultStall, time.Microsecond, c.StallWindow)
	if c.Watch < WatchAuto || c.Watch > WatchSystem {
		errs = append(errs, fmt.Errorf("pressure: Config.Watch %d is not a Watch", c.Watch))
	}
	return errors.Join(errs...)
}

// Source names the kernel source watched, "" when none. The system-wide
// PSI is named "host-wide PSI ...": it is the whole host's pressure, not
// the container's (see SourceNote).
func (m *Monitor) Source() string {
	if m == nil || m.watch == nil {
		return ""
	}
	return m.watch.name
}

// SourceNote says, when the source is the host-wide PSI, why the
// process's own cgroup could not be watched: "read-only cgroup mount", "no
// memory controller", "no memory limit" (cgroup v1, whose pressure level
// then fires on any reclaim of the host's cache), "the cgroup's own source
// failed" or "Config.Watch is WatchSystem", followed by the errors; when
// the source is the cgroup's memory.events because its PSI trigger was
// refused, why in a few words ("PSI trigger refused: EPERM at the cgroup
// namespace root (nsdelegate)", "... read-only cgroup mount", "no PSI in
// this kernel ..."), and the same EPERM words lead the host-wide note of a
// container whose limit is above its namespace root; "" for any other
// source.
func (m *Monitor) SourceNote() string {
	if m == nil || m.watch == nil {
		return ""
	}
	return m.watch.note
}

// Subscribe returns a channel that receives every event from now on, with
// room for buf events (buf < 1 means 1): when it is full, an event is
// dropped and counted in Stats.Dropped, never waited for. cancel closes the
// channel; Close closes every channel. Safe for concurrent use; on a nil or
// closed Monitor the channel is closed at once.
func (m *Monitor) Subscribe(buf int) (events <-chan Event, cancel func()) {
	s := &subscriber{ch: make(chan Event, max(buf, 1))}
	if m == nil {
		close(s.ch)
		return s.ch, func() {}
	}
	m.subMu.Lock()
	defer m.subMu.Unlock()
	if m.closed.Load() {
		close(s.ch)
		return s.ch, func() {}
	}
	old := *m.subs.Load()
	next := append(old[:len(old):len(old)], s)
	m.subs.Store(&next)
	return s.ch, func() { m.unsubscribe(s) }
}

func (m *Monitor) unsubscribe(s *subscriber) {
	m.subMu.Lock()
	defer m.subMu.Unlock()
	old := *m.subs.Load()
	next := make([]*subscriber, 0, len(old))
	for _, x := range old {
		if x != s {
			next = append(next, x)
		}
	}
	m.subs.Store(&next)
	s.once.Do(func() { close(s.ch) })
}

// publish sends e to every subscriber without blocking. The send and the
// close of a channel are both under subMu, so a send never hits a closed
// channel; subMu is held only for the non-blocking sends.
func (m *Monitor) publish(e Event) {
	m.subMu.Lock()
	defer m.subMu.Unlock()
	for _, s := range *m.subs.Load() {
		select {
		case s.ch <- e:
		default:
			m.dropped.Add(1)
		}
	}
}

// Stats returns a snapshot of the counters, and reads memory.events in
// cgroup v2 (a few microseconds; all -1 otherwise or on error).
func (m *Monitor) Stats() Stats {
	s := m.Counters()
	if m != nil && m.events != "" {
		if e, err := cgroupfs.ReadEvents(m.events); err == nil {
			s.MemoryEvents = MemoryEvents(e)
		}
	}
	return s
}

// Counters returns Stats without reading memory.events (its counters all
// -1): atomic loads only, for a caller at the end of every GC cycle. Safe
// for concurrent use.
func (m *Monitor) Counters() Stats {
	if m == nil {
		return Stats{MemoryEvents: MemoryEvents{-1, -1, -1, -1, -1, -1}}
	}
	s := Stats{
		Source:       m.Source(),
		Spirals:      m.spirals.Load(),
		InSpiral:     m.inSpiral.Load(),
		GCShare:      math.Float64frombits(m.lastShare.Load()),
		LiveHeap:     m.lastLive.Load(),
		GCCycles:     m.lastCycles.Load(),
		Lifts:        m.lifts.Load(),
		Lifted:       m.lifted.Load(),
		Signals:      m.signals.Load(),
		Acted:        m.acted.Load(),
		LeftToKernel: m.leftToKernel.Load(),
		CancelsHeld:  m.held.Load(),
		Dropped:      m.dropped.Load(),
	}
	s.MemoryEvents = MemoryEvents{-1, -1, -1, -1, -1, -1}
	return s
}

// Close removes the GC-end hook, stops the watcher and waits for its
// goroutine and for episode actions in flight, ends a lift (restoring
// GOMEMLIMIT) and closes every subscriber's channel. An episode in progress
// is ended with Shed(false). Idempotent; returns nil.
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
		if m.applied && m.cfg.Shed != nil {
			m.cfg.Shed(false)
		}
		m.applied = false
		m.endLiftLocked("monitor closed")
		m.actMu.Unlock()
		m.subMu.Lock()
		for _, s := range *m.subs.Load() {
			s.once.Do(func() { close(s.ch) })
		}
		m.subs.Store(new([]*subscriber))
		m.subMu.Unlock()
	})
	return nil
}

var bg = context.Background()

// act answers kernel signals of w with what the process can relieve, mk
// being what the memory under pressure is made of: a cgroup's signal while
// its memory is known to be mostly page cache is left to the kernel
// (false); otherwise Trim (through its gate), CancelLargest only when the
// memory is known to be mostly anonymous (held on an unknown makeup) and,
// for host-wide PSI, mostly this process's, then the event (true).
func (m *Monitor) act(w *watcher, signals int64, mk Makeup) bool {
	anon := mk.Anonymous()
	if mk.Known() && !anon && !w.hostWide {
		m.leftToKernel.Add(1)
		return false
	}
	m.acted.Add(1)
	if m.cfg.Trim != nil {
		m.cfg.Trim()
	}
	if m.cfg.CancelLargest != nil {
		if anon && (!w.hostWide || mk.ownsHostAnon()) {
			m.cfg.CancelLargest()
		} else {
			m.held.Add(1)
		}
	}
	m.publish(Event{Kind: KindKernel, Time: time.Now(), Source: w.name, Signals: signals, Makeup: mk})
	return true
}
