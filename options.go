package memctl

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/pressure"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
)

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

// defaultArenaMax is the glibc arena cap Start applies where glibc owns
// malloc: glibc otherwise creates up to 8 arenas per core, and each keeps
// what a burst of C threads freed in it (see cheap.SetArenaMax).
const defaultArenaMax = 2

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
// trim.DefaultDelay (2 s). Environment: MEMCTL_TRIM_DELAY, which wins over
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
// a non-zero cfg.Delay given; otherwise trim.DefaultDelay. A zero cfg.Delay
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
// GLIBC_TUNABLES set by the operator always wins. Default: 2.
// Environment: MEMCTL_ARENA_MAX=N|off.
//
// A cap puts more of a burst in each arena, and malloc_trim holds an
// arena's lock while it returns that arena's free pages: a C thread that
// mallocs meanwhile waits for its arena's whole trim (0.8-2.3 s for a
// 2 GiB burst of small blocks under the cap of 2 in docs/benchmarks.md,
// "Stalls"). A program with C threads that need a latency bound sets
// MEMCTL_ARENA_MAX=off or uses an allocator whose release is sliced.
func WithArenaMax(n int) Option { return func(c *config) { c.arenaMax = n } }
