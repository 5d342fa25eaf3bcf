package memctl

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/arenamax"
	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/relief"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// Report is what Start decided.
type Report struct {
	// Off: MEMCTL (off or invalid) switched memctl off and nothing changed:
	// THPPolicy is thp.PolicyKeep, MemLimit GOMEMLIMIT as it is, TrimDelay 0.
	Off bool
	// THPPolicy is the policy applied, THPState the flag read back,
	// THPSystem the system mode ("" if unknown), THPNote why the policy is
	// not the one asked for, and that child processes inherit the flag.
	THPPolicy thp.Policy
	THPState  thp.State
	THPSystem string
	THPNote   string
	// MemLimit is the GOMEMLIMIT decision at Start (Reason never empty);
	// MemLimitRefresh the least time between two re-reads at GC end, 0: none.
	MemLimit        limits.MemLimit
	MemLimitRefresh time.Duration
	// TrimDelay is the trim delay; 0 means trimming is off.
	TrimDelay time.Duration
	// CHeap names the allocator that owns malloc ("glibc", "jemalloc",
	// "mimalloc", "tcmalloc"; "none" when the C heap step is unavailable).
	CHeap string
	// CHeaps names every allocator found (cheap.Heap.Name), the owner of
	// malloc first; filled at each Report call.
	CHeaps []string
	// ArenaMax is the glibc arena cap applied; when 0, ArenaMaxNote says why.
	ArenaMax     int
	ArenaMaxNote string
	// Pressure names the kernel memory-pressure source ("none"), and
	// PressureNote why it is not the cgroup's own PSI trigger.
	Pressure     string
	PressureNote string
	// AutoBurst reports that bursts are detected at GC end.
	AutoBurst bool
}

// Stats is a snapshot of the controller's counters.
type Stats struct {
	Trim       trim.Stats // zero when trimming is off
	GoMemLimit int64      // GOMEMLIMIT now, bytes (math.MaxInt64: none)
	// Misuse counts wiring mistakes (see the package doc) and extra end
	// funcs of Begin (Trim.Misuse included), each kind logged once at WARN.
	Misuse int64
	// CHeap holds the malloc owner's statistics (-1 where unknown), CHeaps
	// every allocator found, the owner of malloc first (cheap.Step.Heaps).
	CHeap     cheap.Stats
	CHeaps    []cheap.Heap
	Pressure  pressure.Stats      // spiral, kernel pressure, memory.events (-1: none)
	AutoBurst trim.AutoBurstStats // zero when the detector is off
	Swap      SwapStats
}

// Controller owns what Start set up. Its methods are safe for concurrent use;
// a nil *Controller, and one whose Start found MEMCTL=off, does nothing.
type Controller struct {
	report    Report
	trimmer   *trim.Trimmer
	limiter   *limits.MemLimiter
	monitor   *pressure.Monitor
	untrim    func()             // removes the pressure trim from internal/relief
	auto      trimwire.AutoBurst // nil: no burst detector
	once      sync.Once
	startedBy string // Start's caller, for the second-Start warning
	rec       recorder
	hist      historyRing
	histOff   atomic.Bool // for benchmarks of the GC-end path
}

// Start applies memctl's settings (see the package doc and each option) and
// returns the controller that owns them. Call it once, at the top of main,
// and defer its Close.
//
// It logs one INFO line with what it decided and one WARN line for each part
// it skipped. It always returns a usable controller: a failing part is
// skipped. The error joins what failed (an invalid MEMCTL_* value, a
// malformed cgroup file, a refused prctl); a part unsupported here is logged
// and is not an error. The controller serves the package-level AfterBurst
// and Begin.
func Start(opts ...Option) (*Controller, error) {
	s := &startup{cfg: newConfig(opts), c: &Controller{startedBy: caller(2)}}
	c, l := s.c, s.cfg.logger
	warnUnknownEnv(l)
	if why, off := s.switchedOff(); off {
		c.startOff(l, why)
	} else {
		s.capArenas() // first: the cap stops only arenas created after it
		s.setTHP()    // next: the flag affects only memory faulted in after it is set
		s.startLimiter()
		s.startTrimmer() // before the burst detector and the pressure watch, which trim through it
		s.startAutoBurst()
		c.report.CHeap = cheap.Detect().Allocator()
		s.watchPressure() // last: its trim reaches the trimmer and the limiter
		s.noteSkipped()
		c.logStarted(l)
	}
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

// fail logs a skipped part: ErrUnsupported at INFO, else at WARN and joined
// to Start's error.
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

// capArenas applies MEMCTL_ARENA_MAX if set, else WithArenaMax; an invalid
// value is reported and gives no cap.
func (s *startup) capArenas() {
	n := s.cfg.arenaMax
	if v, ok := envflag.Lookup("MEMCTL_ARENA_MAX"); ok {
		var err error
		if n, err = envflag.Count("MEMCTL_ARENA_MAX", v, defaultArenaMax); err != nil {
			s.fail(fmt.Errorf("memctl: %w; no arena cap", err))
		}
	} else if n < 0 {
		s.fail(fmt.Errorf("memctl: WithArenaMax(%d): want 0 (no cap) or a count of arenas; no arena cap", n))
		n = 0
	}
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

func (s *startup) setTHP() {
	r := &s.c.report
	r.THPPolicy, r.THPState, r.THPNote = decideTHP(s.cfg.thp, s.cfg.thpSet, os.Getenv("GLIBC_TUNABLES"), thp.Policy.Apply, s.fail)
	if sys, err := thp.System(); err == nil {
		r.THPSystem = string(sys.Enabled)
	}
}

// startLimiter starts the GOMEMLIMIT limiter (nil on failure); each change
// is marked, published, then passed to WithMemLimit's OnChange.
func (s *startup) startLimiter() {
	c, mc := s.c, &s.cfg.memLimit
	mc.Logger = cmp.Or(mc.Logger, s.cfg.logger)
	userChange := mc.OnChange
	mc.OnChange = func(d limits.MemLimit) {
		if c.rec.started.Load() {
			c.hist.Mark(time.Now(), kindLimit, d.GoMemLimit)
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

// startTrimmer starts the trimmer unless the delay, MEMCTL_TRIM_DELAY if set
// else the option's, is 0; a bad value is reported and gives 0.
func (s *startup) startTrimmer() {
	delay := s.cfg.trimDelay
	if v, ok := envflag.Lookup("MEMCTL_TRIM_DELAY"); ok {
		var err error
		if delay, err = parseDelay(v); err != nil {
			s.fail(fmt.Errorf("memctl: %w; trimming is off", err))
		}
	} else if delay != 0 && (delay < trimwire.MinDelay || delay > trimwire.MaxDelay) {
		s.fail(fmt.Errorf("memctl: %s: want 0 (off) or from %v to %v; trimming is off", s.cfg.delayFrom, trimwire.MinDelay, trimwire.MaxDelay))
		delay = 0
	}
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
	trimwire.OnTrim(tr, func() { c.mark(kindTrim) })
	c.trimmer = tr
	c.report.TrimDelay = delay
}

// startAutoBurst starts the detector unless MEMCTL_AUTOBURST or its config
// says off.
func (s *startup) startAutoBurst() {
	cfg := s.cfg.autoBurst
	cfg.Off = !envSwitch("MEMCTL_AUTOBURST", !cfg.Off, false, "burst detection is off", s.fail)
	a, err := trimwire.StartAutoBurst(s.c.trimmer, cfg)
	if err != nil {
		s.fail(fmt.Errorf("memctl: %w; burst detection is off", err))
	}
	s.c.auto, s.c.report.AutoBurst = a, a != nil
}

// envSwitch returns the switch name, or def when unset; an invalid value is
// passed to fail, with what it leaves ("burst detection is off"), and gives
// bad.
func envSwitch(name string, def, bad bool, what string, fail func(error)) bool {
	v, ok := envflag.Lookup(name)
	if !ok {
		return def
	}
	on, err := envflag.Bool(name, v)
	if err != nil {
		fail(fmt.Errorf("memctl: %w; %s", err, what))
		return bad
	}
	return on
}

// watchPressure registers the pressure trim and starts the pressure
// monitor, unless MEMCTL_PRESSURE is off or invalid.
func (s *startup) watchPressure() {
	c := s.c
	if envSwitch("MEMCTL_PRESSURE", true, false, "the pressure watch is off", s.fail) {
		c.untrim = relief.SetTrim(pressureTrim(c))
		pc := s.cfg.pressure
		pc.Logger = cmp.Or(pc.Logger, s.cfg.logger)
		m, err := pressure.Start(pc)
		if err != nil {
			s.fail(err)
		}
		c.monitor = m
	}
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

// startMemLimit applies MEMCTL_REFRESH, MEMCTL_KEEP_GOMEMLIMIT and
// MEMCTL_GOMEMLIMIT_FLOOR to cfg and starts the limiter.
func startMemLimit(cfg limits.MemLimitConfig, fail func(error)) (*limits.MemLimiter, limits.MemLimit, error) {
	if v, ok := envflag.Lookup("MEMCTL_REFRESH"); ok {
		d, err := parseRefresh(v)
		if err != nil {
			fail(err)
		}
		cfg.Refresh = d
	}
	cfg.KeepOperator = envSwitch("MEMCTL_KEEP_GOMEMLIMIT", cfg.KeepOperator, true, "the operator's GOMEMLIMIT is kept", fail)
	if v, ok := envflag.Lookup("MEMCTL_GOMEMLIMIT_FLOOR"); ok {
		n, err := parseFloor(v)
		if err != nil {
			ml := limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1), Reason: "GOMEMLIMIT left as it was: bad MEMCTL_GOMEMLIMIT_FLOOR"}
			return nil, ml, err
		}
		cfg.Floor = n
	}
	return limits.NewMemLimiter(cfg)
}

// parseRefresh parses MEMCTL_REFRESH; off, "0" or a bad value give -1 (no refresh).
func parseRefresh(v string) (time.Duration, error) {
	d, err := envflag.Duration("MEMCTL_REFRESH", v, limits.DefaultRefresh, time.Millisecond)
	if err != nil {
		return -1, fmt.Errorf("memctl: %w; the GOMEMLIMIT refresh is off", err)
	}
	if d == 0 {
		return -1, nil
	}
	return d, nil
}

// byteUnits are GOMEMLIMIT's suffixes (runtime/debug.SetMemoryLimit).
var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// parseFloor parses MEMCTL_GOMEMLIMIT_FLOOR, a byte count >= 1 as GOMEMLIMIT
// writes it ("64MiB"; any case).
func parseFloor(v string) (int64, error) {
	num, shift := v, uint(0)
	for _, u := range byteUnits {
		if len(v) > len(u.suffix) && strings.EqualFold(v[len(v)-len(u.suffix):], u.suffix) {
			num, shift = strings.TrimSpace(v[:len(v)-len(u.suffix)]), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("memctl: MEMCTL_GOMEMLIMIT_FLOOR=%q: want a byte count such as \"64MiB\" (B, KiB, MiB, GiB, TiB); GOMEMLIMIT left as it was", v)
	}
	return n << shift, nil
}

// pressureTrim is the trim kernel pressure asks for: a gated request, then
// (with a refresh) a re-read of the limit, which may be a memory.high just
// lowered.
func pressureTrim(c *Controller) func() {
	tr, lim := c.trimmer, c.limiter
	return func() {
		if tr != nil {
			c.mark(kindPressure)
			trimwire.Request(tr, trimwire.Pressure)
		}
		if lim != nil && lim.Interval() > 0 {
			lim.Poke()
		}
	}
}
