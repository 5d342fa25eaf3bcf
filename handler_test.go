package memctl

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
)

func TestHandler(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	if prev, err := thp.Process(); err == nil {
		defer restoreTHP(prev)
	}
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "GOMEMLIMIT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("MEMCTL_PRESSURE", "off") // no pressure trims from other processes' PSI: the counts are exact
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Hour))
	require.NoError(t, err)
	defer ctl.Close()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "handler-test", Limit: 8 << 20, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pool.Close()
	_, err = ctl.trimmer.TrimNow()
	require.NoError(t, err)

	mux := http.NewServeMux()
	mux.Handle("/debug/memctl", Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	get := func() *state.Record {
		t.Helper()
		resp, err := http.Get(srv.URL + "/debug/memctl")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "application/json; charset=utf-8", resp.Header.Get("Content-Type"))
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		r, err := state.Parse(b) // the same document memctl status reads
		require.NoError(t, err, "%s", b)
		return r
	}
	r := get()
	rep, st := ctl.Report(), ctl.Stats()
	assert.Equal(t, os.Getpid(), r.PID)
	assert.Equal(t, rep.MemLimit.Source.String(), r.GoMemLimit.Source)
	if st.GoMemLimit == 1<<63-1 {
		assert.Nil(t, r.GoMemLimit.Bytes)
	} else {
		require.NotNil(t, r.GoMemLimit.Bytes)
		assert.Equal(t, st.GoMemLimit, *r.GoMemLimit.Bytes)
	}
	assert.Equal(t, rep.THPPolicy.String(), r.THP.Policy)
	assert.Equal(t, int64(1), r.Trim.Trims, "the TrimNow above")
	assert.Equal(t, int64(1), r.Trim.Origins.ByName.Trims, "by origin: the TrimNow is by name")
	assert.Len(t, r.CHeaps, min(len(st.CHeaps), state.MaxCHeaps), "the C heaps")
	assert.Equal(t, st.Trim.TotalReleased, r.Trim.ReleasedBytes)
	var found bool
	for _, p := range r.Pools {
		found = found || p.Name == "handler-test" && p.LimitBytes != nil && *p.LimitBytes == 8<<20
	}
	assert.True(t, found, "the pool, without waiting for a GC: the page is built per request: %+v", r.Pools)

	// Counters are current on each request.
	_, err = ctl.trimmer.TrimNow()
	require.NoError(t, err)
	assert.Equal(t, int64(2), get().Trim.Trims)

	resp, err := http.Post(srv.URL+"/debug/memctl", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))

	// No controller live: closed, GOMEMLIMIT as it is.
	require.NoError(t, ctl.Close())
	r = get()
	assert.True(t, r.Closed)
	var doc map[string]any
	resp, err = http.Get(srv.URL + "/debug/memctl")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	assert.Contains(t, doc, "gomemlimit")
}
