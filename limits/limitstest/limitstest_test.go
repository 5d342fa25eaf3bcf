package limitstest_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/limits/limitstest"
)

// sortHandler is a handler as the README writes it: it charges 8·n bytes
// before it builds n values.
func sortHandler(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err := limits.Grow(r.Context(), 8*n); err != nil {
		if !limits.WriteError(w, err) {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		return
	}
	defer limits.Shrink(r.Context(), 8*n)
	v := make([]int64, n)
	fmt.Fprintln(w, len(v))
}

// Issue 20: a handler tested with httptest and no middleware has no
// budget, so an over-budget request passes; with Request it is refused
// with 429, and a small one is served.
func TestRequestGivesABudget(t *testing.T) {
	big := httptest.NewRequest("GET", "/sort?n=20000000", nil) // 160 MB
	w := httptest.NewRecorder()
	sortHandler(w, big)
	assert.Equal(t, http.StatusOK, w.Code, "without a budget the 160 MB request passes")

	w = httptest.NewRecorder()
	sortHandler(w, limitstest.Request(t, big, 64<<20))
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Contains(t, w.Body.String(), `"code":"resource_exhausted"`)
	assert.Contains(t, w.Body.String(), "in test/TestRequestGivesABudget: requested 160000000 bytes")
	assert.Empty(t, w.Header().Get("Retry-After"), "over its own budget: no retry")

	w = httptest.NewRecorder()
	sortHandler(w, limitstest.Request(t, httptest.NewRequest("GET", "/sort?n=1000", nil), 64<<20))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "1000\n", w.Body.String())
}

// recorder is a testing.TB that collects what the helper reports and runs
// the cleanups when told.
type recorder struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// The test fails when the code under test leaves bytes grown, or shrinks
// more than it grew; it passes when the code is balanced.
func TestContextReportsLeaksAndMisuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		code func(ctx context.Context)
		want string
	}{
		{"balanced", func(ctx context.Context) { _ = limits.Grow(ctx, 1<<20); limits.Shrink(ctx, 1<<20) }, ""},
		{"leak", func(ctx context.Context) { _ = limits.Grow(ctx, 4096) }, "closed with 4096 bytes grown and not shrunk"},
		{"misuse", func(ctx context.Context) { limits.Shrink(ctx, 1) }, "1 Shrink calls took back more than was grown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			ctx, a := limitstest.Context(r, context.Background(), 64<<20)
			require.Same(t, a, limits.FromContext(ctx))
			assert.Equal(t, int64(64<<20), a.Limit())
			tc.code(ctx)
			r.end()
			if tc.want == "" {
				assert.Empty(t, r.errs)
				return
			}
			require.Len(t, r.errs, 1)
			assert.Contains(t, r.errs[0], tc.want)
			assert.True(t, strings.HasPrefix(r.errs[0], "limitstest: test/"+t.Name()), r.errs[0])
		})
	}
}

// fatalRecorder is a recorder whose Fatalf records and stops the
// goroutine, as testing.T's does.
type fatalRecorder struct {
	recorder
	fatal string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// A budget of 0 or less fails the test at once with the reason; a leak in
// an account opened from the test's account (a nested step of the code
// under test) is reported as the test account's own would be.
func TestContextBadLimitAndNestedLeak(t *testing.T) {
	for _, limit := range []int64{0, -1, math.MinInt64} {
		r := &fatalRecorder{recorder: recorder{TB: t}}
		done := make(chan struct{})
		go func() {
			defer close(done)
			limitstest.Context(r, context.Background(), limit)
			t.Errorf("limit %d: Context returned", limit)
		}()
		<-done
		r.end()
		assert.Contains(t, r.fatal, "limitstest: limits: invalid size", "limit %d", limit)
		assert.Contains(t, r.fatal, fmt.Sprint(limit), "the limit is named")
	}
	r := &recorder{TB: t}
	_, a := limitstest.Context(r, context.Background(), 64<<20)
	step, err := a.Open("step", limits.Unlimited)
	require.NoError(t, err)
	require.NoError(t, step.Grow(4096))
	r.end()
	require.Len(t, r.errs, 1)
	assert.Contains(t, r.errs[0], "closed with 4096 bytes grown and not shrunk")
}
