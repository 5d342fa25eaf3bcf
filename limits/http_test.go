package limits

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/relief"
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
	defer Shrink(r.Context(), n)
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
		Limit:          Unlimited,
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

// growsHandler charges each ?n= value in turn to the request's account and
// answers 200, or, at the first error, 429 through WriteError (500 for any
// other error): the handler a new user writes.
func growsHandler(w http.ResponseWriter, r *http.Request) {
	var total int64
	defer func() { Shrink(r.Context(), total) }()
	for _, s := range r.URL.Query()["n"] {
		n, _ := strconv.ParseInt(s, 10, 64)
		if err := Grow(r.Context(), n); err != nil {
			if !WriteError(w, err) {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
			return
		}
		total += n
	}
	fmt.Fprintln(w, "ok")
}

// TestMiddlewareBurstThresholdFollowsLimit: a request never holds more than
// its own limit, so the default threshold is at most half of it.
func TestMiddlewareBurstThresholdFollowsLimit(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 1 << 40})
	for _, tc := range []struct {
		limit   int64
		queries []string // each one request
		bursts  int64
	}{
		// Limit 32 MiB: the threshold is 16 MiB.
		{32 * mib, []string{"n=" + strconv.FormatInt(16*mib-1, 10)}, 0},
		{32 * mib, []string{"n=" + strconv.FormatInt(16*mib, 10)}, 1},
		{32 * mib, []string{"n=" + strconv.FormatInt(8*mib, 10) + "&n=" + strconv.FormatInt(8*mib, 10)}, 1},
		// Limit 64 MiB: 32 MiB. A request that peaked at 48 MiB and was then
		// refused ends a burst by its peak.
		{64 * mib, []string{"n=" + strconv.FormatInt(48*mib, 10) + "&n=" + strconv.FormatInt(32*mib, 10)}, 1},
		// A request holding 8 MiB refused 40 MiB more: it would have held
		// 48 MiB, past 32 MiB.
		{64 * mib, []string{"n=" + strconv.FormatInt(8*mib, 10) + "&n=" + strconv.FormatInt(60*mib, 10)}, 1},
		// Limit 1 GiB: the 64 MiB default.
		{gib, []string{"n=" + strconv.FormatInt(63*mib, 10)}, 0},
		{gib, []string{"n=" + strconv.FormatInt(64*mib, 10)}, 1},
		// No limit of its own: 64 MiB.
		{Unlimited, []string{"n=" + strconv.FormatInt(64*mib-1, 10)}, 0},
		{Unlimited, []string{"n=" + strconv.FormatInt(64*mib, 10)}, 1},
		// Limit 1 byte: the threshold is 1 byte, not 0 (never).
		{1, []string{"n=1"}, 1},
	} {
		var bursts atomic.Int64
		h := mustMiddleware(t, p, HTTPConfig{Limit: tc.limit, AfterBurst: func() { bursts.Add(1) }})(http.HandlerFunc(growsHandler))
		for _, q := range tc.queries {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/?"+q, nil))
		}
		assert.Equal(t, tc.bursts, bursts.Load(), "Limit %d, %v", tc.limit, tc.queries)
	}
	assert.Zero(t, p.Used())

	// A Grow refused (here by a 16 MiB pool) that would not have taken the
	// request to the threshold (32 MiB) does not count.
	small := newTestPool(t, PoolConfig{Limit: 16 * mib})
	var refusedBursts atomic.Int64
	h := mustMiddleware(t, small, HTTPConfig{Limit: 64 * mib, AfterBurst: func() { refusedBursts.Add(1) }})(http.HandlerFunc(growsHandler))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/?n="+strconv.FormatInt(mib, 10)+"&n="+strconv.FormatInt(20*mib, 10), nil))
	assert.Equal(t, 429, w.Code)
	assert.Zero(t, refusedBursts.Load())

	// A negative threshold still means never; an explicit one wins.
	var bursts atomic.Int64
	h = mustMiddleware(t, p, HTTPConfig{Limit: 32 * mib, BurstThreshold: -1, AfterBurst: func() { bursts.Add(1) }})(http.HandlerFunc(growsHandler))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/?n="+strconv.FormatInt(32*mib, 10), nil))
	assert.Zero(t, bursts.Load())
	h = mustMiddleware(t, p, HTTPConfig{Limit: 32 * mib, BurstThreshold: 20 * mib, AfterBurst: func() { bursts.Add(1) }})(http.HandlerFunc(growsHandler))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/?n="+strconv.FormatInt(19*mib, 10), nil))
	assert.Zero(t, bursts.Load())
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/?n="+strconv.FormatInt(20*mib, 10), nil))
	assert.Equal(t, int64(1), bursts.Load())
}

// TestMiddlewareHeapPressureCancelAnswers429: after the heap watch canceled
// a request's context, its account is closed, and the handler's next Grow
// fails with an error that WriteError answers with 429.
func TestMiddlewareHeapPressureCancelAnswers429(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 1 << 40, HeapPressure: 0.9, CancelLargest: true})
	h := mustMiddleware(t, p, HTTPConfig{Limit: Unlimited})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := FromContext(r.Context())
		require.NoError(t, Grow(r.Context(), mib))
		p.observeHeap(15*mib, 16*mib) // heap pressure: this request is the largest, 1/15 of the heap
		<-r.Context().Done()
		require.Eventually(t, func() bool { return a.Used() == 0 }, 5*time.Second, time.Millisecond, "closed when its context ended")
		growsHandler(w, r)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/?n="+strconv.FormatInt(mib, 10), nil))
	assert.Equal(t, http.StatusTooManyRequests, w.Code, w.Body.String())
	var body errorBody
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body), w.Body.String())
	assert.Equal(t, "resource_exhausted", body.Code)
	assert.Equal(t, "limits: closed: pool/req-1: Grow(1048576) after its context ended: "+
		"limits: resource_exhausted in pool/req-1 (heap pressure): requested 1048576 bytes, 15728640 in use, limit 15099494", body.Message)
	assert.Equal(t, "1", w.Header().Get("Retry-After"), "the heap may recover")
	assert.Equal(t, int64(0), p.Stats().Refused, "a Grow on a closed account is not a refusal")
}

// TestWriteErrorHeaders (issue 11, input 3): a handler that set
// Content-Length (or any header of the answer it meant to send) before
// WriteError still sends a well-formed 429 that a client reads to the end;
// Retry-After is there when a retry can succeed (the pool is full, heap
// pressure) and not when it cannot (over the request's own budget or an
// ancestor's).
func TestWriteErrorHeaders(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 3 * mib})
	hog := mustOpen(t, p, "hog", Unlimited)
	require.NoError(t, hog.Grow(2*mib))
	defer shrinkClose(hog)
	h := mustMiddleware(t, p, HTTPConfig{Limit: 2 * mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Retry-After", "3600")
		if r.URL.Query().Get("child") != "" {
			q, err := FromContext(r.Context()).Open("sort", Unlimited)
			require.NoError(t, err)
			defer q.Close()
			r = r.WithContext(NewContext(r.Context(), q))
		}
		growHandler(w, r)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, tc := range []struct {
		query, retryAfter, scope string
	}{
		{"n=" + strconv.FormatInt(2*mib+1, 10), "", "pool/req-1:"},                             // own budget
		{"child=1&n=" + strconv.FormatInt(2*mib+1, 10), "", "pool/req-2:"},                     // the request's, from a child
		{"n=" + strconv.FormatInt(1<<62, 10), "", "pool/req-3:"},                               // a client's absurd size
		{"n=" + strconv.FormatInt(math.MaxInt64, 10), "", "pool/req-4:"},                       // the largest
		{"n=" + strconv.FormatInt(mib+1, 10), "1", "pool:"},                                    // the pool is full
		{"child=1&n=" + strconv.FormatInt(mib+1, 10), "1", "pool:"},                            // from a child
		{"n=" + strconv.FormatInt(2*mib, 10) + "&n=" + strconv.FormatInt(1, 10), "1", "pool:"}, // the pool first
	} {
		resp, err := http.Get(srv.URL + "/?" + tc.query)
		require.NoError(t, err, tc.query)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, "%s: the body is read to its end (no unexpected EOF)", tc.query)
		assert.Equal(t, 429, resp.StatusCode, tc.query)
		assert.Equal(t, int64(len(body)), resp.ContentLength, tc.query)
		assert.Equal(t, strconv.Itoa(len(body)), resp.Header.Get("Content-Length"), tc.query)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), tc.query)
		assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), tc.query)
		assert.Equal(t, tc.retryAfter, resp.Header.Get("Retry-After"), tc.query)
		var eb errorBody
		require.NoError(t, json.Unmarshal(body, &eb), string(body))
		assert.Contains(t, eb.Message, "resource_exhausted in "+tc.scope, tc.query)
	}
	assert.Zero(t, p.Stats().Leaked)
}

// TestWriteErrorRetryAfterRoundsUp: Retry-After is whole seconds, rounded
// up, and only for an error that says a retry can succeed.
func TestWriteErrorRetryAfterRoundsUp(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "", time.Millisecond: "1", time.Second: "1", 1500 * time.Millisecond: "2", -time.Second: ""} {
		w := httptest.NewRecorder()
		require.True(t, WriteError(w, &ExhaustedError{Scope: "pool", RetryAfter: d}))
		assert.Equal(t, want, w.Header().Get("Retry-After"), "%v", d)
	}
}

// TestMiddlewareLimitRequired (issue 11, input 7): a zero HTTPConfig.Limit
// is an error that names limits.Unlimited, which is how no per-request
// limit is asked for; a handler outside the middleware shows up in
// PoolStats.Unguarded.
func TestMiddlewareLimitRequired(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: mib})
	_, err := p.Middleware(HTTPConfig{})
	require.ErrorIs(t, err, ErrInvalidSize)
	assert.Contains(t, err.Error(), "limits.Unlimited")
	h := mustMiddleware(t, p, HTTPConfig{Limit: Unlimited})(http.HandlerFunc(growHandler))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/?n="+strconv.FormatInt(mib+1, 10), nil))
	assert.Equal(t, 429, w.Code, "the pool still limits")

	before := p.Stats().Unguarded
	unguarded := http.HandlerFunc(growHandler) // no middleware
	for range 3 {
		w = httptest.NewRecorder()
		unguarded.ServeHTTP(w, httptest.NewRequest("GET", "/?n=100", nil))
		assert.Equal(t, 200, w.Code)
	}
	assert.Equal(t, before+3, p.Stats().Unguarded)
}

// TestMiddlewareLeak (issue 11, item 6): a handler that returns without
// shrinking what it grew leaks: counted with its bytes, logged once, and in
// strict mode a panic after the account is closed and AfterBurst called.
func TestMiddlewareLeak(t *testing.T) {
	var logs strings.Builder
	p, err := NewPool(PoolConfig{Limit: mib, HeapPressure: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer p.Close()
	leaky := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, Grow(r.Context(), 1000))
	})
	h := mustMiddleware(t, p, HTTPConfig{Limit: mib})(leaky)
	for range 2 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	st := p.Stats()
	assert.Equal(t, int64(2), st.Leaked)
	assert.Equal(t, int64(2000), st.LeakedBytes)
	assert.Zero(t, st.Used, "the account is closed all the same")
	assert.Equal(t, 1, strings.Count(logs.String(), "leak"), logs.String())

	strict := newTestPool(t, PoolConfig{Limit: mib})
	var bursts atomic.Int64
	h = mustMiddleware(t, strict, HTTPConfig{Limit: mib, BurstThreshold: 1, AfterBurst: func() { bursts.Add(1) }})(leaky)
	assert.PanicsWithValue(t, "limits: pool/req-1: closed with 1000 bytes grown and not shrunk", func() {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	})
	assert.Zero(t, strict.Used())
	assert.Equal(t, int64(1), bursts.Load(), "AfterBurst ran before the panic")
	// A handler that panics with bytes grown keeps its own panic (and
	// http.ErrAbortHandler its meaning); the leak is counted. Before, the
	// strict leak panic replaced it.
	for _, v := range []any{"handler boom", http.ErrAbortHandler} {
		h = mustMiddleware(t, strict, HTTPConfig{Limit: mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			require.NoError(t, Grow(r.Context(), 1000))
			panic(v)
		}))
		assert.PanicsWithValue(t, v, func() {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
		})
	}
	assert.Equal(t, int64(3), strict.Stats().Leaked)
	assert.Zero(t, strict.Used())
	// With CancelLargest the account is bound to the request's context; a
	// client that went away is not a leak.
	cl := newTestPool(t, PoolConfig{Limit: mib, CancelLargest: true})
	grown := make(chan error, 1)
	h = mustMiddleware(t, cl, HTTPConfig{Limit: mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		grown <- Grow(r.Context(), 1000)
		<-r.Context().Done()
		assert.Eventually(t, func() bool { return FromContext(r.Context()).Used() == 0 }, 5*time.Second, time.Millisecond)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	}()
	require.NoError(t, <-grown)
	cancel() // the client goes away with the bytes grown
	<-served
	assert.Zero(t, cl.Stats().Leaked)
}

// TestWriteErrorStaleHeaders: a handler that set the headers of the answer
// it meant to send (its framing, its caching, its range) before WriteError
// still sends a 429 that a client reads to its end, over HTTP/1.1 and
// HTTP/2, for GET and HEAD, and that no cache keeps. Before, a stale
// "Transfer-Encoding: gzip" broke the HTTP/1.1 connection ("too many
// transfer encodings") and a stale "Cache-Control: public, max-age=3600"
// and ETag went out with the 429.
func TestWriteErrorStaleHeaders(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 3 * mib})
	stale := map[string]string{
		"Content-Length":      "100000",
		"Transfer-Encoding":   "gzip",
		"Cache-Control":       "public, max-age=3600",
		"Etag":                `"v1"`,
		"Last-Modified":       "Mon, 30 Nov 2026 00:00:00 GMT",
		"Content-Range":       "bytes 0-99999/200000",
		"Content-Disposition": `attachment; filename="report.csv"`,
	}
	h := mustMiddleware(t, p, HTTPConfig{Limit: 2 * mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.URL.Query().Get("k")
		w.Header().Set(k, stale[k])
		growHandler(w, r)
	}))
	for _, h2 := range []bool{false, true} {
		srv := httptest.NewUnstartedServer(h)
		srv.EnableHTTP2 = h2
		srv.StartTLS()
		for k := range stale {
			for _, method := range []string{http.MethodGet, http.MethodHead} {
				what := fmt.Sprintf("HTTP/2 %v, %s, stale %s", h2, method, k)
				req, err := http.NewRequest(method, srv.URL+"/?n=3000000&k="+k, nil)
				require.NoError(t, err)
				resp, err := srv.Client().Do(req)
				require.NoError(t, err, what)
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err, what)
				assert.Equal(t, 429, resp.StatusCode, what)
				if k != "Content-Length" { // the server sets the body's own
					assert.Empty(t, resp.Header.Values(k), what)
				}
				if method == http.MethodGet {
					assert.NotEqual(t, "100000", resp.Header.Get("Content-Length"), what)
					var eb errorBody
					require.NoError(t, json.Unmarshal(body, &eb), what)
					assert.Equal(t, codeResourceExhausted, eb.Code, what)
				}
			}
		}
		srv.Close()
	}
	assert.Zero(t, p.Used())
}

// TestRetryAfterOnlyWhenItCanFit: a refusal by a full pool carries
// Retry-After, but not one of a request that alone asks for more than the
// pool's whole limit (a client's Content-Length of 2 GiB against a 1 GiB
// pool), which a retry meets again. Before, both said Retry-After: 1, and a
// client that obeys it retried forever.
func TestRetryAfterOnlyWhenItCanFit(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: mib, ChunkSize: 4 * kib})
	hog := mustOpen(t, p, "hog", Unlimited)
	require.NoError(t, hog.Grow(mib/2))
	defer shrinkClose(hog)
	a := mustOpen(t, p, "a", Unlimited)
	kid := mustOpen(t, a, "kid", Unlimited)
	defer a.Close()
	require.NoError(t, a.Grow(100*kib))
	defer a.Shrink(100 * kib)
	for _, tc := range []struct {
		acct  *Account
		n     int64
		retry time.Duration
	}{
		{a, 3 * mib / 4, defaultRetryAfter},   // fits once hog is gone
		{kid, 3 * mib / 4, defaultRetryAfter}, // from a child
		{a, mib - 100*kib, defaultRetryAfter}, // exactly the pool with what a holds
		{a, mib - 100*kib + 1, 0},             // one byte more than the pool
		{kid, 2 * mib, 0},
		{a, 1 << 62, 0},
		{kid, math.MaxInt64 - 200*kib, 0},
	} {
		err := tc.acct.Grow(tc.n)
		var e *ExhaustedError
		require.ErrorAs(t, err, &e, "%s Grow(%d)", tc.acct.Name(), tc.n)
		assert.Equal(t, "pool", e.Scope, "%s Grow(%d)", tc.acct.Name(), tc.n)
		assert.Equal(t, tc.retry, e.RetryAfter, "%s Grow(%d)", tc.acct.Name(), tc.n)
		w := httptest.NewRecorder()
		require.True(t, WriteError(w, err))
		assert.Equal(t, map[bool]string{true: "1", false: ""}[tc.retry > 0], w.Header().Get("Retry-After"))
	}
	// Under heap pressure or shedding too, the work that does not fit in
	// the pool's whole limit is told not to retry.
	p.pressure.Store(true)
	p.lastCycle.Store(time.Now().UnixNano())
	for n, retry := range map[int64]time.Duration{mib / 4: defaultRetryAfter, 2 * mib: 0} {
		var e *ExhaustedError
		require.ErrorAs(t, a.Grow(n), &e)
		assert.Equal(t, "pool (heap pressure)", e.Scope)
		assert.Equal(t, retry, e.RetryAfter, "Grow(%d) under heap pressure", n)
	}
	p.pressure.Store(false)
	relief.Shed(true)
	defer relief.Shed(false)
	for n, retry := range map[int64]time.Duration{p.shedLimit(): defaultRetryAfter, 2 * mib: 0} {
		var e *ExhaustedError
		require.ErrorAs(t, a.Grow(n), &e)
		assert.Equal(t, "pool/a (shedding)", e.Scope)
		assert.Equal(t, retry, e.RetryAfter, "Grow(%d) while shedding", n)
	}
}

// TestClientContentLength: a handler charges the client's Content-Length
// before reading the body. Sizes past a limit, however large, are 429
// resource_exhausted, with Retry-After only when a retry can fit (the pool
// is full, not a body larger than the pool or the request's budget); an
// unknown length (a chunked body, ContentLength -1) is the caller's
// ErrInvalidSize; net/http itself answers 400 to a negative or unparsable
// one.
func TestClientContentLength(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 4 * mib})
	hog := mustOpen(t, p, "hog", Unlimited)
	require.NoError(t, hog.Grow(3*mib))
	defer shrinkClose(hog)
	// The handler charges the body itself (TestBodyContentLengthExtremes:
	// the middleware's own charge).
	h := mustMiddleware(t, p, HTTPConfig{Limit: 2 * mib, UnchargedBody: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Grow(r.Context(), r.ContentLength); err != nil {
			if !WriteError(w, err) {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
			return
		}
		defer Shrink(r.Context(), r.ContentLength)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, tc := range []struct {
		header     string // the Content-Length line, or a Transfer-Encoding one
		code       int
		retryAfter string
	}{
		{"Content-Length: 9223372036854775807", 429, ""}, // MaxInt64
		{"Content-Length: 9223372036854775806", 429, ""},
		{"Content-Length: 4611686018427387904", 429, ""}, // 1<<62
		{"Content-Length: 2097153", 429, ""},             // the request's budget + 1
		{"Content-Length: 1048577", 429, "1"},            // the pool is full: retry
		{"Content-Length: 9223372036854775808", 400, ""}, // past int64: net/http
		{"Content-Length: -1", 400, ""},                  // negative: net/http
		{"Transfer-Encoding: chunked", 500, ""},          // unknown length: -1
	} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		_, err = fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\n%s\r\nConnection: close\r\n\r\n", tc.header)
		require.NoError(t, err)
		if strings.HasPrefix(tc.header, "Transfer") {
			_, err = io.WriteString(conn, "0\r\n\r\n")
			require.NoError(t, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, tc.header)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		conn.Close()
		require.NoError(t, err, tc.header)
		assert.Equal(t, tc.code, resp.StatusCode, "%s: %s", tc.header, body)
		assert.Equal(t, tc.retryAfter, resp.Header.Get("Retry-After"), tc.header)
		if tc.code == 429 {
			assert.Contains(t, string(body), `"code":"resource_exhausted"`, tc.header)
		}
	}
	assert.Equal(t, 3*mib, p.Used(), "the requests left nothing behind")
}

// Input (issue 27, item 4): request names repeated across transports in one
// pool (req-2 from the HTTP middleware and req-2 from the gRPC
// interceptor, which uses StartWork). They are numbered in the pool now:
// two middlewares and StartWork on one pool give req-1, req-2, req-3.
func TestRequestNamesUniqueInPool(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 100 * mib})
	var names []string
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		names = append(names, FromContext(r.Context()).Name())
	})
	for _, mw := range []func(http.Handler) http.Handler{
		mustMiddleware(t, p, HTTPConfig{Limit: mib}), mustMiddleware(t, p, HTTPConfig{Limit: mib}),
	} {
		mw(record).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	ctx, w, err := p.StartWork(t.Context(), WorkConfig{Limit: mib})
	require.NoError(t, err)
	names = append(names, FromContext(ctx).Name())
	w.Finish(nil)
	assert.Equal(t, []string{"pool/req-1", "pool/req-2", "pool/req-3"}, names)
}

// scripted serves requests through a middleware whose handler grows ?n=
// bytes and holds them until the test ends the request.
type scripted struct {
	t      *testing.T
	h      http.Handler
	bursts atomic.Int64
}

type held struct {
	release chan struct{}
	done    chan struct{}
}

func newScripted(t *testing.T, p *Pool, limit int64) *scripted {
	s := &scripted{t: t}
	s.h = mustMiddleware(t, p, HTTPConfig{Limit: limit, AfterBurst: func() { s.bursts.Add(1) }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		require.NoError(t, Grow(r.Context(), n))
		defer Shrink(r.Context(), n)
		grown := r.Context().Value(grownKey{}).(chan struct{})
		close(grown)
		<-r.Context().Value(releaseKey{}).(chan struct{})
	}))
	return s
}

type grownKey struct{}
type releaseKey struct{}

// start begins a request of n bytes and returns once it holds them.
func (s *scripted) start(n int64) held {
	hd := held{release: make(chan struct{}), done: make(chan struct{})}
	grown := make(chan struct{})
	r := httptest.NewRequest("GET", "/?n="+strconv.FormatInt(n, 10), nil)
	ctx := r.Context()
	r = r.WithContext(context.WithValue(context.WithValue(ctx, grownKey{}, grown), releaseKey{}, hd.release))
	go func() {
		defer close(hd.done)
		s.h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-grown
	return hd
}

// end ends the request and returns the bursts counted so far.
func (s *scripted) end(hd held) int64 {
	close(hd.release)
	<-hd.done
	return s.bursts.Load()
}

// Issue 19: requests that together peak above the threshold end a burst,
// when the last of them leaves the pool under half the threshold; each
// under the per-request threshold (32 MiB for a 64 MiB budget).
func TestMiddlewareBurstAcrossRequests(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 1 << 40})
	const limit = 64 * mib // threshold 32 MiB
	const r31 = 31_000_000

	t.Run("three concurrent 31 MB", func(t *testing.T) {
		s := newScripted(t, p, limit)
		a, b, c := s.start(r31), s.start(r31), s.start(r31)
		assert.Zero(t, s.end(a), "62 MB still held")
		assert.Zero(t, s.end(b), "31 MB still held: over half the threshold")
		assert.Equal(t, int64(1), s.end(c), "the last one ends the burst")
	})
	t.Run("two concurrent 20 MiB", func(t *testing.T) {
		s := newScripted(t, p, limit)
		a, b := s.start(20*mib), s.start(20*mib)
		s.end(b)
		assert.Equal(t, int64(1), s.end(a))
	})
	t.Run("staggered", func(t *testing.T) {
		// A and B overlap (62 MB), then C overlaps B: one burst, at C's end.
		s := newScripted(t, p, limit)
		a := s.start(r31)
		b := s.start(r31)
		assert.Zero(t, s.end(a))
		c := s.start(r31)
		assert.Zero(t, s.end(b))
		assert.Equal(t, int64(1), s.end(c))
		// The next stretch starts from zero: two small ones end none.
		d, e := s.start(mib), s.start(mib)
		s.end(d)
		assert.Equal(t, int64(1), s.end(e))
	})
	t.Run("together under the threshold", func(t *testing.T) {
		s := newScripted(t, p, limit)
		a, b, c := s.start(10*mib), s.start(10*mib), s.start(10*mib)
		s.end(a)
		s.end(b)
		assert.Zero(t, s.end(c), "30 MiB together is under 32 MiB")
	})
	t.Run("one after another", func(t *testing.T) {
		s := newScripted(t, p, limit)
		for range 5 {
			assert.Zero(t, s.end(s.start(r31)), "never together")
		}
	})
	t.Run("steady overlap", func(t *testing.T) {
		// Eight requests of 1 MiB always in flight, 400 in all: the pool
		// never holds the threshold, so no burst.
		s := newScripted(t, p, limit)
		var q []held
		for range 8 {
			q = append(q, s.start(mib))
		}
		for range 400 {
			s.end(q[0])
			q = append(q[1:], s.start(mib))
		}
		for _, h := range q {
			s.end(h)
		}
		assert.Zero(t, s.bursts.Load())
	})
	t.Run("high steady load ends one burst when it falls", func(t *testing.T) {
		// Four 12 MiB requests always in flight (48 MiB): the burst ends
		// only when the load falls under 16 MiB.
		s := newScripted(t, p, limit)
		var q []held
		for range 4 {
			q = append(q, s.start(12*mib))
		}
		for range 40 {
			assert.Zero(t, s.end(q[0]))
			q = append(q[1:], s.start(12*mib))
		}
		s.end(q[0])
		assert.Zero(t, s.end(q[1]), "24 MiB left")
		assert.Equal(t, int64(1), s.end(q[2]), "12 MiB left: under half the threshold")
		assert.Equal(t, int64(1), s.end(q[3]), "one burst")
	})
	assert.Zero(t, p.Used())
}
