// Package limitstest gives code under test a memory budget without the
// middleware or the interceptors, so that limits.Grow refuses past the budget
// as in production, and the test fails if the code leaves bytes grown:
//
//	r := limitstest.Request(t, httptest.NewRequest("GET", "/sort?n=20000000", nil), 64<<20)
//	w := httptest.NewRecorder()
//	sortHandler(w, r) // its limits.Grow of 160 MB is refused: w.Code is 429
//
// Each call makes a pool of its own (named "test", with no limit and no heap
// watch) and one account in it named after the test; both are closed when
// the test ends. With MEMCTL_BUDGETS=observe or off the budget does not
// refuse, and Context says so in the test log.
package limitstest

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/memctl/memctl/limits"
)

// Context returns a copy of parent that carries a new account with a
// budget of limit bytes (limits.Unlimited for none), and that account. At
// the end of the test the account is closed, and the test fails if bytes
// grown were not shrunk, or a Shrink took back more than was grown. A limit
// ≤ 0 fails the test at once. Safe to call from parallel tests.
func Context(tb testing.TB, parent context.Context, limit int64) (context.Context, *limits.Account) {
	tb.Helper()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "test", Limit: limits.Unlimited, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatalf("limitstest: %v", err)
	}
	a, err := pool.Open(tb.Name(), limit)
	if err != nil {
		pool.Close()
		tb.Fatalf("limitstest: %v", err)
	}
	if m := pool.Mode(); m != limits.ModeEnforce {
		tb.Logf("limitstest: MEMCTL_BUDGETS=%s: the budget of %d bytes counts but does not refuse", m, limit)
	}
	tb.Cleanup(func() {
		a.Close()
		st := pool.Stats()
		pool.Close()
		if st.Leaked > 0 {
			tb.Errorf("limitstest: %s: closed with %d bytes grown and not shrunk (a missing limits.Shrink)", a.Name(), st.LeakedBytes)
		}
		if st.Misuse > 0 {
			tb.Errorf("limitstest: %s: %d Shrink calls took back more than was grown, or a negative size", a.Name(), st.Misuse)
		}
	})
	return limits.NewContext(parent, a), a
}

// Request returns a shallow copy of r whose context carries a new account
// with a budget of limit bytes, as Context does for r.Context().
func Request(tb testing.TB, r *http.Request, limit int64) *http.Request {
	tb.Helper()
	ctx, _ := Context(tb, r.Context(), limit)
	return r.WithContext(ctx)
}
