package limits

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
		if tc.want < peakBuckets {
			assert.LessOrEqual(t, tc.v, PeakBucketBound(tc.want))
		}
		assert.Greater(t, tc.v, PeakBucketBound(tc.want-1)-boolInt(tc.want == 0))
	}
	assert.Equal(t, int64(64<<30), PeakBucketBound(peakBuckets-1))
	assert.Equal(t, int64(math.MaxInt64), PeakBucketBound(peakBuckets))
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
	assert.Equal(t, 100*kib+mib+3*mib+40*mib, s.Sum, "a peak above 64 GiB is counted, not summed")
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

// peakLoad sends 1,000 HTTP requests over loopback, 8 at a time, to a
// server whose handler, behind p's middleware with a budget of limit bytes,
// charges 1 MiB at a time up to the request's peak, from 1 to 60 MiB
// (request i peaks at 1+(i·37 mod 60) MiB); it returns how many got 429.
func peakLoad(t *testing.T, p *Pool, limit int64) (refused int64) {
	t.Helper()
	mw, err := p.Middleware(HTTPConfig{Limit: limit})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peak, _ := strconv.ParseInt(r.URL.Query().Get("peak"), 10, 64)
		var held int64
		defer func() { Shrink(r.Context(), held) }()
		for held < peak {
			if err := Grow(r.Context(), mib); err != nil {
				WriteError(w, err)
				return
			}
			held += mib
		}
	})))
	defer srv.Close()
	var wg sync.WaitGroup
	var n atomic.Int64
	jobs := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				resp, err := http.Get(srv.URL + "/?peak=" + strconv.FormatInt(int64(1+(i*37)%60)*mib, 10))
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
				case http.StatusTooManyRequests:
					n.Add(1)
				default:
					t.Errorf("request %d: %s", i, resp.Status)
				}
			}
		})
	}
	for i := range 1000 {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return n.Load()
}

// TestPeaksPredictRefusals (issue 20): the histogram of 1,000 requests
// with peaks from 1 to 60 MiB in observe mode predicts exactly the
// refusals of enforce mode on the same load, at budgets of 16 and 32 MiB
// (bucket bounds); up to the budget both modes record the same buckets,
// and the same count above it, since a refused request's peak is what it
// asked for.
func TestPeaksPredictRefusals(t *testing.T) {
	run := func(mode string, limit int64) (PoolStats, int64) {
		t.Setenv("MEMCTL_BUDGETS", mode)
		p := newTestPool(t, PoolConfig{Limit: Unlimited})
		refused := peakLoad(t, p, limit)
		return p.Stats(), refused
	}
	obs, obsRefused := run("observe", 32*mib)
	require.Equal(t, ModeObserve, obs.Mode)
	assert.Equal(t, int64(0), obsRefused, "observe refuses nothing")
	assert.Equal(t, int64(1000), obs.Peaks.Count)
	for _, limit := range []int64{32 * mib, 16 * mib} {
		enf, enfRefused := run("enforce", limit)
		require.Equal(t, ModeEnforce, enf.Mode)
		var b strings.Builder
		for i, c := range obs.Peaks.Counts {
			if c != 0 || enf.Peaks.Counts[i] != 0 {
				fmt.Fprintf(&b, "  le %6d MiB: observe %4d, enforce %4d\n", PeakBucketBound(i)>>20, c, enf.Peaks.Counts[i])
			}
		}
		predicted := obs.Peaks.Above(limit)
		t.Logf("peak histogram of 1000 requests, 1-60 MiB, budget %d MiB:\n%sobserve predicts %d refusals (it let %d Grows through); enforce refused %d (RefusedBy.Account %d)",
			limit>>20, b.String(), predicted, obs.Observed, enfRefused, enf.RefusedBy.Account)
		// Up to the budget, the same buckets in both modes; above it,
		// enforce shows where each refused request was stopped (its first
		// refused Grow), observe its whole demand.
		top := peakBucket(limit)
		assert.Equal(t, obs.Peaks.Counts[:top+1], enf.Peaks.Counts[:top+1])
		assert.Equal(t, predicted, enf.Peaks.Above(limit), "and the same count above it")
		want := int64(0)
		for i := range 1000 {
			if int64(1+(i*37)%60)*mib > limit {
				want++
			}
		}
		assert.Equal(t, want, predicted)
		assert.Equal(t, predicted, enfRefused, "observe predicts enforce")
		assert.Equal(t, predicted, enf.RefusedBy.Account)
		assert.GreaterOrEqual(t, obs.Observed, predicted, "observe counts every Grow past the budget, several per request")
	}
}
