package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/limits"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	childtest.Main(m, map[string]func(){"undercharge": childUndercharge})
}

// childUndercharge serves, in a cgroup, one request whose handler builds
// rows of 1 KiB and charges 8 bytes for each, and scrapes its own /metrics
// over loopback once the pool has said at WARN that the charges look too
// small (the handler waits for the scrape), printing the counter and the
// live heap then.
func childUndercharge() {
	if _, err := limits.SetGoMemLimit(context.Background(), limits.MemLimitConfig{}); err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	warned, scraped := make(chan struct{}), make(chan struct{})
	log := slog.New(&hook{Handler: slog.NewTextHandler(os.Stdout, nil), fn: func(r slog.Record) {
		if strings.Contains(r.Message, "charges look too small") {
			close(warned)
		}
	}})
	pool, err := limits.NewPool(limits.PoolConfig{Name: "http", Logger: log})
	if err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	reg := prometheus.NewRegistry()
	if _, err := Register(reg, nil, Pool{Pool: pool}); err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	metricsSrv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metricsSrv.Close()
	go func() {
		<-warned
		defer close(scraped)
		resp, err := http.Get(metricsSrv.URL)
		if err != nil {
			fmt.Println("ERROR=" + err.Error())
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), `memctl_budget_undercharged_total{pool="http"} `); ok {
				fmt.Println("SCRAPE_UNDERCHARGED=" + v)
			}
		}
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		fmt.Printf("SCRAPE_HEAP_LIVE=%d\nGOMEMLIMIT=%d\n", s[0].Value.Uint64(), debug.SetMemoryLimit(-1))
	}()
	mw, _ := pool.Middleware(limits.HTTPConfig{Limit: 64 << 20})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rows [][]byte
		waited := false
		for {
			row := make([]byte, 1024)
			for i := range row {
				row[i] = byte(i)
			}
			rows = append(rows, row)
			if err := limits.Grow(r.Context(), 8); err != nil { // 8 bytes a row: the mistake
				limits.WriteError(w, err)
				return
			}
			if !waited && len(rows)%1024 == 0 {
				select {
				case <-warned:
					<-scraped
					waited = true
					fmt.Printf("ROWS_AT_SCRAPE=%d\n", len(rows))
				default:
				}
			}
		}
	})))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		fmt.Println("ERROR=" + err.Error())
		return
	}
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("ANSWER=%d %s\n", resp.StatusCode, strings.TrimSpace(string(body)))
}

type hook struct {
	slog.Handler
	fn func(slog.Record)
}

func (h *hook) Handle(ctx context.Context, r slog.Record) error {
	h.fn(r)
	return h.Handler.Handle(ctx, r)
}

// TestUnderchargedMetricInCgroup (issue 20): the handler that charges 8
// bytes per 1 KiB row, in a real 256 MiB memory cgroup with GOMEMLIMIT from
// it: memctl_budget_undercharged_total is on /metrics, above 0, while the
// live heap is still far from the limit.
func TestUnderchargedMetricInCgroup(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 256 MiB cgroup")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory fills the cgroup")
	}
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no writable memory cgroup: %v", err)
	}
	g, err := parent.NewChild(fmt.Sprintf("memctl-i20-metrics-%d-%d", os.Getpid(), time.Now().UnixNano()), 256<<20)
	if err != nil {
		t.Skipf("cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Remove(); err != nil {
			t.Errorf("cgroup: %v", err)
		}
	})
	cmd := childtest.Command(t, "undercharge", []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL", "MEMCTL_BUDGETS"}, "GOGC=100")
	g.Wrap(cmd)
	out, err := cmd.CombinedOutput()
	kills, _ := g.OOMKills()
	t.Logf("child: %v; OOM kills %d; output:\n%s", err, kills, out)
	report := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.Contains(k, " ") {
			report[k] = v
		}
	}
	require.NotContains(t, report, "ERROR")
	require.Contains(t, report, "SCRAPE_UNDERCHARGED", "the metric was not on /metrics after the WARN")
	n, err := strconv.ParseFloat(report["SCRAPE_UNDERCHARGED"], 64)
	require.NoError(t, err, "the child's report:\n%s", out)
	live, err := strconv.ParseInt(report["SCRAPE_HEAP_LIVE"], 10, 64)
	require.NoError(t, err, "SCRAPE_HEAP_LIVE; the child's report:\n%s", out)
	rows, err := strconv.ParseInt(report["ROWS_AT_SCRAPE"], 10, 64)
	require.NoError(t, err, "ROWS_AT_SCRAPE; the child's report:\n%s", out)
	t.Logf("memctl_budget_undercharged_total %v at a live heap of %d MiB (%d MiB of rows, %d KiB charged), cgroup limit 256 MiB",
		n, live>>20, rows>>10, rows*8>>10)
	assert.Positive(t, n)
	assert.Less(t, live, int64(128<<20), "before the heap is half way to the limit")
}
