package limits

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// zeros is a body of n zero bytes that counts what was read of it.
type zeros struct {
	n, read int64
}

func (z *zeros) Read(p []byte) (int, error) {
	if z.read >= z.n {
		return 0, io.EOF
	}
	k := int(min(int64(len(p)), z.n-z.read))
	clear(p[:k])
	z.read += int64(k)
	return k, nil
}

func (z *zeros) Close() error { return nil }

// upload returns a POST request of n bytes; chunked asks for a body of
// unknown length (ContentLength -1), as a chunked HTTP/1.1 upload or an
// HTTP/2 one without content-length reaches a handler.
func upload(n int64, chunked bool) (*http.Request, *zeros) {
	z := &zeros{n: n}
	r := httptest.NewRequest(http.MethodPost, "/upload", nil)
	r.Body = z
	r.ContentLength = n
	if chunked {
		r.ContentLength = -1
	}
	return r, z
}

// readAllHandler reads the whole body with io.ReadAll and answers its
// length; on error it writes nothing and records the error and how much
// io.ReadAll had read.
func readAllHandler(got *error, n *int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			*got, *n = err, len(b)
			return
		}
		fmt.Fprintln(w, len(b))
	}
}

func decode429(t *testing.T, w *httptest.ResponseRecorder) errorBody {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, w.Code, w.Body.String())
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	var eb errorBody
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &eb), w.Body.String())
	assert.Equal(t, codeResourceExhausted, eb.Code)
	return eb
}

// TestBodyContentLengthRefused: a Content-Length over what the request's
// budget can grant (twice the length) is answered 429 before the handler
// runs, and nothing of the body is read.
func TestBodyContentLengthRefused(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var bursts atomic.Int64
	var ran atomic.Bool
	h := mustMiddleware(t, p, HTTPConfig{Limit: 64 * mib, AfterBurst: func() { bursts.Add(1) }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Store(true)
	}))
	r, z := upload(200*mib, false)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	eb := decode429(t, w)
	assert.Equal(t, "limits: resource_exhausted in pool/req-1: requested 419430400 bytes, 0 in use, limit 67108864", eb.Message)
	assert.Empty(t, w.Header().Get("Retry-After"), "over the request's own budget: a retry cannot succeed")
	assert.False(t, ran.Load(), "the handler did not run")
	assert.Zero(t, z.read, "nothing of the body was read")
	assert.Zero(t, bursts.Load(), "nothing was allocated: no burst")
	st := p.Stats()
	assert.Zero(t, st.Used)
	assert.Equal(t, int64(1), st.RefusedBy.Account)
	assert.Equal(t, int64(1), st.Peaks.Above(64*mib), "the refused request is in the peak histogram")

	// 33 MiB fits a request's 64 MiB budget once, not twice.
	r, _ = upload(33*mib, false)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	decode429(t, w)
	assert.False(t, ran.Load())
}

// TestBodyContentLengthCharged: a body that fits is charged twice its
// Content-Length while the handler runs, with what the handler grows on
// top, and released when it returns.
func TestBodyContentLengthCharged(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var used, grown int64
	h := mustMiddleware(t, p, HTTPConfig{Limit: 64 * mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used = FromContext(r.Context()).Used()
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		assert.Len(t, b, 10<<20)
		if err := Grow(r.Context(), 50*mib); err != nil { // 20 + 50 > 64
			WriteError(w, err)
			return
		}
		defer Shrink(r.Context(), 50*mib)
		grown = 50 * mib
	}))
	r, z := upload(10*mib, false)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, 20*mib, used, "twice the Content-Length, before the handler read any of it")
	assert.Equal(t, 10*mib, z.read)
	eb := decode429(t, w)
	assert.Contains(t, eb.Message, "requested 52428800 bytes, 20971520 in use")
	assert.Zero(t, grown)
	assert.Zero(t, p.Used(), "the body's charge is released when the handler returns")
	assert.Zero(t, p.Stats().Leaked, "the body's charge is not a leak")
}

// TestBodyChunkedRefused: a body of unknown length is charged as it is
// read; io.ReadAll fails with the budget error once twice the bytes read
// pass the budget, and the middleware answers 429 for the handler that
// wrote nothing.
func TestBodyChunkedRefused(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var bursts atomic.Int64
	var got error
	var read int
	h := mustMiddleware(t, p, HTTPConfig{Limit: 64 * mib, AfterBurst: func() { bursts.Add(1) }})(readAllHandler(&got, &read))
	r, _ := upload(200*mib, true)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.ErrorIs(t, got, ErrResourceExhausted, "io.ReadAll fails with the budget error")
	var e *ExhaustedError
	require.ErrorAs(t, got, &e)
	assert.Equal(t, 64*mib, e.Limit)
	eb := decode429(t, w)
	assert.Equal(t, got.Error(), eb.Message)
	assert.LessOrEqual(t, int64(read), 32*mib, "io.ReadAll got no more than half the budget")
	assert.Greater(t, int64(read), 24*mib)
	assert.Equal(t, int64(1), bursts.Load(), "a body read to the budget ends a burst")
	assert.Zero(t, p.Used())
	assert.Zero(t, p.Stats().Leaked)

	// Each later Read returns the same error.
	body := &chargedBody{rc: io.NopCloser(strings.NewReader("abc")), a: mustOpen(t, p, "x", 1)}
	_, err := body.Read(make([]byte, 3))
	require.ErrorIs(t, err, ErrResourceExhausted)
	_, err2 := body.Read(make([]byte, 3))
	assert.Equal(t, err, err2)
	assert.Zero(t, body.charged.Load())
}

// TestBodyChunkedFits: a chunked body within the budget is read whole,
// charged twice while the handler runs, released after.
func TestBodyChunkedFits(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var used int64
	h := mustMiddleware(t, p, HTTPConfig{Limit: 64 * mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		used = FromContext(r.Context()).Used()
		fmt.Fprintln(w, len(b))
	}))
	r, _ := upload(10*mib, true)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "10485760\n", w.Body.String())
	assert.Equal(t, 20*mib, used)
	assert.Zero(t, p.Used())
}

// TestBodyHandlerAnswers: the middleware adds nothing when the handler
// answered the refused read itself, with WriteError or with a status of
// its own, or had answered before it read.
func TestBodyHandlerAnswers(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
		code int
		body string
	}{
		{"WriteError", func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			require.True(t, WriteError(w, err))
		}, 429, `"code":"resource_exhausted"`},
		{"own status", func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			http.Error(w, "bad upload: "+err.Error(), http.StatusBadRequest)
		}, 400, "bad upload: limits: resource_exhausted"},
		{"answered first", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			_, err := io.ReadAll(r.Body)
			require.ErrorIs(t, err, ErrResourceExhausted)
		}, 202, ""},
		{"flushed first", func(w http.ResponseWriter, r *http.Request) {
			require.NoError(t, http.NewResponseController(w).Flush())
			_, err := io.ReadAll(r.Body)
			require.ErrorIs(t, err, ErrResourceExhausted)
		}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := mustMiddleware(t, p, HTTPConfig{Limit: mib})(tc.h)
			r, _ := upload(10*mib, true)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			assert.Equal(t, tc.code, w.Code)
			assert.Contains(t, w.Body.String(), tc.body)
			if tc.body != "" {
				assert.Equal(t, 1, strings.Count(w.Body.String(), tc.body), "answered once")
			}
			assert.Zero(t, p.Used())
		})
	}
}

// TestBodyUncharged: with UnchargedBody the body is the handler's to
// charge: a 200 MiB upload reaches it and is read whole, and the writer is
// the server's own.
func TestBodyUncharged(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	for _, chunked := range []bool{false, true} {
		var n int64
		var sameWriter bool
		w := httptest.NewRecorder()
		h := mustMiddleware(t, p, HTTPConfig{Limit: 64 * mib, UnchargedBody: true})(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			n, _ = io.Copy(io.Discard, r.Body) // streamed, never held
			sameWriter = rw == http.ResponseWriter(w)
			assert.Zero(t, FromContext(r.Context()).Used())
		}))
		r, _ := upload(200*mib, chunked)
		h.ServeHTTP(w, r)
		assert.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, 200*mib, n)
		assert.True(t, sameWriter)
	}
}

// TestBodyWriterOnlyWhenCharged: a request without a body, or with a
// Content-Length, reaches the handler with the server's own
// ResponseWriter; one of unknown length with a tracker that passes Flush,
// Hijack, ReadFrom and Unwrap through.
func TestBodyWriterOnlyWhenCharged(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var seen http.ResponseWriter
	h := mustMiddleware(t, p, HTTPConfig{Limit: 64 * mib})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = w
		_, _ = io.Copy(w, strings.NewReader("copied")) // ReadFrom
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Same(t, w, seen, "no body: the server's writer")
	r, _ := upload(mib, false)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Same(t, w, seen, "a Content-Length: the server's writer")
	r, _ = upload(mib, true)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	tr, ok := seen.(*writeTracker)
	require.True(t, ok, "%T", seen)
	assert.Same(t, w, tr.Unwrap())
	assert.Equal(t, "copied", w.Body.String())
	assert.True(t, tr.wrote)

	// An informational status is not the answer.
	tr = &writeTracker{ResponseWriter: httptest.NewRecorder()}
	tr.WriteHeader(http.StatusEarlyHints)
	assert.False(t, tr.wrote)
	tr.WriteHeader(http.StatusSwitchingProtocols)
	assert.True(t, tr.wrote)

	// Flush and Hijack reach the writer below.
	tr = &writeTracker{ResponseWriter: w}
	tr.Flush()
	assert.True(t, w.Flushed)
	_, _, err := tr.Hijack()
	assert.ErrorIs(t, err, http.ErrNotSupported, "a recorder cannot be hijacked")
	assert.True(t, tr.wrote)
}

// TestBodyOverRealServer: the same refusals over a real HTTP/1.1
// connection, where net/http frames the body: a 200 MiB upload with a
// Content-Length gets 429 before its body is sent (Expect: 100-continue)
// or while it is, a chunked one gets 429 once half its budget is read, and
// small requests beside them get 200.
func TestBodyOverRealServer(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 256 * mib})
	var got error
	var read int
	mw := mustMiddleware(t, p, HTTPConfig{Limit: 64 * mib})
	mux := http.NewServeMux()
	mux.Handle("/upload", mw(readAllHandler(&got, &read)))
	mux.Handle("/small", mw(http.HandlerFunc(growHandler)))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, tc := range []struct {
		name            string
		chunked, expect bool
	}{{"content-length", false, false}, {"expect 100-continue", false, true}, {"chunked", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			z := &zeros{n: 200 * mib}
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/upload", io.NopCloser(z))
			require.NoError(t, err)
			req.ContentLength = 200 * mib
			if tc.chunked {
				req.ContentLength = -1
			}
			if tc.expect {
				req.Header.Set("Expect", "100-continue")
			}
			tr := &http.Transport{ExpectContinueTimeout: 10e9}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
			assert.Contains(t, string(b), `"code":"resource_exhausted"`)
			if tc.expect {
				assert.Zero(t, z.read, "the body was never sent")
			}
			resp, err = http.Get(srv.URL + "/small?n=1000")
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
		})
	}
	assert.True(t, errors.Is(got, ErrResourceExhausted), "%v", got)
	assert.Zero(t, p.Used())
}

// TestBodyContentLengthExtremes: Content-Lengths from a raw connection,
// charged by the middleware at twice their size without overflow: past the
// request's budget, however large, 429 with no Retry-After; past the
// pool's room, 429 with Retry-After: 1; what net/http refuses, 400 before
// the middleware; a chunked body read whole, 200.
func TestBodyContentLengthExtremes(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 4 * mib})
	hog := mustOpen(t, p, "hog", Unlimited)
	require.NoError(t, hog.Grow(3*mib))
	defer shrinkClose(hog)
	var got error
	var read int
	srv := httptest.NewServer(mustMiddleware(t, p, HTTPConfig{Limit: 4 * mib})(readAllHandler(&got, &read)))
	defer srv.Close()
	for _, tc := range []struct {
		header     string // the Content-Length line, or a Transfer-Encoding one
		code       int
		retryAfter string
	}{
		{"Content-Length: 9223372036854775807", 429, ""}, // MaxInt64
		{"Content-Length: 4611686018427387904", 429, ""}, // 1<<62: twice it overflows
		{"Content-Length: 4611686018427387903", 429, ""},
		{"Content-Length: 2097153", 429, ""},             // twice it is the request's budget + 2
		{"Content-Length: 1048576", 429, "1"},            // the pool is full: retry
		{"Content-Length: 9223372036854775808", 400, ""}, // past int64: net/http
		{"Transfer-Encoding: chunked", 200, ""},          // empty
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
	assert.NoError(t, got)
	assert.Equal(t, 3*mib, p.Used(), "the requests left nothing behind")
}

// middlewareBefore is Pool.Middleware as it was before request bodies were
// charged (git show 15b3e11:limits/http.go), kept verbatim as the control
// of BenchmarkMiddleware and of TestUploadsInCgroup.
func (p *Pool) middlewareBefore(cfg HTTPConfig) (func(http.Handler) http.Handler, error) {
	if err := checkLimit(cfg.Limit, func() string { return "HTTPConfig.Limit: Middleware" }); err != nil {
		return nil, err
	}
	threshold := cfg.BurstThreshold
	if threshold == 0 {
		threshold = defaultBurstThreshold
		if cfg.Limit != Unlimited {
			threshold = max(min(threshold, cfg.Limit/2), 1)
		}
	}
	if cfg.AfterBurst == nil {
		p.log.Info("limits: HTTPConfig.AfterBurst is nil: a request that peaks high does not end a burst for the trimmer (pass memctl.AfterBurst)",
			"pool", p.name)
	}
	// inflight counts the requests in the handler; overlapped is set when
	// two were at once since the last burst they ended together.
	var inflight atomic.Int64
	var overlapped atomic.Bool
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var a *Account
			var err error
			if cfg.Name != nil {
				a, err = p.Open(cfg.Name(r), cfg.Limit)
			} else {
				a, err = p.open("", p.seq.Add(1), cfg.Limit) // "req-N", built only if needed, numbered in the pool
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			// The account closes when the handler returns. Only a pool that
			// may cancel the largest request needs the request's own
			// cancelable context (WithAccount: about 6 allocations more).
			var ctx context.Context
			var end func() string
			returned := false
			if p.cancelLargest {
				ctx, end = withAccount(r.Context(), a)
			} else {
				ctx = NewContext(r.Context(), a)
			}
			if inflight.Add(1) > 1 && !overlapped.Load() {
				overlapped.Store(true)
			}
			defer func() {
				reached := max(a.Peak(), a.refusedAt.Load())
				var leak string
				if end != nil {
					leak = end()
				} else {
					leak = a.close(nil)
					p.workEnded(a)
				}
				left := inflight.Add(-1)
				together := threshold > 0 && overlapped.Load() && p.endBurstTogether(threshold)
				if together {
					overlapped.Store(left > 1)
				}
				if threshold > 0 && (reached >= threshold || together) && cfg.AfterBurst != nil {
					cfg.AfterBurst()
				}
				// A handler's own panic goes on (net/http logs it, or
				// http.ErrAbortHandler aborts): the leak it caused is
				// counted, and a strict panic would replace it.
				if leak != "" && p.strict && returned {
					panic(leak)
				}
			}()
			next.ServeHTTP(w, r.WithContext(ctx))
			returned = true
		})
	}, nil
}
