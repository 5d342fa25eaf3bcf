package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/memctl/memctl/limits"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nopWriter is a ResponseWriter that discards what it is given.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkHandler is the http scenario's handler without the network: bare
// (the plain arms) against behind Pool.Middleware with a 1 MiB budget (the
// memctl arms), in the same run. The difference is what the middleware
// costs per request; compare with
//
//	go test -run '^$' -bench Handler -benchmem -count 10 ./bench/ > h.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl h.txt
func BenchmarkHandler(b *testing.B) {
	p := defaultParams(false)
	b.Run("impl=bare", func(b *testing.B) {
		benchHandler(b, handler(p.Alloc))
	})
	b.Run("impl=middleware", func(b *testing.B) {
		pool, err := limits.NewPool(limits.PoolConfig{Name: "bench"})
		require.NoError(b, err)
		b.Cleanup(pool.Close)
		mw, err := pool.Middleware(limits.HTTPConfig{Limit: p.Budget})
		require.NoError(b, err)
		benchHandler(b, mw(handler(p.Alloc)))
	})
}

func benchHandler(b *testing.B, h http.Handler) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := &nopWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}

// TestHandler checks the handler the http scenario serves: 1 KiB answers,
// the allocation charged to the request's budget behind the middleware, and
// a budget too small refused with 429 resource_exhausted.
func TestHandler(t *testing.T) {
	rec := httptest.NewRecorder()
	handler(32<<10).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, 1024, rec.Body.Len())

	pool, err := limits.NewPool(limits.PoolConfig{Name: "bench", Limit: 1 << 30})
	require.NoError(t, err)
	defer pool.Close()
	var peak int64
	probe := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler(32<<10).ServeHTTP(w, r)
		peak = limits.FromContext(r.Context()).Peak()
	})
	mw, err := pool.Middleware(limits.HTTPConfig{Limit: 1 << 20})
	require.NoError(t, err)
	rec = httptest.NewRecorder()
	mw(probe).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, int64(32<<10), peak, "the request's allocation was charged to its account")

	small, err := pool.Middleware(limits.HTTPConfig{Limit: 16 << 10})
	require.NoError(t, err)
	rec = httptest.NewRecorder()
	small(handler(32<<10)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Contains(t, rec.Body.String(), "resource_exhausted")
}
