package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// defaultRatio is MemLimitConfig.Ratio's default, automemlimit's.
const defaultRatio = 0.9

// defaultFloor is MemLimitConfig.Floor's default: below it a small service's
// GC runs on almost every allocation (docs/benchmarks.md).
const defaultFloor = 64 << 20

// DefaultRefresh is MemLimitConfig.Refresh's default.
const DefaultRefresh = 10 * time.Second

// ErrImplausibleLimit is matched (errors.Is) by the error for a memory limit
// this process could not be running under: a hard limit of 0 or, when first
// read, not above the memory it holds (RssAnon + RssShmem), or a memory.high of
// 0 or 1. GOMEMLIMIT is then left as it was (docs/gomemlimit.md).
var ErrImplausibleLimit = errors.New("limits: implausible memory limit")

// Source says where the memory limit behind GOMEMLIMIT came from.
type Source int

const (
	// SourceNone: no limit was found; GOMEMLIMIT was left as it was.
	SourceNone Source = iota
	// SourceCgroupV1: the cgroup v1 memory controller.
	SourceCgroupV1
	// SourceCgroupV2: a cgroup v2 memory.max, or memory.high without one
	// (MemLimit.File says which).
	SourceCgroupV2
	// SourceSystem: total system memory (MemLimitConfig.SystemFallback).
	SourceSystem
	// SourceEnv: the operator's GOMEMLIMIT or AUTOMEMLIMIT=off; memctl did not
	// touch GOMEMLIMIT.
	SourceEnv
	// SourceDeclared: MEMCTL_MEMORY_LIMIT (MemLimit.File is
	// "MEMCTL_MEMORY_LIMIT=<value>").
	SourceDeclared
	// SourceLambda: AWS Lambda's AWS_LAMBDA_FUNCTION_MEMORY_SIZE,
	// in MB of 2^20 bytes.
	SourceLambda
)

// String returns "none", "cgroup v1", "cgroup v2", "system", "env",
// "declared" or "lambda".
func (s Source) String() string {
	switch s {
	case SourceNone:
		return "none"
	case SourceCgroupV1:
		return "cgroup v1"
	case SourceCgroupV2:
		return "cgroup v2"
	case SourceSystem:
		return "system"
	case SourceEnv:
		return "env"
	case SourceDeclared:
		return "declared"
	case SourceLambda:
		return "lambda"
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText returns String's word, so that a Source reads "cgroup v1" in JSON
// and slog. It never fails.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a word String returns. Any other text is an error that
// quotes it, and s is left as it was.
func (s *Source) UnmarshalText(b []byte) error {
	for v := SourceNone; v <= SourceLambda; v++ {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("limits: unknown Source %q, want none, cgroup v1, cgroup v2, system, env, declared or lambda", b)
}

// MemLimitConfig configures SetGoMemLimit and NewMemLimiter. The zero value is
// the default: 90% of the cgroup limit less what is charged outside the Go
// runtime, never under 64 MiB, re-read at most every 10 s at GC end and when a
// limit file is written, no system fallback, no logging.
type MemLimitConfig struct {
	// Ratio is the share of the memory limit used for GOMEMLIMIT, in (0.0,
	// 1.0]; AUTOMEMLIMIT wins over it. Default: 0, which means 0.9.
	Ratio float64
	// Floor is the smallest GOMEMLIMIT set, in bytes (the limit when smaller),
	// with a WARN. Negative is an error. Default: 0, which means 64 MiB
	// (docs/benchmarks.md). Environment (through memctl.Start):
	// MEMCTL_GOMEMLIMIT_FLOOR.
	Floor int64
	// SystemFallback uses total system memory as the limit when the process
	// has no cgroup limit. Default: false.
	SystemFallback bool
	// Refresh is the least time between two re-reads of the limit at GC end,
	// and between two wake-ups of the follower's timer (see MemLimiter): a
	// resize is followed within about Refresh, a write to a limit file at once.
	// Negative turns both off. Default: 0 (means DefaultRefresh, 10 s).
	// Environment (through memctl.Start): MEMCTL_REFRESH=off|<duration>.
	Refresh time.Duration
	// NoHeadroom turns off the headroom: by default GOMEMLIMIT is Ratio of the
	// limit minus the larger of what this process holds outside the Go runtime
	// (C heap, thread stacks, shmem) and what the cgroup is charged that the Go
	// runtime does not hold and the kernel cannot reclaim (memory.stat: other
	// processes, tmpfs, kernel memory), both read again at each refresh; page
	// cache is not subtracted (docs/gomemlimit.md). Turn it off where
	// GOMEMLIMIT is computed for another process (memctl exec). Default: false.
	NoHeadroom bool
	// OnChange is called after each decision that changes what is in force (see
	// MemLimiter.Subscribe), while the limiter is locked: it must be short and
	// not call the limiter. Default: nil.
	OnChange func(MemLimit)
	// KeepOperator keeps an operator's GOMEMLIMIT above the cgroup's hard
	// limit, which by default memctl replaces while the limit is under it, with
	// a WARN. Default: false. Environment (through memctl.Start):
	// MEMCTL_KEEP_GOMEMLIMIT=on.
	KeepOperator bool
	// Logger receives each later change of GOMEMLIMIT (INFO) and each distinct
	// failure and floor warning once (WARN); the first decision is returned,
	// not logged, but for its floor warning. Default: nil (no logging).
	Logger *slog.Logger

	// Test hooks; nil means the real read (newMemLimiter). noGCEnd leaves
	// out the refresh at GC end.
	read       func() (cgroupfs.Limit, error)
	usage      func() (held, goMapped int64, err error)
	cgroupFile string
	charge     func(version int, dir string) (charge, error)
	live       func() int64
	follower   func() (follower, error)
	noGCEnd    bool
}

// MemLimit is what SetGoMemLimit or a refresh decided, and why.
type MemLimit struct {
	// GoMemLimit is GOMEMLIMIT after the call, in bytes; math.MaxInt64
	// means no limit (the Go default).
	GoMemLimit int64
	// MemoryLimit is the memory limit found, in bytes; 0 when none was.
	MemoryLimit int64
	// Ratio is the share of MemoryLimit used (0 without one); GoMemLimit is
	// Ratio × MemoryLimit − Outside, raised to the floor.
	Ratio float64
	// Source says where MemoryLimit came from, File the file ("" for none,
	// system).
	Source Source
	File   string `json:",omitempty"`
	// Outside is what was subtracted from the limit, in bytes (see
	// MemLimitConfig.NoHeadroom); Charged is the part read from the cgroup's
	// memory.stat (0 when the process's own reading was the larger).
	Outside int64 `json:",omitempty"`
	Charged int64 `json:",omitempty"`
	// Reclaimable is the limit's cgroup's page cache in bytes (not subtracted);
	// 0 when unknown.
	Reclaimable int64 `json:",omitempty"`
	// High and HighFile are the cgroup v2 memory.high GOMEMLIMIT was lowered
	// toward, in bytes; 0 and "" when memory.high did not lower it.
	High     int64  `json:",omitempty"`
	HighFile string `json:",omitempty"`
	// LiveFloor is true when GOMEMLIMIT was held at 1.5 × the live heap, above
	// what memory.high asked for.
	LiveFloor bool `json:",omitempty"`
	// AtFloor is true when GoMemLimit was raised to the floor (or to
	// MemoryLimit under it): the GC will run often.
	AtFloor bool `json:",omitempty"`
	// LimitUnknown is true when a limit may be set above the process's cgroup
	// namespace, out of sight (docs/gomemlimit.md).
	LimitUnknown bool `json:",omitempty"`
	// Sandbox names the sandbox recognised ("gVisor"), where the cgroup files
	// may not carry the limit the host enforces; "" otherwise.
	Sandbox string `json:",omitempty"`
	// Operator is the operator's GOMEMLIMIT in bytes (math.MaxInt64 for "off"),
	// 0 when unset; Overridden is true while memctl overrides it (see
	// MemLimitConfig.KeepOperator).
	Operator   int64 `json:",omitempty"`
	Overridden bool  `json:",omitempty"`
	// Reason is one human-readable sentence about the decision.
	Reason string
}

// SetGoMemLimit sets GOMEMLIMIT (debug.SetMemoryLimit) from the process's
// cgroup memory limit, v1 or v2, and returns the decision. Unless cfg.Refresh
// is negative or the operator's environment wins, the limit is then followed
// (see MemLimiter) until ctx is done.
//
// GOMEMLIMIT is Ratio × the hard limit (v1's limit or memory.max) less the
// memory outside the Go runtime (MemLimitConfig.NoHeadroom), never under
// MemLimitConfig.Floor nor over the limit; a v2 memory.high under it lowers it,
// never under 1.5 × the live heap. MEMCTL_MEMORY_LIMIT or
// AWS_LAMBDA_FUNCTION_MEMORY_SIZE declares a limit where no cgroup shows one.
// With GOMEMLIMIT or AUTOMEMLIMIT=off in the environment, Source is SourceEnv
// and GOMEMLIMIT is left as set (see MemLimitConfig.KeepOperator); a numeric
// AUTOMEMLIMIT is the ratio. Each case: docs/gomemlimit.md.
//
// With no cgroup limit GOMEMLIMIT is left as it was, Source is SourceNone,
// Reason starts with "no cgroup memory limit", and the error is nil (see
// cfg.SystemFallback, MemLimit.LimitUnknown). On error (an invalid Ratio or
// Floor, a cgroup file that cannot be read or parsed, ErrImplausibleLimit)
// GOMEMLIMIT is unchanged and is the result's GoMemLimit, and the error starts
// with "limits:". Safe to call from any goroutine; GOMEMLIMIT is process-wide,
// the last call wins.
func SetGoMemLimit(ctx context.Context, cfg MemLimitConfig) (MemLimit, error) {
	m, d, err := NewMemLimiter(cfg)
	context.AfterFunc(ctx, m.Close)
	return d, err
}
