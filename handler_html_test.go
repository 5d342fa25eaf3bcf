package memctl

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/plot"
	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
)

const hostile = `"><script>alert(1)</script><img src=x onerror=alert(2)>`

// The page is for people and safe on a debug port: strings from the
// process (the cgroup path, pool names) come out as text, the page loads
// nothing from elsewhere and runs no script, and the method rules are the
// JSON handler's.
func TestPageEscapesAndRules(t *testing.T) {
	gml := int64(400 << 20)
	r := &state.Record{PID: 42, Updated: time.Now(),
		GoMemLimit: state.GoMemLimit{Bytes: &gml, Source: "cgroup v2", File: "/sys/fs/cgroup/" + hostile + "/memory.max", MemoryLimitBytes: 512 << 20},
		Pools:      []state.Pool{{Name: hostile, Mode: "enforce"}}}
	t0 := time.Now()
	entries := []historyEntry{
		{At: t0, Kind: kindGCEnd, RSS: 100 << 20, Live: 50 << 20, GoMemLimit: gml},
		{At: t0.Add(time.Second), Kind: kindTrim, RSS: 60 << 20, Live: 50 << 20, GoMemLimit: gml},
	}
	var b strings.Builder
	require.NoError(t, historyChart(entries, r, 300<<20).WriteSVG(&b))
	rec := httptest.NewRecorder()
	servePage(rec, r)
	page := rec.Body.String()
	assert.NotContains(t, page, "<script", "no script, hostile or not")
	assert.NotContains(t, page, "<img")
	assert.Contains(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;", "the pool name and the cgroup path as text")
	assert.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	assert.Contains(t, rec.Header().Get("Content-Security-Policy"), "default-src 'none'")
	assert.NotRegexp(t, `<[^>]*\s(src|href|xlink:href|action)=`, page, "nothing loaded from elsewhere")
	assert.NotRegexp(t, `<[^>]*\son[a-z]+=`, page, "no event handler")
	c, err := plot.Read(strings.NewReader(b.String()))
	require.NoError(t, err)
	require.Len(t, c.Series, 2)
	assert.Equal(t, "RSS", c.Series[0].Name)
	assert.Equal(t, []plot.Point{{X: -1, Y: 100}, {X: 0, Y: 60}}, c.Series[0].Points)
	assert.Len(t, c.Lines, 3, "GOMEMLIMIT, the memory limit, memory.high")
	assert.Equal(t, []plot.Mark{{Label: "trim", X: 0}}, c.Marks)

	srv := httptest.NewServer(Handler())
	defer srv.Close()
	for _, tc := range []struct {
		accept, query string
		html          bool
	}{
		{"text/html,application/xhtml+xml,*/*;q=0.8", "", true},
		{"", "?format=html", true},
		{"text/html", "?format=json", false},
		{"application/json", "", false},
		{"", "", false},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.query, nil)
		req.Header.Set("Accept", tc.accept)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, tc.html, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html"), "%+v", tc)
		assert.Equal(t, tc.html, strings.HasPrefix(string(body), "<!doctype html>"), "%+v", tc)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"?format=html", nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// BenchmarkGCEndPath is the whole GC-end path of a started controller (one
// runtime/metrics read, every subscriber), with the page's history (as
// Start sets it) and without it, in the same run: the history adds at most
// 5% and allocates nothing.
func BenchmarkGCEndPath(b *testing.B) {
	for _, withHistory := range []bool{false, true} {
		b.Run(fmt.Sprintf("history=%v", withHistory), func(b *testing.B) {
			ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(b, err)
			defer ctl.Close()
			ctl.histOff.Store(!withHistory)
			b.ReportAllocs()
			for b.Loop() {
				gcend.Fire()
			}
		})
	}
}

// The GC-end path of a started controller allocates nothing: every
// subscriber, the page's history and the state record's fingerprint
// (which reads the burst detector's counters) at each GC end.
func TestGCEndPathAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer ctl.Close()
	require.NotNil(t, ctl.auto, "the burst detector runs")
	gcend.Fire() // a first GC end may set up what later ones reuse
	assert.Zero(t, testing.AllocsPerRun(200, gcend.Fire))
}

// Each trim the facade's trimmer runs or skips is marked in the history
// the page draws (through trimwire.OnTrim), after its counters are in
// Stats.
func TestTrimMarksHistory(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	if prev, err := thp.Process(); err == nil {
		defer restoreTHP(prev)
	}
	for _, k := range []string{"MEMCTL", "MEMCTL_TRIM_DELAY"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Millisecond),
		WithMemLimit(limits.MemLimitConfig{Refresh: time.Hour}))
	require.NoError(t, err)
	defer ctl.Close()
	ctl.AfterBurst()
	require.Eventually(t, func() bool {
		s := ctl.Stats().Trim
		return s.Trims+s.Skipped > 0
	}, 30*time.Second, 5*time.Millisecond, "the trim after AfterBurst ran or was skipped")
	require.Eventually(t, func() bool {
		for _, e := range ctl.hist.Entries() {
			if e.Kind == kindTrim {
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond, "the trim is marked in the history")
}
