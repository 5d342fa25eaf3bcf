package limits

import (
	"context"
	"net/http"
	"sync/atomic"
)

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
