package limits_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/memctl/memctl/limits"
)

// A query's account refuses the operator that would take it past its budget.
// The error carries the exact bytes asked for, the bytes in use and allowed,
// and the scope, and maps to every protocol's resource_exhausted.
func ExampleExhaustedError() {
	pool, _ := limits.NewPool(limits.PoolConfig{Limit: 1 << 30})
	defer pool.Close()
	query, _ := pool.Open("query-17", 1<<20) // 1 MiB budget
	defer query.Close()
	sort, _ := query.Open("sort", limits.Unlimited)
	defer sort.Close()

	err := sort.Grow(3 << 20)
	var e *limits.ExhaustedError
	if errors.As(err, &e) {
		fmt.Println(errors.Is(err, limits.ErrResourceExhausted))
		fmt.Println(e.Scope, e.Requested, e.Used, e.Limit)
		fmt.Println(e.Code(), e.HTTPStatus())
		fmt.Println(err)
		// The interceptors of the modules .../grpcbudget and
		// .../connectbudget answer it with code 8 RESOURCE_EXHAUSTED
		// (Connect: resource_exhausted, HTTP 429); a handler outside
		// them maps it with grpcbudget.Status or connectbudget.Error.
	}
	// Output:
	// true
	// pool/query-17 3145728 0 1048576
	// resource_exhausted 429
	// limits: resource_exhausted in pool/query-17: requested 3145728 bytes, 0 in use, limit 1048576
}

// A handler charges what it builds to the request's account and answers a
// budget error with 429 and a JSON body.
func ExamplePool_Middleware() {
	pool, _ := limits.NewPool(limits.PoolConfig{Limit: 1 << 30})
	defer pool.Close()
	mw, _ := pool.Middleware(limits.HTTPConfig{Limit: 64 << 20})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const size = 100 << 20 // what this request would build
		if err := limits.Grow(r.Context(), size); err != nil {
			limits.WriteError(w, err)
			return
		}
		defer limits.Shrink(r.Context(), size)
		w.Write(make([]byte, size)[:2])
	}))

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/report", nil))
	fmt.Print(w.Code, " ", w.Body.String())
	// Output:
	// 429 {"code":"resource_exhausted","message":"limits: resource_exhausted in pool/req-1: requested 104857600 bytes, 0 in use, limit 67108864"}
}

// Code that runs with and without budgets: with no account in the context,
// limits.Grow counts nothing and returns nil.
func ExampleGrow() {
	fmt.Println(limits.Grow(context.Background(), 1<<40))
	// Output:
	// <nil>
}
