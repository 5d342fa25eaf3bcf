package limits

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/envflag"
)

// defaultPoolRatio is the share of GOMEMLIMIT that becomes a pool's limit
// when PoolConfig.Limit is 0. Accounted bytes are live heap; the other half
// is for what requests do not report (buffers, runtime, goroutine stacks) and
// for the garbage the collector needs room for between cycles: with a live
// heap at half of GOMEMLIMIT the collector still runs at its normal GOGC pace
// instead of continuously.
const defaultPoolRatio = 0.5

// defaultChunkSize is the size, in bytes, of the chunks in which an account
// reserves from its pool (or parent account) when PoolConfig.ChunkSize is 0.
// CockroachDB's util/mon reserves in 10 KiB chunks; 64 KiB keeps the pool's
// shared counter out of the path of all but about one in 64 allocations of
// 1 KiB, at a cost of at most two chunks per open account held but unused.
const defaultChunkSize = 64 << 10

// defaultHeapPressure is the share of GOMEMLIMIT above which the live Go
// heap puts a pool under heap pressure when PoolConfig.HeapPressure is 0.
// With a live heap at 90% of GOMEMLIMIT the collector runs nearly
// continuously and any further growth risks the OOM killer.
const defaultHeapPressure = 0.9

// defaultCancelShare is the share of the live Go heap that an account must
// hold before CancelLargest cancels it, when PoolConfig.CancelShare is 0.
// Canceling an account that holds less frees too little to end the
// pressure: the pressure then comes from memory outside the accounts (a
// cache, unreported buffers, many small requests) and the pool says so once
// at WARN instead of canceling small requests one per GC cycle.
const defaultCancelShare = 0.05

// defaultShedSize is the most bytes an account may reach while shedding:
// the size at which examples/server's requests count as a burst
// (defaultBurstThreshold), so that what sheds is the large work.
const defaultShedSize = defaultBurstThreshold

// defaultRetryAfter is the ExhaustedError.RetryAfter of a refusal that a
// retry can get past: the pool is full or under heap pressure, and both
// change as other requests end and the collector runs. WriteError sends it
// as Retry-After: 1 (seconds, RFC 9110 section 10.2.3).
const defaultRetryAfter = time.Second

// heapRefreshInterval is the longest a pool refusing Grows under heap
// pressure waits for a GC cycle before it runs one (runtime.GC on a
// goroutine of its own that exits): refused requests allocate almost
// nothing, so the cycle that would clear the pressure may otherwise not come
// before the runtime's forced GC, two minutes later. At most one such GC a
// second, and none while the program's own allocation runs the collector.
const heapRefreshInterval = time.Second

// defaultChargeRatio is how many times more than the pool's accounts hold
// together the live heap beyond its baseline must be, at the end of a GC
// cycle with requests in flight, before the pool says the charges look too
// small, when PoolConfig.ChargeRatio is 0 (see there). Code that reports
// its structures' sizes (8·n for n int64, len(b) for a []byte) under-counts
// the runtime's overhead by well under 2x (map buckets, slice capacity,
// pointer-rich nodes); 4x is past that, and a handler that charges 8 bytes
// for each 1 KiB row (128x) is far past it.
const defaultChargeRatio = 4

// chargeCheckFloor is the fewest bytes, beyond the baseline, that the live
// heap must hold for the charge check to speak (16 MiB, or an eighth of
// GOMEMLIMIT when that is more): below it, connection buffers, goroutine
// stacks and the runtime's own growth with the load are not told from
// under-reported requests.
const chargeCheckFloor = 16 << 20

// maxChunkSize bounds PoolConfig.ChunkSize.
const maxChunkSize = 1 << 30

// Mode is what a pool does with a Grow past a budget, set by the operator with
// MEMCTL_BUDGETS (read by NewPool, in memctl's switch grammar): enforce (the
// default; also on, yes, true, 1, t), observe (count and log, at most once per
// 10 s, what would be refused: the way to roll budgets out), or off (also no,
// false, 0, f, and MEMCTL=off). Any other value is logged at WARN and budgets
// are enforced: a typo must not lift a limit.
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
	switch m {
	case ModeEnforce:
		return "enforce"
	case ModeObserve:
		return "observe"
	case ModeOff:
		return "off"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// observeLogInterval is the shortest time between two log lines of a pool
// in ModeObserve about Grows it let through; the ones in between are only
// counted (PoolStats.Observed).
const observeLogInterval = 10 * time.Second

// parseMode reads the budget mode from MEMCTL and MEMCTL_BUDGETS, in the
// grammar of memctl's other switches (spaces trimmed, any case, the
// strconv.ParseBool spellings and yes/no as on and off): MEMCTL off ("off",
// "no", "0", "f", "false") is ModeOff; otherwise MEMCTL_BUDGETS "" (unset),
// "enforce" or an on word ("on", "yes", "1", "t", "true") is ModeEnforce,
// "observe" is ModeObserve, and "off" or an off word is ModeOff. Any other
// value returns ModeEnforce and an error, where memctl's other switches turn
// their part off: a budget is a limit, and a typo must not lift it.
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
	// the open account bound with WithAccount that uses the most, with an
	// *ExhaustedError as its cause, if it holds at least CancelShare of the
	// live heap (else one WARN per episode). Default: false.
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
	// Logger receives the pool's few log lines: its limit (INFO), and at WARN a
	// second default pool, a bad MEMCTL_BUDGETS, the first misuse and leak,
	// pressure that cancels nothing, and, rate-limited, what ModeObserve let
	// through. Default: nil (means slog.Default()).
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
