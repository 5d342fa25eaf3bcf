package limits

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/gcend"
)

// TestParseMode: MEMCTL_BUDGETS in any case, spaces trimmed, with the
// strconv.ParseBool spellings and yes/no for on and off; MEMCTL off wins;
// anything else enforces, with an error to log.
func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		memctl, budgets string
		want            Mode
		bad             bool
	}{
		{"", "", ModeEnforce, false},
		{"", "enforce", ModeEnforce, false},
		{"", " ENFORCE\n", ModeEnforce, false},
		{"", "on", ModeEnforce, false},
		{"", "1", ModeEnforce, false},
		{"", "t", ModeEnforce, false},
		{"", "True", ModeEnforce, false},
		{"", "YES", ModeEnforce, false},
		{"", "no", ModeOff, false},
		{"false", "observe", ModeOff, false},
		{"NO", "", ModeOff, false},
		{"", "observe", ModeObserve, false},
		{"", "\tObserve ", ModeObserve, false},
		{"", "off", ModeOff, false},
		{"", "OFF", ModeOff, false},
		{"", "0", ModeOff, false},
		{"", "F", ModeOff, false},
		{"", "false", ModeOff, false},
		{"off", "", ModeOff, false},
		{" Off ", "enforce", ModeOff, false},
		{"on", "observe", ModeObserve, false},
		{"", "observ", ModeEnforce, true},
		{"", "yess", ModeEnforce, true},
		{"", "enforce,observe", ModeEnforce, true},
		{"", "2", ModeEnforce, true},
	} {
		env := map[string]string{"MEMCTL": tc.memctl, "MEMCTL_BUDGETS": tc.budgets}
		got, err := parseMode(func(k string) string { return env[k] })
		assert.Equal(t, tc.want, got, "MEMCTL=%q MEMCTL_BUDGETS=%q", tc.memctl, tc.budgets)
		if tc.bad {
			require.Error(t, err, "%q", tc.budgets)
			assert.Contains(t, err.Error(), "budgets are enforced")
			assert.Contains(t, err.Error(), "MEMCTL_BUDGETS=")
		} else {
			assert.NoError(t, err, "%q", tc.budgets)
		}
	}
	for m, s := range map[Mode]string{ModeEnforce: "enforce", ModeObserve: "observe", ModeOff: "off", 7: "Mode(7)"} {
		assert.Equal(t, s, m.String())
	}
}

// newModePool returns a pool made with MEMCTL_BUDGETS=budgets, its logs.
func newModePool(t *testing.T, budgets string, cfg PoolConfig) (*Pool, *strings.Builder) {
	t.Helper()
	t.Setenv("MEMCTL", "")
	t.Setenv("MEMCTL_BUDGETS", budgets)
	var logs strings.Builder
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	p, err := NewPool(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p, &logs
}

// TestModeObserve (issue 11, item 5): budgets account and count what they
// would refuse, and log it at most once per observeLogInterval, without
// refusing: the account's limit, the pool's, heap pressure, and the cancel
// of CancelLargest.
func TestModeObserve(t *testing.T) {
	p, logs := newModePool(t, "observe", PoolConfig{Limit: mib, HeapPressure: 0.9, CancelLargest: true})
	assert.Equal(t, ModeObserve, p.Mode())
	assert.Contains(t, logs.String(), "mode=observe")
	a := mustOpen(t, p, "a", 100*kib)
	ctx, done := WithAccount(context.Background(), a)
	defer done()
	require.NoError(t, a.Grow(200*kib), "past the account's limit")
	require.NoError(t, a.Grow(2*mib), "past the pool's limit")
	require.NoError(t, a.Grow(1), "each Grow past a limit is seen, not only the first")
	assert.Equal(t, 2*mib+200*kib+1, a.Used(), "accounted all the same")
	assert.Equal(t, int64(3), p.Stats().Observed)
	assert.Zero(t, p.Stats().Refused)
	assert.Equal(t, 1, strings.Count(logs.String(), "not refused"), "rate-limited: %s", logs.String())
	assert.Contains(t, logs.String(), "MEMCTL_BUDGETS=observe")

	p.observeHeap(15*mib, 16*mib) // heap pressure, a is 1/7 of the heap
	assert.True(t, p.Stats().UnderHeapPressure)
	require.NoError(t, ctx.Err(), "observe cancels nothing")
	assert.Zero(t, p.Stats().Canceled)
	assert.Equal(t, int64(4), p.Stats().Observed, "the cancel it would have made")
	b := mustOpen(t, p, "b", Unlimited)
	require.NoError(t, b.Grow(mib), "heap pressure refuses nothing")
	assert.Equal(t, int64(5), p.Stats().Observed)
	b.Shrink(mib)
	b.Close()
	a.Shrink(2*mib + 200*kib + 1)
	// A total past math.MaxInt64 is refused in every mode.
	require.NoError(t, a.Grow(1<<62))
	require.ErrorIs(t, a.Grow(1<<62), ErrResourceExhausted)
	a.Shrink(1 << 62)
}

// TestModeOff: MEMCTL_BUDGETS=off, or MEMCTL=off, refuses nothing, logs
// nothing per Grow, and runs no heap watch.
func TestModeOff(t *testing.T) {
	for _, env := range [][2]string{{"", "off"}, {"off", ""}, {"off", "enforce"}, {"", "FALSE"}} {
		t.Run(env[0]+"_"+env[1], func(t *testing.T) {
			subs := gcend.Active()
			t.Setenv("MEMCTL", env[0])
			t.Setenv("MEMCTL_BUDGETS", env[1])
			var logs strings.Builder
			p, err := NewPool(PoolConfig{Limit: mib, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, err)
			defer p.Close()
			assert.Equal(t, ModeOff, p.Stats().Mode)
			assert.Equal(t, subs, gcend.Active(), "no heap watch")
			a := mustOpen(t, p, "a", kib)
			require.NoError(t, a.Grow(10*mib))
			assert.Equal(t, 10*mib, a.Used())
			assert.Zero(t, p.Stats().Refused)
			assert.NotContains(t, logs.String(), "not refused")
			a.Shrink(10 * mib)
			a.Close()
			assert.Zero(t, p.Used())
		})
	}
}

// TestModeInvalidEnforces: a bad MEMCTL_BUDGETS is logged at WARN and
// budgets are enforced: a typo must not lift a limit.
func TestModeInvalidEnforces(t *testing.T) {
	p, logs := newModePool(t, "obsrve", PoolConfig{Limit: mib, HeapPressure: -1})
	assert.Equal(t, ModeEnforce, p.Mode())
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), `MEMCTL_BUDGETS=\"obsrve\"`)
	a := mustOpen(t, p, "a", kib)
	require.ErrorIs(t, a.Grow(kib+1), ErrResourceExhausted)
	a.Close()
}
