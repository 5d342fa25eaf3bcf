package limits

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPeakBucket(t *testing.T) {
	for _, tc := range []struct {
		v    int64
		want int
	}{
		{0, 0}, {1, 0}, {64 * kib, 0}, {64*kib + 1, 1}, {128 * kib, 1}, {128*kib + 1, 2},
		{mib, 4}, {32 * mib, 9}, {32*mib + 1, 10}, {64 << 30, 20}, {64<<30 + 1, 21}, {math.MaxInt64, 21},
	} {
		assert.Equal(t, tc.want, peakBucket(tc.v), "%d", tc.v)
		if tc.want < PeakBuckets {
			assert.LessOrEqual(t, tc.v, PeakBucketBound(tc.want))
		}
		assert.Greater(t, tc.v, PeakBucketBound(tc.want-1)-boolInt(tc.want == 0))
	}
	assert.Equal(t, int64(64<<30), PeakBucketBound(PeakBuckets-1))
	assert.Equal(t, int64(math.MaxInt64), PeakBucketBound(PeakBuckets))
	assert.Equal(t, int64(0), PeakBucketBound(-1))
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func TestPeakHistogramAboveQuantile(t *testing.T) {
	var h peakHistogram
	for _, v := range []int64{0, 100 * kib, mib, 3 * mib, 40 * mib, math.MaxInt64} {
		h.record(v)
	}
	s := h.snapshot()
	assert.Equal(t, int64(6), s.Count)
	assert.Equal(t, int64(math.MaxInt64), s.Sum, "saturates")
	assert.Equal(t, int64(6), s.Above(0))
	assert.Equal(t, int64(5), s.Above(64*kib))
	assert.Equal(t, int64(3), s.Above(mib))
	assert.Equal(t, int64(3), s.Above(2*mib), "3 MiB is above 2 MiB")
	assert.Equal(t, int64(2), s.Above(4*mib))
	assert.Equal(t, int64(1), s.Above(64*mib))
	assert.Equal(t, int64(0), s.Above(math.MaxInt64))
	assert.Equal(t, int64(64*kib), s.Quantile(0))
	assert.Equal(t, int64(mib), s.Quantile(0.5))
	assert.Equal(t, int64(64*mib), s.Quantile(5.0/6))
	assert.Equal(t, int64(math.MaxInt64), s.Quantile(1))
	assert.Equal(t, int64(0), s.Quantile(math.NaN()))
	assert.Equal(t, int64(0), (&PeakHistogram{}).Quantile(0.5))
}

// peakLoad runs 1,000 jobs on pool p, 8 at a time, whose peaks go from 1 to
// 60 MiB (job i peaks at 1+(i·37 mod 60) MiB), each charged 1 MiB at a time
// under a 32 MiB budget, and returns how many were refused.
func peakLoad(t *testing.T, p *Pool) (refused int64) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	jobs := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				peak := int64(1+(i*37)%60) * mib
				err := p.Do(context.Background(), WorkConfig{Limit: 32 * mib}, func(ctx context.Context) error {
					var held int64
					defer func() { Shrink(ctx, held) }()
					for held < peak {
						if err := Grow(ctx, mib); err != nil {
							return err
						}
						held += mib
					}
					return nil
				})
				if err != nil {
					mu.Lock()
					if errors.Is(err, ErrResourceExhausted) {
						refused++
					} else {
						t.Errorf("job %d: %v", i, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range 1000 {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return refused
}

// TestPeaksPredictRefusals: the histogram of 1,000 jobs with peaks from 1
// to 60 MiB in observe mode predicts exactly the refusals of enforce mode
// on the same load, at the budget of 32 MiB (a bucket bound); both modes
// record the same buckets, since a refused job's peak is what it asked
// for.
func TestPeaksPredictRefusals(t *testing.T) {
	run := func(mode string) (PoolStats, int64) {
		t.Setenv("MEMCTL_BUDGETS", mode)
		p := newTestPool(t, PoolConfig{Limit: Unlimited})
		refused := peakLoad(t, p)
		return p.Stats(), refused
	}
	obs, obsRefused := run("observe")
	enf, enfRefused := run("enforce")
	require.Equal(t, ModeObserve, obs.Mode)
	require.Equal(t, ModeEnforce, enf.Mode)
	assert.Equal(t, int64(0), obsRefused, "observe refuses nothing")
	var b strings.Builder
	for i, c := range obs.Peaks.Counts {
		if c != 0 || enf.Peaks.Counts[i] != 0 {
			fmt.Fprintf(&b, "  le %6d MiB: observe %4d, enforce %4d\n", PeakBucketBound(i)>>20, c, enf.Peaks.Counts[i])
		}
	}
	predicted := obs.Peaks.Above(32 * mib)
	t.Logf("peak histogram of 1000 jobs, 1-60 MiB:\n%sobserve predicts %d refusals at 32 MiB (observed %d let through); enforce refused %d (RefusedBy.Account %d)",
		b.String(), predicted, obs.Observed, enfRefused, enf.RefusedBy.Account)
	assert.Equal(t, int64(1000), obs.Peaks.Count)
	assert.Equal(t, obs.Peaks.Counts, enf.Peaks.Counts, "the same buckets in both modes (the sums differ: a refused job stops at its first refusal)")
	// Jobs peaking at 33..60 MiB: 28 of every 60.
	want := int64(0)
	for i := range 1000 {
		if 1+(i*37)%60 > 32 {
			want++
		}
	}
	assert.Equal(t, want, predicted)
	assert.Equal(t, predicted, enfRefused, "observe predicts enforce")
	assert.Equal(t, predicted, enf.RefusedBy.Account)
	assert.GreaterOrEqual(t, obs.Observed, predicted, "observe counts every Grow past the budget, several per job")
}
