package memctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/arenamax"
	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/history"
	"github.com/memctl/memctl/internal/relief"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
	"github.com/memctl/memctl/trim/cheap"
)

// DefaultTrimDelay is how long after the last burst the trim runs: long
// enough that back-to-back requests of one burst give one trim, short enough
// that RSS is back down within about three seconds (see examples/burst).
const DefaultTrimDelay = trim.DefaultDelay

// Option configures Start. Options are applied in order; the operator's
// environment variables win over them.
type Option func(*config)

type config struct {
	logger    *slog.Logger
	thp       thp.Policy
	thpSet    bool // WithTHP was given
	memLimit  limits.MemLimitConfig
	trimDelay time.Duration
	delayFrom string // the option that set trimDelay, for its error
	trim      trim.Config
	arenaMax  int
	pressure  pressure.Config
	autoBurst trim.AutoBurstConfig
}

// WithPressure configures the GC death-spiral detector and the kernel
// memory-pressure watcher (package pressure). Start gives it the logger
// when the Config has none, and the trim that kernel pressure asks for:
// the trimmer's, through the one trim gate. A death spiral sheds large
// Grows in every pool and lifts GOMEMLIMIT through the limiter when it
// came from the cgroup (LiftOff refuses lifts); kernel pressure cancels
// the largest request in pools configured with CancelLargest. Close stops
// both. Default: the zero pressure.Config.
func WithPressure(cfg pressure.Config) Option { return func(c *config) { c.pressure = cfg } }

// DefaultArenaMax is the glibc arena cap Start applies where glibc owns
// malloc: glibc otherwise creates up to 8 arenas per core, and each keeps
// what a burst of C threads freed in it (see cheap.SetArenaMax for the
// figures measured here).
const DefaultArenaMax = 2

// WithLogger sets the logger for the startup line and for later warnings.
// Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithTHP sets what Start does with the process's THP flag. The flag is
// inherited by child processes (fork and exec). Default:
// thp.PolicyExceptAdvised where the kernel has it (Linux 6.18), else
// thp.PolicyDisable, keeping an operator's GLIBC_TUNABLES
// glibc.malloc.hugetlb=1 (see Start). Environment: MEMCTL_THP, which wins
// (off means thp.PolicyKeep: memctl leaves the flag as it is; on means the
// default).
func WithTHP(p thp.Policy) Option { return func(c *config) { c.thp, c.thpSet = p, true } }

// WithMemLimit configures GOMEMLIMIT from the cgroup limit (ratio, floor,
// system fallback, refresh interval, headroom); see limits.SetGoMemLimit.
// The refresh stops at Close. Default: the zero MemLimitConfig (ratio 0.9
// less the memory outside the Go runtime, floor 64 MiB, re-read at GC end
// at most every 10 s and when a limit file is written, no fallback). Environment: GOMEMLIMIT, AUTOMEMLIMIT,
// MEMCTL_REFRESH, MEMCTL_GOMEMLIMIT_FLOOR.
func WithMemLimit(cfg limits.MemLimitConfig) Option { return func(c *config) { c.memLimit = cfg } }

// WithTrimDelay sets how long after the last AfterBurst the trim runs:
// 0 turns trimming off; otherwise from trim.MinDelay (1 ms) to
// trim.MaxDelay (24 h). A negative delay or one outside that range is
// invalid and follows the one rule for invalid values: trimming is off,
// Start logs it at WARN and returns it in its error. Default:
// DefaultTrimDelay (2 s). Environment: MEMCTL_TRIM_DELAY, which wins over
// this option; between this option and a non-zero Delay of WithTrim, the
// last one given wins.
func WithTrimDelay(d time.Duration) Option {
	return func(c *config) { c.trimDelay, c.delayFrom = d, fmt.Sprintf("WithTrimDelay(%v)", d) }
}

// WithTrim configures the trimmer (package trim): its max wait, release
// threshold, C heap step and so on; see trim.Config. Start fills in what
// the zero Config leaves to it: Logger (the logger of WithLogger) and
// Strict (on under SetStrict). The delay is decided in this order:
// MEMCTL_TRIM_DELAY when it is set; otherwise the last of WithTrimDelay and
// a non-zero cfg.Delay given; otherwise DefaultTrimDelay. A zero cfg.Delay
// leaves the delay as it is, so WithTrim cannot turn trimming off: use
// WithTrimDelay(0) or MEMCTL_TRIM_DELAY=off. An invalid field follows the
// one rule for invalid values: trimming is off, Start logs the error at WARN
// and returns it. Default: the zero trim.Config.
func WithTrim(cfg trim.Config) Option {
	return func(c *config) {
		c.trim = cfg
		if cfg.Delay != 0 {
			c.trimDelay, c.delayFrom = cfg.Delay, fmt.Sprintf("WithTrim(trim.Config{Delay: %v})", cfg.Delay)
		}
	}
}

// WithArenaMax sets the glibc malloc arena cap (mallopt M_ARENA_MAX) that
// Start applies where glibc owns malloc and cgo is on; 0 leaves glibc's
// default. A negative n is invalid: no cap, and Start logs it at WARN and
// returns it in its error. MALLOC_ARENA_MAX or an arena_max in
// GLIBC_TUNABLES set by the operator always wins. Default: DefaultArenaMax
// (2). Environment: MEMCTL_ARENA_MAX=N|off.
//
// A cap puts more of a burst in each arena, and malloc_trim holds an
// arena's lock while it returns that arena's free pages: a C thread that
// mallocs meanwhile waits for its arena's whole trim (0.8-2.3 s for a
// 2 GiB burst of small blocks under the cap of 2 in docs/benchmarks.md,
// "Stalls"). A program with C threads that need a latency bound sets
// MEMCTL_ARENA_MAX=off or uses an allocator whose release is sliced.
func WithArenaMax(n int) Option { return func(c *config) { c.arenaMax = n } }

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
	// MemLimit is the GOMEMLIMIT decision at Start (its Reason is never
	// empty); MemLimitRefresh the least time between two re-reads of the
	// limit at GC end, 0 when there is no refresh (MEMCTL_REFRESH=off, the
	// operator's GOMEMLIMIT). Between GC ends a written limit file is
	// followed at once (limits.MemLimiter: inotify, else a timer every
	// MemLimitRefresh while a limit is followed; the startup line's
	// gomemlimit_follow says which), and kernel memory pressure re-reads
	// the limit (limits.MemLimiter.Poke) before the pressure trim.
	MemLimit        limits.MemLimit
	MemLimitRefresh time.Duration
	// TrimDelay is the trim delay; 0 means trimming is off.
	TrimDelay time.Duration
	// CHeap names the allocator that owns malloc, whose C heap the trim
	// releases: "glibc", "jemalloc", "mimalloc", "tcmalloc", or "none" when
	// the C heap step is unavailable (cgo off, musl, not Linux).
	CHeap string
	// CHeaps names every allocator found in the process (cheap.Heap.Name):
	// the owner of malloc first, then those other objects carry (a
	// library's own jemalloc, one dlopened with RTLD_LOCAL, a prefixed
	// copy), with those present and not trimmed marked so. Report fills it
	// at each call, as found then; empty when the C heap step is
	// unavailable.
	CHeaps []string
	// ArenaMax is the glibc arena cap applied, 0 when none was; ArenaMaxNote
	// says why not (switched off, operator's setting, not glibc, cgo off, an
	// invalid value) when it is 0.
	ArenaMax     int
	ArenaMaxNote string
	// Pressure names the kernel memory-pressure source watched (for
	// example "cgroup v1 /sys/fs/cgroup/memory/app/memory.pressure_level
	// low"), "none" when there is none. The system-wide PSI is named
	// "host-wide PSI ...", and PressureNote then says why the cgroup's own
	// signal could not be used (a read-only cgroup mount, no memory
	// controller, no limit; see pressure.Monitor.SourceNote); when the
	// cgroup's memory.events is watched because its PSI trigger was
	// refused, PressureNote says why ("PSI trigger refused: EPERM at the
	// cgroup namespace root (nsdelegate)").
	Pressure     string
	PressureNote string
	// AutoBurst reports that bursts are detected at GC end (WithAutoBurst,
	// MEMCTL_AUTOBURST); false when that or trimming is off.
	AutoBurst bool
}

// Stats is a snapshot of the controller's counters.
type Stats struct {
	// Trim holds the trimmer's counters (zero when trimming is off):
	// Trim.Pressure counts the trims asked for on kernel pressure, run
	// and skipped, and their CPU, apart from the debounced ones;
	// Trim.SkippedMinRelease and its siblings the skips by reason.
	Trim trim.Stats
	// GoMemLimit is GOMEMLIMIT now, in bytes (math.MaxInt64: no limit).
	GoMemLimit int64
	// Misuse counts the process's misuse of the package so far, each kind
	// logged once at WARN: wiring mistakes (AfterBurst or Begin called with
	// no live controller, Start called while an earlier controller was
	// live: the second Start is logged through its own logger, the rest
	// through slog.Default) and end funcs of Begin called more often than
	// Begin (those of bursts begun with no trimmer, plus this controller's
	// trimmer's, Trim.Misuse). SetStrict makes the extra end panic instead.
	Misuse int64
	// CHeap holds the statistics of the allocator that owns malloc, -1
	// where unknown (all of them when the C heap step is unavailable: cgo
	// off, musl, not Linux). Reading them costs about a microsecond
	// (mallinfo2 walks glibc's arenas; see cheap.Step.Stats).
	CHeap cheap.Stats
	// CHeaps holds every allocator found in the process, the owner of
	// malloc first, each with its figures and what the trims released from
	// it (see cheap.Step.Heaps: about 2 µs more with glibc alone, and a
	// scan of the objects loaded since the last call, if any).
	CHeaps []cheap.Heap
	// Pressure holds the death-spiral and kernel-pressure counters and the
	// cgroup v2 memory.events counters (all -1 elsewhere).
	Pressure pressure.Stats
	// AutoBurst holds the burst detector's counters (zero when it is off).
	AutoBurst trim.AutoBurstStats
	// Swap holds the process's VmSwap and its cgroup's swap (see
	// SwapStats): three small file reads.
	Swap SwapStats
}

// Controller owns what Start set up: the trimmer and the GOMEMLIMIT refresh.
// Its methods are safe for concurrent use; a nil *Controller, and one whose
// Start found MEMCTL=off, does nothing.
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

// Start applies memctl's settings to this process and returns the controller
// that owns them; call it once, at the top of main (the THP flag does not split
// pages that are already huge) and defer its Close:
//
//   - THP: no huge pages except where the program asked for them with
//     madvise(MADV_HUGEPAGE) (thp.PolicyExceptAdvised, prctl
//     PR_SET_THP_DISABLE with PR_THP_DISABLE_EXCEPT_ADVISED, Linux 6.18),
//     or none at all (thp.PolicyDisable) on an older kernel, unless MEMCTL_THP
//     or WithTHP says otherwise. The flag is inherited by child processes
//     (fork and exec): a child keeps its own advised regions' huge pages
//     under the default. An operator's GLIBC_TUNABLES glibc.malloc.hugetlb=1
//     (glibc advises its heap) is kept: on an older kernel the flag is then
//     left as it is, and the startup line's thp_note says so;
//   - GOMEMLIMIT: 90% of the cgroup memory limit less the memory outside
//     the Go runtime, re-read at GC end at most every 10 s, unless the
//     operator set GOMEMLIMIT or AUTOMEMLIMIT;
//   - a trimmer that returns freed memory DefaultTrimDelay after a burst:
//     one it detects at GC end (trim.AutoBurstConfig, unless MEMCTL_AUTOBURST or
//     WithAutoBurst turns that off), or one marked with AfterBurst or Begin.
//
// It logs one INFO line that states what it decided, and one WARN line for
// each part it had to skip (so the caller need not log the error again). It
// always returns a usable controller: a part that fails is reported and skipped, never
// fatal. The error joins what failed: an invalid MEMCTL_* value (that part is
// left off, the operator's intent is not guessed), a malformed cgroup file,
// a prctl refused. A part that is unsupported here (off Linux, an older
// kernel) is logged and is not an error.
//
// The controller becomes the one the package-level AfterBurst and Begin use.
// Start is meant to run once per process; a second Start while an earlier
// controller is live (including the one the auto package started) is a
// wiring mistake: it logs a WARN naming where the earlier one was started,
// and the newest controller wins. Both keep running until their Close;
// closing the newest hands the package-level functions back to the latest
// earlier controller still live, and closing an older one leaves the newer
// in place.
func Start(opts ...Option) (*Controller, error) {
	cfg := config{logger: slog.Default(), thp: thp.PolicyDisable, trimDelay: DefaultTrimDelay, arenaMax: DefaultArenaMax}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	c := &Controller{startedBy: caller(2)}
	var errs []error
	warnUnknownEnv(cfg.logger)
	if v, ok := envflag.Lookup("MEMCTL"); ok {
		on, err := envflag.Bool("MEMCTL", v)
		if err != nil {
			err = fmt.Errorf("memctl: %w; memctl is off", err)
			cfg.logger.Warn("memctl: invalid switch", "error", err)
			errs = append(errs, err)
		}
		if !on {
			c.startOff(cfg.logger, "MEMCTL="+v)
			return c, errors.Join(errs...)
		}
	}
	fail := func(err error) {
		if errors.Is(err, errors.ErrUnsupported) {
			cfg.logger.Info("memctl: not supported here", "reason", err.Error())
			return
		}
		cfg.logger.Warn("memctl: part skipped", "error", err)
		errs = append(errs, err)
	}

	// The arena cap first: it stops only arenas created after it.
	arenaMax := cfg.arenaMax
	if v, ok := envflag.Lookup("MEMCTL_ARENA_MAX"); ok {
		n, err := envflag.Count("MEMCTL_ARENA_MAX", v, DefaultArenaMax)
		if err != nil {
			fail(fmt.Errorf("memctl: %w; no arena cap", err))
		}
		arenaMax = n
	} else if arenaMax < 0 {
		fail(fmt.Errorf("memctl: WithArenaMax(%d): want 0 (no cap) or a count of arenas; no arena cap", arenaMax))
		arenaMax = 0
	}
	if arenaMax > 0 {
		switch err := cheap.SetArenaMax(arenaMax); {
		case err == nil:
			c.report.ArenaMax = arenaMax
		case errors.Is(err, arenamax.ErrOperatorSet), errors.Is(err, cheap.ErrUnavailable):
			c.report.ArenaMaxNote = err.Error()
		default:
			fail(err)
		}
	} else if len(errs) == 0 {
		c.report.ArenaMaxNote = "switched off (MEMCTL_ARENA_MAX or WithArenaMax)"
	}

	// THP next: the flag affects only memory faulted in after it is set.
	c.report.THPPolicy, c.report.THPState, c.report.THPNote = applyTHP(cfg.thp, cfg.thpSet, fail)
	if s, err := thp.System(); err == nil {
		c.report.THPSystem = string(s.Enabled)
	}

	cfg.memLimit.Logger = cmpOr(cfg.memLimit.Logger, cfg.logger)
	userChange := cfg.memLimit.OnChange
	cfg.memLimit.OnChange = func(d limits.MemLimit) {
		if c.rec.started.Load() {
			c.hist.Mark(time.Now(), history.KindLimit, d.GoMemLimit)
			c.publish() // a limit followed while idle shows at once
		}
		if userChange != nil {
			userChange(d)
		}
	}
	lim, ml, err := startMemLimit(cfg.memLimit, fail)
	if err != nil {
		fail(err)
	}
	c.limiter, c.report.MemLimit, c.report.MemLimitRefresh = lim, ml, lim.Interval()

	delay := cfg.trimDelay
	if v, ok := envflag.Lookup("MEMCTL_TRIM_DELAY"); ok {
		d, err := parseDelay(v)
		if err != nil {
			fail(fmt.Errorf("memctl: %w; trimming is off", err))
		}
		delay = d
	} else if delay != 0 && (delay < trim.MinDelay || delay > trim.MaxDelay) {
		fail(fmt.Errorf("memctl: %s: want 0 (off) or from %v to %v; trimming is off", cfg.delayFrom, trim.MinDelay, trim.MaxDelay))
		delay = 0
	}
	if delay > 0 {
		tc := cfg.trim
		tc.Delay, tc.Logger, tc.Strict = delay, cmpOr(tc.Logger, cfg.logger), tc.Strict || strict.Load()
		tr, err := trim.New(tc)
		if err != nil {
			fail(err)
		} else {
			trimwire.OnTrim(tr, func() { c.mark(history.KindTrim) })
			c.trimmer = tr
			c.report.TrimDelay = delay
		}
	}
	c.auto = startAutoBurst(cfg.autoBurst, c.trimmer, fail)
	c.report.AutoBurst = c.auto != nil
	c.report.CHeap = cheap.Detect().Allocator()
	c.monitor = startPressure(cfg, c, fail)
	c.report.Pressure, c.report.PressureNote = cmp.Or(c.monitor.Source(), "none"), c.monitor.SourceNote()

	if c.report.MemLimit.Reason == "" { // SetGoMemLimit failed: its WARN line has the error
		c.report.MemLimit.GoMemLimit = debug.SetMemoryLimit(-1)
		c.report.MemLimit.Reason = "GOMEMLIMIT left as it was: the memory limit could not be read (see the WARN line)"
	}
	if c.report.ArenaMax == 0 && c.report.ArenaMaxNote == "" {
		c.report.ArenaMaxNote = "skipped (see the WARN line)"
	}
	c.logStarted(cfg.logger)
	register(c, cfg.logger)
	c.startRecord(cfg.logger)
	return c, errors.Join(errs...)
}

// logStarted writes the startup line: one INFO line a person reads at a
// glance in kubectl logs (under 300 characters: GOMEMLIMIT in MiB and where
// it came from, THP, trims, the pressure watched), then one DEBUG line,
// "memctl details", with every decision in full and in numbers a pipeline
// can keep as one type: gomemlimit_bytes is bytes or "none", trim_delay a
// duration or "off", arena_max a count or "off" (with arena_max_reason).
// The same details are in memctl status and /debug/memctl. Errors are only
// on the WARN lines.
func (c *Controller) logStarted(l *slog.Logger) {
	r := c.report
	info := []slog.Attr{
		slog.String("gomemlimit", mibOrNone(r.MemLimit.GoMemLimit)),
		slog.String("gomemlimit_source", limitSource(r.MemLimit)),
		slog.String("thp", r.THPState.String()),
		slog.String("trim_delay", delayOrOff(r.TrimDelay)),
		slog.String("auto_burst", onOff(r.AutoBurst)),
		slog.String("pressure", shortPressure(r.Pressure, r.PressureNote)),
	}
	if r.MemLimit.Sandbox != "" {
		// A sandbox with a kernel of its own (gVisor) may show no cgroup
		// limit: said here, as the likely reason a limit is missing.
		info = append(info, slog.String("sandbox", r.MemLimit.Sandbox))
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, "memctl started", info...)
	if !l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{
		slog.String("thp_policy", r.THPPolicy.String()),
		slog.String("thp_system", cmp.Or(r.THPSystem, "unknown")),
		slog.String("thp_note", r.THPNote),
		slog.String("gomemlimit_bytes", bytesOrNone(r.MemLimit.GoMemLimit)),
		slog.String("gomemlimit_file", cmp.Or(r.MemLimit.File, "none")),
		slog.String("gomemlimit_outside", strconv.FormatInt(r.MemLimit.Outside, 10)),
		slog.String("gomemlimit_reclaimable", strconv.FormatInt(r.MemLimit.Reclaimable, 10)),
		slog.String("gomemlimit_refresh", delayOrOff(r.MemLimitRefresh)),
		slog.String("gomemlimit_follow", cmp.Or(c.limiter.Following(), "none")),
		slog.String("gomemlimit_reason", r.MemLimit.Reason),
		slog.String("c_heap", r.CHeap),
		slog.String("c_heap_stats", c.Stats().CHeap.String()),
		slog.String("c_heaps", cmp.Or(strings.Join(c.Report().CHeaps, "; "), "none")),
		slog.String("pressure_source", r.Pressure),
	}
	if r.PressureNote != "" {
		attrs = append(attrs, slog.String("pressure_note", r.PressureNote))
	}
	// arena_max: the cap on glibc's malloc arenas (MALLOC_ARENA_MAX), which
	// bounds the C heap of a cgo program with many threads.
	if r.ArenaMax > 0 {
		attrs = append(attrs, slog.String("arena_max", strconv.Itoa(r.ArenaMax)))
	} else {
		attrs = append(attrs, slog.String("arena_max", "off"), slog.String("arena_max_reason", r.ArenaMaxNote))
	}
	l.LogAttrs(context.Background(), slog.LevelDebug, "memctl details", attrs...)
}

// mibOrNone gives b in MiB with one decimal ("227.7MiB"), or "none" for
// math.MaxInt64 (no limit).
func mibOrNone(b int64) string {
	if b == math.MaxInt64 {
		return "none"
	}
	return inMiB(b)
}

func inMiB(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + "MiB" }

// limitSource says in a few words where GOMEMLIMIT came from: the share of
// which limit, less what, or why there is none. The full reason is
// gomemlimit_reason on the DEBUG line.
func limitSource(m limits.MemLimit) string {
	switch {
	case m.Source == limits.SourceEnv && len(m.Reason) <= 64:
		return m.Reason // "GOMEMLIMIT=… is set in the environment"
	case m.Source == limits.SourceEnv:
		return "the operator's GOMEMLIMIT or AUTOMEMLIMIT"
	case m.MemoryLimit <= 0 && m.LimitUnknown:
		return "none: no cgroup limit in sight (may be set above the namespace)"
	case m.MemoryLimit <= 0:
		return "none: no memory limit found"
	}
	s := fmt.Sprintf("%g%% of %s limit %s", m.Ratio*100, m.Source, inMiB(m.MemoryLimit))
	if m.High > 0 {
		s = fmt.Sprintf("memory.high %s", inMiB(m.High))
	}
	if m.Outside > 0 {
		s += " less " + inMiB(m.Outside) + " outside Go"
	}
	if m.AtFloor {
		s += ", at the floor"
	}
	if m.Overridden {
		s += ", the operator's " + inMiB(m.Operator) + " being above the limit"
	}
	return s
}

// shortPressure is the pressure source for the INFO line: file names
// without their directories, and the note saying why the cgroup's own
// signal is not the one watched (its first clause).
func shortPressure(src, note string) string {
	f := strings.Fields(src)
	for i, w := range f {
		if strings.HasPrefix(w, "/") {
			f[i] = filepath.Base(w)
		}
	}
	s := cmp.Or(strings.Join(f, " "), "none")
	// The note's first clause, whole when short ("PSI trigger refused:
	// EPERM at the cgroup namespace root (nsdelegate)"), else its reason
	// alone (the error it quotes is on the DEBUG line).
	if i := strings.Index(note, ";"); i > 0 {
		note = note[:i]
	}
	if i := strings.Index(note, ":"); len(note) > 80 && i > 0 {
		note = note[:i]
	}
	if note = strings.TrimSpace(note); note != "" {
		s += "; " + note
	}
	return s
}

// startOff records a controller that does nothing (MEMCTL=off): the report
// says what the process has, untouched, and one INFO line says why.
func (c *Controller) startOff(l *slog.Logger, why string) {
	c.report = Report{Off: true, THPPolicy: thp.PolicyKeep, ArenaMaxNote: why}
	if st, err := thp.Process(); err == nil {
		c.report.THPState = st
	}
	c.report.MemLimit = limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1), Source: limits.SourceNone,
		Reason: why + ": GOMEMLIMIT left as it was"}
	l.LogAttrs(context.Background(), slog.LevelInfo, "memctl is off",
		slog.String("reason", why), slog.String("gomemlimit", bytesOrNone(c.report.MemLimit.GoMemLimit)))
	register(c, l)
	c.startRecord(l)
}

func bytesOrNone(b int64) string {
	if b == math.MaxInt64 {
		return "none"
	}
	return strconv.FormatInt(b, 10)
}

func delayOrOff(d time.Duration) string {
	if d <= 0 {
		return "off"
	}
	return d.String()
}

func cmpOr(l, def *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return def
}

// parseDelay parses MEMCTL_TRIM_DELAY with the one grammar
// (internal/envflag): an off word or "0" for no trimming, an on word for
// DefaultTrimDelay, or a duration from trim.MinDelay to trim.MaxDelay. A
// bad value gives 0 (trimming off) and an *envflag.Error.
func parseDelay(v string) (time.Duration, error) {
	d, err := envflag.Duration("MEMCTL_TRIM_DELAY", v, DefaultTrimDelay, trim.MinDelay)
	if err != nil || d > trim.MaxDelay {
		return 0, &envflag.Error{Name: "MEMCTL_TRIM_DELAY", Value: v,
			Want: fmt.Sprintf(`"off" or a duration from %v to %v such as "2s"`, trim.MinDelay, trim.MaxDelay)}
	}
	return d, nil
}

// Report returns what Start decided, and the allocators found now
// (CHeaps).
func (c *Controller) Report() Report {
	if c == nil {
		return Report{Off: true}
	}
	r := c.report
	if !r.Off {
		for _, h := range cheap.Detect().Heaps() {
			r.CHeaps = append(r.CHeaps, h.Name())
		}
	}
	return r
}

// AfterBurst marks the end of a burst of work: the trim runs once, the trim
// delay after the last AfterBurst (and at the latest trim.Config.MaxWait after
// the first of a run that does not pause). It allocates nothing; while a
// trim is pending it is one atomic load, and only the first call after the
// trimmer went idle takes an uncontended lock to set the timer (see
// trim.Trimmer.AfterBurst for the figures).
func (c *Controller) AfterBurst() {
	if c != nil && c.trimmer != nil {
		c.trimmer.AfterBurst()
	}
}

// Begin marks a burst in flight; no trim runs until the returned func is
// called (up to the trimmer's max wait, see trim.Config.MaxWait), which also
// counts as AfterBurst. Call the func exactly once: a func called more
// often than Begin is misuse, counted in Stats.Misuse and logged once at
// WARN, and a panic only under SetStrict. The same holds with no trimmer
// (no Start, MEMCTL=off, trimming off): Begin then only counts. It
// allocates nothing. Safe for concurrent use.
func (c *Controller) Begin() (end func()) {
	if c == nil || c.trimmer == nil {
		loose.Add(1)
		return looseEnd
	}
	return c.trimmer.Begin()
}

// Bursts begun with no trimmer to take them, and the misuse of their ends.
var (
	loose, looseMisuse atomic.Int64
	looseWarned        atomic.Bool
	strict             atomic.Bool
)

func looseEnd() {
	if loose.Add(-1) >= 0 {
		return
	}
	loose.Add(1)
	looseMisuse.Add(1)
	if strict.Load() {
		panic("memctl: burst ended more often than begun")
	}
	if looseWarned.CompareAndSwap(false, true) {
		slog.Default().Warn("memctl: burst ended more often than begun (an end func called twice?); counted in Stats.Misuse, logged once")
	}
}

// SetStrict turns the strict mode for tests on or off and returns the
// previous setting. In strict mode misuse panics instead of being counted
// and logged: an end func of Begin called more often than Begin, whether or
// not Start ran (a controller started in strict mode keeps it). Production
// code leaves it off (the default): memctl must not crash the service it
// protects. Safe for concurrent use.
func SetStrict(on bool) (previous bool) { return strict.Swap(on) }

// Stats returns the controller's counters and the C heap's statistics.
func (c *Controller) Stats() Stats {
	s := Stats{GoMemLimit: debug.SetMemoryLimit(-1), Misuse: misuse.Load()}
	s.CHeap, _ = cheap.Detect().Stats() // all -1 when unavailable
	s.CHeaps = cheap.Detect().Heaps()
	if c != nil && c.trimmer != nil {
		s.Trim = c.trimmer.Stats()
	}
	if c != nil {
		s.Pressure, s.AutoBurst = c.monitor.Stats(), autoBurstStats(c.auto)
		s.Swap = c.swap.read()
	} else {
		s.Swap = looseSwap.read()
	}
	s.Misuse += looseMisuse.Load() + s.Trim.Misuse
	return s
}

// Close stops the trimmer (a pending trim is dropped, a running one is
// waited for) and the GOMEMLIMIT refresh, and returns when the trimmer's
// goroutine has exited. The THP flag and GOMEMLIMIT stay as they are. Close is
// idempotent and returns nil.
func (c *Controller) Close() error {
	if c == nil {
		return nil
	}
	c.once.Do(func() {
		unregister(c)
		c.rec.sub.Stop() // before the trimmer's Close: no republish after it
		_ = c.monitor.Close()
		if c.untrim != nil {
			c.untrim()
		}
		if c.auto != nil {
			c.auto.Close()
		}
		c.limiter.Close()
		if c.trimmer != nil {
			_ = c.trimmer.Close()
		}
		c.stopRecord()
		c.hist.Close()
	})
	return nil
}

// AfterBurst calls AfterBurst on the live controller of the latest Start.
// With none (Start not called, or its controller closed) it does nothing,
// which is a wiring mistake: the first such call logs a WARN through
// slog.Default, and every one is counted in Stats.Misuse. The path with a
// controller costs what Controller.AfterBurst costs.
func AfterBurst() {
	if c := current.Load(); c != nil {
		c.AfterBurst()
		return
	}
	noController("AfterBurst")
}

// Begin calls Begin on the live controller of the latest Start. With none
// it is a wiring mistake reported as AfterBurst's is, and it only counts
// the burst, so that an end func called twice is misuse with or without
// Start (see Controller.Begin; read the count with CurrentStats).
func Begin() (end func()) {
	c := current.Load()
	if c == nil {
		noController("Begin")
	}
	return c.Begin()
}

// CurrentStats returns the Stats of the live controller of the latest
// Start, or, with none, the counters kept without one (Misuse, GoMemLimit,
// CHeap).
func CurrentStats() Stats { return current.Load().Stats() }

var (
	// current is the controller the package-level functions use: the last
	// of live, the controllers started and not yet closed, oldest first.
	current atomic.Pointer[Controller]
	liveMu  sync.Mutex
	live    []*Controller

	misuse       atomic.Int64
	warnedNoCtl  atomic.Bool
	warnedSecond atomic.Bool
)

// register makes c the controller of the package-level functions, and warns
// (once per process) when an earlier one is still live.
func register(c *Controller, l *slog.Logger) {
	liveMu.Lock()
	var prev *Controller
	if n := len(live); n > 0 {
		prev = live[n-1]
	}
	live = append(live, c)
	current.Store(c)
	liveMu.Unlock()
	if prev == nil {
		return
	}
	misuse.Add(1)
	if !warnedSecond.Swap(true) {
		l.Warn("memctl: Start called while an earlier controller is live (a second Start, or Start beside the auto package); "+
			"the newest now serves memctl.AfterBurst and memctl.Begin, and both run until their Close",
			"earlier_start", prev.startedBy, "this_start", c.startedBy)
	}
}

// unregister hands the package-level functions to the latest controller
// still live.
func unregister(c *Controller) {
	liveMu.Lock()
	defer liveMu.Unlock()
	for i, x := range live {
		if x == c {
			live = append(live[:i], live[i+1:]...)
			break
		}
	}
	if n := len(live); n > 0 {
		current.Store(live[n-1])
	} else {
		current.Store(nil)
	}
}

func noController(fn string) {
	misuse.Add(1)
	if !warnedNoCtl.Load() && !warnedNoCtl.Swap(true) {
		slog.Default().Warn("memctl: " + fn + " called with no live controller: nothing will be trimmed; " +
			"call memctl.Start at the top of main (or import github.com/memctl/memctl/auto) and Close it at exit")
	}
}

// caller names the function skip frames up, with its file and line, for the
// second-Start warning: "main.main (main.go:12)".
func caller(skip int) string {
	pc, file, line, ok := runtime.Caller(skip)
	if !ok {
		return "unknown"
	}
	name := "unknown"
	if f := runtime.FuncForPC(pc); f != nil {
		name = f.Name()
	}
	return fmt.Sprintf("%s (%s:%d)", name, filepath.Base(file), line)
}

// startPressure registers the pressure trim (internal/relief) and starts
// the death-spiral detector and the kernel watcher, unless MEMCTL_PRESSURE
// is off (or invalid: then off, and reported); a watcher that cannot start
// is reported through fail and the detector runs all the same.
func startPressure(cfg config, c *Controller, fail func(error)) *pressure.Monitor {
	if v, ok := envflag.Lookup("MEMCTL_PRESSURE"); ok {
		on, err := envflag.Bool("MEMCTL_PRESSURE", v)
		if err != nil {
			fail(fmt.Errorf("memctl: %w; the pressure watch is off", err))
			return nil
		}
		if !on {
			return nil
		}
	}
	c.untrim = relief.SetTrim(pressureTrim(c))
	pc := cfg.pressure
	pc.Logger = cmp.Or(pc.Logger, cfg.logger)
	m, err := pressure.Start(pc)
	if err != nil {
		fail(err)
	}
	return m
}

// pressureTrim is the trim kernel pressure asks for (through
// internal/relief): the trimmer's gated request (trimwire.Request), the gate of
// every trim (the estimate, the cost rule, the 2% CPU budget), never a
// forced TrimNow. With a GOMEMLIMIT refresh it then re-reads the limit
// (MemLimiter.Poke, at most once a second): the pressure may be a
// memory.high just lowered under the usage, where the kernel throttles
// allocation and GC ends are rare. The trim comes first: it is what
// relieves the cgroup, and a re-read at its limit is slow (every page the
// reading allocates is reclaimed for).
func pressureTrim(c *Controller) func() {
	tr, lim := c.trimmer, c.limiter
	return func() {
		if tr != nil {
			c.mark(history.KindPressure)
			trimwire.Request(tr, trimwire.Pressure)
		}
		if lim != nil && lim.Interval() > 0 {
			lim.Poke()
		}
	}
}

// Subscribe returns a channel of the death-spiral and kernel-pressure
// events (see pressure.Monitor.Subscribe: buf is its room, a full channel
// drops and counts, cancel closes it; Close closes it too). On a nil
// controller, or one without a monitor, the channel is closed at once.
func (c *Controller) Subscribe(buf int) (events <-chan pressure.Event, cancel func()) {
	var m *pressure.Monitor
	if c != nil {
		m = c.monitor
	}
	return m.Subscribe(buf)
}
