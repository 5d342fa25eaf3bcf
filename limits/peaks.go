package limits

import (
	"math"
	"math/bits"
	"sync/atomic"
)

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
