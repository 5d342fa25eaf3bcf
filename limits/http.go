package limits

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
)

// DefaultBurstThreshold is the peak, in bytes, above which a request ends a
// burst (HTTPConfig.AfterBurst) when HTTPConfig.BurstThreshold is 0.
const DefaultBurstThreshold = 64 << 20

// HTTPConfig configures Pool.Middleware. The zero value opens accounts
// without a limit of their own (the pool's limit still applies), named
// "req-1", "req-2", ..., with no burst hook.
type HTTPConfig struct {
	// Limit is each request's budget in bytes; 0 means requests only count
	// and are limited by the pool alone. Negative is an error. Default: 0.
	Limit int64
	// Name returns the account name for a request, the element after the
	// pool's name in error scopes. Default: nil (means "req-N", N counting
	// the middleware's requests from 1).
	Name func(*http.Request) string
	// BurstThreshold is the account peak, in bytes, at or above which a
	// request ends a burst: AfterBurst is called once the handler returns
	// and the account is closed. Negative means never. Default: 0 (means
	// DefaultBurstThreshold, 64 MiB).
	BurstThreshold int64
	// AfterBurst is called, on the request's goroutine, after a request
	// whose peak reached BurstThreshold; memctl wires it to the trimmer,
	// which returns the freed memory to the OS a few seconds later. It
	// should return quickly. Default: nil (nothing is called).
	AfterBurst func()
}

// Middleware returns a net/http middleware that opens an account per
// request with cfg.Limit, binds it to the request's context (WithAccount:
// limits.Grow(r.Context(), n) charges it, and the pool's heap watch may
// cancel the context) and closes it when the handler returns, even by panic.
// Handlers answer a budget error with WriteError. When the pool is closed the
// middleware answers 503 Service Unavailable without calling the handler.
// It returns an error matching ErrInvalidSize for a negative cfg.Limit. The
// middleware is safe for concurrent use.
func (p *Pool) Middleware(cfg HTTPConfig) (func(http.Handler) http.Handler, error) {
	if cfg.Limit < 0 {
		return nil, fmt.Errorf("%w: HTTPConfig.Limit %d is negative", ErrInvalidSize, cfg.Limit)
	}
	threshold := cfg.BurstThreshold
	if threshold == 0 {
		threshold = DefaultBurstThreshold
	}
	var seq atomic.Int64
	name := cfg.Name
	if name == nil {
		name = func(*http.Request) string { return "req-" + strconv.FormatInt(seq.Add(1), 10) }
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a, err := p.Open(name(r), cfg.Limit)
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			ctx, done := WithAccount(r.Context(), a)
			defer func() {
				peak := a.Peak()
				done()
				if threshold > 0 && peak >= threshold && cfg.AfterBurst != nil {
					cfg.AfterBurst()
				}
			}()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}, nil
}

// errorBody is the JSON body WriteError sends.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteError answers a budget error: when err matches ErrResourceExhausted
// (a refused Grow, or context.Cause of a context the heap watch canceled) it
// writes status 429 with the JSON body
// {"code":"resource_exhausted","message":"<err.Error()>"} and returns true;
// for any other error (or nil) it writes nothing and returns false. Call it
// before writing anything else to w.
func WriteError(w http.ResponseWriter, err error) bool {
	if err == nil || !errors.Is(err, ErrResourceExhausted) {
		return false
	}
	body, _ := json.Marshal(errorBody{Code: CodeResourceExhausted, Message: err.Error()})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(HTTPStatusResourceExhausted)
	_, _ = w.Write(append(body, '\n'))
	return true
}
