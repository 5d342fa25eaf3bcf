package memctl

import (
	"log/slog"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/memctl/memctl/thp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 13 input 7: an extra end() panicked when Start ran and did nothing
// when it did not. Now it is counted (Stats.Misuse) the same way in both
// cases, and panics only under SetStrict.
func TestExtraEndWithAndWithoutStart(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	if prev, err := thp.Process(); err == nil {
		defer restoreTHP(prev)
	}
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	require.Nil(t, current.Load(), "no controller before Start")

	// Without Start. Begin with no controller is a wiring mistake
	// (counted once per call), and the extra end is misuse of its own.
	m0 := CurrentStats().Misuse
	end := Begin()
	assert.Equal(t, m0+1, CurrentStats().Misuse, "Begin without Start is a wiring mistake")
	end()
	assert.NotPanics(t, end, "an extra end without Start does not panic")
	assert.Equal(t, m0+2, CurrentStats().Misuse, "and is counted")

	// With Start.
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Hour))
	require.NoError(t, err)
	end = Begin()
	end()
	assert.NotPanics(t, end, "an extra end with Start does not panic")
	assert.Equal(t, m0+3, CurrentStats().Misuse, "and is counted the same way")
	assert.Equal(t, int64(1), ctl.Stats().Trim.Misuse)
	require.NoError(t, ctl.Close())

	// Strict mode: both panic.
	defer SetStrict(SetStrict(true))
	end = Begin()
	end()
	assert.PanicsWithValue(t, "memctl: burst ended more often than begun", end)
	ctl, err = Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Hour))
	require.NoError(t, err)
	defer ctl.Close()
	end = Begin()
	end()
	assert.PanicsWithValue(t, "trim: burst ended more often than begun", end)
	assert.Equal(t, m0+5, CurrentStats().Misuse, "two Begins without Start, two extra ends without a trimmer, one in this controller's trimmer")

	// A Begin made without a trimmer and ended after Start is not misuse.
	require.NoError(t, ctl.Close())
	end = Begin()
	ctl, err = Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Hour))
	require.NoError(t, err)
	defer ctl.Close()
	assert.NotPanics(t, end)
	assert.Equal(t, m0+5, CurrentStats().Misuse, "the third Begin without Start; no extra end, none in the new controller's trimmer")
}

// Issue 13 input 8: MEMCTL_TRIM_DELAY=2562047h gave a negative max wait (no
// bound). Delays past trim.MaxDelay, and every other out-of-range value of
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
