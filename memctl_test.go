package memctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/thpflag"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
)

// moreChildren are child processes that test files building only in some
// configurations (a platform, cgo) add to TestMain's.
var moreChildren = map[string]func(){}

func TestMain(m *testing.M) {
	if os.Getenv(childtest.EnvVar) == "" {
		// The THP flag is inherited: children start from a clear flag even
		// when the tests themselves run under a disabled one.
		_ = thpflag.Set(thpflag.Enabled)
	}
	children := map[string]func(){"start": childStart, "resize": childResize, "refresh": childRefresh, "wiring": childWiring,
		"three-requests": childThreeRequests}
	maps.Copy(children, moreChildren)
	childtest.Main(m, children)
}

// childStart runs Start with a JSON logger on standard error and reports
// what the process's own /proc files and runtime say afterwards.
func childStart() {
	ctl, err := Start(WithLogger(slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	childtest.Say("ERR", strings.ReplaceAll(fmt.Sprint(err), "\n", "; "))
	st, perr := procfs.ReadFile("/proc/self/status")
	if perr != nil {
		childtest.Fail("%v", perr)
	}
	v, _ := st.Int("THP_enabled")
	childtest.Say("THP_ENABLED", v)
	childtest.Say("GOMEMLIMIT", debug.SetMemoryLimit(-1))
	r := ctl.Report()
	childtest.Say("OFF", r.Off)
	childtest.Say("THP_REPORT", r.THPState)
	childtest.Say("TRIM_DELAY", r.TrimDelay)
	childtest.Say("SOURCE", r.MemLimit.Source)
	childtest.Say("MEMLIMIT_BYTES", r.MemLimit.GoMemLimit)
	childtest.Say("MEMLIMIT_REASON", r.MemLimit.Reason)
	childtest.Say("ARENA_MAX", r.ArenaMax)
	childtest.Say("ARENA_NOTE", r.ArenaMaxNote)
	childtest.Say("C_HEAP", r.CHeap)
	childtest.Say("PRESSURE", r.Pressure)
	childtest.Say("AUTOBURST", r.AutoBurst)
	if err := ctl.Close(); err != nil {
		childtest.Fail("close: %v", err)
	}
}

// runStart runs childStart with env and returns its report and the log
// records it wrote.
func runStart(t *testing.T, g *cgrouptest.Group, env ...string) (map[string]string, []map[string]any) {
	t.Helper()
	cmd := childtest.Command(t, "start", []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_AUTOBURST", "MEMCTL_ARENA_MAX", "MEMCTL_PRESSURE", "GOMEMLIMIT", "AUTOMEMLIMIT", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "LD_PRELOAD"}, env...)
	if g != nil {
		g.Wrap(cmd)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	return childtest.ParseReport(out), parseRecords(t, stderr.String())
}

// infoLines counts the INFO lines and returns the last, with the keys of
// the DEBUG "memctl details" line that follows the startup line added.
func infoLines(recs []map[string]any) (n int, last map[string]any) {
	for _, r := range recs {
		switch {
		case r["level"] == "INFO":
			n++
			last = maps.Clone(r)
		case r["msg"] == "memctl details" && last != nil:
			for k, v := range r {
				if k != "level" && k != "msg" && k != "time" {
					last[k] = v
				}
			}
		}
	}
	return n, last
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

func TestStartDefaults(t *testing.T) {
	r, recs := runStart(t, nil)
	assert.Equal(t, "<nil>", r["ERR"])
	// Issue 19: except-advised on this kernel (6.18), so that a child's
	// advised regions keep their huge pages; THP_enabled reads 1 under it.
	assert.Equal(t, "disabled-except-advised", r["THP_REPORT"], "PR_GET_THP_DISABLE in the child")
	assert.Equal(t, "1", r["THP_ENABLED"], "THP_enabled in the child's /proc/self/status")
	assert.Equal(t, "2s", r["TRIM_DELAY"])
	n, line := infoLines(recs)
	require.Equal(t, 1, n, "exactly one INFO line: %v", recs)
	assert.Equal(t, "memctl started", line["msg"])
	assert.Equal(t, "disabled-except-advised", line["thp"])
	assert.Equal(t, "except-advised", line["thp_policy"])
	assert.Contains(t, line["thp_note"], "inherited by child processes")
	for _, k := range []string{"gomemlimit", "gomemlimit_source", "trim_delay", "c_heap", "thp_system"} {
		assert.Contains(t, line, k)
	}
}

func TestStartSetsGOMEMLIMITInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	r, recs := runStart(t, g)
	_, line := infoLines(recs)
	// 0.9 of the limit less what the child holds outside the Go runtime
	// (the binary, C heap: a few MiB).
	outside, err := strconv.ParseInt(fmt.Sprint(line["gomemlimit_outside"]), 10, 64)
	require.NoError(t, err, "gomemlimit_outside in %v", line)
	assert.Less(t, outside, int64(32<<20))
	ratio := 0.9
	want := int64(float64(g.Limit)*ratio) - outside
	assert.Equal(t, strconv.FormatInt(want, 10), r["GOMEMLIMIT"])
	assert.Equal(t, strconv.FormatInt(want, 10), line["gomemlimit_bytes"])
	assert.Equal(t, strconv.FormatFloat(float64(want)/(1<<20), 'f', 1, 64)+"MiB", line["gomemlimit"])
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	assert.Equal(t, filepath.Join(g.Dir, file), line["gomemlimit_file"])
	assert.Equal(t, "10s", line["gomemlimit_refresh"], "refresh on by default")
	assert.Contains(t, line["gomemlimit_source"], "90% of "+r["SOURCE"]+" limit 256.0MiB less ")
	assert.NotEmpty(t, line["gomemlimit_follow"], "how a written limit is noticed between GC ends")
	assert.Contains(t, r["SOURCE"], "cgroup v")

	r, _ = runStart(t, g, "GOMEMLIMIT=100MiB")
	assert.Equal(t, strconv.Itoa(100<<20), r["GOMEMLIMIT"], "the operator's GOMEMLIMIT wins")
	assert.Equal(t, "env", r["SOURCE"])
}

func TestStartPressureSwitch(t *testing.T) {
	r, _ := runStart(t, nil)
	if _, err := os.Stat("/proc/pressure/memory"); err == nil && os.Geteuid() == 0 {
		assert.NotEqual(t, "none", r["PRESSURE"], "PSI is watched by default here")
	}
	for _, v := range []string{"off", " OFF ", "0", "false", "no"} {
		r, _ = runStart(t, nil, "MEMCTL_PRESSURE="+v)
		assert.Equal(t, "<nil>", r["ERR"], v)
		assert.Equal(t, "none", r["PRESSURE"], "MEMCTL_PRESSURE=%q", v)
	}
	r, recs := runStart(t, nil, "MEMCTL_PRESSURE=sometimes")
	assert.Contains(t, r["ERR"], `MEMCTL_PRESSURE="sometimes"`)
	assert.Equal(t, "none", r["PRESSURE"], "an invalid value switches the part off")
	// One WARN names the bad value; a WARN of something else this machine
	// did meanwhile (CI's CGO_ENABLED=0 step once read two) is not this
	// test's, and is shown.
	var warns, named []string
	for _, rec := range recs {
		if rec["level"] == "WARN" {
			line := fmt.Sprint(rec)
			warns = append(warns, line)
			if strings.Contains(line, "MEMCTL_PRESSURE") {
				named = append(named, line)
			}
		}
	}
	assert.Len(t, named, 1, "one WARN names MEMCTL_PRESSURE; every WARN: %q", warns)
}

func TestStartOff(t *testing.T) {
	r, recs := runStart(t, nil, "MEMCTL=off")
	assert.Equal(t, "true", r["OFF"])
	assert.Equal(t, "1", r["THP_ENABLED"], "THP untouched")
	assert.Equal(t, strconv.FormatInt(math.MaxInt64, 10), r["GOMEMLIMIT"], "GOMEMLIMIT untouched")
	assert.Equal(t, strconv.FormatInt(math.MaxInt64, 10), r["MEMLIMIT_BYTES"], "Report says no limit as the doc does")
	assert.NotEmpty(t, r["MEMLIMIT_REASON"])
	n, line := infoLines(recs)
	assert.Equal(t, 1, n)
	assert.Equal(t, "memctl is off", line["msg"])
	assert.Equal(t, "none", line["gomemlimit"])
	assert.Equal(t, "MEMCTL=off", line["reason"])
}

func TestStartEnvironmentSwitches(t *testing.T) {
	r, _ := runStart(t, nil, "MEMCTL_THP=keep", "MEMCTL_TRIM_DELAY=off")
	assert.Equal(t, "<nil>", r["ERR"])
	assert.Equal(t, "1", r["THP_ENABLED"])
	assert.Equal(t, "0s", r["TRIM_DELAY"])

	r, _ = runStart(t, nil, "MEMCTL_THP=except-advised", "MEMCTL_TRIM_DELAY=500ms")
	assert.Equal(t, "500ms", r["TRIM_DELAY"])
	if r["ERR"] == "<nil>" { // Linux 6.18 and later
		assert.Equal(t, "1", r["THP_ENABLED"], "except-advised leaves THP_enabled at 1; PR_GET_THP_DISABLE says 3")
	}

	r, recs := runStart(t, nil, "MEMCTL_THP=disabel", "MEMCTL_TRIM_DELAY=soon")
	assert.Contains(t, r["ERR"], "MEMCTL_THP")
	assert.Contains(t, r["ERR"], "MEMCTL_TRIM_DELAY")
	assert.Equal(t, "1", r["THP_ENABLED"], "a typo is not guessed at: THP left as it was")
	assert.Equal(t, "0s", r["TRIM_DELAY"], "a bad delay turns trimming off")
	n, _ := infoLines(recs)
	assert.Equal(t, 1, n)
}

func countLevel(recs []map[string]any, level string) int {
	n := 0
	for _, r := range recs {
		if r["level"] == level {
			n++
		}
	}
	return n
}

func TestStartEnvironmentEdgeCases(t *testing.T) {
	r, _ := runStart(t, nil, "MEMCTL=OFF")
	assert.Equal(t, "true", r["OFF"], "MEMCTL is case-insensitive")

	r, recs := runStart(t, nil, "MEMCTL=flase")
	assert.Equal(t, "true", r["OFF"], "an invalid value switches its part off: here all of memctl")
	assert.Contains(t, r["ERR"], `MEMCTL="flase"`, "an unknown MEMCTL value is reported")
	assert.Equal(t, "1", r["THP_ENABLED"], "and nothing is touched")
	assert.Equal(t, 1, countLevel(recs, "WARN"), "one WARN line: %v", recs)

	r, _ = runStart(t, nil, "MEMCTL_THP=", "MEMCTL_TRIM_DELAY=", "MEMCTL_ARENA_MAX=", "MEMCTL=")
	assert.Equal(t, "<nil>", r["ERR"], "empty means unset")
	assert.Equal(t, "disabled-except-advised", r["THP_REPORT"], "the default")
	assert.Equal(t, "2s", r["TRIM_DELAY"])

	r, _ = runStart(t, nil, "MEMCTL_THP= Keep ", "MEMCTL_TRIM_DELAY=500us")
	assert.Equal(t, "1", r["THP_ENABLED"], "surrounding space and case are ignored")
	assert.Contains(t, r["ERR"], "MEMCTL_TRIM_DELAY=\"500us\"", "a delay below the minimum names the variable")
	assert.Equal(t, "0s", r["TRIM_DELAY"])
}

func TestReportReadsBackInheritedTHP(t *testing.T) {
	// The child inherits a disabled flag; a typo in MEMCTL_THP leaves it so,
	// and the report must say what the process really has.
	if err := thpflag.Set(thpflag.Disabled); err != nil {
		t.Skipf("prctl: %v", err)
	}
	defer func() { require.NoError(t, thpflag.Set(thpflag.Enabled)) }()
	r, recs := runStart(t, nil, "MEMCTL_THP=disabel")
	assert.Contains(t, r["ERR"], "MEMCTL_THP")
	assert.Equal(t, "0", r["THP_ENABLED"])
	assert.Equal(t, "disabled", r["THP_REPORT"])
	_, line := infoLines(recs)
	assert.Equal(t, "disabled", line["thp"])
}

func TestStartArenaMax(t *testing.T) {
	r, recs := runStart(t, nil)
	_, line := infoLines(recs)
	if r["C_HEAP"] != "glibc" {
		assert.Equal(t, "0", r["ARENA_MAX"], "no glibc, no cap")
		assert.Contains(t, r["ARENA_NOTE"], "unavailable")
		return
	}
	assert.Equal(t, "2", r["ARENA_MAX"])
	assert.Equal(t, "2", line["arena_max"])
	assert.Contains(t, line["c_heap_stats"], "glibc: arena")

	r, _ = runStart(t, nil, "MALLOC_ARENA_MAX=4")
	assert.Equal(t, "0", r["ARENA_MAX"], "the operator's MALLOC_ARENA_MAX wins")
	assert.Contains(t, r["ARENA_NOTE"], "MALLOC_ARENA_MAX=4")
	assert.Equal(t, "<nil>", r["ERR"])

	r, _ = runStart(t, nil, "MEMCTL_ARENA_MAX=off")
	assert.Equal(t, "0", r["ARENA_MAX"])
	r, _ = runStart(t, nil, "MEMCTL_ARENA_MAX=3")
	assert.Equal(t, "3", r["ARENA_MAX"])
	r, _ = runStart(t, nil, "MEMCTL_ARENA_MAX=-1")
	assert.Contains(t, r["ERR"], "MEMCTL_ARENA_MAX")
	assert.Equal(t, "0", r["ARENA_MAX"])
}

func TestOperatorDelayWinsOverWithTrim(t *testing.T) {
	defer goleak.VerifyNone(t)
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	if prev, err := thp.Process(); err == nil {
		defer restoreTHP(prev)
	}
	t.Setenv("MEMCTL_TRIM_DELAY", "10s")
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrim(trim.Config{Delay: 100 * time.Millisecond}))
	require.NoError(t, err)
	defer ctl.Close()
	assert.Equal(t, 10*time.Second, ctl.Report().TrimDelay)
	assert.Equal(t, 10*time.Second, ctl.trimmer.Delay(), "the trimmer runs with the operator's delay")
}

func restoreTHP(s thp.State) {
	switch s {
	case thp.StateEnabled:
		_ = thpflag.Set(thpflag.Enabled)
	case thp.StateDisabled:
		_ = thpflag.Set(thpflag.Disabled)
	case thp.StateDisabledExceptAdvised:
		_ = thpflag.Set(thpflag.DisabledExceptAdvised)
	}
}

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
