package metrics_test

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/metrics"
)

// A service that serves /metrics: memctl's controller and its budget pool
// registered with the default registry, next to the Go runtime's own
// metrics. (examples/server in the memctl module does not import this
// package, so that the memctl module does not depend on client_golang.)
func Example() {
	ctl, _ := memctl.Start() // logs what it decided
	defer ctl.Close()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "http"})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	if _, err := metrics.Register(prometheus.DefaultRegisterer, ctl, metrics.Pool{Pool: pool}); err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", promhttp.Handler())
	// log.Fatal(http.ListenAndServe(":9090", nil))
}
