package limits

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/logattr"
)

// Pool is a shared memory budget in bytes from which accounts are opened. It
// is safe for concurrent use; the zero value is not usable.
type Pool struct {
	used      atomic.Int64 // what the top-level accounts reserved
	peak      atomic.Int64
	burstPeak atomic.Int64 // the highest used since the last burst ended together
	pressure  atomic.Bool
	_         [39]byte // the shared counters on their own cache line

	closed        atomic.Bool // read on every Grow: a cache line of its own
	mode          Mode
	limit         atomic.Int64 // Unlimited when the pool has no limit
	chunk         int64
	derived       bool          // Limit 0: the limit follows GOMEMLIMIT
	gen           atomic.Uint64 // the memLimitGen the limit was computed at
	_             [16]byte
	refusedBy     [4]atomic.Int64 // by refusalScope; PoolStats.Refused is their sum
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
	mu            sync.Mutex                           // guards listed and refreshing
	listed        map[*Account]context.CancelCauseFunc // the accounts CancelLargest may cancel
	refreshing    bool                                 // a refreshHeap goroutine runs
	refreshAgain  bool                                 // it runs one more cycle
	wg            sync.WaitGroup                       // the refresh goroutine
}

var unguarded atomic.Int64 // PoolStats.Unguarded

// fromCgroup and fromSystem are the fallbacks without GOMEMLIMIT.
var (
	fromCgroup = memlimit.FromCgroup
	fromSystem = memlimit.FromSystem
)

// NewPool returns a pool configured by cfg; Close it when done. It returns an
// error matching ErrInvalidSize for a negative Limit or a ChunkSize outside
// [0, 1 GiB], an error for a field out of range, and an error when Limit is 0,
// GOMEMLIMIT is not set and neither a cgroup limit nor the physical memory can
// be read. It reads MEMCTL and MEMCTL_BUDGETS (see Mode), and logs the limit
// and its source at INFO.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if err := checkPoolConfig(cfg); err != nil {
		return nil, err
	}
	p := newPoolDefaults(cfg)
	p.readMode()
	limit, from := cfg.Limit, "PoolConfig.Limit"
	if limit == Unlimited {
		from = "PoolConfig.Limit: Unlimited"
	}
	if p.derived {
		p.gen.Store(memLimitGen.Load())
		var err error
		if limit, from, err = p.defaultLimit(debug.SetMemoryLimit(-1)); err != nil {
			return nil, err
		}
	}
	p.limit.Store(limit)
	if p.heapRatio > 0 && p.mode != ModeOff {
		p.watchHeap()
	}
	p.register(limit, from)
	return p, nil
}

// checkPoolConfig returns NewPool's error for a cfg out of range.
func checkPoolConfig(cfg PoolConfig) error {
	if cfg.Limit < 0 {
		return fmt.Errorf("%w: PoolConfig.Limit %d is negative", ErrInvalidSize, cfg.Limit)
	}
	if cfg.ShedSize < 0 {
		return fmt.Errorf("%w: PoolConfig.ShedSize %d is negative", ErrInvalidSize, cfg.ShedSize)
	}
	if cfg.ChunkSize < 0 || cfg.ChunkSize > maxChunkSize {
		return fmt.Errorf("%w: PoolConfig.ChunkSize %d is not in [0, %d]", ErrInvalidSize, cfg.ChunkSize, maxChunkSize)
	}
	if math.IsNaN(cfg.HeapPressure) || cfg.HeapPressure > 1 {
		return fmt.Errorf("limits: PoolConfig.HeapPressure %v is not in (0.0, 1.0] (0: default, negative: off)", cfg.HeapPressure)
	}
	if !(cfg.CancelShare >= 0 && cfg.CancelShare <= 1) {
		return fmt.Errorf("limits: PoolConfig.CancelShare %v is not in (0.0, 1.0] (0: default)", cfg.CancelShare)
	}
	if math.IsNaN(cfg.ChargeRatio) || math.IsInf(cfg.ChargeRatio, 0) {
		return fmt.Errorf("limits: PoolConfig.ChargeRatio %v is not a finite number (0: default, negative: off)", cfg.ChargeRatio)
	}
	return nil
}

// newPoolDefaults returns a pool with cfg's fields and their defaults.
func newPoolDefaults(cfg PoolConfig) *Pool {
	p := &Pool{
		name:          cmp.Or(cfg.Name, "pool"),
		derived:       cfg.Limit == 0,
		chunk:         cmp.Or(cfg.ChunkSize, defaultChunkSize),
		heapRatio:     cmp.Or(cfg.HeapPressure, defaultHeapPressure),
		cancelShare:   cmp.Or(cfg.CancelShare, defaultCancelShare),
		chargeRatio:   cmp.Or(cfg.ChargeRatio, defaultChargeRatio),
		cancelLargest: cfg.CancelLargest,
		strict:        cfg.Strict,
		log:           cmp.Or(cfg.Logger, slog.Default()),
		shedSize:      cfg.ShedSize,
	}
	p.heapScope = p.name + " (heap pressure)"
	p.baseline.Store(-1)
	return p
}

// readMode sets the pool's mode, logging one other than ModeEnforce at INFO.
func (p *Pool) readMode() {
	mode, err := parseMode(os.Getenv)
	if err != nil {
		p.log.Warn("limits: bad MEMCTL_BUDGETS", "pool", p.name, "error", err)
	}
	p.mode = mode
	if mode != ModeEnforce {
		p.log.Info("limits: budgets are not enforced", "pool", p.name, "mode", mode.String())
	}
}

// watchHeap subscribes the pool to each GC end (observeHeap).
func (p *Pool) watchHeap() {
	wp := weak.Make(p) // weak: a pool dropped without Close stops its watch
	p.sub = gcend.Subscribe(func(s *gcend.Sample) bool {
		p := wp.Value()
		if p == nil {
			return false
		}
		p.observeHeap(s.Live, s.GoMemLimit)
		return true
	})
}

// register adds the pool to the open pools, logging its limit at INFO and,
// unless ModeOff, a duplicate name or a second default pool at WARN.
func (p *Pool) register(limit int64, from string) {
	if p.mode != ModeOff && openPool(func(q *Pool) bool { return q.name == p.name }) != nil {
		p.log.Warn("limits: another open pool has the same name: the errors, Stats and metrics of the two cannot be told apart (set PoolConfig.Name)", "pool", p.name)
	}
	p.log.Info("limits: pool made", "pool", p.name, "limit", mibOrUnlimited(limit), "limit_source", from)
	other := openPool(func(q *Pool) bool { return q.derived && q.mode != ModeOff })
	if p.derived && p.mode != ModeOff && other != nil {
		p.log.Warn("limits: a second pool with the default limit: each may use half of GOMEMLIMIT, together all of it; share one pool (the HTTP middleware, grpcbudget and connectbudget can) or set PoolConfig.Limit",
			"pool", p.name, "other_pool", other.name)
	}
	registerPool(p)
}

// memLimitGen counts this package's changes of GOMEMLIMIT (noteMemLimitSet),
// which derived pools follow at their next reservation; other changes are
// seen at the next GC end.
var memLimitGen atomic.Uint64

func noteMemLimitSet() { memLimitGen.Add(1) }

// curLimit returns the pool's limit, first following a changed GOMEMLIMIT.
func (p *Pool) curLimit() int64 {
	if p.derived {
		if g := memLimitGen.Load(); g != p.gen.Load() {
			p.follow(g, debug.SetMemoryLimit(-1))
		}
	}
	return p.limit.Load()
}

// follow sets a derived pool's limit to defaultPoolRatio of gml, read at
// generation g, unless GOMEMLIMIT is unset.
func (p *Pool) follow(g uint64, gml int64) {
	if old := p.gen.Load(); (g != old && !p.gen.CompareAndSwap(old, g)) || !gomemlimit.IsSet(gml) {
		return
	}
	limit := poolShare(gml)
	if prev := p.limit.Swap(limit); prev != limit && !within(limit, prev, 1000) {
		p.log.Info("limits: pool limit follows GOMEMLIMIT", "pool", p.name, "limit", mibOrUnlimited(limit),
			"was", mibOrUnlimited(prev), "gomemlimit", logattr.MiBCompact(gml))
	}
}

// mibOrUnlimited gives a limit as "111.7MiB" or "unlimited".
func mibOrUnlimited(n int64) string {
	if n == Unlimited {
		return "unlimited"
	}
	return logattr.MiBCompact(n)
}

// defaultLimit returns PoolConfig.Limit 0's limit given GOMEMLIMIT gml, and
// where it came from.
func (p *Pool) defaultLimit(gml int64) (int64, string, error) {
	if gml != math.MaxInt64 {
		return poolShare(gml), "half of GOMEMLIMIT " + logattr.MiBCompact(gml) + ", following it", nil
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
	limit := poolShare(int64(float64(min(base, math.MaxInt64)) * defaultRatio))
	return limit, "GOMEMLIMIT not set: half of 90% of the " + from + " " + logattr.MiBCompact(int64(min(base, math.MaxInt64))) + "; follows GOMEMLIMIT once set", nil
}

// poolShare returns the default pool limit for a GOMEMLIMIT of gml bytes.
func poolShare(gml int64) int64 { return max(int64(float64(gml)*defaultPoolRatio), 1) }

// Name returns the pool's name, the first element of every scope.
func (p *Pool) Name() string { return p.name }

// Limit returns the pool's limit in bytes; Unlimited means none. See
// PoolConfig.Limit.
func (p *Pool) Limit() int64 { return p.curLimit() }

// Mode returns the pool's budget mode.
func (p *Pool) Mode() Mode { return p.mode }

// Used returns the bytes the pool's accounts hold, including up to two
// reserved, unused chunks per open account.
func (p *Pool) Used() int64 { return p.used.Load() }

// RefusedBy counts refused Grow calls by the scope that refused them.
type RefusedBy struct {
	Account      int64 // the account's or an ancestor's limit
	Pool         int64 // the pool was full
	HeapPressure int64 // the live heap was over PoolConfig.HeapPressure
	Shedding     int64 // past ShedSize during a GC death spiral
}

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() PoolStats {
	by := RefusedBy{
		Account: p.refusedBy[scopeAccount].Load(), Pool: p.refusedBy[scopePool].Load(),
		HeapPressure: p.refusedBy[scopeHeap].Load(), Shedding: p.refusedBy[scopeShed].Load(),
	}
	return PoolStats{
		RefusedBy:         by,
		Refused:           by.Account + by.Pool + by.HeapPressure + by.Shedding,
		Limit:             p.curLimit(),
		Mode:              p.mode,
		Used:              p.used.Load(),
		Peak:              p.peak.Load(),
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

// Open opens a top-level account, scope "<pool>/<name>", with its own limit in
// bytes (Unlimited: only the pool limits it). It returns an error matching
// ErrInvalidSize for a limit ≤ 0, and ErrClosed after Close.
func (p *Pool) Open(name string, limit int64) (*Account, error) {
	return p.open(name, 0, limit)
}

// open is Open; seq > 0 names the account "req-<seq>", built only if needed.
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
// makes every further Open and Grow on the pool and its accounts fail with
// ErrClosed. Idempotent.
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
