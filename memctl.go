package memctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/limits"
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
	memLimit  limits.MemLimitConfig
	trimDelay time.Duration
	trimOpts  []trim.Option
	arenaMax  int
}

// DefaultArenaMax is the glibc arena cap Start applies where glibc owns
// malloc: glibc otherwise creates up to 8 arenas per core, and each keeps
// what a burst of C threads freed in it (see cheap.SetArenaMax for the
// figures measured here).
const DefaultArenaMax = 2

// WithLogger sets the logger for the startup line and for later warnings.
// Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithTHP sets what Start does with the process's THP flag.
// Default: thp.PolicyDisable. Environment: MEMCTL_THP.
func WithTHP(p thp.Policy) Option { return func(c *config) { c.thp = p } }

// WithMemLimit configures GOMEMLIMIT from the cgroup limit (ratio, system
// fallback, refresh interval); see limits.SetGoMemLimit. Refresh stops at
// Close. Default: the zero MemLimitConfig (ratio 0.9, no fallback, no
// refresh). Environment: GOMEMLIMIT, AUTOMEMLIMIT.
func WithMemLimit(cfg limits.MemLimitConfig) Option { return func(c *config) { c.memLimit = cfg } }

// WithTrimDelay sets how long after the last AfterBurst the trim runs; 0
// turns trimming off. Default: DefaultTrimDelay (2 s).
// Environment: MEMCTL_TRIM_DELAY.
func WithTrimDelay(d time.Duration) Option { return func(c *config) { c.trimDelay = d } }

// WithTrimOptions passes options to the trimmer (for example
// trim.WithMinRelease or trim.WithMaxWait). The delay is WithTrimDelay's or
// MEMCTL_TRIM_DELAY's: a trim.WithDelay given here is overridden.
func WithTrimOptions(opts ...trim.Option) Option {
	return func(c *config) { c.trimOpts = append(c.trimOpts, opts...) }
}

// WithArenaMax sets the glibc malloc arena cap (mallopt M_ARENA_MAX) that
// Start applies where glibc owns malloc and cgo is on; 0 leaves glibc's
// default. MALLOC_ARENA_MAX or an arena_max in GLIBC_TUNABLES set by the
// operator always wins. Default: DefaultArenaMax (2).
// Environment: MEMCTL_ARENA_MAX=N|off.
func WithArenaMax(n int) Option { return func(c *config) { c.arenaMax = n } }

// Report is what Start decided.
type Report struct {
	// Off is true when MEMCTL=off switched memctl off.
	Off bool
	// THPPolicy is the policy applied, THP the process state read back
	// after it (PR_GET_THP_DISABLE), THPSystem the system mode
	// (/sys/kernel/mm/transparent_hugepage/enabled, "" if unknown).
	THPPolicy thp.Policy
	THP       thp.State
	THPSystem string
	// MemLimit is the GOMEMLIMIT decision.
	MemLimit limits.MemLimit
	// TrimDelay is the trim delay; 0 means trimming is off.
	TrimDelay time.Duration
	// CHeap names the allocator that owns malloc, whose C heap the trim
	// releases: "glibc", "jemalloc", "mimalloc", "tcmalloc", or "none" when
	// the C heap step is unavailable (cgo off, musl, not Linux).
	CHeap string
	// ArenaMax is the glibc arena cap applied, 0 when none was; ArenaMaxNote
	// says why not (operator's setting, not glibc, cgo off) when it is 0.
	ArenaMax     int
	ArenaMaxNote string
}

// Stats is a snapshot of the controller's counters.
type Stats struct {
	// Trim holds the trimmer's counters (zero when trimming is off).
	Trim trim.Stats
	// GoMemLimit is GOMEMLIMIT now, in bytes (math.MaxInt64: no limit).
	GoMemLimit int64
	// Misuse counts end funcs of Begin called more often than Begin: those
	// of bursts begun with no trimmer (no Start, MEMCTL=off, trimming off)
	// since the process started, plus this controller's trimmer's
	// (Trim.Misuse).
	Misuse int64
	// CHeap holds the statistics of the allocator that owns malloc, -1
	// where unknown (all of them when the C heap step is unavailable: cgo
	// off, musl, not Linux). Reading them costs about a microsecond
	// (mallinfo2 walks glibc's arenas; see cheap.Step.Stats).
	CHeap cheap.Stats
}

// Controller owns what Start set up: the trimmer and the GOMEMLIMIT refresh.
// Its methods are safe for concurrent use; a nil *Controller, and one whose
// Start found MEMCTL=off, does nothing.
type Controller struct {
	report  Report
	trimmer *trim.Trimmer
	cancel  context.CancelFunc
	once    sync.Once
}

var current atomic.Pointer[Controller]

// Start applies memctl's settings to this process and returns the controller
// that owns them; call it at the top of main (the THP flag does not split
// pages that are already huge) and defer its Close:
//
//   - THP: thp.PolicyDisable (prctl PR_SET_THP_DISABLE) unless MEMCTL_THP or
//     WithTHP says otherwise;
//   - GOMEMLIMIT: 90% of the cgroup memory limit, unless the operator set
//     GOMEMLIMIT or AUTOMEMLIMIT;
//   - a trimmer that returns freed memory DefaultTrimDelay after a burst
//     (AfterBurst).
//
// It logs one INFO line that states what it decided, and one WARN line for
// each part it had to skip (so the caller need not log the error again). It
// always returns a usable controller: a part that fails is reported and skipped, never
// fatal. The error joins what failed: an invalid MEMCTL_* value (that part is
// left off, the operator's intent is not guessed), a malformed cgroup file,
// a prctl refused. A part that is unsupported here (off Linux, an older
// kernel) is logged and is not an error. The controller becomes the one the
// package-level AfterBurst and Begin use.
func Start(opts ...Option) (*Controller, error) {
	cfg := config{logger: slog.Default(), thp: thp.PolicyDisable, trimDelay: DefaultTrimDelay, arenaMax: DefaultArenaMax}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	c := &Controller{}
	var errs []error
	switch v := getenv("MEMCTL"); strings.ToLower(v) {
	case "off":
		c.report.Off = true
		cfg.logger.Info("memctl is off", "MEMCTL", v)
		current.Store(c)
		return c, nil
	case "", "on":
	default:
		err := fmt.Errorf("memctl: MEMCTL=%q: want \"off\" or \"on\"; memctl stays on", v)
		cfg.logger.Warn("memctl: bad switch", "error", err)
		errs = append(errs, err)
	}
	fail := func(err error) {
		if errors.Is(err, errors.ErrUnsupported) {
			cfg.logger.Info("memctl: not supported here", "error", err)
			return
		}
		cfg.logger.Warn("memctl: part skipped", "error", err)
		errs = append(errs, err)
	}

	// The arena cap first: it stops only arenas created after it.
	arenaMax := cfg.arenaMax
	if v := getenv("MEMCTL_ARENA_MAX"); v != "" {
		n, err := parseArenaMax(v)
		if err != nil {
			fail(err)
		}
		arenaMax = n
	}
	if arenaMax > 0 {
		switch err := cheap.SetArenaMax(arenaMax); {
		case err == nil:
			c.report.ArenaMax = arenaMax
		case errors.Is(err, cheap.ErrOperatorSet), errors.Is(err, cheap.ErrUnavailable):
			c.report.ArenaMaxNote = err.Error()
		default:
			fail(err)
		}
	} else {
		c.report.ArenaMaxNote = "off"
	}

	// THP next: the flag affects only memory faulted in after it is set.
	policy, thpOK := cfg.thp, true
	if v := getenv("MEMCTL_THP"); v != "" {
		p, err := thp.ParsePolicy(v)
		if err != nil {
			fail(fmt.Errorf("memctl: MEMCTL_THP: %w", err))
			thpOK = false
		}
		policy = p
	}
	c.report.THPPolicy = policy
	if thpOK {
		st, err := policy.Apply()
		if err != nil {
			fail(err)
		}
		c.report.THP = st
	} else if st, err := thp.Process(); err == nil {
		c.report.THP = st // as inherited
	}
	if s, err := thp.System(); err == nil {
		c.report.THPSystem = string(s.Enabled)
	}

	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	cfg.memLimit.Logger = cmpOr(cfg.memLimit.Logger, cfg.logger)
	ml, err := limits.SetGoMemLimit(ctx, cfg.memLimit)
	if err != nil {
		fail(err)
	}
	c.report.MemLimit = ml

	delay := cfg.trimDelay
	if v := getenv("MEMCTL_TRIM_DELAY"); v != "" {
		d, err := parseDelay(v)
		if err != nil {
			fail(err)
		}
		delay = d
	}
	if delay > 0 {
		topts := append([]trim.Option{trim.WithLogger(cfg.logger), trim.WithStrict(strict.Load())}, cfg.trimOpts...)
		tr, err := trim.New(append(topts, trim.WithDelay(delay))...)
		if err != nil {
			fail(err)
		} else {
			c.trimmer = tr
			c.report.TrimDelay = delay
		}
	}
	c.report.CHeap = cheap.Detect().Allocator()

	r := c.report
	arena := strconv.Itoa(r.ArenaMax)
	if r.ArenaMax == 0 {
		arena = r.ArenaMaxNote
	}
	cfg.logger.LogAttrs(context.Background(), slog.LevelInfo, "memctl started",
		slog.String("thp", r.THP.String()),
		slog.String("thp_policy", r.THPPolicy.String()),
		slog.String("thp_system", r.THPSystem),
		slog.Int64("gomemlimit", r.MemLimit.Bytes),
		slog.String("gomemlimit_source", r.MemLimit.Source.String()),
		slog.String("gomemlimit_reason", r.MemLimit.Reason),
		slog.Duration("trim_delay", r.TrimDelay),
		slog.String("c_heap", r.CHeap),
		slog.String("c_heap_stats", c.Stats().CHeap.String()),
		slog.String("arena_max", arena),
	)
	current.Store(c)
	return c, errors.Join(errs...)
}

// getenv returns the variable's value with surrounding space removed; empty
// means unset, as it does for GOMEMLIMIT and GOGC in the Go runtime (a
// "MEMCTL_THP=" left by a deployment template switches nothing).
func getenv(key string) string { return strings.TrimSpace(os.Getenv(key)) }

func cmpOr(l, def *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return def
}

// parseDelay parses MEMCTL_TRIM_DELAY: "off" or "0" for no trimming, or a
// positive time.ParseDuration string such as "2s". A bad value turns
// trimming off and is an error.
func parseDelay(v string) (time.Duration, error) {
	if strings.EqualFold(v, "off") {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || (d != 0 && d < trim.MinDelay) || d < 0 || d > trim.MaxDelay {
		return 0, fmt.Errorf("memctl: MEMCTL_TRIM_DELAY=%q: want \"off\" or a duration from %v to %v such as \"2s\"", v, trim.MinDelay, trim.MaxDelay)
	}
	return d, nil
}

// parseArenaMax parses MEMCTL_ARENA_MAX: "off" or "0" for no cap, or a
// positive count. A bad value means no cap and is an error.
func parseArenaMax(v string) (int, error) {
	if strings.EqualFold(v, "off") {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("memctl: MEMCTL_ARENA_MAX=%q: want \"off\" or a count of arenas such as \"2\"", v)
	}
	return n, nil
}

// Report returns what Start decided.
func (c *Controller) Report() Report {
	if c == nil {
		return Report{Off: true}
	}
	return c.report
}

// AfterBurst marks the end of a burst of work: the trim runs once, the trim
// delay after the last AfterBurst (and at the latest trim.WithMaxWait after
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
// called (up to the trimmer's max wait, see trim.WithMaxWait), which also
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
	s := Stats{GoMemLimit: debug.SetMemoryLimit(-1)}
	s.CHeap, _ = cheap.Detect().Stats() // all -1 when unavailable
	if c != nil && c.trimmer != nil {
		s.Trim = c.trimmer.Stats()
	}
	s.Misuse = looseMisuse.Load() + s.Trim.Misuse
	return s
}

// Close stops the trimmer (a pending trim is dropped, a running one is
// waited for) and the GOMEMLIMIT refresh, and returns when their goroutines
// have exited. The THP flag and GOMEMLIMIT stay as they are. Close is
// idempotent and returns nil.
func (c *Controller) Close() error {
	if c == nil {
		return nil
	}
	c.once.Do(func() {
		current.CompareAndSwap(c, nil)
		if c.cancel != nil {
			c.cancel()
		}
		if done := c.report.MemLimit.RefreshDone; done != nil {
			<-done
		}
		if c.trimmer != nil {
			_ = c.trimmer.Close()
		}
	})
	return nil
}

// AfterBurst calls AfterBurst on the controller of the latest Start, and
// does nothing when there is none (or it was closed).
func AfterBurst() { current.Load().AfterBurst() }

// Begin calls Begin on the controller of the latest Start; with none it
// only counts the burst, so that an end func called twice is misuse with or
// without Start (see Controller.Begin; read the count with
// CurrentStats).
func Begin() (end func()) { return current.Load().Begin() }

// CurrentStats returns the Stats of the controller of the latest Start, or,
// with none, the counters kept without one (Misuse, GoMemLimit, CHeap).
func CurrentStats() Stats { return current.Load().Stats() }
