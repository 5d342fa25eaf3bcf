package limits

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/gcend"
)

// DefaultPoolRatio is the share of GOMEMLIMIT that becomes a pool's limit
// when PoolConfig.Limit is 0. Accounted bytes are live heap; the other half
// is for what requests do not report (buffers, runtime, goroutine stacks) and
// for the garbage the collector needs room for between cycles: with a live
// heap at half of GOMEMLIMIT the collector still runs at its normal GOGC pace
// instead of continuously.
const DefaultPoolRatio = 0.5

// DefaultChunkSize is the size, in bytes, of the chunks in which an account
// reserves from its pool (or parent account) when PoolConfig.ChunkSize is 0.
// CockroachDB's util/mon reserves in 10 KiB chunks; 64 KiB keeps the pool's
// shared counter out of the path of all but about one in 64 allocations of
// 1 KiB, at a cost of at most two chunks per open account held but unused.
const DefaultChunkSize = 64 << 10

// DefaultHeapPressure is the share of GOMEMLIMIT above which the live Go
// heap puts a pool under heap pressure when PoolConfig.HeapPressure is 0.
// With a live heap at 90% of GOMEMLIMIT the collector runs nearly
// continuously and any further growth risks the OOM killer.
const DefaultHeapPressure = 0.9

// DefaultCancelShare is the share of the live Go heap that an account must
// hold before CancelLargest cancels it, when PoolConfig.CancelShare is 0.
// Canceling an account that holds less frees too little to end the
// pressure: the pressure then comes from memory outside the accounts (a
// cache, unreported buffers, many small requests) and the pool says so once
// at WARN instead of canceling small requests one per GC cycle.
const DefaultCancelShare = 0.05

// DefaultShedSize is the most bytes an account may reach while shedding:
// the size at which examples/server's requests count as a burst
// (DefaultBurstThreshold), so that what sheds is the large work.
const DefaultShedSize = DefaultBurstThreshold

// DefaultRetryAfter is the ExhaustedError.RetryAfter of a refusal that a
// retry can get past: the pool is full or under heap pressure, and both
// change as other requests end and the collector runs. WriteError sends it
// as Retry-After: 1 (seconds, RFC 9110 section 10.2.3).
const DefaultRetryAfter = time.Second

// heapRefreshInterval is the longest a pool refusing Grows under heap
// pressure waits for a GC cycle before it runs one (runtime.GC on a
// goroutine of its own that exits): refused requests allocate almost
// nothing, so the cycle that would clear the pressure may otherwise not come
// before the runtime's forced GC, two minutes later. At most one such GC a
// second, and none while the program's own allocation runs the collector.
const heapRefreshInterval = time.Second

// DefaultChargeRatio is how many times more than the pool's accounts hold
// together the live heap beyond its baseline must be, at the end of a GC
// cycle with requests in flight, before the pool says the charges look too
// small, when PoolConfig.ChargeRatio is 0 (see there). Code that reports
// its structures' sizes (8·n for n int64, len(b) for a []byte) under-counts
// the runtime's overhead by well under 2x (map buckets, slice capacity,
// pointer-rich nodes); 4x is past that, and a handler that charges 8 bytes
// for each 1 KiB row (128x) is far past it.
const DefaultChargeRatio = 4

// ChargeCheckFloor is the fewest bytes, beyond the baseline, that the live
// heap must hold for the charge check to speak (16 MiB, or an eighth of
// GOMEMLIMIT when that is more): below it, connection buffers, goroutine
// stacks and the runtime's own growth with the load are not told from
// under-reported requests.
const ChargeCheckFloor = 16 << 20

// maxChunkSize bounds PoolConfig.ChunkSize.
const maxChunkSize = 1 << 30

// Mode is what a pool does with a Grow past a budget, set by the operator
// with MEMCTL_BUDGETS, read by NewPool (spaces trimmed, any case):
//
//   - enforce (also on, yes, true, 1, t; the default when unset): refuse;
//   - observe: account, count (PoolStats.Observed) and log, at most once per
//     ObserveLogInterval, what would have been refused, without refusing:
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
	// most one line per ObserveLogInterval). Heap pressure cancels nothing;
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

// ObserveLogInterval is the shortest time between two log lines of a pool
// in ModeObserve about Grows it let through; the ones in between are only
// counted (PoolStats.Observed).
const ObserveLogInterval = 10 * time.Second

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
	// 0 means DefaultPoolRatio (0.5) of GOMEMLIMIT, following it: a change
	// the MemLimiter makes (a refresh after a resize) is seen at the pool's
	// next reservation, Limit or Stats call, any other (SetMemoryLimit, a
	// death-spiral lift) at the next GC cycle's end. Without GOMEMLIMIT it
	// is 0.5 of DefaultRatio (0.9) of the cgroup memory limit (automemlimit's
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
	// a reserved chunk touch only the account. Default: 0 (means
	// DefaultChunkSize, 64 KiB).
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
	// Default: 0 (means DefaultHeapPressure, 0.9).
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
	// Default: 0 (means DefaultCancelShare, 0.05).
	CancelShare float64
	// ChargeRatio is the check of the charges against the heap: at the end
	// of each GC cycle (with the heap watch: HeapPressure not negative and
	// budgets not off), when requests are in flight and the live heap
	// beyond its baseline is more than ChargeRatio times what the pool's
	// accounts hold together, and more than ChargeCheckFloor, the pool
	// counts the cycle (PoolStats.Undercharged) and logs one WARN line, the
	// first time only, with the figures: the requests hold far more than
	// they report, and their budgets protect nothing. The baseline is the
	// live heap at the last GC end with no account open, lowered whenever
	// the live heap falls under it (PoolStats.HeapBaseline); what is
	// reliable and what is not is in docs/sizing.md. A negative value turns
	// the check off. Default: 0 (means DefaultChargeRatio, 4).
	ChargeRatio float64
	// ShedSize is the most bytes an account (its own and its children's)
	// may reach while shedding (a GC death spiral); Grows past
	// it are refused. Default: 0 (means DefaultShedSize, 64 MiB, or a
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

// Pool is a shared memory budget in bytes from which accounts are opened.
// The pool's counter is touched only when an account crosses a chunk
// boundary. A Pool is safe for concurrent use. Create one with NewPool and
// Close it when done; the zero value is not usable.
type Pool struct {
	// used is the sum of the reservations of the pool's top-level accounts.
	used atomic.Int64
	peak atomic.Int64
	// burstPeak is the highest used since the last burst that the
	// middleware's requests ended together (see Middleware).
	burstPeak atomic.Int64
	pressure  atomic.Bool
	_         [39]byte // keep the shared counters on their own cache line

	// Read on every Grow, written once: a line of its own that stays
	// shared in every core's cache.
	closed atomic.Bool
	mode   Mode
	limit  atomic.Int64 // Unlimited when the pool has no limit
	chunk  int64
	// derived is true for a pool made with Limit 0: its limit follows
	// GOMEMLIMIT. gen is the memLimitGen its limit was computed at.
	derived bool
	gen     atomic.Uint64
	_       [16]byte

	refused       atomic.Int64
	refusedBy     [4]atomic.Int64 // by refusalScope
	observed      atomic.Int64
	misuse        atomic.Int64
	leaked        atomic.Int64
	leakedBytes   atomic.Int64
	canceled      atomic.Int64
	heapLive      atomic.Int64
	heapThreshold atomic.Int64
	heapCycles    atomic.Int64
	lastCycle     atomic.Int64 // time.Now().UnixNano() of the last cycle seen
	observeLogAt  atomic.Int64 // UnixNano of the last ModeObserve log line
	misuseLogged  atomic.Bool
	leakLogged    atomic.Bool
	outsideLogged atomic.Bool  // reset when the pressure ends
	kernelWarnAt  atomic.Int64 // UnixNano of CancelLargest's last no-cancel WARN
	inFlight      atomic.Int64 // open top-level accounts
	baseline      atomic.Int64 // the charge check's heap baseline; -1: none yet
	undercharged  atomic.Int64
	chargeLogged  atomic.Bool
	peaks         peakHistogram
	seq           atomic.Int64 // numbers the accounts of StartWork and Do

	name          string
	heapScope     string
	heapRatio     float64
	cancelShare   float64
	chargeRatio   float64
	shedSize      int64 // PoolConfig.ShedSize; 0: the default (shedLimit)
	cancelLargest bool
	strict        bool
	log           *slog.Logger
	sub           *gcend.Subscription

	heapMu    sync.Mutex // serializes heap readings
	sample    [2]metricsSample
	seenCycle uint64 // the GC cycle read last; guarded by heapMu

	mu           sync.Mutex // guards the list of cancellable accounts and refreshing
	head         *Account
	refreshing   bool           // a refreshHeap goroutine runs
	refreshAgain bool           // it runs one more cycle
	wg           sync.WaitGroup // the refresh goroutine
}

// unguarded counts limits.Grow calls whose context had no account.
var unguarded atomic.Int64

// fromCgroup and fromSystem read the memory a pool without GOMEMLIMIT falls
// back on; tests replace them.
var (
	fromCgroup = memlimit.FromCgroup
	fromSystem = memlimit.FromSystem
)

// NewPool returns a pool configured by cfg. It returns an error matching
// ErrInvalidSize for a negative Limit or a ChunkSize outside [0, 1 GiB], an
// error for a HeapPressure or CancelShare above 1 or NaN, and an error when
// Limit is 0, GOMEMLIMIT is not set and neither a cgroup limit nor the
// physical memory can be read. It reads MEMCTL and MEMCTL_BUDGETS (see
// Mode); a bad MEMCTL_BUDGETS is logged at WARN and budgets are enforced.
// With the heap watch on (the default), the pool subscribes to the end of
// each GC cycle (internal/gcend); it starts no goroutine and no timer of its
// own. Call Close to remove it; a pool dropped without Close removes it at
// the next cycle.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if cfg.Limit < 0 {
		return nil, fmt.Errorf("%w: PoolConfig.Limit %d is negative", ErrInvalidSize, cfg.Limit)
	}
	if cfg.ShedSize < 0 {
		return nil, fmt.Errorf("%w: PoolConfig.ShedSize %d is negative", ErrInvalidSize, cfg.ShedSize)
	}
	if cfg.ChunkSize < 0 || cfg.ChunkSize > maxChunkSize {
		return nil, fmt.Errorf("%w: PoolConfig.ChunkSize %d is not in [0, %d]", ErrInvalidSize, cfg.ChunkSize, maxChunkSize)
	}
	if math.IsNaN(cfg.HeapPressure) || cfg.HeapPressure > 1 {
		return nil, fmt.Errorf("limits: PoolConfig.HeapPressure %v is not in (0.0, 1.0] (0: default, negative: off)", cfg.HeapPressure)
	}
	if !(cfg.CancelShare >= 0 && cfg.CancelShare <= 1) {
		return nil, fmt.Errorf("limits: PoolConfig.CancelShare %v is not in (0.0, 1.0] (0: default)", cfg.CancelShare)
	}
	if math.IsNaN(cfg.ChargeRatio) || math.IsInf(cfg.ChargeRatio, 0) {
		return nil, fmt.Errorf("limits: PoolConfig.ChargeRatio %v is not a finite number (0: default, negative: off)", cfg.ChargeRatio)
	}
	p := &Pool{
		name:          cfg.Name,
		derived:       cfg.Limit == 0,
		chunk:         cfg.ChunkSize,
		heapRatio:     cfg.HeapPressure,
		cancelShare:   cfg.CancelShare,
		chargeRatio:   cfg.ChargeRatio,
		cancelLargest: cfg.CancelLargest,
		strict:        cfg.Strict,
		log:           cfg.Logger,
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.name == "" {
		p.name = "pool"
	}
	p.heapScope = p.name + " (heap pressure)"
	if p.chunk == 0 {
		p.chunk = DefaultChunkSize
	}
	if p.cancelShare == 0 {
		p.cancelShare = DefaultCancelShare
	}
	if p.chargeRatio == 0 {
		p.chargeRatio = DefaultChargeRatio
	}
	p.baseline.Store(-1)
	mode, err := parseMode(os.Getenv)
	if err != nil {
		p.log.Warn("limits: bad MEMCTL_BUDGETS", "pool", p.name, "error", err)
	}
	p.mode = mode
	if mode != ModeEnforce {
		p.log.Info("limits: budgets are not enforced", "pool", p.name, "mode", mode.String())
	}
	limit, from := cfg.Limit, "PoolConfig.Limit"
	if limit == Unlimited {
		from = "PoolConfig.Limit: Unlimited"
	}
	if p.derived {
		p.gen.Store(memLimitGen.Load())
		if limit, from, err = p.defaultLimit(debug.SetMemoryLimit(-1)); err != nil {
			return nil, err
		}
	}
	p.limit.Store(limit)
	p.shedSize = cfg.ShedSize // 0: shedSizeFor the limit now (shedLimit)
	if p.heapRatio == 0 {
		p.heapRatio = DefaultHeapPressure
	}
	p.sample[0].Name = liveHeapMetric
	p.sample[1].Name = gcCyclesMetric
	if p.heapRatio > 0 && p.mode != ModeOff {
		wp := weak.Make(p) // weak: a pool dropped without Close stops its watch
		p.sub = gcend.Subscribe(func(s *gcend.Sample) bool {
			p := wp.Value()
			if p == nil {
				return false
			}
			p.heapAt(s.Live, s.Cycles, s.GoMemLimit)
			return true
		})
	}
	if p.mode != ModeOff && poolNamed(p.name) {
		p.log.Warn("limits: another open pool has the same name: the errors, Stats and metrics of the two cannot be told apart (set PoolConfig.Name)", "pool", p.name)
	}
	p.log.Info("limits: pool made", "pool", p.name, "limit", mibOrUnlimited(limit), "limit_source", from)
	if other := derivedPool(); p.derived && p.mode != ModeOff && other != "" {
		p.log.Warn("limits: a second pool with the default limit: each may use half of GOMEMLIMIT, together all of it; share one pool (the HTTP middleware, grpcbudget and connectbudget can) or set PoolConfig.Limit",
			"pool", p.name, "other_pool", other)
	}
	registerPool(p)
	return p, nil
}

// derivedPool returns the name of an open pool whose limit follows
// GOMEMLIMIT, "" when there is none.
func derivedPool() string {
	name := ""
	eachPool(func(q *Pool) {
		if name == "" && q.derived && q.mode != ModeOff && !q.closed.Load() {
			name = q.name
		}
	})
	return name
}

// memLimitGen counts the changes of GOMEMLIMIT made by this package (the
// MemLimiter's refresh): a pool whose limit follows GOMEMLIMIT compares it
// with the generation its limit was computed at, one atomic load on the
// pool's path (an account crossing a chunk boundary), never on Grow's
// common path. Changes made elsewhere (the program's SetMemoryLimit, a
// death-spiral lift) are seen at the next GC cycle's end (observeHeap).
var memLimitGen atomic.Uint64

// noteMemLimitSet is called after every debug.SetMemoryLimit of this
// package that changes GOMEMLIMIT.
func noteMemLimitSet() { memLimitGen.Add(1) }

// curLimit returns the pool's limit, first following GOMEMLIMIT when it
// was changed since the limit was computed (derived pools only).
func (p *Pool) curLimit() int64 {
	if p.derived {
		if g := memLimitGen.Load(); g != p.gen.Load() {
			p.follow(g, debug.SetMemoryLimit(-1))
		}
	}
	return p.limit.Load()
}

// follow sets a derived pool's limit to DefaultPoolRatio of GOMEMLIMIT gml,
// computed at generation g, and logs the change at INFO. A GOMEMLIMIT that
// is no longer set keeps the limit as it is. Of concurrent callers with the
// same g only one acts.
func (p *Pool) follow(g uint64, gml int64) {
	old := p.gen.Load()
	if g != old && !p.gen.CompareAndSwap(old, g) {
		return
	}
	if gml <= 0 || gml == math.MaxInt64 {
		return
	}
	limit := max(int64(float64(gml)*DefaultPoolRatio), 1)
	if prev := p.limit.Swap(limit); prev != limit && !within(limit, prev, 1000) {
		p.log.Info("limits: pool limit follows GOMEMLIMIT", "pool", p.name, "limit", mibOrUnlimited(limit),
			"was", mibOrUnlimited(prev), "gomemlimit", inMiBTight(gml))
	}
}

// mibOrUnlimited gives a limit in MiB ("111.7MiB", as memctl's startup
// line writes GOMEMLIMIT), or "unlimited".
func mibOrUnlimited(n int64) string {
	if n == Unlimited {
		return "unlimited"
	}
	return inMiBTight(n)
}

// inMiBTight gives n bytes in MiB with one decimal and no space ("111.7MiB").
func inMiBTight(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + "MiB" }

// poolNamed reports whether an open pool is named name.
func poolNamed(name string) bool {
	found := false
	eachPool(func(q *Pool) { found = found || (q.name == name && !q.closed.Load()) })
	return found
}

// defaultLimit returns the limit of a pool configured with Limit 0, given
// GOMEMLIMIT gml (math.MaxInt64 when not set), and where it came from; see
// PoolConfig.Limit.
func (p *Pool) defaultLimit(gml int64) (int64, string, error) {
	if gml != math.MaxInt64 {
		return max(int64(float64(gml)*DefaultPoolRatio), 1), "half of GOMEMLIMIT " + inMiBTight(gml) + ", following it", nil
	}
	from := "cgroup memory limit"
	base, err := fromCgroup()
	if err != nil || base == 0 || base >= math.MaxInt64 {
		from = "physical memory"
		var err2 error
		if base, err2 = fromSystem(); err2 != nil || base == 0 {
			return 0, "", fmt.Errorf("limits: pool %s: no GOMEMLIMIT, no cgroup memory limit (%v) and no physical memory size (%v): set PoolConfig.Limit", p.name, err, err2)
		}
	}
	limit := max(int64(float64(min(base, math.MaxInt64))*DefaultRatio*DefaultPoolRatio), 1)
	return limit, "GOMEMLIMIT not set: half of 90% of the " + from + " " + inMiBTight(int64(min(base, math.MaxInt64))) + "; follows GOMEMLIMIT once set", nil
}

// Name returns the pool's name, the first element of every scope.
func (p *Pool) Name() string { return p.name }

// Limit returns the pool's limit in bytes; Unlimited (math.MaxInt64) means
// none. A pool made with PoolConfig.Limit 0 follows GOMEMLIMIT (see there).
func (p *Pool) Limit() int64 { return p.curLimit() }

// Mode returns the pool's budget mode, read from the environment by NewPool.
func (p *Pool) Mode() Mode { return p.mode }

// Used returns the bytes the pool's accounts hold, which includes up to two
// chunks per open account reserved but not yet used.
func (p *Pool) Used() int64 { return p.used.Load() }

// Stats returns a snapshot of the pool's counters.
// RefusedBy counts refused Grow calls by the scope that refused them.
type RefusedBy struct {
	// Account counts refusals by the account's own limit or an ancestor
	// account's: the request was over its budget (no Retry-After).
	Account int64
	// Pool counts refusals because the pool was full.
	Pool int64
	// HeapPressure counts refusals while the live heap was over the pool's
	// heap-pressure threshold (PoolConfig.HeapPressure).
	HeapPressure int64
	// Shedding counts refusals past ShedSize during a GC death spiral.
	Shedding int64
}

func (p *Pool) Stats() PoolStats {
	return PoolStats{
		RefusedBy: RefusedBy{
			Account: p.refusedBy[scopeAccount].Load(), Pool: p.refusedBy[scopePool].Load(),
			HeapPressure: p.refusedBy[scopeHeap].Load(), Shedding: p.refusedBy[scopeShed].Load(),
		},
		Limit:             p.curLimit(),
		Mode:              p.mode,
		Used:              p.used.Load(),
		Peak:              p.peak.Load(),
		Refused:           p.refused.Load(),
		Observed:          p.observed.Load(),
		Misuse:            p.misuse.Load(),
		Leaked:            p.leaked.Load(),
		LeakedBytes:       p.leakedBytes.Load(),
		Unguarded:         unguarded.Load(),
		UnderHeapPressure: p.pressure.Load(),
		HeapLive:          p.heapLive.Load(),
		HeapThreshold:     p.heapThreshold.Load(),
		GCCycles:          p.heapCycles.Load(),
		Canceled:          p.canceled.Load(),
		Name:              p.name,
		InFlight:          p.inFlight.Load(),
		Peaks:             p.peaks.snapshot(),
		Undercharged:      p.undercharged.Load(),
		HeapBaseline:      p.baseline.Load(),
	}
}

// Open opens a top-level account named name with its own limit in bytes
// (Unlimited: none of its own; the pool still limits it). The account's
// scope is "<pool>/<name>". It returns an error matching ErrInvalidSize for
// a limit that is negative or 0, and ErrClosed after Close. Safe for
// concurrent use.
func (p *Pool) Open(name string, limit int64) (*Account, error) {
	return p.open(name, 0, limit)
}

// open is Open; seq > 0 names the account "req-<seq>" without building the
// string (the middleware's default names).
func (p *Pool) open(name string, seq, limit int64) (*Account, error) {
	if err := checkLimit(limit, func() string { return p.name + "/" + name + ": Open" }); err != nil {
		return nil, err
	}
	if p.closed.Load() {
		return nil, fmt.Errorf("%w: %s: Open(%q)", ErrClosed, p.name, name)
	}
	p.inFlight.Add(1)
	return newAccount(p, nil, name, seq, limit), nil
}

// Close stops the heap watch, waits for a GC cycle the pool started, and
// makes every further Open and Grow on the pool and on any of its accounts,
// children included, fail with ErrClosed. Accounts still open keep what they
// hold until they are closed. Close is idempotent and safe for concurrent
// use.
func (p *Pool) Close() {
	p.mu.Lock()
	already := p.closed.Swap(true)
	p.mu.Unlock()
	if already {
		return
	}
	unregisterPool(p)
	p.sub.Stop()
	p.wg.Wait()
}

// reserve takes want bytes from the pool, or only need (≤ want) when want
// does not fit, and returns how many it took. When need does not fit either
// the error is an *ExhaustedError; in ModeObserve and ModeOff the refusal is
// recorded in o and the bytes are taken anyway, unless the total would pass
// math.MaxInt64.
func (p *Pool) reserve(want, need int64, o *observation) (int64, error) {
	if p.closed.Load() {
		return 0, fmt.Errorf("%w: pool %s", ErrClosed, p.name)
	}
	if p.pressure.Load() {
		p.refreshIfStale()
		e := &ExhaustedError{Requested: need, Used: p.heapLive.Load(), Limit: p.heapThreshold.Load(), Scope: p.heapScope, RetryAfter: DefaultRetryAfter}
		if o.over(p, e) {
			return 0, e
		}
	}
	limit := p.curLimit()
	for {
		cur := p.used.Load()
		got := want
		if need > limit-cur {
			e := &ExhaustedError{Requested: need, Used: cur, Limit: limit, Scope: p.name, RetryAfter: DefaultRetryAfter}
			if need > math.MaxInt64-cur || o.over(p, e) {
				return 0, e
			}
			got = need // so that the next Grow past the limit is seen too
		} else if want > limit-cur {
			got = need
		}
		if p.used.CompareAndSwap(cur, cur+got) {
			notePeak(&p.peak, cur+got)
			notePeak(&p.burstPeak, cur+got)
			return got, nil
		}
	}
}

// unreserve returns n bytes to the pool.
func (p *Pool) unreserve(n int64) { p.used.Add(-n) }

// noteRefused counts a Grow(n) that failed with err when err is a refusal
// (an *ExhaustedError), fills in the size the caller asked for, and records
// in the account and its ancestors what they would have used.
func (a *Account) noteRefused(n int64, err error) {
	e, ok := err.(*ExhaustedError)
	if !ok {
		return
	}
	a.pool.refusedBy[a.pool.refusalScope(e)].Add(1)
	e.Requested = n
	if e.RetryAfter > 0 {
		// The pool was full, under heap pressure or shedding: a retry can
		// succeed once that passes, unless this work alone does not fit in
		// the pool's limit.
		u := max(a.used.Load(), 0) + a.kids.Load()
		if l := a.pool.limit.Load(); n > l-min(u, l) {
			e.RetryAfter = 0
		}
	}
	a.pool.refused.Add(1)
	for x := a; x != nil; x = x.parent {
		u := max(x.used.Load(), 0) + x.kids.Load()
		notePeak(&x.refusedAt, u+min(n, math.MaxInt64-u))
	}
}

// The scopes a refusal is counted under (PoolStats.RefusedBy).
const (
	scopeAccount = iota
	scopePool
	scopeHeap
	scopeShed
)

// refusalScope tells which scope refused with e: the pool (its name alone),
// heap pressure, shedding, or an account.
func (p *Pool) refusalScope(e *ExhaustedError) int {
	switch {
	case e.Scope == p.name:
		return scopePool
	case e.Scope == p.heapScope:
		return scopeHeap
	case strings.HasSuffix(e.Scope, " (shedding)"):
		return scopeShed
	}
	return scopeAccount
}

// noteObserved counts a Grow let through in ModeObserve or ModeOff, and
// logs it in ModeObserve, at most once per ObserveLogInterval.
func (p *Pool) noteObserved(e *ExhaustedError) {
	p.observed.Add(1)
	if p.mode != ModeObserve {
		return
	}
	now := time.Now().UnixNano()
	last := p.observeLogAt.Load()
	if (last != 0 && now-last < int64(ObserveLogInterval)) || !p.observeLogAt.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn("limits: budget exceeded, not refused (MEMCTL_BUDGETS=observe)",
		"error", e.Error(), "observed", p.observed.Load())
}

// noteLeak counts an account closed with n bytes it grew and did not
// shrink, logs the first one, and returns the message a strict pool panics
// with ("" when not strict).
func (p *Pool) noteLeak(scope string, n int64) string {
	p.leaked.Add(1)
	p.leakedBytes.Add(n)
	msg := "limits: " + scope + ": closed with " + strconv.FormatInt(n, 10) + " bytes grown and not shrunk"
	if p.strict {
		return msg
	}
	if p.leakLogged.CompareAndSwap(false, true) {
		p.log.Warn("limits: account leak (counted in PoolStats.Leaked; only the first is logged)", "error", msg)
	}
	return ""
}

// list adds a, with the cancel function of its context, to the accounts
// that CancelLargest may cancel.
func (p *Pool) list(a *Account, cancel context.CancelCauseFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.listed || a.reserved.Load() < 0 {
		return
	}
	a.listed, a.cancel = true, cancel
	a.next = p.head
	if p.head != nil {
		p.head.prev = a
	}
	p.head = a
}

// unlist removes a from the accounts that CancelLargest may cancel.
func (p *Pool) unlist(a *Account) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !a.listed {
		return
	}
	a.listed = false
	if a.prev != nil {
		a.prev.next = a.next
	} else {
		p.head = a.next
	}
	if a.next != nil {
		a.next.prev = a.prev
	}
	a.prev, a.next, a.cancel = nil, nil, nil
}

// notePeak raises peak to v if v is higher.
func notePeak(peak *atomic.Int64, v int64) {
	for {
		p := peak.Load()
		if v <= p || peak.CompareAndSwap(p, v) {
			return
		}
	}
}
