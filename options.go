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
// memory-pressure watcher (package pressure). Default: the zero
// pressure.Config. Environment: MEMCTL_PRESSURE=on|off.
func WithPressure(cfg pressure.Config) Option { return func(c *config) { c.pressure = cfg } }

// WithAutoBurst configures the burst detector (trim.AutoBurstConfig), which
// finds bursts at GC end and trims after them. An invalid field leaves it off
// and is returned by Start. Default: the zero trim.AutoBurstConfig.
// Environment: MEMCTL_AUTOBURST=on|off, which wins over cfg.Off.
func WithAutoBurst(cfg trim.AutoBurstConfig) Option { return func(c *config) { c.autoBurst = cfg } }

// defaultArenaMax is the glibc arena cap Start applies (glibc's own: 8 a core).
const defaultArenaMax = 2

// WithLogger sets the logger for the startup line and for later warnings.
// Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithTHP sets what Start does with the process's THP flag, which child
// processes inherit. Default: thp.PolicyExceptAdvised where the kernel has it
// (Linux 6.18), else thp.PolicyDisable, or thp.PolicyKeep under an operator's
// GLIBC_TUNABLES glibc.malloc.hugetlb=1. Environment: MEMCTL_THP, which wins
// (off means thp.PolicyKeep, on the default).
func WithTHP(p thp.Policy) Option { return func(c *config) { c.thp, c.thpSet = p, true } }

// WithMemLimit configures GOMEMLIMIT from the cgroup limit; see
// limits.SetGoMemLimit. The refresh stops at Close. Default: the zero
// MemLimitConfig. Environment: GOMEMLIMIT, AUTOMEMLIMIT, MEMCTL_REFRESH,
// MEMCTL_GOMEMLIMIT_FLOOR, MEMCTL_MEMORY_LIMIT, MEMCTL_KEEP_GOMEMLIMIT.
func WithMemLimit(cfg limits.MemLimitConfig) Option { return func(c *config) { c.memLimit = cfg } }

// WithTrimDelay sets how long after the last AfterBurst the trim runs: 0
// (off) or from 1 ms to 24 h; any other value turns trimming off and is
// returned by Start. Default: 2 s. Environment: MEMCTL_TRIM_DELAY, which
// wins; between this and WithTrim's non-zero Delay, the last given wins.
func WithTrimDelay(d time.Duration) Option {
	return func(c *config) { c.trimDelay, c.delayFrom = d, fmt.Sprintf("WithTrimDelay(%v)", d) }
}

// WithTrim configures the trimmer (trim.Config); Start fills in Logger and
// Strict. A non-zero cfg.Delay is as WithTrimDelay; a zero one leaves the
// delay. An invalid field turns trimming off and is returned by Start.
// Default: the zero trim.Config.
func WithTrim(cfg trim.Config) Option {
	return func(c *config) {
		c.trim = cfg
		if cfg.Delay != 0 {
			c.trimDelay, c.delayFrom = cfg.Delay, fmt.Sprintf("WithTrim(trim.Config{Delay: %v})", cfg.Delay)
		}
	}
}

// WithArenaMax sets the glibc malloc arena cap (mallopt M_ARENA_MAX) where
// glibc owns malloc and cgo is on; 0 leaves glibc's default, a negative n is
// invalid (no cap, returned by Start). The operator's MALLOC_ARENA_MAX or
// GLIBC_TUNABLES arena_max wins. Default: 2. Environment:
// MEMCTL_ARENA_MAX=N|off. C threads that need a latency bound want no cap
// (docs/benchmarks.md, "Stalls").
func WithArenaMax(n int) Option { return func(c *config) { c.arenaMax = n } }
