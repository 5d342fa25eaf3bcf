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

// Mode is what a pool does with a Grow past a budget, set by the operator
// with MEMCTL_BUDGETS, read by NewPool (spaces trimmed, any case):
//
//   - enforce (also on, yes, true, 1, t; the default when unset): refuse;
//   - observe: account, count (PoolStats.Observed) and log, at most once per
//     10 s, what would have been refused, without refusing:
//     the safe way to roll budgets out;
//   - off (also no, false, 0, f): refuse nothing, run no heap watch.
//
// MEMCTL=off turns budgets off too. Any other value is logged at WARN and
// budgets are enforced, where memctl's other switches turn their part off:
// a budget is a limit, and a typo must not lift it.
type Mode int

const (
	// ModeEnforce refuses a Grow past a budget with an *ExhaustedError. The
	// default.
	ModeEnforce Mode = iota
	// ModeObserve accounts as ModeEnforce does but lets a Grow past a
	// budget through; it counts it in PoolStats.Observed and logs it (at
	// most one line per 10 s). Heap pressure cancels nothing;
	// a cancel CancelLargest would make is counted and logged the same way.
	// The way to roll budgets out on a running service.
	ModeObserve
	// ModeOff refuses nothing and logs nothing: accounts still count (Used,
	// Peak), and the heap watch does not run. MEMCTL_BUDGETS=off, or
	// MEMCTL=off.
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

// PoolConfig configures NewPool. The zero value is the default: a pool
// named "pool" limited to half of GOMEMLIMIT (or the fallback below), 64 KiB
// chunks, heap pressure at 90% of GOMEMLIMIT.
type PoolConfig struct {
	// Name is the pool's one name: the first element of every scope in
	// its errors, PoolStats.Name, and the pool label of its metrics (package
	// github.com/memctl/memctl/metrics). NewPool logs at WARN when another
	// open pool has the same name. Default: "pool".
	Name string
	// Limit is the pool's budget in bytes, shared by all its accounts.
	// 0 means 0.5 of GOMEMLIMIT, following it: a change
	// the MemLimiter makes (a refresh after a resize) is seen at the pool's
	// next reservation, Limit or Stats call, any other (SetMemoryLimit, a
	// death-spiral lift) at the next GC cycle's end. Without GOMEMLIMIT it
	// is 0.5 of 0.9 of the cgroup memory limit (automemlimit's
	// memlimit.FromCgroup) or of the physical memory (memlimit.FromSystem),
	// until GOMEMLIMIT is set; NewPool fails when it can read neither.
	// NewPool logs the limit and its source at INFO (each later change too),
	// and a WARN when another open pool has a default limit: together they
	// may use all of GOMEMLIMIT; share one pool between transports instead.
	// Unlimited asks for no limit by name; a negative Limit is an error.
	// Default: 0.
	Limit int64
	// ChunkSize is the granularity, in bytes, in which accounts reserve from
	// the pool or their parent account, in [1, 1 GiB]. Grow and Shrink within
	// a reserved chunk touch only the account. Default: 0, which
	// means 64 KiB.
	ChunkSize int64
	// HeapPressure is the share of GOMEMLIMIT, in (0.0, 1.0], that the live
	// Go heap (runtime/metrics /gc/heap/live:bytes) may reach before the pool
	// refuses every Grow that needs more from it; it is checked at the end of
	// each GC cycle, by a hook the collector runs (internal/gcend), not by a
	// timer. GOMEMLIMIT is read again at every cycle
	// (debug.SetMemoryLimit(-1)), so the threshold follows a refresh of
	// GOMEMLIMIT. A negative value turns the watch off. Without GOMEMLIMIT
	// there is no pressure. Refused requests allocate too little to cause
	// the GC cycle that would show the memory free again, so under pressure
	// the pool runs one itself (runtime.GC, on a goroutine that exits, and
	// reads the heap at its end): when the work of an account that the
	// pressure canceled, or that held at least CancelShare of the live heap,
	// ends (Close, WithAccount's cancel, the middleware after the handler),
	// and when it refuses a Grow and no GC cycle has run for a second, so
	// that requests are served again soon after a large request the
	// pressure canceled ends (measured figures: docs/benchmarks.md).
	// Default: 0, which means 0.9.
	HeapPressure float64
	// CancelLargest, under heap pressure, cancels at the end of a GC cycle
	// the context of the open account (among those bound with WithAccount)
	// that uses the most bytes, with an *ExhaustedError as the cause
	// (context.Cause), provided it uses at least CancelShare of the live
	// heap; when none does, the pool logs one WARN line per episode of
	// pressure instead. Default: false.
	CancelLargest bool
	// CancelShare is the share of the live Go heap, in (0.0, 1.0], that an
	// account must hold for CancelLargest to cancel it (for a cancel on the
	// kernel's memory pressure: of the Go memory).
	// Default: 0, which means 0.05.
	CancelShare float64
	// ChargeRatio is the check of the charges against the heap: at the end
	// of each GC cycle (with the heap watch: HeapPressure not negative and
	// budgets not off), when requests are in flight and the live heap
	// beyond its baseline is more than ChargeRatio times what the pool's
	// accounts hold together, and more than 16 MiB (or an eighth of
	// GOMEMLIMIT when that is more), the pool counts the cycle
	// (PoolStats.Undercharged) and logs one WARN line, the first time
	// only, with the figures: the requests hold far more than
	// they report, and their budgets protect nothing. The baseline is the
	// live heap at the last GC end with no account open, lowered whenever
	// the live heap falls under it (PoolStats.HeapBaseline); what is
	// reliable and what is not is in docs/sizing.md. A negative value turns
	// the check off. Default: 0, which means 4.
	ChargeRatio float64
	// ShedSize is the most bytes an account (its own and its children's)
	// may reach while shedding (a GC death spiral); Grows past
	// it are refused. Default: 0, which means 64 MiB, or a
	// sixteenth of a smaller pool's limit, at least one chunk).
	ShedSize int64
	// Strict makes misuse and leaks panic instead of being counted: a
	// Shrink of more than the account grew itself or of a negative size,
	// and an account closed with bytes it did not shrink. The panic comes
	// after every lock is released. Tests turn it on. Default: false.
	Strict bool
	// Logger receives the pool's few log lines: its limit and source at
	// NewPool and each change that follows GOMEMLIMIT (INFO), a second pool
	// with a default limit (WARN),
	// a bad MEMCTL_BUDGETS (WARN), the first misuse and the first leak
	// (WARN), pressure that cancels nothing (WARN, once per episode of heap
	// pressure, at most once a minute for the kernel's),
	// and in ModeObserve what would have been refused (WARN, rate-limited).
	// Default: nil (means slog.Default()).
	Logger *slog.Logger
}

// PoolStats is a snapshot of a pool's counters.
type PoolStats struct {
	// Limit is the pool's limit in bytes now (a default pool's follows
	// GOMEMLIMIT); Unlimited (math.MaxInt64) means no limit.
	Limit int64
	// Mode is the pool's budget mode (MEMCTL_BUDGETS).
	Mode Mode
	// Used is the bytes the pool's accounts hold, including up to two chunks
	// per open account that are reserved but not yet used.
	Used int64
	// Peak is the highest Used since NewPool.
	Peak int64
	// Refused counts Grow calls refused with ErrResourceExhausted by any
	// scope of the pool (account, ancestor, pool, heap pressure). A Grow on
	// an account closed by a heap-pressure cancel is not counted, though its
	// error matches ErrResourceExhausted too (see ErrClosed); the cancel is
	// counted in Canceled.
	Refused int64
	// RefusedBy splits Refused by what refused the Grow.
	RefusedBy RefusedBy
	// Observed counts Grow calls that would have been refused, and cancels
	// CancelLargest would have made, let through because the pool is in
	// ModeObserve or ModeOff.
	Observed int64
	// Misuse counts Shrink calls of more than the account grew itself or
	// of a negative size.
	Misuse int64
	// Leaked counts accounts closed with bytes they grew and did not
	// shrink, and LeakedBytes sums those bytes (see Account.Close).
	Leaked, LeakedBytes int64
	// Unguarded counts limits.Grow calls, in the whole process, whose
	// context carried no account: a handler outside the middleware, with no
	// budget. It is the same in the stats of every pool.
	Unguarded int64
	// UnderHeapPressure is true when the live heap was above HeapThreshold at the
	// end of the last GC cycle.
	UnderHeapPressure bool
	// HeapLive is the live Go heap in bytes at the end of the last GC cycle
	// the watch saw; 0 before the first one or when the watch is off.
	HeapLive int64
	// HeapThreshold is PoolConfig.HeapPressure times GOMEMLIMIT at the last
	// GC cycle, in bytes; 0 when GOMEMLIMIT is not set or the watch is off.
	HeapThreshold int64
	// GCCycles counts the GC cycles the heap watch has seen.
	GCCycles int64
	// Canceled counts contexts canceled by CancelLargest.
	Canceled int64
	// Name is the pool's name (PoolConfig.Name): the first element of the
	// scope of its errors, and the pool label of its metrics.
	Name string
	// InFlight is the number of top-level accounts open: the requests,
	// RPCs and jobs in progress (and any long-lived account).
	InFlight int64
	// Peaks is the distribution of the peaks of the pool's closed top-level
	// accounts, in every mode: the data to size budgets from (see
	// PeakHistogram and docs/sizing.md).
	Peaks PeakHistogram
	// Undercharged counts the GC cycles at whose end the live heap beyond
	// HeapBaseline was more than PoolConfig.ChargeRatio times Used, with
	// requests in flight: charges that look too small.
	Undercharged int64
	// HeapBaseline is the live Go heap in bytes that the charge check takes
	// as the service's own (see PoolConfig.ChargeRatio); -1 before the
	// first GC cycle the watch saw or when the check is off.
	HeapBaseline int64
}
