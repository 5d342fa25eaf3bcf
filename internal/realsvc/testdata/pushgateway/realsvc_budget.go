//go:build realsvc_budget

package main

import (
	"log"
	"net/http"
	"strings"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
)

// This file and one changed line in main.go (the handler wrapped in
// realsvcPush) add memctl to Pushgateway as the README's "Start, with
// budgets" section shows: the budget middleware charges each push's body
// and refuses the one over budget with 429. The parsed form, about 10
// times the body, is not charged (the pool's "charges look too small" WARN).
var budget func(http.Handler) http.Handler

func init() {
	_, _ = memctl.Start() // in init: main is Pushgateway's own; never closed
	pool, err := limits.NewPool(limits.PoolConfig{Name: "push", CancelLargest: true})
	if err != nil {
		log.Fatal(err)
	}
	budget, err = pool.Middleware(limits.HTTPConfig{
		Limit:          48 << 20, // each push may hold 48 MiB of body
		BurstThreshold: 8 << 20,  // a push of 8 MiB or more ends a burst
		AfterBurst:     memctl.AfterBurst,
	})
	if err != nil {
		log.Fatal(err)
	}
}

// realsvcPush sends pushes (PUT and POST under /metrics/job) through the
// budget and everything else straight to h.
func realsvcPush(h http.Handler) http.Handler {
	charged := budget(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method == http.MethodPut || r.Method == http.MethodPost) && strings.Contains(r.URL.Path, "/metrics/job") {
			charged.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
