package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/limits"
)

// /metrics over HTTP, as a service serves it: the text format carries the
// memctl_ families with their help and type lines.
func TestServeMetrics(t *testing.T) {
	ctl := start(t)
	pool, err := limits.NewPool(limits.PoolConfig{Name: "http", Limit: 8 << 20, HeapPressure: -1})
	require.NoError(t, err)
	defer pool.Close()
	reg := prometheus.NewRegistry()
	_, err = Register(reg, ctl, Pool{Name: "http", Pool: pool})
	require.NoError(t, err)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	text := string(body)
	for _, want := range []string{
		"# TYPE memctl_trims_total counter",
		"# TYPE memctl_trim_released_bytes_total counter",
		"memctl_enabled 1",
		`memctl_budget_limit_bytes{pool="http"} 8.388608e+06`,
		`memctl_budget_refusals_total{pool="http",scope="account"} 0`,
		"memctl_trim_delay_seconds 0.01",
	} {
		assert.Contains(t, text, want)
	}
}
