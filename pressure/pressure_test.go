package pressure

import (
	"io"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
)

var unknownEvents = cgroupfs.Events{Low: -1, High: -1, Max: -1, OOM: -1, OOMKill: -1, OOMGroupKill: -1}

func TestConfigInvalid(t *testing.T) {
	for name, cfg := range map[string]Config{
		"window short":      {Window: time.Millisecond},
		"window negative":   {Window: -time.Second},
		"share over 1":      {GCShare: 1.5},
		"share NaN":         {GCShare: math.NaN()},
		"share negative":    {GCShare: -0.1},
		"live ratio inf":    {LiveRatio: math.Inf(1)},
		"lift step 2":       {LiftStep: 2},
		"lift for long":     {LiftFor: 2 * time.Hour},
		"interval short":    {MinInterval: time.Millisecond},
		"stall window long": {StallWindow: time.Minute},
		"stall > window":    {Stall: 3 * time.Second},
		"watch unknown":     {Watch: "sometimes"},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := Start(cfg)
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Contains(t, err.Error(), "pressure: Config.")
		})
	}
}

// fakeOwner is GOMEMLIMIT's owner, as the limiter: a lift sets the
// GOMEMLIMIT in force plus extra, at most ceiling; Lift(0) restores it,
// unless GOMEMLIMIT changed since the lift.
type fakeOwner struct {
	ceiling, base, to int64
	asked             []int64
}

func (o *fakeOwner) lift(extra int64) (from, to int64, ok bool) {
	o.asked = append(o.asked, extra)
	cur := debug.SetMemoryLimit(-1)
	if extra == 0 {
		lifted := o.to
		o.to = 0
		if lifted == 0 || cur != lifted {
			return cur, cur, false
		}
		debug.SetMemoryLimit(o.base)
		return cur, o.base, true
	}
	o.base, o.to = cur, min(cur+extra, o.ceiling)
	debug.SetMemoryLimit(o.to)
	return cur, o.to, true
}

// testDeps are deps that act on nothing outside the test: no trim, no
// cancel, no shedding, and lifts through the fake owner o (none when nil).
func testDeps(o *fakeOwner) deps {
	d := deps{getenv: os.Getenv, trim: func() bool { return false }, cancel: func() int { return 0 }, shed: func(bool) {},
		lift: func(int64) (int64, int64, bool) { return 0, 0, false }, ceiling: func() int64 { return 0 }}
	if o != nil {
		d.lift, d.ceiling = o.lift, func() int64 { return o.ceiling }
	}
	return d
}

// newTestMonitor returns a Monitor of cfg with testDeps(o), without its
// detector's hook or watcher.
func newTestMonitor(t *testing.T, cfg Config, o *fakeOwner) *Monitor {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	require.NoError(t, cfg.fill())
	m := &Monitor{cfg: cfg, deps: testDeps(o), log: cfg.Logger}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func TestSubscribeDropsWhenFull(t *testing.T) {
	m := newTestMonitor(t, Config{}, nil)
	ch, cancel := m.Subscribe(2)
	for range 5 {
		m.publish(Event{Kind: KindKernel})
	}
	assert.Len(t, ch, 2)
	assert.Equal(t, int64(3), m.Stats().Dropped)
	cancel()
	cancel() // idempotent
	n := 0
	for range ch {
		n++
	}
	assert.Equal(t, 2, n, "the buffered events stay readable, then the channel is closed")
	m.publish(Event{Kind: KindKernel}) // no subscriber: no panic, nothing dropped
	assert.Equal(t, int64(3), m.Stats().Dropped)

	ch2, _ := m.Subscribe(0)
	require.NoError(t, m.Close())
	_, open := <-ch2
	assert.False(t, open, "Close closes every channel")
	ch3, _ := m.Subscribe(1)
	_, open = <-ch3
	assert.False(t, open, "a channel from a closed Monitor is closed")

	var nilM *Monitor
	ch4, cancel4 := nilM.Subscribe(1)
	cancel4()
	_, open = <-ch4
	assert.False(t, open)
	assert.Equal(t, int64(-1), nilM.Stats().MemoryEvents.OOMKill)
}

func TestStatsReadsMemoryEvents(t *testing.T) {
	m := newTestMonitor(t, Config{}, nil)
	m.events = "../internal/cgroupfs/testdata/events/v6.18"
	assert.Equal(t, cgroupfs.Events{Low: 0, High: 12, Max: 3456, OOM: 7, OOMKill: 2, OOMGroupKill: 0}, cgroupfs.Events(m.Stats().MemoryEvents))
	m.events = "../internal/cgroupfs/testdata/events/bad-negative"
	assert.Equal(t, unknownEvents, cgroupfs.Events(m.Stats().MemoryEvents), "malformed: unknown, not zero")
	m.events = ""
	assert.Equal(t, unknownEvents, cgroupfs.Events(m.Stats().MemoryEvents), "not cgroup v2")
}
