package limits

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustMiddleware(t *testing.T, p *Pool, cfg HTTPConfig) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := p.Middleware(cfg)
	require.NoError(t, err)
	return mw
}

// growHandler charges ?n= bytes to the request's account and answers 200,
// or 429 through WriteError.
func growHandler(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err := Grow(r.Context(), n); err != nil {
		if !WriteError(w, err) {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		return
	}
	fmt.Fprintln(w, "ok")
}

func TestMiddlewareAnswers429(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 100 * mib})
	srv := httptest.NewServer(mustMiddleware(t, p, HTTPConfig{Limit: mib})(http.HandlerFunc(growHandler)))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/?n=1000")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	resp, err = http.Get(srv.URL + "/?n=2000000")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, 429, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.JSONEq(t, `{"code":"resource_exhausted","message":"limits: resource_exhausted in pool/req-2: requested 2000000 bytes, 0 in use, limit 1048576"}`, string(body))
	assert.Zero(t, p.Used(), "each request's account is closed when its handler returns")
	assert.Equal(t, int64(1), p.Stats().Refused)
}

func TestWriteErrorOnlyAnswersBudgetErrors(t *testing.T) {
	for _, err := range []error{nil, errors.New("other"), ErrInvalidSize, ErrClosed} {
		w := httptest.NewRecorder()
		assert.False(t, WriteError(w, err), "%v", err)
		assert.Zero(t, w.Body.Len())
	}
	w := httptest.NewRecorder()
	wrapped := fmt.Errorf("sort: %w", &ExhaustedError{Requested: 1, Used: 2, Limit: 2, Scope: "pool/x"})
	assert.True(t, WriteError(w, wrapped))
	assert.Equal(t, 429, w.Code)
	var body map[string]string
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
	assert.Equal(t, map[string]string{"code": "resource_exhausted", "message": wrapped.Error()}, body)
}

func TestMiddlewareAfterBurstAndPanic(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 1 << 40})
	var bursts atomic.Int64
	h := mustMiddleware(t, p, HTTPConfig{
		BurstThreshold: 8 * mib,
		AfterBurst:     func() { bursts.Add(1) },
		Name:           func(r *http.Request) string { return r.URL.Path[1:] },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := FromContext(r.Context())
		assert.Equal(t, "pool"+r.URL.Path, a.Name())
		growHandler(w, r)
		if r.URL.Query().Get("panic") != "" {
			panic("handler")
		}
	}))
	serve := func(target string) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", target, nil))
	}
	serve("/small?n=1000")
	assert.Zero(t, bursts.Load(), "a small request ends no burst")
	serve("/big?n=" + strconv.FormatInt(8*mib, 10))
	assert.Equal(t, int64(1), bursts.Load(), "a request whose peak reached the threshold ends a burst")
	assert.Panics(t, func() { serve("/boom?n=100&panic=1") })
	assert.Zero(t, p.Used(), "the account is closed even when the handler panics")

	_, err := p.Middleware(HTTPConfig{Limit: -1})
	assert.ErrorIs(t, err, ErrInvalidSize)
	p.Close()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/late", nil))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
}

// TestMiddlewareEightConcurrent80MiB: eight concurrent requests of 80 MiB
// each, against a 100 MiB per-request budget and a 400 MiB pool. Every
// request holds its memory until all eight have asked, so exactly five fit
// and three are refused, by the pool.
func TestMiddlewareEightConcurrent80MiB(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 400 * mib})
	var asked sync.WaitGroup
	asked.Add(8)
	var mu sync.Mutex
	var scopes []string
	h := mustMiddleware(t, p, HTTPConfig{Limit: 100 * mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := Grow(r.Context(), 80*mib)
		asked.Done()
		if err != nil {
			var e *ExhaustedError
			if errors.As(err, &e) {
				mu.Lock()
				scopes = append(scopes, e.Scope)
				mu.Unlock()
			}
			WriteError(w, err)
			return
		}
		defer Shrink(r.Context(), 80*mib)
		buf := make([]byte, 80*mib)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		asked.Wait() // hold it until every request has asked
		fmt.Fprintln(w, len(buf))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	type result struct {
		code int
		body string
	}
	results := make(chan result, 8)
	for range 8 {
		go func() {
			resp, err := http.Get(srv.URL + "/big")
			if err != nil {
				results <- result{0, err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- result{resp.StatusCode, string(b)}
		}()
	}
	count := map[int]int{}
	for range 8 {
		r := <-results
		count[r.code]++
		if r.code == 429 {
			var eb errorBody
			require.NoError(t, json.Unmarshal([]byte(r.body), &eb), r.body)
			assert.Equal(t, "resource_exhausted", eb.Code)
			assert.Contains(t, eb.Message, "resource_exhausted in pool: requested 83886080 bytes")
		}
	}
	assert.Equal(t, map[int]int{200: 5, 429: 3}, count)
	assert.Equal(t, []string{"pool", "pool", "pool"}, scopes)
	assert.Zero(t, p.Used())
	assert.Equal(t, 400*mib, p.Stats().Peak)
}
