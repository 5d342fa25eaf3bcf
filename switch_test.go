package memctl

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
)

// One grammar for every switch (internal/envflag): the off words switch a
// part off, the on words give its default, any case, space ignored.
func TestSwitchGrammarMEMCTL(t *testing.T) {
	for _, v := range []string{"off", "0", "false", "no", "FALSE", " Off ", "f", "No"} {
		r, recs := runStart(t, nil, "MEMCTL="+v)
		assert.Equal(t, "true", r["OFF"], "MEMCTL=%q", v)
		assert.Equal(t, "<nil>", r["ERR"], "MEMCTL=%q is a valid off word", v)
		assert.Equal(t, "1", r["THP_ENABLED"], "MEMCTL=%q: THP untouched", v)
		assert.Zero(t, countLevel(recs, "WARN"), "MEMCTL=%q", v)
	}
	for _, v := range []string{"on", "1", "true", "YES", " On "} {
		r, _ := runStart(t, nil, "MEMCTL="+v)
		assert.Equal(t, "false", r["OFF"], "MEMCTL=%q", v)
		assert.Equal(t, "<nil>", r["ERR"], "MEMCTL=%q", v)
		assert.Equal(t, "disabled-except-advised", r["THP_REPORT"], "MEMCTL=%q: memctl on", v)
	}
	for _, v := range []string{"flase", "2", "disable", "of"} {
		r, _ := runStart(t, nil, "MEMCTL="+v)
		assert.Equal(t, "true", r["OFF"], "MEMCTL=%q: invalid switches memctl off", v)
		assert.Contains(t, r["ERR"], "MEMCTL="+strconv.Quote(v), v)
	}
}

func TestSwitchGrammarParts(t *testing.T) {
	// MEMCTL_THP: off means memctl leaves the flag alone (keep), not "THP off".
	for _, v := range []string{"off", "OFF", "false", "0", "no", "keep"} {
		r, _ := runStart(t, nil, "MEMCTL_THP="+v)
		assert.Equal(t, "<nil>", r["ERR"], "MEMCTL_THP=%q", v)
		assert.Equal(t, "1", r["THP_ENABLED"], "MEMCTL_THP=%q keeps the inherited flag", v)
	}
	for _, v := range []string{"on", "true", "1"} {
		r, _ := runStart(t, nil, "MEMCTL_THP="+v)
		assert.Equal(t, "<nil>", r["ERR"], "MEMCTL_THP=%q", v)
		assert.Equal(t, "disabled-except-advised", r["THP_REPORT"], "MEMCTL_THP=%q is the default, except-advised on this kernel", v)
	}
	r, _ := runStart(t, nil, "MEMCTL_THP=Disable")
	assert.Equal(t, "<nil>", r["ERR"])
	assert.Equal(t, "0", r["THP_ENABLED"], "disable")
	r, _ = runStart(t, nil, "MEMCTL_THP=2")
	assert.Contains(t, r["ERR"], `MEMCTL_THP="2"`)
	assert.Equal(t, "1", r["THP_ENABLED"])

	for v, want := range map[string]string{"off": "0s", "0": "0s", "false": "0s", "No": "0s", "0s": "0s",
		"on": "2s", "TRUE": "2s", "yes": "2s", "750ms": "750ms"} {
		r, _ := runStart(t, nil, "MEMCTL_TRIM_DELAY="+v)
		assert.Equal(t, "<nil>", r["ERR"], "MEMCTL_TRIM_DELAY=%q", v)
		assert.Equal(t, want, r["TRIM_DELAY"], "MEMCTL_TRIM_DELAY=%q", v)
	}
	for _, v := range []string{"-1s", "1us", "soon", "2"} {
		r, _ := runStart(t, nil, "MEMCTL_TRIM_DELAY="+v)
		assert.Contains(t, r["ERR"], "MEMCTL_TRIM_DELAY="+strconv.Quote(v))
		assert.Equal(t, "0s", r["TRIM_DELAY"], "invalid: trimming off")
	}

	for _, v := range []string{"no", "false", "0", "OFF"} {
		r, _ := runStart(t, nil, "MEMCTL_ARENA_MAX="+v)
		assert.Equal(t, "<nil>", r["ERR"], "MEMCTL_ARENA_MAX=%q", v)
		assert.Equal(t, "0", r["ARENA_MAX"], "MEMCTL_ARENA_MAX=%q", v)
	}
	for _, v := range []string{"-1", "two", "1.5"} {
		r, _ := runStart(t, nil, "MEMCTL_ARENA_MAX="+v)
		assert.Contains(t, r["ERR"], "MEMCTL_ARENA_MAX="+strconv.Quote(v))
		assert.Equal(t, "0", r["ARENA_MAX"])
	}
	if r, _ := runStart(t, nil); r["C_HEAP"] == "glibc" {
		r, _ := runStart(t, nil, "MEMCTL_ARENA_MAX=on")
		assert.Equal(t, "2", r["ARENA_MAX"], "on: the default cap")
	}
}

// The options follow the same rule as the variables: 0 is off, an invalid
// value is off and an error, never silently off.
func TestOptionsInvalidValues(t *testing.T) {
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_ARENA_MAX"} {
		t.Setenv(k, "")
	}
	for _, tc := range []struct {
		opt     Option
		wantErr string
	}{
		{WithTrimDelay(-time.Second), "WithTrimDelay(-1s)"},
		{WithTrimDelay(time.Microsecond), "WithTrimDelay(1µs)"},
		{WithTrimDelay(0), ""},
		{WithTrim(trim.Config{Delay: -time.Second}), "WithTrim(trim.Config{Delay: -1s})"},
		{WithTrim(trim.Config{Delay: trim.MaxDelay + 1}), "WithTrim(trim.Config{Delay: 24h0m0.000000001s})"},
		{WithTrim(trim.Config{MaxWait: -time.Second}), "trim: Config.MaxWait -1s"},
		{WithArenaMax(-1), "WithArenaMax(-1)"},
	} {
		ctl, recs, err := startInProcess(t, tc.opt)
		if tc.wantErr == "" {
			assert.NoError(t, err)
			assert.Zero(t, ctl.Report().TrimDelay)
			continue
		}
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.wantErr)
		assert.Equal(t, 1, countLevel(recs, "WARN"), "%s: logged once at WARN: %v", tc.wantErr, recs)
		if strings.HasPrefix(tc.wantErr, "WithTrim") || strings.HasPrefix(tc.wantErr, "trim:") {
			assert.Zero(t, ctl.Report().TrimDelay, "trimming off")
			assert.Nil(t, ctl.trimmer)
		} else {
			assert.Zero(t, ctl.Report().ArenaMax)
			assert.Equal(t, trim.DefaultDelay, ctl.Report().TrimDelay, "an arena error leaves trimming on")
		}
	}
}

// startInProcess runs Start in this process with a JSON logger, restores
// GOMEMLIMIT and the THP flag at cleanup, and closes the controller.
func startInProcess(t *testing.T, opts ...Option) (*Controller, []map[string]any, error) {
	t.Helper()
	prevLimit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prevLimit) })
	if prev, err := thp.Process(); err == nil {
		t.Cleanup(func() { restoreTHP(prev) })
	}
	var buf bytes.Buffer
	ctl, err := Start(append([]Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))}, opts...)...)
	require.NoError(t, ctl.Close())
	return ctl, parseRecords(t, buf.String()), err
}

func parseRecords(t *testing.T, s string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		recs = append(recs, rec)
	}
	return recs
}

// The startup line reads as words and numbers of one type each: no
// sentinel, no error text, a reason always present.
func TestStartupLineReadable(t *testing.T) {
	number := regexp.MustCompile(`^[0-9]+$`)
	for _, env := range [][]string{
		{},
		{"AUTOMEMLIMIT=off", "MEMCTL_TRIM_DELAY=off", "MEMCTL_ARENA_MAX=off"},
		{"MEMCTL_TRIM_DELAY=soon", "MEMCTL_ARENA_MAX=lots", "MEMCTL_THP=disabel"},
		{"GOMEMLIMIT=100MiB"},
	} {
		r, recs := runStart(t, nil, env...)
		_, line := infoLines(recs)
		require.NotNil(t, line, "%v", env)
		for _, rec := range recs {
			if rec["level"] == "INFO" {
				assert.NotContains(t, rec, "error", "%v: errors only on WARN (and DEBUG) lines: %v", env, rec)
			}
		}
		assert.NotEmpty(t, line["gomemlimit_reason"], "%v", env)
		assert.NotEmpty(t, r["MEMLIMIT_REASON"], "%v", env)
		g := line["gomemlimit_bytes"].(string)
		assert.True(t, g == "none" || number.MatchString(g), "%v: gomemlimit=%q", env, g)
		assert.NotEqual(t, "9223372036854775807", g)
		d := line["trim_delay"].(string)
		assert.True(t, d == "off" || d == "2s", "%v: trim_delay=%q", env, d)
		a := line["arena_max"].(string)
		assert.True(t, a == "off" || number.MatchString(a), "%v: arena_max=%q", env, a)
		if a == "off" {
			assert.NotEmpty(t, line["arena_max_reason"], "%v", env)
		}
		assert.NotEmpty(t, line["thp_system"])
	}
	_, recs := runStart(t, nil, "AUTOMEMLIMIT=off", "MEMCTL_TRIM_DELAY=off")
	_, line := infoLines(recs)
	assert.Equal(t, "none", line["gomemlimit"], "no GOMEMLIMIT: none, not MaxInt64")
	assert.Equal(t, "off", line["trim_delay"])
}

// childWiring makes the wiring mistake named by WIRING and reports what the
// package-level functions reached. slog.Default writes JSON on standard
// error.
func childWiring() {
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	opts := []Option{WithTrimDelay(10 * time.Millisecond), WithTrim(trim.Config{MinRelease: trim.NeverSkip})}
	waitTrim := func(c *Controller) int64 {
		for deadline := time.Now().Add(20 * time.Second); c.Stats().Trim.Trims == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		return c.Stats().Trim.Trims
	}
	switch os.Getenv("WIRING") {
	case "nostart":
		AfterBurst()
		AfterBurst()
		Begin()()
	case "second-closed": // the newer is closed: the older serves again
		c1, _ := Start(opts...)
		c2, _ := Start(opts...)
		_ = c2.Close()
		AfterBurst()
		childtest.Say("C1_TRIMS", waitTrim(c1))
		_ = c1.Close()
	case "first-closed": // the older is closed: the newer still serves
		c1, _ := Start(opts...)
		c2, _ := Start(opts...)
		_ = c1.Close()
		AfterBurst()
		childtest.Say("C2_TRIMS", waitTrim(c2))
		_ = c2.Close()
		AfterBurst() // none live now
	default:
		childtest.Fail("unknown WIRING %q", os.Getenv("WIRING"))
	}
	childtest.Say("MISUSE", (*Controller)(nil).Stats().Misuse)
}

func runWiring(t *testing.T, which string) (map[string]string, []map[string]any) {
	t.Helper()
	cmd := childtest.Command(t, "wiring", []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_ARENA_MAX"}, "WIRING="+which)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	return childtest.ParseReport(out), parseRecords(t, stderr.String())
}

func warnings(recs []map[string]any) []string {
	var w []string
	for _, r := range recs {
		if r["level"] == "WARN" {
			w = append(w, r["msg"].(string))
		}
	}
	return w
}

func TestAfterBurstWithoutStartWarnsOnce(t *testing.T) {
	r, recs := runWiring(t, "nostart")
	w := warnings(recs)
	require.Len(t, w, 1, "one WARN for three calls: %v", recs)
	assert.Contains(t, w[0], "AfterBurst called with no live controller")
	assert.Contains(t, w[0], "memctl.Start")
	assert.Equal(t, "3", r["MISUSE"], "every call counted")
}

func TestSecondStartWarnsAndOlderServesAfterNewerCloses(t *testing.T) {
	r, recs := runWiring(t, "second-closed")
	w := warnings(recs)
	require.Len(t, w, 1, "%v", recs)
	assert.Contains(t, w[0], "Start called while an earlier controller is live")
	for _, rec := range recs {
		if rec["level"] == "WARN" {
			assert.Contains(t, rec["earlier_start"], "childWiring", "names where the earlier Start was")
		}
	}
	assert.Equal(t, "1", r["C1_TRIMS"], "after the newer's Close, AfterBurst reaches the older (issue 14: it reached neither)")
	assert.Equal(t, "1", r["MISUSE"])

	r, recs = runWiring(t, "first-closed")
	assert.Equal(t, "1", r["C2_TRIMS"], "closing the older leaves the newer in place")
	w = warnings(recs)
	require.Len(t, w, 2, "%v", recs)
	assert.Contains(t, w[1], "no live controller", "after both Close, AfterBurst says so")
	assert.Equal(t, "2", r["MISUSE"])
}

func TestWiringLeavesNothingRunning(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_ARENA_MAX"} {
		t.Setenv(k, "")
	}
	ctl1, _, _ := startInProcess(t)
	ctl2, _, _ := startInProcess(t)
	assert.Nil(t, current.Load(), "both closed: no controller")
	assert.NotSame(t, ctl1, ctl2)
}
