package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"
)

// MemLimitConfig.Ratio's and Floor's defaults (docs/benchmarks.md).
const (
	defaultRatio = 0.9
	defaultFloor = 64 << 20
)

// DefaultRefresh is MemLimitConfig.Refresh's default.
const DefaultRefresh = 10 * time.Second

// ErrImplausibleLimit is matched (errors.Is) by the error for a memory limit
// this process could not be running under (a hard limit of 0 or not above
// what it holds when first read, a memory.high of 0 or 1); GOMEMLIMIT is then
// left as it was.
var ErrImplausibleLimit = errors.New("limits: implausible memory limit")

// Source says where the memory limit behind GOMEMLIMIT came from.
type Source int

const (
	SourceNone     Source = iota // no limit was found; GOMEMLIMIT was left as it was
	SourceCgroupV1               // the cgroup v1 memory controller
	SourceCgroupV2               // memory.max, or memory.high without one (MemLimit.File)
	SourceSystem                 // total system memory (MemLimitConfig.SystemFallback)
	SourceEnv                    // the operator's GOMEMLIMIT or AUTOMEMLIMIT=off, left as set
	SourceDeclared               // MEMCTL_MEMORY_LIMIT
	SourceLambda                 // AWS_LAMBDA_FUNCTION_MEMORY_SIZE, in MB of 2^20 bytes
)

var sourceNames = [...]string{"none", "cgroup v1", "cgroup v2", "system", "env", "declared", "lambda"}

// String returns "none", "cgroup v1", "cgroup v2", "system", "env",
// "declared" or "lambda".
func (s Source) String() string {
	if s >= 0 && int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText returns String's word; it never fails.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a word String returns; other text is an error.
func (s *Source) UnmarshalText(b []byte) error {
	if i := slices.Index(sourceNames[:], string(b)); i >= 0 {
		*s = Source(i)
		return nil
	}
	return fmt.Errorf("limits: unknown Source %q, want none, cgroup v1, cgroup v2, system, env, declared or lambda", b)
}

// MemLimitConfig configures SetGoMemLimit and NewMemLimiter. The zero value is
// the default.
type MemLimitConfig struct {
	// Ratio is the share of the memory limit used for GOMEMLIMIT, in (0.0,
	// 1.0]; AUTOMEMLIMIT wins over it. Default: 0, which means 0.9.
	Ratio float64
	// Floor is the smallest GOMEMLIMIT set, in bytes (the limit when smaller),
	// with a WARN; negative is an error. Default: 0, which means 64 MiB.
	Floor int64
	// SystemFallback uses total system memory as the limit when the process
	// has no cgroup limit. Default: false.
	SystemFallback bool
	// Refresh is the least time between two re-reads of the limit at GC end
	// and between two wake-ups of the follower's timer; negative turns both
	// off. Default: 0, which means DefaultRefresh.
	Refresh time.Duration
	// NoHeadroom turns off the headroom: by default GOMEMLIMIT is Ratio of the
	// limit minus the larger of what this process holds outside the Go runtime
	// and what the cgroup is charged that the Go runtime does not hold and the
	// kernel cannot reclaim (docs/gomemlimit.md). Default: false.
	NoHeadroom bool
	// OnChange is called after each decision that changes what is in force (see
	// MemLimiter.Subscribe), while the limiter is locked: it must be short and
	// not call the limiter. Default: nil.
	OnChange func(MemLimit)
	// KeepOperator keeps an operator's GOMEMLIMIT above the cgroup's hard
	// limit, which by default memctl replaces, with a WARN, while the limit is
	// under it. Default: false.
	KeepOperator bool
	// Logger receives each later change of GOMEMLIMIT (INFO) and each distinct
	// failure and floor warning once (WARN); the first decision's errors are
	// returned, not logged. Default: nil (no logging).
	Logger *slog.Logger

	deps limDeps // test hooks
}

// MemLimit is what SetGoMemLimit or a refresh decided, and why.
// All sizes are in bytes.
type MemLimit struct {
	GoMemLimit  int64   // GOMEMLIMIT after the call; math.MaxInt64: no limit
	MemoryLimit int64   // the memory limit found; 0: none
	Ratio       float64 // the share of MemoryLimit used; 0 without one
	Source      Source  // where MemoryLimit came from
	File        string  `json:",omitempty"` // the file it came from; "" for none and system
	// Outside is what was subtracted from the limit (MemLimitConfig.NoHeadroom);
	// Charged the part read from the cgroup's memory.stat, 0 when the
	// process's own reading was the larger.
	Outside     int64 `json:",omitempty"`
	Charged     int64 `json:",omitempty"`
	Reclaimable int64 `json:",omitempty"` // the limit's cgroup's page cache; 0: unknown
	// High and HighFile are the memory.high GOMEMLIMIT was lowered toward; 0
	// and "" when memory.high did not lower it.
	High     int64  `json:",omitempty"`
	HighFile string `json:",omitempty"`
	// LiveFloor: GOMEMLIMIT was held at 1.5 × the live heap, above memory.high's target.
	LiveFloor bool `json:",omitempty"`
	// AtFloor: GoMemLimit was raised to the floor (or to MemoryLimit under it).
	AtFloor bool `json:",omitempty"`
	// LimitUnknown: a limit may be set above the cgroup namespace, out of sight.
	LimitUnknown bool   `json:",omitempty"`
	Sandbox      string `json:",omitempty"` // the sandbox recognised ("gVisor"), or ""
	// Operator is the operator's GOMEMLIMIT (math.MaxInt64 for "off"), 0 when
	// unset; Overridden is true while memctl overrides it (KeepOperator).
	Operator   int64  `json:",omitempty"`
	Overridden bool   `json:",omitempty"`
	Reason     string // one human-readable sentence about the decision
}

// SetGoMemLimit sets GOMEMLIMIT from the process's cgroup memory limit and
// returns the decision; unless cfg.Refresh is negative or the operator's
// environment wins, the limit is then followed (see MemLimiter) until ctx is
// done. GOMEMLIMIT is Ratio × the hard limit less the memory outside the Go
// runtime, never under Floor nor over the limit; a memory.high under it lowers
// it, never under 1.5 × the live heap. MEMCTL_MEMORY_LIMIT or
// AWS_LAMBDA_FUNCTION_MEMORY_SIZE declares a limit where no cgroup shows one;
// GOMEMLIMIT or AUTOMEMLIMIT=off in the environment wins (SourceEnv), and a
// numeric AUTOMEMLIMIT is the ratio (docs/gomemlimit.md).
//
// With no cgroup limit GOMEMLIMIT is left as it was, Source is SourceNone and
// the error nil. On error (a bad Ratio or Floor, a cgroup file that cannot be
// read or parsed, ErrImplausibleLimit) GOMEMLIMIT is unchanged, and the error
// starts with "limits:". Safe to call from any goroutine; the last call wins.
func SetGoMemLimit(ctx context.Context, cfg MemLimitConfig) (MemLimit, error) {
	m, d, err := NewMemLimiter(cfg)
	context.AfterFunc(ctx, m.Close)
	return d, err
}
