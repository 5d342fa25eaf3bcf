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
// memory-pressure watcher (package pressure), which trim through the
// trimmer's gate. A death spiral sheds large Grows in every pool and lifts
// a cgroup-derived GOMEMLIMIT (unless LiftOff); kernel pressure cancels
// the largest request in pools with CancelLargest. Close stops both.
// Default: the zero pressure.Config. Environment: MEMCTL_PRESSURE=on|off.
func WithPressure(cfg pressure.Config) Option { return func(c *config) { c.pressure = cfg } }

// defaultArenaMax is the glibc arena cap Start applies: glibc otherwise makes
// up to 8 arenas per core, each keeping what a burst of C threads freed in it.
const defaultArenaMax = 2

// WithLogger sets the logger for the startup line and for later warnings.
// Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithTHP sets what Start does with the process's THP flag, inherited by child
// processes (fork and exec), which keep their advised regions' huge pages under
// the default. Default: thp.PolicyExceptAdvised where the kernel has it (Linux
// 6.18), else thp.PolicyDisable; under an operator's GLIBC_TUNABLES
// glibc.malloc.hugetlb=1 (glibc advises its heap) an older kernel's flag is
// left as it is, and the startup line's thp_note says so. Environment:
// MEMCTL_THP, which wins (off means thp.PolicyKeep, on the default).
func WithTHP(p thp.Policy) Option { return func(c *config) { c.thp, c.thpSet = p, true } }

// WithMemLimit configures GOMEMLIMIT from the cgroup limit; see
// limits.SetGoMemLimit. The refresh stops at Close. Default: the zero
// MemLimitConfig. Environment: GOMEMLIMIT, AUTOMEMLIMIT, MEMCTL_REFRESH,
// MEMCTL_GOMEMLIMIT_FLOOR, MEMCTL_MEMORY_LIMIT, MEMCTL_KEEP_GOMEMLIMIT.
func WithMemLimit(cfg limits.MemLimitConfig) Option { return func(c *config) { c.memLimit = cfg } }

// WithTrimDelay sets how long after the last AfterBurst the trim runs: 0
// turns trimming off; otherwise from 1 ms to 24 h. Any other value is
// invalid: trimming is off, and Start logs it at WARN and returns it.
// Default: 2 s. Environment: MEMCTL_TRIM_DELAY, which wins; between this
// option and a non-zero Delay of WithTrim, the last one given wins.
func WithTrimDelay(d time.Duration) Option {
	return func(c *config) { c.trimDelay, c.delayFrom = d, fmt.Sprintf("WithTrimDelay(%v)", d) }
}

// WithTrim configures the trimmer (package trim; see trim.Config). Start fills
// in Logger (WithLogger's) and Strict (SetStrict's). A non-zero cfg.Delay is as
// WithTrimDelay; a zero one leaves the delay as it is, so WithTrim cannot turn
// trimming off. An invalid field turns trimming off, and Start logs the error
// at WARN and returns it. Default: the zero trim.Config.
func WithTrim(cfg trim.Config) Option {
	return func(c *config) {
		c.trim = cfg
		if cfg.Delay != 0 {
			c.trimDelay, c.delayFrom = cfg.Delay, fmt.Sprintf("WithTrim(trim.Config{Delay: %v})", cfg.Delay)
		}
	}
}

// WithArenaMax sets the glibc malloc arena cap (mallopt M_ARENA_MAX) Start
// applies where glibc owns malloc and cgo is on; 0 leaves glibc's default. A
// negative n is invalid: no cap, and Start logs it at WARN and returns it.
// MALLOC_ARENA_MAX or an arena_max in GLIBC_TUNABLES set by the operator always
// wins. Default: 2. Environment: MEMCTL_ARENA_MAX=N|off. A C thread waits for
// its arena's whole malloc_trim, and a cap puts more of a burst in each arena:
// C threads that need a latency bound want no cap (docs/benchmarks.md,
// "Stalls").
func WithArenaMax(n int) Option { return func(c *config) { c.arenaMax = n } }
