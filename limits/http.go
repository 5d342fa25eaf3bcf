package limits

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// defaultBurstThreshold is the largest default burst threshold, in bytes:
// when HTTPConfig.BurstThreshold is 0 a request ends a burst at 64 MiB, or at
// half of HTTPConfig.Limit when that is smaller.
const defaultBurstThreshold = 64 << 20

// HTTPConfig configures Pool.Middleware. Limit must be set; the other
// fields' zero values name accounts "req-1", "req-2", ... and call no burst
// hook.
type HTTPConfig struct {
	// Limit is each request's budget in bytes, required: 0 (the zero value)
	// and negative values are errors, so that a forgotten budget is not
	// silently unlimited. Unlimited asks for requests limited by the pool
	// alone.
	Limit int64
	// Name returns the account name for a request, the element after the
	// pool's name in error scopes. Default: nil (means "req-N", N counting
	// the pool's numbered requests from 1, whatever the transport).
	Name func(*http.Request) string
	// BurstThreshold is the size, in bytes, at or above which a request
	// ends a burst: AfterBurst is called once the handler returns and the
	// account is closed when the account's peak (Account.Peak) reached it,
	// or when a Grow of the request was refused with ErrResourceExhausted
	// and what the account used plus the refused size reached it (code that
	// allocates before it reports leaves that much garbage; code that
	// reports first was about to). Requests that reach it together end a
	// burst too: once two of the middleware's requests were in flight at
	// once, and the pool's use (Pool.Used, what all its accounts hold, in
	// 64 KiB chunks by default) has peaked at BurstThreshold or more since
	// the last burst they ended, the request whose end leaves it under half
	// of BurstThreshold calls AfterBurst (three concurrent requests of
	// 31 MB each under a 32 MiB threshold end one burst when the last of
	// them ends). A steady load that keeps the pool above half the
	// threshold ends no burst until it falls. Negative means never.
	// Default: 0, which means 64 MiB, or Limit/2
	// when Limit is set and Limit/2 is smaller (at least 1 byte): a request
	// never holds more than Limit, so a request limited to 32 MiB ends a
	// burst at 16 MiB.
	// Unlimited counts as no limit here.
	BurstThreshold int64
	// AfterBurst is called, on the request's goroutine, after a request
	// that reached BurstThreshold, alone or together with others (see
	// BurstThreshold). Nothing is wired automatically: to
	// return the burst's freed memory to the OS a few seconds later, pass
	// memctl.AfterBurst (the trimmer of memctl.Start). It should return
	// quickly. Default: nil (nothing is called; Middleware says so once at
	// INFO through the pool's logger).
	AfterBurst func()
	// UnchargedBody leaves request bodies out of the budget: the handler
	// charges what it keeps. Set it for handlers that stream their body
	// rather than hold it (io.Copy to a file, a proxy), which the charge
	// would refuse once the bytes read passed the budget, and for a gRPC
	// or Connect server behind the middleware whose interceptors
	// (grpcbudget, connectbudget) charge each message. Default: false (the
	// body is charged, see Middleware).
	UnchargedBody bool
}

// Middleware returns a net/http middleware that opens an account per
// request with cfg.Limit, puts it in the request's context
// (limits.Grow(r.Context(), n) charges it) and closes it when the handler
// returns, even by panic. With PoolConfig.CancelLargest the account is bound
// to a cancelable context of its own (WithAccount) that the pool's heap
// watch may cancel; without it the middleware skips that context and costs
// 3 allocations a request: the account, the context value and the request
// copy of r.WithContext (measured figures: docs/benchmarks.md).
// When the pool is closed the middleware answers 503 Service Unavailable
// without calling the handler. It returns an error matching ErrInvalidSize
// for a cfg.Limit that is negative or 0. The middleware is safe for
// concurrent use.
//
// The request body is charged to the account before it is in memory
// (unless cfg.UnchargedBody), at twice its length: a body read into memory
// is held twice at its peak (io.ReadAll copies its chunks into one slice
// at the end, bytes.Buffer and json.Decoder copy their buffer as they
// grow). A request whose Content-Length is more than that can grant (its
// own limit, the pool's room) is answered 429 resource_exhausted, as
// WriteError answers, before the handler runs, and nothing of the body is
// read; the ExhaustedError's Requested is twice the Content-Length. A body
// of unknown length (chunked, or HTTP/2 without content-length) is charged
// as it is read: each Read of r.Body charges twice the bytes it read, and
// once the budget refuses, that Read and every later one return the budget
// error, so that io.ReadAll or json.Decoder fail with it. A handler answers
// it with WriteError, or returns without writing: the middleware then
// answers 429 itself (for such requests it wraps the ResponseWriter to see
// whether the handler wrote; Flush, Hijack, ReadFrom and
// http.ResponseController pass through). The body's charge is released
// when the handler returns; a request without a body costs what it cost
// before bodies were charged. In a 512 MiB cgroup with a 256 MiB
// pool and 64 MiB per request, three concurrent 200 MiB uploads to a
// handler that reads its body with io.ReadAll are refused with 429 while
// small requests are served; without the charge the server is OOM-killed
// (docs/budgets.md). A handler that charged the body itself (Grow(ctx,
// r.ContentLength)) no longer needs to.
//
// A handler shrinks what it grew before it returns (defer limits.Shrink)
// and answers a Grow error with WriteError (the package example); a leak
// is counted as in Account.Close and, with PoolConfig.Strict, panics after
// the account is closed and AfterBurst called, unless the handler itself
// panicked. With CancelLargest, a Grow after the request's context ended
// fails as WithAccount says (429 after a heap-pressure cancel); without
// it, a handler that should stop when the client goes away checks
// r.Context().Err() as usual.
func (p *Pool) Middleware(cfg HTTPConfig) (func(http.Handler) http.Handler, error) {
	if err := checkLimit(cfg.Limit, func() string { return "HTTPConfig.Limit: Middleware" }); err != nil {
		return nil, err
	}
	m := &httpMiddleware{p: p, cfg: cfg, threshold: burstThreshold(cfg.Limit, cfg.BurstThreshold)}
	if cfg.AfterBurst == nil {
		p.log.Info("limits: HTTPConfig.AfterBurst is nil: a request that peaks high does not end a burst for the trimmer (pass memctl.AfterBurst)",
			"pool", p.name)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(next, w, r)
		})
	}, nil
}

// httpMiddleware is one middleware made by Pool.Middleware: its
// configuration and what its requests share. Safe for concurrent use.
type httpMiddleware struct {
	p         *Pool
	cfg       HTTPConfig
	threshold int64 // bytes, cfg.BurstThreshold resolved (burstThreshold); <= 0: never
	// inflight counts the requests in the handler; overlapped is set when
	// two were at once since the last burst they ended together.
	inflight   atomic.Int64
	overlapped atomic.Bool
}

// httpRequest is the state of one request in the middleware, owned by the
// request's goroutine. It lives on serve's stack: the methods that take it
// keep no pointer to it.
type httpRequest struct {
	a *Account
	// end is WithAccount's end with PoolConfig.CancelLargest, nil without.
	end func() string
	// What the body is charged, in bytes: all of it up front for a
	// Content-Length (charged), each Read's share otherwise (body).
	charged int64
	body    *chargedBody
	// admitted is false when the Content-Length was refused: nothing of
	// the body was read.
	admitted bool
	// returned is set when the handler returned, or the middleware
	// answered without calling it, rather than panicked.
	returned bool
}

// serve serves one request: it opens the request's account, admits its
// body and calls next, then closes the account (finish), even by panic.
// A closed pool is answered 503 without calling next.
func (m *httpMiddleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	a, err := m.open(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	// The account closes when the handler returns. Only a pool that may
	// cancel the largest request needs the request's own cancelable
	// context (WithAccount, which allocates more).
	rq := httpRequest{a: a, admitted: true}
	var ctx context.Context
	if m.p.cancelLargest {
		ctx, rq.end = withAccount(r.Context(), a)
	} else {
		ctx = NewContext(r.Context(), a)
	}
	if m.inflight.Add(1) > 1 && !m.overlapped.Load() {
		m.overlapped.Store(true)
	}
	defer m.finish(&rq)
	r = r.WithContext(ctx)
	var tracker *writeTracker
	if r.ContentLength != 0 && !m.cfg.UnchargedBody {
		if r.ContentLength > 0 {
			if !rq.admit(w, r.ContentLength) {
				return
			}
		} else {
			rq.body = &chargedBody{rc: r.Body, a: a}
			r.Body = rq.body
			tracker = &writeTracker{ResponseWriter: w}
			w = tracker
		}
	}
	next.ServeHTTP(w, r)
	rq.returned = true
	if tracker != nil && !tracker.wrote && rq.body.err != nil {
		WriteError(tracker.ResponseWriter, rq.body.err)
	}
}

// open opens the account of request r: named by cfg.Name, or "req-N",
// built only if needed, numbered in the pool. It returns Open's errors.
func (m *httpMiddleware) open(r *http.Request) (*Account, error) {
	if m.cfg.Name != nil {
		return m.p.Open(m.cfg.Name(r), m.cfg.Limit)
	}
	return m.p.open("", m.p.seq.Add(1), m.cfg.Limit)
}

// admit charges a body of contentLength bytes (> 0) to the request's
// account up front (bodyCharge). When the account refuses it, admit
// answers w as WriteError does (503 with the error's text when the account
// or pool is closed), marks the request not admitted and returns false:
// the handler must not run.
func (rq *httpRequest) admit(w http.ResponseWriter, contentLength int64) bool {
	n := bodyCharge(contentLength)
	if err := rq.a.Grow(n); err != nil {
		rq.admitted, rq.returned = false, true
		if !WriteError(w, err) {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // closed
		}
		return false
	}
	rq.charged = n
	return true
}

// finish ends request rq, deferred by serve: it releases the body's
// charge, closes the account, calls cfg.AfterBurst when the request ended
// a burst, and panics with the leak report when the pool is strict, the
// account leaked and the handler did not panic itself.
func (m *httpMiddleware) finish(rq *httpRequest) {
	a := rq.a
	if rq.body != nil {
		rq.charged += rq.body.charged.Load()
	}
	if rq.charged != 0 {
		a.Shrink(rq.charged)
	}
	reached := max(a.Peak(), a.refusedAt.Load())
	if !rq.admitted {
		reached = a.Peak() // nothing of the body was read: no garbage to trim
	}
	var leak string
	if rq.end != nil {
		leak = rq.end()
	} else {
		leak = a.close(nil)
		m.p.workEnded(a)
	}
	m.endBurst(reached)
	// A handler's own panic goes on (net/http logs it, or
	// http.ErrAbortHandler aborts): the leak it caused is counted, and a
	// strict panic would replace it.
	if leak != "" && m.p.strict && rq.returned {
		panic(leak)
	}
}

// endBurst counts a request out of the handler and calls cfg.AfterBurst
// when the request, which reached reached bytes, ended a burst alone or
// together with others (see HTTPConfig.BurstThreshold).
func (m *httpMiddleware) endBurst(reached int64) {
	left := m.inflight.Add(-1)
	together := m.threshold > 0 && m.overlapped.Load() && m.p.endBurstTogether(m.threshold)
	if together {
		m.overlapped.Store(left > 1)
	}
	if m.threshold > 0 && (reached >= m.threshold || together) && m.cfg.AfterBurst != nil {
		m.cfg.AfterBurst()
	}
}

// endBurstTogether reports whether the pool's requests together peaked at
// threshold or more since the last burst they ended and the pool's use is
// now under half of it; the one caller that sees it so restarts the peak
// from the use now.
func (p *Pool) endBurstTogether(threshold int64) bool {
	peak := p.burstPeak.Load()
	if peak < threshold {
		return false
	}
	used := p.used.Load()
	return used < threshold/2 && p.burstPeak.CompareAndSwap(peak, used)
}

// staleHeaders are the headers WriteError deletes: those of the content the
// handler meant to send. Content-Encoding stays, as in http.Error: a
// compressing middleware sets it and compresses what WriteError writes
// (go.dev/issue/66343).
var staleHeaders = [...]string{"Content-Length", "Transfer-Encoding", "Cache-Control", "Etag", "Last-Modified", "Content-Range", "Content-Disposition"}

// errorBody is the JSON body WriteError sends.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteError answers a budget error: when err matches ErrResourceExhausted
// (a refused Grow, context.Cause of a context the heap watch canceled, or
// the ErrClosed error of a Grow after that cancel) it writes status 429 with
// the JSON body {"code":"resource_exhausted","message":"<err.Error()>"} and
// returns true. As http.Error does, it deletes a Content-Length the handler
// set for other content, and sets Content-Type (application/json) and
// X-Content-Type-Options: nosniff; it also deletes the other headers of that
// content that would break or outlive the answer: Transfer-Encoding,
// Cache-Control, ETag, Last-Modified, Content-Range and
// Content-Disposition (ServeContent deletes the same before an error). As
// http.Error does, it keeps Content-Encoding, which a compressing
// middleware sets for what it compresses (go.dev/issue/66343): a handler
// that set Content-Encoding itself and compresses by hand deletes it first.
// It sets Retry-After from ExhaustedError.RetryAfter, in whole seconds,
// and deletes it when that is 0 (a retry cannot succeed).
//
// For any other error, and for nil, it writes nothing and returns false,
// and the caller answers: ErrInvalidSize is a bug of the caller (500),
// ErrClosed wrapping context.Canceled means the client went away (any
// answer is lost), ErrClosed alone means the account or pool was closed
// (for example 503). Call it before writing anything else to w.
func WriteError(w http.ResponseWriter, err error) bool {
	if err == nil || !errors.Is(err, ErrResourceExhausted) {
		return false
	}
	body, _ := json.Marshal(errorBody{Code: CodeResourceExhausted, Message: err.Error()})
	h := w.Header()
	// The headers of the answer the handler meant to send describe other
	// content: its length, its framing (a stale Transfer-Encoding breaks the
	// HTTP/1.1 connection: "too many transfer encodings"), and its caching
	// (a stale Cache-Control: max-age lets a shared cache serve the 429 to
	// everyone), as net/http's ServeContent deletes them before an error.
	for _, k := range staleHeaders {
		h.Del(k)
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Del("Retry-After")
	if e, ok := errors.AsType[*ExhaustedError](err); ok && e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(body, '\n'))
	return true
}
