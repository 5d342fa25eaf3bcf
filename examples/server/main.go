// Command server is a net/http server whose /sort endpoint builds a sorted
// list of n random int64 values (8·n bytes) and charges every array it
// allocates to the request's memory budget (package
// github.com/memctl/memctl/limits). A request that would need more than its
// budget, or more than the shared pool has left, gets 429 with
// {"code":"resource_exhausted",...} and the server keeps serving everyone
// else; without budgets the same request takes the whole process down.
//
//	GOMEMLIMIT=192MiB go run ./examples/server -addr 127.0.0.1:8080 -request-budget 64MiB
//	curl -s  'http://127.0.0.1:8080/sort?n=100000'     # 800 KB: 200 and a summary
//	curl -si 'http://127.0.0.1:8080/sort?n=134217728'  # 1 GiB: 429 resource_exhausted
//	curl -s  'http://127.0.0.1:8080/stats'             # the pool's counters (JSON)
//
// In a memory cgroup (systemd-run --scope -p MemoryMax=256M) with
// -budgets=false, the 1 GiB request gets the process OOM-killed.
//
// Run it with -h for its flags. It prints "listening on http://ADDR" once
// it accepts connections, and shuts down cleanly on SIGINT or SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/bytesize"
	"github.com/memctl/memctl/limits"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	addr          string
	requestBudget int64
	budgets       bool
	pool          limits.PoolConfig // -pool, -heap-pressure, -cancel-largest
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen address")
	budget := fs.String("request-budget", "64MiB", "each request's budget in bytes (KiB, MiB, GiB suffixes; 0: the pool alone limits)")
	pool := fs.String("pool", "0", "the shared pool in bytes (0: half of GOMEMLIMIT)")
	fs.BoolVar(&c.budgets, "budgets", true, "account requests against budgets")
	fs.Float64Var(&c.pool.HeapPressure, "heap-pressure", 0, "share of GOMEMLIMIT the live heap may reach (0: 0.9, negative: off)")
	fs.BoolVar(&c.pool.CancelLargest, "cancel-largest", false, "under heap pressure, cancel the largest request")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var err error
	if c.requestBudget, err = bytesize.Parse(*budget); err != nil {
		return c, fmt.Errorf("-request-budget: %w", err)
	}
	if c.pool.Limit, err = bytesize.Parse(*pool); err != nil {
		return c, fmt.Errorf("-pool: %w", err)
	}
	return c, nil
}

// run serves until SIGINT or SIGTERM.
func run(args []string, stdout io.Writer) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	ctl, err := memctl.Start() // THP off, GOMEMLIMIT from the cgroup, the trimmer
	if err != nil {
		fmt.Fprintln(os.Stderr, "server: memctl:", err) // the parts that failed are off
	}
	defer ctl.Close()
	h, pool, err := newHandler(cfg)
	if err != nil {
		return err
	}
	if pool != nil {
		defer pool.Close()
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	limit := "none"
	if pool != nil {
		limit = strconv.FormatInt(pool.Limit(), 10)
	}
	fmt.Fprintf(stdout, "listening on http://%s budgets=%v request-budget=%d pool-limit=%s\n",
		ln.Addr(), cfg.budgets, cfg.requestBudget, limit)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// newHandler returns the server's routes: /sort, /stats and /healthz. With
// cfg.budgets, /sort runs behind the limits middleware of a new pool, which
// the caller closes.
func newHandler(cfg config) (http.Handler, *limits.Pool, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	if !cfg.budgets {
		mux.HandleFunc("GET /sort", sortHandler)
		mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "{}") })
		return mux, nil, nil
	}
	pool, err := limits.NewPool(cfg.pool)
	if err != nil {
		return nil, nil, err
	}
	budget := cfg.requestBudget
	if budget == 0 {
		budget = limits.Unlimited // the flag's 0 asks for no per-request limit
	}
	mw, err := pool.Middleware(limits.HTTPConfig{Limit: budget, AfterBurst: memctl.AfterBurst})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	mux.Handle("GET /sort", mw(http.HandlerFunc(sortHandler)))
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(pool.Stats())
	})
	return mux, pool, nil
}

// maxN bounds ?n= so that 8·n bytes cannot overflow (512 GiB).
const maxN = 1 << 36

// summary is /sort's answer: the list itself would be as large as the
// request asked.
type summary struct {
	N      int64 `json:"n"`
	Min    int64 `json:"min"`
	Median int64 `json:"median"`
	Max    int64 `json:"max"`
}

// sortHandler answers /sort?n=N with a summary of a sorted list of N random
// values, 429 when the request's budget refuses the list.
func sortHandler(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 1 || n > maxN {
		http.Error(w, fmt.Sprintf("server: n=%q: want an integer in [1, %d]", r.URL.Query().Get("n"), int64(maxN)), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	list, err := build(ctx, n)
	if err != nil {
		if !limits.WriteError(w, err) {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
		return
	}
	defer limits.Shrink(ctx, 8*int64(cap(list)))
	slices.Sort(list)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(summary{N: n, Min: list[0], Median: list[len(list)/2], Max: list[len(list)-1]})
}

// build returns n random values. It grows the list by doubling, as append
// does, charging each new backing array before allocating it and returning
// the old one once copied: a runaway request is refused at its budget, not
// after the whole heap.
func build(ctx context.Context, n int64) ([]int64, error) {
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	var list []int64
	for int64(len(list)) < n { // the list is full here: grow it
		newCap := min(max(2*int64(cap(list)), 1024), n)
		if err := limits.Grow(ctx, 8*newCap); err != nil {
			limits.Shrink(ctx, 8*int64(cap(list)))
			return nil, err
		}
		bigger := make([]int64, len(list), newCap)
		copy(bigger, list)
		limits.Shrink(ctx, 8*int64(cap(list)))
		list = bigger
		for len(list) < cap(list) {
			list = append(list, rng.Int64())
		}
		if err := context.Cause(ctx); err != nil {
			limits.Shrink(ctx, 8*int64(cap(list)))
			return nil, err
		}
	}
	return list, nil
}
