// Command service is the complete small service of the README: memctl.Start,
// a budget pool, the HTTP middleware, a handler that charges what it builds
// before building it, and the /debug/memctl page.
//
//	ADDR=127.0.0.1:8080 go run ./examples/service
//	curl -s  'http://127.0.0.1:8080/sum?n=1000'        # 499500
//	curl -si 'http://127.0.0.1:8080/sum?n=100000000'   # 800 MB: 429 resource_exhausted
//	curl -s  'http://127.0.0.1:8080/debug/memctl'      # what memctl decided (JSON)
//
// The README shows this file's code as it is: keep the two in step.
package main

import (
	"cmp"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
)

func main() {
	// THP off, GOMEMLIMIT from the cgroup limit, a trim 2 s after each
	// burst. Start logs one short INFO line with what it decided and a
	// WARN line for each part it skipped; it never fails the service.
	ctl, _ := memctl.Start()
	defer ctl.Close()

	// The budget pool: half of GOMEMLIMIT (following it), shared by all
	// requests; one pool for every transport (pass it to grpcbudget and
	// connectbudget too). Under heap pressure the largest request is
	// canceled. NewPool logs its limit and where it came from.
	pool, err := limits.NewPool(limits.PoolConfig{Name: "http", CancelLargest: true})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	budget, err := pool.Middleware(limits.HTTPConfig{
		Limit:      64 << 20,          // each request may hold 64 MiB
		AfterBurst: memctl.AfterBurst, // a request that peaked high ends a burst
	})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("/sum", budget(http.HandlerFunc(sum)))
	mux.Handle("/debug/memctl", memctl.Handler()) // what memctl decided, as JSON
	addr := cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080")
	log.Printf("listening on http://%s", addr)
	log.Fatal(http.ListenAndServe(addr, mux))
}

// sum adds the numbers 0 to n-1 after holding them in memory: 8·n bytes,
// charged to the request's budget before they are allocated.
func sum(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err := limits.Grow(r.Context(), 8*n); err != nil {
		if !limits.WriteError(w, err) { // 429 {"code":"resource_exhausted",...}
			http.Error(w, err.Error(), http.StatusBadRequest) // a negative n
		}
		return
	}
	defer limits.Shrink(r.Context(), 8*n)
	xs := make([]int64, n)
	var s int64
	for i := range xs {
		xs[i] = int64(i)
		s += xs[i]
	}
	fmt.Fprintln(w, s)
}
