package limits

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// defaultBurstThreshold is the largest default BurstThreshold, in bytes.
const defaultBurstThreshold = 64 << 20

// HTTPConfig configures Pool.Middleware. Limit must be set.
type HTTPConfig struct {
	// Limit is each request's budget in bytes, required: ≤ 0 is an error.
	// Unlimited leaves only the pool to limit requests.
	Limit int64
	// Name returns a request's account name. Default: nil (means "req-N", N
	// counting the pool's requests from 1).
	Name func(*http.Request) string
	// BurstThreshold is the size, in bytes, at or above which a request ends a
	// burst: when the account's peak, or its use plus a refused Grow, reached
	// it, or when requests in flight together took Pool.Used to it and the
	// last to end leaves it under half (docs/budgets.md). Negative means never.
	// Default: 0, which means 64 MiB, or Limit/2 when smaller (at least 1 byte).
	BurstThreshold int64
	// AfterBurst is called on the request's goroutine, once the handler
	// returned, after a request that ended a burst; pass memctl.AfterBurst.
	// Default: nil (nothing is called; Middleware says so once at INFO).
	AfterBurst func()
	// UnchargedBody leaves request bodies out of the budget (handlers that
	// stream their body; gRPC or Connect servers). Default: false.
	UnchargedBody bool
}

// Middleware returns a net/http middleware that opens an account per request
// with cfg.Limit, puts it in the request's context and closes it when the
// handler returns, even by panic; with PoolConfig.CancelLargest it binds it
// with WithAccount. When the pool is closed it answers 503 without calling the
// handler. It returns an error matching ErrInvalidSize for a cfg.Limit ≤ 0.
//
// Unless cfg.UnchargedBody, the request body is charged at twice its length
// until the handler returns: a Content-Length the budget cannot grant is
// answered 429 before the handler runs, and a body of unknown length is
// charged as it is read, a refused Read returning the budget error (and a 429
// if the handler writes nothing). A leak counts as in Account.Close, and
// panics with PoolConfig.Strict unless the handler panicked.
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

// httpMiddleware is one Pool.Middleware and what its requests share.
type httpMiddleware struct {
	p          *Pool
	cfg        HTTPConfig
	threshold  int64        // bytes, cfg.BurstThreshold resolved; <= 0: never
	inflight   atomic.Int64 // requests in the handler
	overlapped atomic.Bool  // two at once since the last burst they ended together
}

// httpRequest is one request's state, on serve's stack: keep no pointer.
type httpRequest struct {
	work     Work  // its account and context (begin, closeAccount)
	charged  int64 // a Content-Length's charge; body's are per Read
	body     *chargedBody
	admitted bool // false: the Content-Length was refused, nothing read
	returned bool // the handler returned (or was not called), not panicked
}

// serve serves one request (see Middleware).
func (m *httpMiddleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	a, err := m.open(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	rq := httpRequest{work: Work{a: a}, admitted: true}
	rq.work.begin(r.Context(), m.p.cancelLargest)
	if m.inflight.Add(1) > 1 && !m.overlapped.Load() {
		m.overlapped.Store(true)
	}
	defer m.finish(&rq)
	r = r.WithContext(rq.work.ctx)
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

// open opens r's account, named by cfg.Name or "req-N".
func (m *httpMiddleware) open(r *http.Request) (*Account, error) {
	if m.cfg.Name != nil {
		return m.p.Open(m.cfg.Name(r), m.cfg.Limit)
	}
	return m.p.open("", m.p.seq.Add(1), m.cfg.Limit)
}

// admit charges a body of contentLength bytes up front; on a refusal it
// answers w (WriteError, or 503 when closed) and returns false.
func (rq *httpRequest) admit(w http.ResponseWriter, contentLength int64) bool {
	n := bodyCharge(contentLength)
	if err := rq.work.a.Grow(n); err != nil {
		rq.admitted, rq.returned = false, true
		if !WriteError(w, err) {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // closed
		}
		return false
	}
	rq.charged = n
	return true
}

// finish ends rq: it releases the body's charge, closes the account, ends a
// burst, and panics on a strict leak.
func (m *httpMiddleware) finish(rq *httpRequest) {
	a := rq.work.a
	if rq.body != nil {
		rq.charged += rq.body.charged.Load()
	}
	a.Shrink(rq.charged) // 0: nothing
	reached := max(a.Peak(), a.refusedAt.Load())
	if !rq.admitted {
		reached = a.Peak() // nothing of the body was read: no garbage to trim
	}
	leak := rq.work.closeAccount()
	m.endBurst(reached)
	if leak != "" && m.p.strict && rq.returned {
		panic(leak)
	}
}

// endBurst counts a request out and calls AfterBurst when it ended a burst.
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

// endBurstTogether reports whether the pool's use peaked at threshold and is
// now under half of it; the one caller that sees it so restarts the peak.
func (p *Pool) endBurstTogether(threshold int64) bool {
	peak := p.burstPeak.Load()
	if peak < threshold {
		return false
	}
	used := p.used.Load()
	return used < threshold/2 && p.burstPeak.CompareAndSwap(peak, used)
}

// staleHeaders are the headers WriteError deletes, as net/http's
// ServeContent does before an error.
var staleHeaders = [...]string{"Content-Length", "Transfer-Encoding", "Cache-Control", "Etag", "Last-Modified", "Content-Range", "Content-Disposition"}

// errorBody is the JSON body WriteError sends.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteError answers a budget error: when err matches ErrResourceExhausted it
// writes status 429 with the JSON body
// {"code":"resource_exhausted","message":"<err.Error()>"} and returns true. It
// sets Content-Type, X-Content-Type-Options: nosniff and Retry-After
// (ExhaustedError.RetryAfter in whole seconds), and deletes the headers of
// the content the handler meant to send (Content-Length, Transfer-Encoding,
// Cache-Control, ETag, Last-Modified, Content-Range, Content-Disposition).
// Call it before writing anything else to w. For any other error, and nil, it
// writes nothing and returns false.
func WriteError(w http.ResponseWriter, err error) bool {
	if err == nil || !errors.Is(err, ErrResourceExhausted) {
		return false
	}
	body, _ := json.Marshal(errorBody{Code: codeResourceExhausted, Message: err.Error()})
	h := w.Header()
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

// bodyCopies is how many times its length a request body is charged: read
// into memory it is held twice at its peak (docs/budgets.md).
const bodyCopies = 2

// bodyCharge returns bodyCopies × n, saturated at math.MaxInt64.
func bodyCharge(n int64) int64 {
	if n > math.MaxInt64/bodyCopies {
		return math.MaxInt64
	}
	return n * bodyCopies
}

// chargedBody is a body of unknown length charged as it is read; after a
// refusal every Read returns the budget error (docs/budgets.md).
type chargedBody struct {
	rc      io.ReadCloser
	a       *Account
	charged atomic.Int64
	err     error // the first refusal, returned by every later Read
}

func (b *chargedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.rc.Read(p)
	if n > 0 {
		c := bodyCharge(int64(n))
		if gerr := b.a.Grow(c); gerr != nil {
			b.err = gerr
			return 0, gerr
		}
		b.charged.Add(c)
	}
	return n, err
}

func (b *chargedBody) Close() error { return b.rc.Close() }

// writeTracker records whether the handler has answered, so that a refused
// read gets the middleware's 429 only when it wrote nothing.
type writeTracker struct {
	http.ResponseWriter
	wrote bool
}

func (w *writeTracker) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols { // 1xx is not the answer, but 101 is
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *writeTracker) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// Flush sends what was written, and the headers: the answer has begun.
func (w *writeTracker) Flush() {
	w.wrote = true
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *writeTracker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.wrote = true
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// ReadFrom keeps net/http's sendfile path for io.Copy(w, file).
func (w *writeTracker) ReadFrom(r io.Reader) (int64, error) {
	w.wrote = true
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, r)
}

func (w *writeTracker) Unwrap() http.ResponseWriter { return w.ResponseWriter }
