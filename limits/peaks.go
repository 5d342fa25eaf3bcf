package limits

import (
	"math"
	"math/bits"
	"sync/atomic"
)

// The buckets of the per-request peak histogram (PoolStats.Peaks): bucket
// i < PeakBuckets holds the peaks in (PeakBucketBound(i-1),
// PeakBucketBound(i)], bytes, and bucket PeakBuckets the peaks above the
// last bound. The bounds are the powers of two from 64 KiB to 64 GiB: a
// request budget is usually a power of two, and at a bound the histogram
// counts exactly the requests that budget refuses (PeakHistogram.Above).
const (
	// PeakBuckets is the number of bounded buckets (21); PeakHistogram has
	// one more, for the peaks above the last bound.
	PeakBuckets = 21
	// peakBucketMin is the first bound, in bytes (64 KiB): bucket 0 holds
	// every peak up to it, requests that never grew included.
	peakBucketMin = 64 << 10
)

// PeakBucketBound returns the upper bound, in bytes, of bucket i in
// [0, PeakBuckets): 64 KiB << i (64 KiB, 128 KiB, ..., 64 GiB). For
// i ≥ PeakBuckets it returns math.MaxInt64 (the overflow bucket); a
// negative i returns 0.
func PeakBucketBound(i int) int64 {
	switch {
	case i < 0:
		return 0
	case i >= PeakBuckets:
		return math.MaxInt64
	}
	return peakBucketMin << i
}

// PeakHistogram is the distribution of the peaks of a pool's top-level
// accounts (one per request, job or RPC), recorded when each account
// closes, in every Mode: what each request reached or asked for, so that in
// ModeObserve it shows what a budget would refuse before it is enforced.
// A request's peak is the highest of its Account.Peak and of Used plus the
// size of any Grow refused (or, in ModeObserve and ModeOff, let through past
// a limit): the memory it asked for, not only what it was granted. Accounts
// opened from an account count in their top-level account's peak, not on
// their own. A copy is a snapshot; the zero value is an empty histogram.
type PeakHistogram struct {
	// Counts[i] counts the peaks in bucket i (see PeakBucketBound); it is
	// not cumulative. Counts[PeakBuckets] counts the peaks above 64 GiB.
	Counts [PeakBuckets + 1]int64
	// Count is the number of peaks recorded: the sum of Counts.
	Count int64
	// Sum is the sum of the peaks up to the last bound (64 GiB), in bytes:
	// a peak above it (a client's absurd size, refused) is counted in
	// Counts[PeakBuckets] only, so that one such request does not swamp
	// the sum. It saturates at math.MaxInt64.
	Sum int64
}

// Above returns how many recorded peaks are above limit bytes, counting
// whole buckets: exactly the requests a per-request budget of limit would
// have refused when limit is a bucket bound (PeakBucketBound); for another
// limit, those above the smallest bound at or above limit, a lower bound.
func (h *PeakHistogram) Above(limit int64) int64 {
	var n int64
	for i := PeakBuckets; i >= 0 && PeakBucketBound(i-1) >= limit; i-- {
		n += h.Counts[i]
	}
	return n
}

// Quantile returns the upper bound, in bytes, of the bucket that holds the
// q-quantile of the peaks, q in [0.0, 1.0]: at least a share q of the
// requests peaked at or under it. It returns 0 when the histogram is empty
// or q is out of range or NaN, and math.MaxInt64 when the quantile is in
// the overflow bucket.
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
	counts [PeakBuckets + 1]atomic.Int64
	sum    atomic.Int64
}

// peakBucket returns the bucket of a peak of v bytes.
func peakBucket(v int64) int {
	if v <= peakBucketMin {
		return 0
	}
	// The smallest i with v ≤ peakBucketMin<<i: the bit length of
	// (v-1)>>16, 16 being log2 of peakBucketMin.
	return min(bits.Len64(uint64(v-1)>>16), PeakBuckets)
}

// record adds one peak of v bytes (v ≥ 0).
func (h *peakHistogram) record(v int64) {
	b := peakBucket(v)
	h.counts[b].Add(1)
	if b == PeakBuckets {
		return
	}
	for {
		s := h.sum.Load()
		if h.sum.CompareAndSwap(s, s+min(v, math.MaxInt64-s)) { // saturating
			return
		}
	}
}

// snapshot copies the histogram; Count is the sum of the Counts read. With
// requests closing meanwhile, Sum may include a peak that Counts does not,
// or the reverse.
func (h *peakHistogram) snapshot() PeakHistogram {
	var s PeakHistogram
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = h.sum.Load()
	return s
}
