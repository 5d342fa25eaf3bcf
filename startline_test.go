package memctl

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

func init() { moreChildren["start-default-logger"] = childStartDefaultLogger }

// childStartDefaultLogger runs Start with no option at all: the line goes
// to slog.Default, as in a service that imports auto.
func childStartDefaultLogger() {
	ctl, _ := Start()
	_ = ctl.Close()
}

// Input (issue 27, item 3): the startup line was 937 characters with 17
// keys, GOMEMLIMIT in raw bytes and arena_max=2 unexplained. In a real
// 256 MiB cgroup with defaults it must be readable at a glance in kubectl
// logs: under 300 characters (the bound), GOMEMLIMIT in MiB and
// where it came from; the details at DEBUG; no WARN line when nothing
// needs action.
func TestStartupLineShortInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	cmd := childtest.Command(t, "start-default-logger", []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_AUTOBURST",
		"MEMCTL_ARENA_MAX", "MEMCTL_PRESSURE", "GOMEMLIMIT", "AUTOMEMLIMIT", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "LD_PRELOAD"})
	g.Wrap(cmd)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	var line string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, "memctl started") {
			line = l
		}
	}
	require.NotEmpty(t, line, stderr.String())
	t.Logf("%d characters: %s", len(line), line)
	assert.Less(t, len(line), 300, "the whole line, with the log package's date and level")
	assert.Regexp(t, regexp.MustCompile(` gomemlimit=[0-9]+\.[0-9]MiB `), line)
	assert.Contains(t, line, `gomemlimit_source="90% of cgroup v`)
	assert.Contains(t, line, "limit 256.0MiB less ")
	assert.Regexp(t, regexp.MustCompile(` thp=\S+ trim_delay=2s auto_burst=on pressure=`), line)
	assert.NotContains(t, stderr.String(), " WARN ", "nothing needs action here")
	assert.NotContains(t, line, "arena_max", "details are at DEBUG")
}

// Issue 13 input 8: MEMCTL_TRIM_DELAY=2562047h gave a negative max wait (no
// bound). Delays past trimwire.MaxDelay, and every other out-of-range value of
// the same kind, are a clear error that names the variable.
func TestTrimDelayOverflow(t *testing.T) {
	for _, v := range []string{"2562047h", "2562047h47m16.854775807s", "25h", "24h0m0.000000001s", "9223372036854775807ns", "99999999999h", "-1s"} {
		d, err := parseDelay(v)
		assert.Zero(t, d, v)
		if assert.Error(t, err, v) {
			assert.Contains(t, err.Error(), `MEMCTL_TRIM_DELAY="`+v+`"`)
			assert.Contains(t, err.Error(), "from 1ms to 24h0m0s")
		}
	}
	for v, want := range map[string]time.Duration{"24h": 24 * time.Hour, "1ms": time.Millisecond, "off": 0, "0": 0} {
		d, err := parseDelay(v)
		require.NoError(t, err, v)
		assert.Equal(t, want, d, v)
	}
	r, _ := runStart(t, nil, "MEMCTL_TRIM_DELAY=2562047h")
	assert.Contains(t, r["ERR"], `MEMCTL_TRIM_DELAY="2562047h"`)
	assert.Equal(t, "0s", r["TRIM_DELAY"], "a bad delay turns trimming off")
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
