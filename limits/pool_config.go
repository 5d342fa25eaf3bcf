package limits

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/envflag"
)

// defaultPoolRatio is PoolConfig.Limit's default share of GOMEMLIMIT; the
// other half is for unreported memory and the GC's room at GOGC's pace.
const defaultPoolRatio = 0.5

// defaultChunkSize is PoolConfig.ChunkSize's default, in bytes: the pool's
// shared counter sees about one in 64 Grows of 1 KiB.
const defaultChunkSize = 64 << 10

// defaultHeapPressure is PoolConfig.HeapPressure's default.
const defaultHeapPressure = 0.9

// defaultCancelShare is PoolConfig.CancelShare's default: canceling a
// smaller account frees too little to end the pressure.
const defaultCancelShare = 0.05

// defaultShedSize is PoolConfig.ShedSize's default: the burst threshold.
const defaultShedSize = defaultBurstThreshold

// defaultRetryAfter is the ExhaustedError.RetryAfter of a refusal a retry can
// get past (a full pool, heap pressure, shedding).
const defaultRetryAfter = time.Second

// heapRefreshInterval is the longest a pool refusing Grows under heap
// pressure waits for a GC cycle before it runs one (docs/budgets.md).
const heapRefreshInterval = time.Second

// defaultChargeRatio is PoolConfig.ChargeRatio's default: honest charges
// miss the runtime's overhead by well under 2x.
const defaultChargeRatio = 4

// chargeCheckFloor is the least live heap beyond the baseline, in bytes, at
// which the charge check speaks (or GOMEMLIMIT/8 when more; docs/sizing.md).
const chargeCheckFloor = 16 << 20

// maxChunkSize bounds PoolConfig.ChunkSize.
const maxChunkSize = 1 << 30

// Mode is what a pool does with a Grow past a budget, set by the operator with
// MEMCTL_BUDGETS (read by NewPool; any case, spaces trimmed): enforce (the
// default; also on, yes, true, 1, t), observe (count, and log at most once per
// 10 s, what would be refused), or off (also no, false, 0, f, and
// MEMCTL=off). Any other value is logged at WARN and budgets are enforced.
type Mode int

const (
	// ModeEnforce refuses a Grow past a budget with an *ExhaustedError.
	ModeEnforce Mode = iota
	// ModeObserve counts and logs a Grow past a budget, and a cancel
	// CancelLargest would make, and lets it through.
	ModeObserve
	// ModeOff refuses and logs nothing; accounts still count, and the heap
	// watch does not run.
	ModeOff
)

// String returns "enforce", "observe" or "off".
func (m Mode) String() string {
	if names := [...]string{"enforce", "observe", "off"}; m >= 0 && int(m) < len(names) {
		return names[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// observeLogInterval is the least time between two ModeObserve log lines.
const observeLogInterval = 10 * time.Second

// parseMode reads the budget mode from MEMCTL and MEMCTL_BUDGETS (see Mode).
// A bad value returns ModeEnforce and an error, where memctl's other
// switches turn off: a typo must not lift a limit.
func parseMode(getenv func(string) string) (Mode, error) {
	if envflag.IsOff(getenv("MEMCTL")) {
		return ModeOff, nil
	}
	v := getenv("MEMCTL_BUDGETS")
	t := strings.ToLower(strings.TrimSpace(v))
	switch {
	case t == "", t == "enforce", envflag.IsOn(t):
		return ModeEnforce, nil
	case t == "observe":
		return ModeObserve, nil
	case envflag.IsOff(t):
		return ModeOff, nil
	}
	return ModeEnforce, fmt.Errorf("limits: %w; budgets are enforced", &envflag.Error{Name: "MEMCTL_BUDGETS", Value: v, Want: `"enforce", "observe" or "off"`})
}

// PoolConfig configures NewPool. The zero value is the default: a pool named
// "pool" limited to half of GOMEMLIMIT, 64 KiB chunks, heap pressure at 90% of
// GOMEMLIMIT.
type PoolConfig struct {
	// Name is the pool's name: the first element of its scopes, PoolStats.Name
	// and its metrics' pool label; a duplicate is logged at WARN. Default:
	// "pool".
	Name string
	// Limit is the pool's budget in bytes, shared by all its accounts;
	// Unlimited asks for none, and negative is an error. 0 means half of
	// GOMEMLIMIT, following it; without GOMEMLIMIT, half of 0.9 of the cgroup
	// limit or of the physical memory, until it is set. NewPool logs the limit
	// and its source at INFO, and a WARN when another open pool has a default
	// limit: share one pool between transports. Default: 0.
	Limit int64
	// ChunkSize is the granularity, in bytes, in which accounts reserve from
	// their parent, in [1, 1 GiB]. Default: 0, which means 64 KiB.
	ChunkSize int64
	// HeapPressure is the share of GOMEMLIMIT, in (0.0, 1.0], that the live Go
	// heap may reach at the end of a GC cycle before the pool refuses every
	// Grow that needs more from it. Negative turns the watch off; without
	// GOMEMLIMIT there is no pressure. Under pressure the pool runs GC cycles
	// itself so that requests are served again soon (docs/benchmarks.md).
	// Default: 0, which means 0.9.
	HeapPressure float64
	// CancelLargest, under heap pressure, cancels at a GC end the context of
	// the largest account bound with WithAccount, with an *ExhaustedError
	// cause, if it holds at least CancelShare of the live heap (else one
	// WARN per episode). Default: false.
	CancelLargest bool
	// CancelShare is the share of the live heap (on kernel pressure: of the Go
	// memory), in (0.0, 1.0], an account must hold for CancelLargest to cancel
	// it. Default: 0, which means 0.05.
	CancelShare float64
	// ChargeRatio is the check of the charges against the heap: at a GC end
	// with requests in flight, a live heap beyond PoolStats.HeapBaseline more
	// than ChargeRatio times what the accounts hold, and more than 16 MiB (or
	// GOMEMLIMIT/8), is counted in PoolStats.Undercharged and logged once at
	// WARN (docs/sizing.md). Negative turns it off. Default: 0, which means 4.
	ChargeRatio float64
	// ShedSize is the most bytes an account may reach while shedding in a GC
	// death spiral. Default: 0, which means 64 MiB, or a sixteenth of a smaller
	// pool limit (at least one chunk).
	ShedSize int64
	// Strict makes misuse and leaks panic (after every lock is released)
	// instead of being counted. For tests. Default: false.
	Strict bool
	// Logger receives the pool's few log lines (its limit at INFO; misuse,
	// leaks and the like at WARN, once or rate-limited). Default: nil (means
	// slog.Default()).
	Logger *slog.Logger
}

// PoolStats is a snapshot of a pool's counters.
type PoolStats struct {
	// Limit is the pool's limit in bytes now; Unlimited means none.
	Limit int64
	// Mode is the pool's budget mode (MEMCTL_BUDGETS).
	Mode Mode
	// Used is Pool.Used.
	Used int64
	// Peak is the highest Used since NewPool.
	Peak int64
	// Refused counts Grows refused with ErrResourceExhausted (a Grow after a
	// heap-pressure cancel counts in Canceled only).
	Refused int64
	// RefusedBy splits Refused by what refused the Grow.
	RefusedBy RefusedBy
	// Observed counts refusals and cancels let through in ModeObserve or
	// ModeOff.
	Observed int64
	// Misuse counts misused Shrinks (see Account.Shrink).
	Misuse int64
	// Leaked counts leaked accounts and LeakedBytes their bytes
	// (Account.Close).
	Leaked, LeakedBytes int64
	// Unguarded counts limits.Grow calls with no account in ctx, process-wide.
	Unguarded int64
	// UnderHeapPressure is whether HeapLive was above HeapThreshold.
	UnderHeapPressure bool
	// HeapLive is the live Go heap in bytes at the last GC end the watch saw; 0
	// before it or when the watch is off.
	HeapLive int64
	// HeapThreshold is PoolConfig.HeapPressure × GOMEMLIMIT in bytes; 0 without
	// GOMEMLIMIT or the watch.
	HeapThreshold int64
	// GCCycles counts the GC cycles the heap watch has seen.
	GCCycles int64
	// Canceled counts contexts canceled by CancelLargest.
	Canceled int64
	// Name is PoolConfig.Name.
	Name string
	// InFlight is the number of top-level accounts open (requests, RPCs, jobs).
	InFlight int64
	// Peaks is the distribution of the peaks of the closed top-level accounts.
	Peaks PeakHistogram
	// Undercharged counts the GC ends where the charges looked too small (see
	// PoolConfig.ChargeRatio).
	Undercharged int64
	// HeapBaseline is the live heap in bytes the charge check takes as the
	// service's own; -1 before the first GC end or when the check is off.
	HeapBaseline int64
}
