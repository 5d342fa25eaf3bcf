package memctl

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/arenamax"
	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/history"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// Report is what Start decided.
type Report struct {
	// Off is true when MEMCTL=off (or another off word, or an invalid
	// value) switched memctl off. Then nothing was changed: THPPolicy is
	// thp.PolicyKeep, MemLimit holds GOMEMLIMIT as it is (math.MaxInt64
	// when none is set, Source limits.SourceNone), TrimDelay is 0.
	Off bool
	// THPPolicy is the policy applied, THPState the process state read back
	// after it (PR_GET_THP_DISABLE), THPSystem the system mode
	// (/sys/kernel/mm/transparent_hugepage/enabled, "" if unknown).
	// THPNote says why the policy was chosen when it is not the one asked
	// for or the default, and that child processes inherit the flag.
	THPPolicy thp.Policy
	THPState  thp.State
	THPSystem string
	THPNote   string
	// MemLimit is the GOMEMLIMIT decision at Start (its Reason is never empty);
	// MemLimitRefresh the least time between two re-reads of the limit at GC
	// end, 0 when there is no refresh (MEMCTL_REFRESH=off, the operator's
	// GOMEMLIMIT).
	MemLimit        limits.MemLimit
	MemLimitRefresh time.Duration
	// TrimDelay is the trim delay; 0 means trimming is off.
	TrimDelay time.Duration
	// CHeap names the allocator that owns malloc, whose C heap the trim
	// releases: "glibc", "jemalloc", "mimalloc", "tcmalloc", or "none" when
	// the C heap step is unavailable (cgo off, musl, not Linux).
	CHeap string
	// CHeaps names every allocator found (cheap.Heap.Name), the owner of
	// malloc first, untrimmed ones marked so; filled at each Report call.
	// Empty when the C heap step is unavailable.
	CHeaps []string
	// ArenaMax is the glibc arena cap applied, 0 when none was; ArenaMaxNote
	// says why not (switched off, operator's setting, not glibc, cgo off, an
	// invalid value) when it is 0.
	ArenaMax     int
	ArenaMaxNote string
	// Pressure names the kernel memory-pressure source watched, "none" when
	// there is none; PressureNote says why it is not the cgroup's own PSI
	// trigger when it is not (pressure.Monitor.SourceNote).
	Pressure     string
	PressureNote string
	// AutoBurst reports that bursts are detected at GC end (WithAutoBurst,
	// MEMCTL_AUTOBURST); false when that or trimming is off.
	AutoBurst bool
}

// Stats is a snapshot of the controller's counters.
type Stats struct {
	// Trim holds the trimmer's counters (zero when trimming is off).
	Trim trim.Stats
	// GoMemLimit is GOMEMLIMIT now, in bytes (math.MaxInt64: no limit).
	GoMemLimit int64
	// Misuse counts the process's misuse of the package so far, each kind
	// logged once at WARN: wiring mistakes (see the package doc) and end funcs
	// of Begin called more often than Begin (including Trim.Misuse). SetStrict
	// makes the extra end panic instead.
	Misuse int64
	// CHeap holds the statistics of the allocator that owns malloc, -1 where
	// unknown (all of them when the C heap step is unavailable); see
	// cheap.Step.Stats for their cost.
	CHeap cheap.Stats
	// CHeaps holds every allocator found in the process, the owner of malloc
	// first, with its figures and what the trims released from it (see
	// cheap.Step.Heaps).
	CHeaps []cheap.Heap
	// Pressure holds the death-spiral and kernel-pressure counters and the
	// cgroup v2 memory.events counters (all -1 elsewhere).
	Pressure pressure.Stats
	// AutoBurst holds the burst detector's counters (zero when it is off).
	AutoBurst trim.AutoBurstStats
	// Swap holds the process's VmSwap and its cgroup's swap (SwapStats).
	Swap SwapStats
}

// Controller owns what Start set up: the trimmer, the GOMEMLIMIT refresh and
// the pressure monitor. Its methods are safe for concurrent use; a nil
// *Controller, and one whose Start found MEMCTL=off, does nothing.
type Controller struct {
	report    Report
	trimmer   *trim.Trimmer
	limiter   *limits.MemLimiter
	monitor   *pressure.Monitor
	untrim    func()             // removes the pressure trim from internal/relief
	auto      trimwire.AutoBurst // nil: no burst detector
	once      sync.Once
	startedBy string   // Start's caller, for the second-Start warning
	rec       recorder // the state record (state.go)
	swap      swapSource
	hist      history.Ring // the last minutes, for Handler's page
	histOff   atomic.Bool  // benchmarks of the GC-end path without it
}

// Start applies memctl's settings (see the package doc and each option) to
// this process and returns the controller that owns them. Call it once, at
// the top of main (the THP flag does not split pages already huge), and
// defer its Close.
//
// It logs one INFO line with what it decided and one WARN line for each part
// it skipped, so the caller need not log the error again. It always returns
// a usable controller: a failing part is skipped, never fatal. The error
// joins what failed (an invalid MEMCTL_* value, a malformed cgroup file, a
// refused prctl); a part unsupported here is logged and is not an error.
//
// The controller serves the package-level AfterBurst and Begin; a second
// Start while it is live is a wiring mistake (see the package doc).
func Start(opts ...Option) (*Controller, error) {
	s := &startup{cfg: newConfig(opts), c: &Controller{startedBy: caller(2)}}
	c, l := s.c, s.cfg.logger
	warnUnknownEnv(l)
	if why, off := s.switchedOff(); off {
		c.startOff(l, why)
		return c, errors.Join(s.errs...)
	}
	s.capArenas() // first: the cap stops only arenas created after it
	s.setTHP()    // next: the flag affects only memory faulted in after it is set
	s.startLimiter()
	s.startTrimmer() // before the burst detector and the pressure watch, which trim through it
	c.auto = startAutoBurst(s.cfg.autoBurst, c.trimmer, s.fail)
	c.report.AutoBurst = c.auto != nil
	c.report.CHeap = cheap.Detect().Allocator()
	s.watchPressure() // last: its trim reaches the trimmer and the limiter
	s.noteSkipped()
	c.logStarted(l)
	register(c, l)
	c.startRecord(l)
	return c, errors.Join(s.errs...)
}

// startup is one Start call's work in progress, on that call's goroutine.
type startup struct {
	cfg  config
	c    *Controller
	errs []error
}

// newConfig returns the defaults with opts applied; a nil logger discards.
func newConfig(opts []Option) config {
	cfg := config{logger: slog.Default(), thp: thp.PolicyDisable, trimDelay: trimwire.DefaultDelay, arenaMax: defaultArenaMax}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// fail reports a skipped part: errors.ErrUnsupported at INFO, anything else
// at WARN and joined to Start's error.
func (s *startup) fail(err error) {
	if errors.Is(err, errors.ErrUnsupported) {
		s.cfg.logger.Info("memctl: not supported here", "reason", err.Error())
		return
	}
	s.cfg.logger.Warn("memctl: part skipped", "error", err)
	s.errs = append(s.errs, err)
}

// switchedOff reports whether MEMCTL switches memctl off (invalid: off, an error).
func (s *startup) switchedOff() (why string, off bool) {
	v, ok := envflag.Lookup("MEMCTL")
	if !ok {
		return "", false
	}
	on, err := envflag.Bool("MEMCTL", v)
	if err != nil {
		err = fmt.Errorf("memctl: %w; memctl is off", err)
		s.cfg.logger.Warn("memctl: invalid switch", "error", err)
		s.errs = append(s.errs, err)
	}
	if on {
		return "", false
	}
	return "MEMCTL=" + v, true
}

// arenaMax returns MEMCTL_ARENA_MAX if set, else WithArenaMax; an invalid
// value is reported to fail and gives 0 (no cap).
func (s *startup) arenaMax() int {
	if v, ok := envflag.Lookup("MEMCTL_ARENA_MAX"); ok {
		n, err := envflag.Count("MEMCTL_ARENA_MAX", v, defaultArenaMax)
		if err != nil {
			s.fail(fmt.Errorf("memctl: %w; no arena cap", err))
		}
		return n
	}
	if n := s.cfg.arenaMax; n < 0 {
		s.fail(fmt.Errorf("memctl: WithArenaMax(%d): want 0 (no cap) or a count of arenas; no arena cap", n))
		return 0
	}
	return s.cfg.arenaMax
}

// capArenas applies the glibc arena cap and sets ArenaMax or ArenaMaxNote.
func (s *startup) capArenas() {
	n := s.arenaMax()
	if n <= 0 {
		if len(s.errs) == 0 {
			s.c.report.ArenaMaxNote = "switched off (MEMCTL_ARENA_MAX or WithArenaMax)"
		}
		return
	}
	switch err := cheap.SetArenaMax(n); {
	case err == nil:
		s.c.report.ArenaMax = n
	case errors.Is(err, arenamax.ErrOperatorSet), errors.Is(err, cheap.ErrUnavailable):
		s.c.report.ArenaMaxNote = err.Error()
	default:
		s.fail(err)
	}
}

// setTHP applies the THP policy and sets the report's THP fields.
func (s *startup) setTHP() {
	r := &s.c.report
	r.THPPolicy, r.THPState, r.THPNote = applyTHP(s.cfg.thp, s.cfg.thpSet, s.fail)
	if sys, err := thp.System(); err == nil {
		r.THPSystem = string(sys.Enabled)
	}
}

// startLimiter starts the GOMEMLIMIT limiter (nil when it could not start)
// and sets the report's MemLimit fields. Once started, each change is
// marked in the history and published, then passed to WithMemLimit's
// OnChange (with the limiter locked).
func (s *startup) startLimiter() {
	c, mc := s.c, &s.cfg.memLimit
	mc.Logger = cmp.Or(mc.Logger, s.cfg.logger)
	userChange := mc.OnChange
	mc.OnChange = func(d limits.MemLimit) {
		if c.rec.started.Load() {
			c.hist.Mark(time.Now(), history.KindLimit, d.GoMemLimit)
			c.publish() // a limit followed while idle shows at once
		}
		if userChange != nil {
			userChange(d)
		}
	}
	lim, ml, err := startMemLimit(*mc, s.fail)
	if err != nil {
		s.fail(err)
	}
	c.limiter, c.report.MemLimit, c.report.MemLimitRefresh = lim, ml, lim.Interval()
}

// trimDelay returns MEMCTL_TRIM_DELAY if set, else WithTrimDelay or
// WithTrim; a value outside [MinDelay, MaxDelay] or invalid is reported to
// fail and gives 0 (no trimming).
func (s *startup) trimDelay() time.Duration {
	if v, ok := envflag.Lookup("MEMCTL_TRIM_DELAY"); ok {
		d, err := parseDelay(v)
		if err != nil {
			s.fail(fmt.Errorf("memctl: %w; trimming is off", err))
		}
		return d
	}
	if d := s.cfg.trimDelay; d != 0 && (d < trimwire.MinDelay || d > trimwire.MaxDelay) {
		s.fail(fmt.Errorf("memctl: %s: want 0 (off) or from %v to %v; trimming is off", s.cfg.delayFrom, trimwire.MinDelay, trimwire.MaxDelay))
		return 0
	}
	return s.cfg.trimDelay
}

// startTrimmer starts the trimmer unless the delay is 0 and sets the
// report's TrimDelay; a failure is reported to fail and leaves both unset.
func (s *startup) startTrimmer() {
	delay := s.trimDelay()
	if delay <= 0 {
		return
	}
	c, tc := s.c, s.cfg.trim
	tc.Delay, tc.Logger, tc.Strict = delay, cmp.Or(tc.Logger, s.cfg.logger), tc.Strict || strict.Load()
	tr, err := trim.New(tc)
	if err != nil {
		s.fail(err)
		return
	}
	trimwire.OnTrim(tr, func() { c.mark(history.KindTrim) })
	c.trimmer = tr
	c.report.TrimDelay = delay
}

// watchPressure starts the pressure watch and sets the report's Pressure fields.
func (s *startup) watchPressure() {
	c := s.c
	c.monitor = startPressure(s.cfg, c, s.fail)
	c.report.Pressure, c.report.PressureNote = cmp.Or(c.monitor.Source(), "none"), c.monitor.SourceNote()
}

// noteSkipped fills in what a skipped part left empty for the startup line.
func (s *startup) noteSkipped() {
	r := &s.c.report
	if r.MemLimit.Reason == "" { // SetGoMemLimit failed: its WARN line has the error
		r.MemLimit.GoMemLimit = debug.SetMemoryLimit(-1)
		r.MemLimit.Reason = "GOMEMLIMIT left as it was: the memory limit could not be read (see the WARN line)"
	}
	if r.ArenaMax == 0 && r.ArenaMaxNote == "" {
		r.ArenaMaxNote = "skipped (see the WARN line)"
	}
}
