package limits

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
)

// MemLimiter keeps GOMEMLIMIT at its MemLimitConfig's share of the memory
// limit. It re-reads the limit at GC ends (at most once per Refresh) and when
// a limit file is written (see Following), and sets GOMEMLIMIT again when the
// hard limit changed or the result moved by 1% or more (toward memory.high:
// 5%). It never overrides the operator's environment, never replaces a limit
// the program set with "no limit", and stops when the program changes
// GOMEMLIMIT after memctl set it (docs/gomemlimit.md). Its methods are safe
// for concurrent use; a nil *MemLimiter does nothing.
type MemLimiter struct {
	fallback bool
	every    time.Duration
	log      *slog.Logger
	limDeps
	self selfReads // the default read, charge and usage; with mu held

	epoch    time.Time
	next     atomic.Int64 // nanoseconds since epoch of the next due re-read
	last     atomic.Pointer[MemLimit]
	disown   func() // removes m as GOMEMLIMIT's owner (gomemlimit.SetOwner)
	subMu    sync.Mutex
	subs     []chan MemLimit
	onChange func(MemLimit)
	sub      *gcend.Subscription

	on bool // the configuration is valid
	// op is the operator's GOMEMLIMIT (math.MaxInt64: "off"; 0: none), opText
	// as set; opWrites: memctl may override op above the hard limit.
	op       int64
	opText   string
	opWrites bool
	mu       sync.Mutex // serializes decisions; limState and the fields below
	limState
	before       int64             // GOMEMLIMIT before memctl set it
	charges      map[string]charge // the last account read from each cgroup directory
	seen         map[string]bool
	stopped      bool
	decl         declared // the limit the environment declares (hasDecl)
	hasDecl      bool
	oneBound     [1]cgroupfs.Bound      // found.bounds of a limit read without Bounds
	boundCharges []chargeRead           // planInputs.boundCharges' buffer
	following    atomic.Pointer[string] // Following
	poked        atomic.Int64           // nanoseconds since epoch of the last Poke re-read
	folMu        sync.Mutex             // fol, folClosing
	fol          follower               // nil until started
	folClosing   bool
	folDone      chan struct{}
	closed       atomic.Bool // Close was called: Poke re-reads nothing
}

const maxSeen = 64 // distinct failures remembered, and logged once each

// NewMemLimiter sets GOMEMLIMIT as SetGoMemLimit does and starts the refresh
// unless cfg.Refresh is negative, the operator's environment wins, or cfg is
// invalid. It always returns a usable *MemLimiter (Close it to stop the
// refresh), the decision, and SetGoMemLimit's error.
func NewMemLimiter(cfg MemLimitConfig) (*MemLimiter, MemLimit, error) {
	m := newMemLimiter(cfg)
	d := MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}
	m.sandbox = detectSandbox()
	d.Sandbox = m.sandbox
	m.readDeclaredEnv()
	if reason, err := m.configure(cfg, d.GoMemLimit); err != nil {
		d.Reason = reason
		m.store(d)
		return m, d, err
	}
	m.on = true
	m.disown = gomemlimit.SetOwner(m) // lifts (package pressure) come here
	m.mu.Lock()
	d, err := m.decide(true)
	m.mu.Unlock()
	m.startRefresh()
	return m, d, err
}

// limDeps are the limiter's reads and what starts its refresh; nil is the
// real one. Tests set them in MemLimitConfig.deps.
type limDeps struct {
	read     func() (cgroupfs.Limit, error)
	usage    func() (held, goMapped int64, err error)
	charge   func(version int, dir string) (charge, error)
	live     func() int64
	follower func() (follower, error)
	noGCEnd  bool // no re-read at GC ends
}

// newMemLimiter returns a MemLimiter with cfg's fields and hooks; it reads nothing.
func newMemLimiter(cfg MemLimitConfig) *MemLimiter {
	m := &MemLimiter{
		fallback: cfg.SystemFallback, log: cfg.Logger,
		limDeps: cfg.deps, epoch: time.Now(), onChange: cfg.OnChange,
		seen: make(map[string]bool), charges: make(map[string]charge),
	}
	m.headroom = !cfg.NoHeadroom
	if m.charge == nil {
		m.charge = m.self.charge
	}
	if m.live == nil {
		m.live = readLive
	}
	if m.read == nil {
		m.read = m.self.limit.Read
	}
	if m.usage == nil {
		m.usage = m.self.usage
	}
	if m.follower == nil {
		m.follower = newFollower
	}
	return m
}

// readDeclaredEnv sets m.decl and m.hasDecl; a bad value is logged at WARN.
func (m *MemLimiter) readDeclaredEnv() {
	var bad []error
	held, _, uerr := m.usage()
	if uerr != nil {
		held = 0 // not known: only the value itself is judged
	}
	m.decl, m.hasDecl, bad = readDeclared(held)
	for _, err := range bad {
		if m.log != nil {
			m.log.Warn("limits: declared memory limit", "error", err)
		}
	}
}

// configure sets m's ratio, operator, floor and interval; cur is GOMEMLIMIT
// now. On a bad value it returns the Reason and the error.
func (m *MemLimiter) configure(cfg MemLimitConfig, cur int64) (reason string, err error) {
	m.ratio, m.ratioFrom = cfg.Ratio, "configured"
	if m.ratio == 0 {
		m.ratio, m.ratioFrom = defaultRatio, "default"
	}
	if err := m.operatorEnv(cfg, cur); err != nil {
		return "GOMEMLIMIT left as it was: bad AUTOMEMLIMIT", err
	}
	if !validRatio(m.ratio) {
		return "GOMEMLIMIT left as it was: bad ratio", fmt.Errorf("limits: GOMEMLIMIT ratio %v: want a ratio in (0.0, 1.0]", m.ratio)
	}
	if m.floor = cmp.Or(cfg.Floor, defaultFloor); m.floor < 0 {
		return "GOMEMLIMIT left as it was: bad floor", fmt.Errorf("limits: GOMEMLIMIT floor %d: want a byte count of 0 (the default, %d) or more", cfg.Floor, defaultFloor)
	}
	m.every = cmp.Or(cfg.Refresh, DefaultRefresh)
	return "", nil
}

// operatorEnv reads GOMEMLIMIT and AUTOMEMLIMIT into m.op, m.opText,
// m.opWrites and m.ratio; a bad AUTOMEMLIMIT is an error.
func (m *MemLimiter) operatorEnv(cfg MemLimitConfig, cur int64) error {
	// An empty GOMEMLIMIT is unset, as runtime.readGOMEMLIMIT reads it.
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		m.op, m.opText = cur, "GOMEMLIMIT="+v
		m.opWrites = !cfg.KeepOperator && cur != math.MaxInt64
	} else if v, ok := envflag.Lookup("AUTOMEMLIMIT"); ok {
		r, err := envflag.Ratio("AUTOMEMLIMIT", os.Getenv("AUTOMEMLIMIT"), m.ratio)
		if err != nil {
			return fmt.Errorf("limits: %w", err)
		}
		switch {
		case r == 0:
			m.op, m.opText = cur, "AUTOMEMLIMIT="+v
		case !envflag.IsOn(v):
			m.ratio, m.ratioFrom = r, "AUTOMEMLIMIT"
		}
	}
	return nil
}

// startRefresh starts the re-read at GC ends and, with a memory cgroup, the
// follower. Called without m.mu.
func (m *MemLimiter) startRefresh() {
	if m.every <= 0 {
		return
	}
	m.next.Store(int64(m.every))
	if !m.noGCEnd {
		m.sub = gcend.Subscribe(m.atGCEnd)
	}
	m.mu.Lock()
	found := m.dir != "" && !m.stopped
	m.mu.Unlock()
	if found {
		m.startFollow()
	}
}

// Refresh re-reads the limit now, sets GOMEMLIMIT as the refresh does, and
// returns the decision and its error. It returns Last, doing nothing, when the
// operator's environment wins, the configuration was invalid, or the program
// took GOMEMLIMIT over.
func (m *MemLimiter) Refresh() (MemLimit, error) {
	if m == nil {
		return MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.stopped {
		return m.Last(), nil
	}
	m.next.Store(dueAfter(time.Since(m.epoch), m.every))
	return m.decide(false)
}

// Last returns the latest decision.
func (m *MemLimiter) Last() MemLimit {
	if m == nil {
		return MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}
	}
	return *m.last.Load()
}

// Interval returns the least time between two re-reads, 0 when there is no
// refresh.
func (m *MemLimiter) Interval() time.Duration {
	if m == nil || m.sub == nil {
		return 0
	}
	return m.every
}

// Close stops the refresh and the follower, waits for its goroutine, and
// closes the files kept open; GOMEMLIMIT stays as it is. Idempotent.
func (m *MemLimiter) Close() {
	if m != nil {
		m.closed.Store(true)
		if m.disown != nil {
			m.disown()
		}
		m.sub.Stop()
		m.closeFollow()
		m.subMu.Lock()
		for _, ch := range m.subs {
			close(ch)
		}
		m.subs = nil
		m.subMu.Unlock()
		m.mu.Lock()
		m.self.close()
		m.mu.Unlock()
	}
}

// store publishes d and, when what is in force changed, tells the
// subscribers and OnChange. Called with m.mu held, or before m is shared.
func (m *MemLimiter) store(d MemLimit) {
	prev := m.last.Load()
	if prev != nil && *prev == d {
		return
	}
	m.last.Store(new(d))
	if prev != nil && prev.GoMemLimit == d.GoMemLimit && prev.MemoryLimit == d.MemoryLimit && prev.High == d.High &&
		prev.Source == d.Source && prev.File == d.File && prev.Overridden == d.Overridden {
		return
	}
	m.subMu.Lock()
	for _, ch := range m.subs { // the latest wins: a full channel gives up its oldest value
		select {
		case ch <- d:
		default:
			select {
			case <-ch:
			default:
			}
			select {
			case ch <- d:
			default:
			}
		}
	}
	m.subMu.Unlock()
	if m.onChange != nil && prev != nil {
		m.onChange(d)
	}
}

// Subscribe returns a channel that receives the decision each time what is in
// force changes (GOMEMLIMIT, the limit, memory.high, their source, the
// operator's value). buf is its room, at least 1; when full, the oldest
// decision is dropped. cancel, or Close, closes the channel; on a nil
// *MemLimiter it is closed at once.
func (m *MemLimiter) Subscribe(buf int) (changes <-chan MemLimit, cancel func()) {
	ch := make(chan MemLimit, max(buf, 1))
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
	return ch, func() {
		m.subMu.Lock()
		defer m.subMu.Unlock()
		if i := slices.Index(m.subs, ch); i >= 0 {
			m.subs = slices.Delete(m.subs, i, i+1)
			close(ch)
		}
	}
}

// atGCEnd re-reads at a GC end once the interval has passed, unless a
// re-read is running.
func (m *MemLimiter) atGCEnd(*gcend.Sample) bool { return m.tick(time.Since(m.epoch)) }

func (m *MemLimiter) tick(now time.Duration) bool {
	if int64(now) < m.next.Load() {
		return true
	}
	if !m.mu.TryLock() {
		return true
	}
	defer m.mu.Unlock()
	m.next.Store(dueAfter(now, m.every))
	if m.stopped {
		return false
	}
	_, _ = m.decide(false)
	return !m.stopped
}

// dueAfter returns now + every, or math.MaxInt64 (never) when that overflows.
func dueAfter(now, every time.Duration) int64 {
	if every > math.MaxInt64-now {
		return math.MaxInt64
	}
	return int64(now + every)
}

// decide reads, sets GOMEMLIMIT, records and returns the decision; first
// (NewMemLimiter's call) returns its errors unlogged. Called with m.mu held.
// In bytes, with outside(cg) = max(held − Go mapped, cg's charge − Go resident):
//
//	hard       = min over each hard limit L on the path of Ratio × L − outside(L's cgroup), ≥ floor
//	target     = max(Ratio × memory.high − outside(its cgroup), liveHeapFactor × live heap, floor)
//	GOMEMLIMIT = min(hard, target)
//
// A fall of the target is followed only in steps of 1/20 (hysteresis).
func (m *MemLimiter) decide(first bool) (d MemLimit, err error) {
	gomemlimit.Do(func() { d, err = m.decideLocked(first) })
	m.store(d)
	return d, err
}

func (m *MemLimiter) decideLocked(first bool) (MemLimit, error) {
	cur := gomemlimit.Read()
	if expect := m.expected(); expect != 0 && cur != expect {
		m.stopped = true
		m.info(fmt.Sprintf("limits: GOMEMLIMIT was changed to %d by the program; memctl no longer refreshes it", cur))
		return MemLimit{GoMemLimit: cur, Reason: "GOMEMLIMIT was set by the program after memctl"}, nil
	}
	r := compute(m.readPlan(first, cur))
	m.limState, m.said = r.st, r.d.Reason
	for _, w := range r.warns {
		m.warn(w.first, w.key, w.err)
	}
	if m.op != 0 {
		return m.applyOperator(r.d, r.a, first), r.err
	}
	return m.apply(r.d, r.a, cur, first), r.err
}

// expected returns the GOMEMLIMIT memctl set last, or the operator's; 0: none.
func (m *MemLimiter) expected() int64 {
	if m.applied != 0 {
		return m.applied
	}
	return m.op
}
