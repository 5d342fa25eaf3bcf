package limits

import (
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/envflag"
)

// PoolConfig's defaults (see its fields).
const (
	defaultPoolRatio    = 0.5      // of GOMEMLIMIT
	defaultChunkSize    = 64 << 10 // bytes
	maxChunkSize        = 1 << 30  // bytes
	defaultHeapPressure = 0.9
	defaultCancelShare  = 0.05
	defaultShedSize     = defaultBurstThreshold
	defaultChargeRatio  = 4
	// chargeCheckFloor is the least live heap beyond the baseline, in bytes,
	// at which the charge check speaks (or GOMEMLIMIT/8 when more).
	chargeCheckFloor = 16 << 20
)

// defaultRetryAfter is the ExhaustedError.RetryAfter of a refusal a retry can
// get past (a full pool, heap pressure, shedding).
const defaultRetryAfter = time.Second

// heapRefreshInterval is the longest a pool refusing Grows under heap
// pressure waits for a GC cycle before it runs one.
const heapRefreshInterval = time.Second

// Mode is what a pool does with a Grow past a budget, set by the operator with
// MEMCTL_BUDGETS (read by NewPool, any case): enforce (the default; also on,
// yes, true, 1, t), observe, or off (also no, false, 0, f, and MEMCTL=off).
// Any other value is logged at WARN and budgets are enforced.
type Mode int

const (
	ModeEnforce Mode = iota // refuse with an *ExhaustedError
	// ModeObserve counts, and logs at most once per 10 s, a Grow past a
	// budget or a cancel CancelLargest would make, and lets it through.
	ModeObserve
	// ModeOff refuses and logs nothing; accounts still count; no heap watch.
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

// parseMode reads the budget mode from MEMCTL and MEMCTL_BUDGETS (see Mode);
// a bad value returns ModeEnforce and an error.
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

// PoolConfig configures NewPool. The zero value is the default.
type PoolConfig struct {
	// Name is the first element of the pool's scopes, PoolStats.Name and its
	// metrics' pool label; a duplicate is logged at WARN. Default: "pool".
	Name string
	// Limit is the pool's budget in bytes, shared by all its accounts;
	// Unlimited asks for none, and negative is an error. 0 means half of
	// GOMEMLIMIT, following it; without GOMEMLIMIT, half of 0.9 of the cgroup
	// limit or of the physical memory, until it is set. Default: 0.
	Limit int64
	// ChunkSize is the granularity, in bytes, in which accounts reserve from
	// their parent, in [1, 1 GiB]. Default: 0, which means 64 KiB.
	ChunkSize int64
	// HeapPressure is the share of GOMEMLIMIT, in (0.0, 1.0], that the live
	// heap may reach at a GC end before the pool refuses every Grow that
	// needs more from it, and runs GC cycles itself. Negative turns the watch
	// off; without GOMEMLIMIT there is no pressure. Default: 0, which means 0.9.
	HeapPressure float64
	// CancelLargest, under heap pressure, cancels at a GC end the context of
	// the largest account bound with WithAccount, with an *ExhaustedError
	// cause, if it holds at least CancelShare of the live heap. Default: false.
	CancelLargest bool
	// CancelShare is the share of the live heap (on kernel pressure: of the Go
	// memory), in (0.0, 1.0], an account must hold for CancelLargest to cancel
	// it. Default: 0, which means 0.05.
	CancelShare float64
	// ChargeRatio is the charge check: at a GC end with requests in flight, a
	// live heap beyond PoolStats.HeapBaseline more than ChargeRatio times what
	// the accounts hold, and more than 16 MiB (or GOMEMLIMIT/8), counts in
	// PoolStats.Undercharged (docs/sizing.md). Negative turns it off. Default:
	// 0, which means 4.
	ChargeRatio float64
	// ShedSize is the most bytes an account may reach while shedding in a GC
	// death spiral. Default: 0, which means 64 MiB, or a sixteenth of a smaller
	// pool limit (at least one chunk).
	ShedSize int64
	// Strict makes misuse and leaks panic instead of being counted. For tests.
	// Default: false.
	Strict bool
	// Logger receives the pool's log lines. Default: nil (slog.Default()).
	Logger *slog.Logger
}

// PoolStats is a snapshot of a pool's counters; sizes are in bytes.
type PoolStats struct {
	Limit int64 // the pool's limit now; Unlimited means none
	Mode  Mode
	Used  int64 // Pool.Used
	Peak  int64 // the highest Used since NewPool
	// Refused counts Grows refused with ErrResourceExhausted (a Grow after a
	// heap-pressure cancel counts in Canceled only); RefusedBy splits it.
	Refused   int64
	RefusedBy RefusedBy
	// Observed counts refusals and cancels let through in ModeObserve or ModeOff.
	Observed int64
	Misuse   int64 // misused Shrinks (see Account.Shrink)
	// Leaked counts leaked accounts and LeakedBytes their bytes (Account.Close).
	Leaked, LeakedBytes int64
	// Unguarded counts limits.Grow calls with no account in ctx, process-wide.
	Unguarded int64
	// UnderHeapPressure is whether HeapLive was above HeapThreshold.
	UnderHeapPressure bool
	// HeapLive is the live heap at the last GC end the watch saw; 0 before it
	// or when the watch is off.
	HeapLive int64
	// HeapThreshold is HeapPressure × GOMEMLIMIT; 0 without GOMEMLIMIT or the watch.
	HeapThreshold int64
	GCCycles      int64  // the GC cycles the heap watch has seen
	Canceled      int64  // contexts canceled by CancelLargest
	Name          string // PoolConfig.Name
	InFlight      int64  // top-level accounts open (requests, RPCs, jobs)
	// Peaks is the distribution of the peaks of the closed top-level accounts.
	Peaks PeakHistogram
	// Undercharged counts the GC ends where the charges looked too small
	// (PoolConfig.ChargeRatio).
	Undercharged int64
	// HeapBaseline is the live heap the charge check takes as the service's
	// own; -1 before the first GC end or when the check is off.
	HeapBaseline int64
}

// The buckets of PoolStats.Peaks (see PeakBucketBound).
const (
	peakBuckets   = len(PeakHistogram{}.Counts) - 1 // the bounded buckets, 21
	peakBucketMin = 64 << 10                        // the first bound, in bytes
)

// PeakBucketBound returns the upper bound, in bytes, of bucket i: 64 KiB << i
// for i from 0 to 20, math.MaxInt64 above, 0 for a negative i. Bucket i holds
// the peaks in (PeakBucketBound(i-1), PeakBucketBound(i)].
func PeakBucketBound(i int) int64 {
	switch {
	case i < 0:
		return 0
	case i >= peakBuckets:
		return math.MaxInt64
	}
	return peakBucketMin << i
}

// PeakHistogram is the distribution of the peaks of a pool's top-level
// accounts, recorded at each close in every Mode. A peak is the highest of
// Account.Peak and Used plus a refused, or observed, Grow. The zero value is
// empty.
type PeakHistogram struct {
	// Counts[i] counts the peaks in bucket i (see PeakBucketBound), not
	// cumulative; Counts[21], the peaks above 64 GiB.
	Counts [22]int64
	Count  int64 // the sum of Counts
	// Sum is the sum of the peaks up to 64 GiB, in bytes, saturated at
	// math.MaxInt64.
	Sum int64
}

// Above returns how many recorded peaks are above limit bytes, by whole
// buckets: exact when limit is a bucket bound, else a lower bound.
func (h *PeakHistogram) Above(limit int64) int64 {
	var n int64
	for i := peakBuckets; i >= 0 && PeakBucketBound(i-1) >= limit; i-- {
		n += h.Counts[i]
	}
	return n
}

// Quantile returns the upper bound, in bytes, of the bucket that holds the
// q-quantile of the peaks, q in [0.0, 1.0]; 0 when the histogram is empty or q
// is out of range.
func (h *PeakHistogram) Quantile(q float64) int64 {
	if h.Count == 0 || !(q >= 0 && q <= 1) {
		return 0
	}
	want := int64(math.Ceil(q * float64(h.Count)))
	var n int64
	for i, c := range h.Counts {
		if n += c; n >= want && n > 0 {
			return PeakBucketBound(i)
		}
	}
	return math.MaxInt64
}

// peakHistogram is the pool's live histogram: atomic counters, no lock.
type peakHistogram struct {
	counts [peakBuckets + 1]atomic.Int64
	sum    atomic.Int64
}

// peakBucket returns the bucket of a peak of v bytes.
func peakBucket(v int64) int {
	if v <= peakBucketMin {
		return 0
	}
	// The smallest i with v ≤ peakBucketMin<<i.
	return min(bits.Len64(uint64(v-1)>>16), peakBuckets)
}

// record adds one peak of v bytes (v ≥ 0).
func (h *peakHistogram) record(v int64) {
	b := peakBucket(v)
	h.counts[b].Add(1)
	if b == peakBuckets {
		return
	}
	for {
		s := h.sum.Load()
		if h.sum.CompareAndSwap(s, s+min(v, math.MaxInt64-s)) { // saturating
			return
		}
	}
}

// snapshot copies the histogram; with requests closing meanwhile, Sum and
// Counts may differ by a peak.
func (h *peakHistogram) snapshot() PeakHistogram {
	var s PeakHistogram
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = h.sum.Load()
	return s
}
