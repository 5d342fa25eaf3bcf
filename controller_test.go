package memctl

import (
	"log/slog"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
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

func TestCloseLeavesNothingRunning(t *testing.T) {
	defer goleak.VerifyNone(t)
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	prevTHP, err := thp.Process()
	if err == nil {
		defer restoreTHP(prevTHP)
	}
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(50*time.Millisecond),
		WithMemLimit(limits.MemLimitConfig{Refresh: time.Hour}))
	require.NoError(t, err)
	AfterBurst() // pending trim: a timer exists now
	end := Begin()
	end()
	require.NoError(t, ctl.Close())
	require.NoError(t, ctl.Close(), "Close is idempotent")
	AfterBurst() // no controller: does nothing, starts nothing
	Begin()()
	assert.Zero(t, ctl.Stats().Trim.Trims, "Close dropped the pending trim")
}

func TestNilController(t *testing.T) {
	var c *Controller
	c.AfterBurst()
	c.Begin()()
	assert.NoError(t, c.Close())
	assert.True(t, c.Report().Off)
}
