package main

import (
	"bytes"
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/trimwire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFlags(t *testing.T) {
	var stderr bytes.Buffer
	cfg, asJSON, err := parseFlags(nil, &stderr)
	require.NoError(t, err)
	assert.False(t, asJSON)
	assert.Equal(t, 5, cfg.Runs)
	assert.Equal(t, []string{"burst", "cadence", "http", "load", "load-contended", "load-gc"}, cfg.Scenarios)
	assert.Equal(t, int64(2<<30), cfg.CgroupLimit)
	assert.Equal(t, 30*time.Second, cfg.Params.Window)
	assert.Equal(t, 60*time.Second, cfg.Params.CadenceFor)
	assert.Equal(t, 2100*time.Millisecond, cfg.Params.CadencePeriod)
	assert.Equal(t, int64(1<<30), cfg.Params.Burst)
	assert.Equal(t, int64(64<<20), cfg.Params.CadenceBurst)
	assert.Equal(t, int64(20<<20), cfg.Params.Live)

	cfg, _, err = parseFlags([]string{"-quick"}, &stderr)
	require.NoError(t, err)
	assert.True(t, cfg.Quick)
	assert.Equal(t, 1, cfg.Runs)
	assert.Equal(t, 3500*time.Millisecond, cfg.Params.Window)
	assert.Equal(t, int64(1<<30), cfg.Params.Burst, "-quick keeps the sizes")

	cfg, asJSON, err = parseFlags([]string{"-quick", "-runs", "3", "-json", "-scenarios", "http, burst", "-cgroup-limit", "512MiB", "-window", "12s", "-cadence-for", "8s", "-requests", "500"}, &stderr)
	require.NoError(t, err)
	assert.True(t, asJSON)
	assert.Equal(t, 3, cfg.Runs)
	assert.Equal(t, []string{"http", "burst"}, cfg.Scenarios)
	assert.Equal(t, int64(512<<20), cfg.CgroupLimit)
	assert.Equal(t, 12*time.Second, cfg.Params.Window)
	assert.Equal(t, 8*time.Second, cfg.Params.CadenceFor)
	assert.Equal(t, 500, cfg.Params.Requests)

	cfg, _, err = parseFlags([]string{"-cgroup-limit", "0"}, &stderr)
	require.NoError(t, err)
	assert.Zero(t, cfg.CgroupLimit, "0 runs without cgroups")

	for _, bad := range [][]string{
		{"-runs", "-1"}, {"-scenarios", "burst,nope"}, {"-cgroup-limit", "2GB"}, {"-window", "-1s"},
		{"-requests", "-5"}, {"-nope"}, {"extra"},
	} {
		_, _, err := parseFlags(bad, &stderr)
		assert.Error(t, err, "%q", bad)
	}
	_, _, err = parseFlags([]string{"-scenarios", "burst,nope"}, &stderr)
	assert.ErrorContains(t, err, `unknown scenario "nope"`)
}

func TestCLIBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 2, cli([]string{"-runs", "-1"}, &out, &errb))
	assert.Contains(t, errb.String(), "-runs -1")
	assert.Empty(t, out.String())
	assert.Equal(t, 0, cli([]string{"-h"}, &out, &errb))
}

func TestRunRejects(t *testing.T) {
	cfg := defaultConfig(true)
	cfg.Runs = 0
	_, err := run(cfg, &bytes.Buffer{})
	assert.ErrorContains(t, err, "runs 0")
	cfg = defaultConfig(true)
	cfg.Scenarios = []string{"nope"}
	_, err = run(cfg, &bytes.Buffer{})
	assert.ErrorContains(t, err, `unknown scenario "nope"`)
}

func TestTrimLog(t *testing.T) {
	var next bytes.Buffer
	h := &trimLog{trims: new(trims), next: slog.NewTextHandler(&next, nil)}
	l := slog.New(h)
	assert.True(t, h.Enabled(context.Background(), slog.LevelDebug), "the trimmer logs trims at DEBUG")
	l.Debug("trim: done", "took", 40*time.Millisecond, "released_bytes", 1<<30)
	l.With("part", "trim").Debug("trim: done", "took", 60*time.Millisecond)
	l.Debug("trim: skipped", "estimate_bytes", 1)
	l.Info("memctl started", "thp", "disabled")
	spans := h.get()
	assert.Len(t, spans, 2, "derived handlers share the trims")
	assert.Equal(t, 100*time.Millisecond, time.Duration(spans[0][1]-spans[0][0]+spans[1][1]-spans[1][0]))
	assert.Contains(t, next.String(), "memctl started")
	assert.NotContains(t, next.String(), "trim:", "DEBUG records are not passed on")

	r := slog.NewRecord(time.Now(), slog.LevelDebug, "trim: done", 0)
	assert.ErrorContains(t, h.Handle(context.Background(), r), "without a took duration")
}

func TestChildIO(t *testing.T) {
	var out bytes.Buffer
	in := bytes.NewBufferString("go\nstop\n")
	err := runChild("nope/plain", in, &out)
	assert.ErrorContains(t, err, `unknown scenario "nope"`)
	err = runChild("burst/nope", in, &out)
	assert.ErrorContains(t, err, `unknown arm "nope"`)
	t.Setenv(paramsEnv, "{bad")
	err = runChild("burst/plain", in, &out)
	assert.ErrorContains(t, err, paramsEnv)
}

func TestChildEnviron(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "1GiB")
	t.Setenv("MEMCTL", "off")
	t.Setenv("MEMCTL_TRIM_DELAY", "5s")
	t.Setenv("AUTOMEMLIMIT", "0.5")
	t.Setenv("KEEP_ME", "1")
	env, err := childEnviron("burst/plain", defaultParams(true))
	require.NoError(t, err)
	assert.Contains(t, env, "KEEP_ME=1")
	assert.Contains(t, env, childEnv+"=burst/plain")
	for _, kv := range env {
		for _, bad := range []string{"GOMEMLIMIT=", "MEMCTL=", "MEMCTL_TRIM_DELAY=", "AUTOMEMLIMIT="} {
			assert.False(t, strings.HasPrefix(kv, bad), "%s is passed on", kv)
		}
	}
}

// The freeos arm runs debug.FreeOSMemory (a forced GC) one trim delay after
// each burst, the memctl arms' delay: -trim-delay's, else memctl's default;
// nothing else.
func TestFreeOSArm(t *testing.T) {
	a, ok := armByKey("freeos")
	require.True(t, ok)
	assert.False(t, a.memctl())
	limit := debug.SetMemoryLimit(-1)
	st, err := setupArm(a, params{})
	require.NoError(t, err)
	assert.Equal(t, trimwire.DefaultDelay, st.freeOSDelay)
	assert.Nil(t, st.ctl, "no memctl")
	assert.Equal(t, limit, debug.SetMemoryLimit(-1), "GOMEMLIMIT left as it is")
	st.close()

	st, err = setupArm(a, params{TrimDelay: 50 * time.Millisecond})
	require.NoError(t, err)
	defer st.close()
	assert.Equal(t, 50*time.Millisecond, st.freeOSDelay)
	forced := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	n := forced()
	st.afterBurst()
	assert.Eventually(t, func() bool { return forced() > n }, 10*time.Second, 10*time.Millisecond, "FreeOSMemory ran")
}
