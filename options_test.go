package memctl

import (
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/thp"
	"github.com/memctl/memctl/trim"
)

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
		{WithTrim(trim.Config{Delay: trimwire.MaxDelay + 1}), "WithTrim(trim.Config{Delay: 24h0m0.000000001s})"},
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
			assert.Equal(t, trimwire.DefaultDelay, ctl.Report().TrimDelay, "an arena error leaves trimming on")
		}
	}
}

// The trim delay: MEMCTL_TRIM_DELAY when set, otherwise the last of
// WithTrimDelay and a non-zero trim.Config.Delay; a zero Delay leaves it.
// Start fills in the trimmer's Logger and Strict; the rest of the Config
// reaches the trimmer.
func TestWithTrimDelayOrder(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	if prev, err := thp.Process(); err == nil {
		defer restoreTHP(prev)
	}
	t.Setenv("MEMCTL_TRIM_DELAY", "")
	os.Unsetenv("MEMCTL_TRIM_DELAY")
	quiet := WithLogger(slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"none", nil, trimwire.DefaultDelay},
		{"WithTrimDelay last", []Option{WithTrim(trim.Config{Delay: 3 * time.Second}), WithTrimDelay(5 * time.Second)}, 5 * time.Second},
		{"WithTrim last", []Option{WithTrimDelay(5 * time.Second), WithTrim(trim.Config{Delay: 3 * time.Second})}, 3 * time.Second},
		{"zero Delay leaves it", []Option{WithTrimDelay(5 * time.Second), WithTrim(trim.Config{MaxWait: time.Minute})}, 5 * time.Second},
		{"zero Delay, default", []Option{WithTrim(trim.Config{MaxWait: time.Minute})}, trimwire.DefaultDelay},
		{"WithTrimDelay(0) after WithTrim is off", []Option{WithTrim(trim.Config{Delay: 3 * time.Second}), WithTrimDelay(0)}, 0},
	} {
		ctl, err := Start(append([]Option{quiet}, tc.opts...)...)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, ctl.Report().TrimDelay, tc.name)
		assert.Equal(t, tc.want, ctl.trimmer.Delay(), tc.name)
		require.NoError(t, ctl.Close())
	}

	ctl, err := Start(quiet, WithTrim(trim.Config{MaxWait: time.Minute, NoCHeap: true}))
	require.NoError(t, err)
	assert.Equal(t, time.Minute, ctl.trimmer.MaxWait(), "the Config reaches the trimmer")
	assert.Empty(t, ctl.Stats().Trim.CHeapAllocator, "NoCHeap reaches the trimmer")
	require.NoError(t, ctl.Close())

	t.Setenv("MEMCTL_TRIM_DELAY", "7s")
	ctl, err = Start(quiet, WithTrimDelay(5*time.Second), WithTrim(trim.Config{Delay: 3 * time.Second}))
	require.NoError(t, err)
	assert.Equal(t, 7*time.Second, ctl.trimmer.Delay(), "the environment wins")
	require.NoError(t, ctl.Close())
}
