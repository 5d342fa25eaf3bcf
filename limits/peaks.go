package limits

import (
	"math"
	"math/bits"
	"sync/atomic"
)

// The buckets of PoolStats.Peaks (see PeakBucketBound).
const (
	// peakBuckets is the number of bounded buckets, 21.
	peakBuckets = len(PeakHistogram{}.Counts) - 1
	// peakBucketMin is the first bound, in bytes (64 KiB): bucket 0 holds
	// every peak up to it, requests that never grew included.
	peakBucketMin = 64 << 10
)

// PeakBucketBound returns the upper bound, in bytes, of bucket i: 64 KiB << i
// for i from 0 to 20, math.MaxInt64 above, 0 for a negative i. Bucket i of
// PeakHistogram.Counts holds the peaks in (PeakBucketBound(i-1),
// PeakBucketBound(i)] bytes, so that a budget at a bound refuses exactly the
// peaks above it.
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
// accounts, recorded at each close in every Mode. A peak is what the request
// asked for: the highest of Account.Peak and Used plus a refused, or observed,
// Grow; nested accounts count in their top-level account's. A copy is a
// snapshot; the zero value is empty.
type PeakHistogram struct {
	// Counts[i] counts the peaks in bucket i (see PeakBucketBound); it is
	// not cumulative. Counts[21] counts the peaks above 64 GiB.
	Counts [22]int64
	// Count is the number of peaks recorded: the sum of Counts.
	Count int64
	// Sum is the sum of the peaks up to the last bound (64 GiB), in bytes;
	// peaks above it count in Counts[21] only. It saturates at
	// math.MaxInt64.
	Sum int64
}

// Above returns how many recorded peaks are above limit bytes, by whole
// buckets: exactly the requests a budget of limit would have refused when limit
// is a bucket bound; otherwise a lower bound.
func (h *PeakHistogram) Above(limit int64) int64 {
	var n int64
	for i := peakBuckets; i >= 0 && PeakBucketBound(i-1) >= limit; i-- {
		n += h.Counts[i]
	}
	return n
}

// Quantile returns the upper bound, in bytes, of the bucket that holds the
// q-quantile of the peaks, q in [0.0, 1.0]; 0 when the histogram is empty or q
// is out of range or NaN, and math.MaxInt64 in the overflow bucket.
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
	// The smallest i with v ≤ peakBucketMin<<i (16 = log2 peakBucketMin).
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
