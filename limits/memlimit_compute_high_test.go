package limits

import (
	"log/slog"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// v2Cgroup is a made-up v2 cgroup whose memory.max, memory.high, usage and
// live heap a test changes between refreshes.
type v2Cgroup struct {
	mu        sync.Mutex
	max, high int64 // cgroupfs.NoLimit for "max"
	rss, live int64
	highErr   error
}

func (c *v2Cgroup) read() (cgroupfs.Limit, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := cgroupfs.Limit{Version: 2, Cgroup: "/app", Dir: "/sys/fs/cgroup/app", Bytes: cgroupfs.NoLimit,
		Max: c.max, High: c.high, HighErr: c.highErr}
	if c.max != cgroupfs.NoLimit {
		l.MaxFile, l.Bytes, l.File = "/sys/fs/cgroup/app/memory.max", c.max, "/sys/fs/cgroup/app/memory.max"
	}
	if c.high != cgroupfs.NoLimit {
		l.HighFile = "/sys/fs/cgroup/app/memory.high"
		if l.Bytes == cgroupfs.NoLimit || c.high < l.Bytes {
			l.Bytes, l.File = c.high, l.HighFile
		}
	}
	return l, nil
}

func (c *v2Cgroup) set(f func(c *v2Cgroup)) {
	c.mu.Lock()
	f(c)
	c.mu.Unlock()
}

func (c *v2Cgroup) cfg(rec *recorder) MemLimitConfig {
	cfg := cfgFor(c.read)
	cfg.deps.usage = func() (int64, int64, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.rss, c.rss, nil
	}
	cfg.deps.live = func() int64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.live
	}
	cfg.Logger = slog.New(rec)
	return cfg
}

func ratioOf(n int64) int64 { return int64(float64(n) * 0.9) }

// TestHighUnderUsage is issue 18's case 2: memory.max 1 GiB, then
// memory.high 16 MiB under the usage (systemd set-property MemoryHigh=):
// GOMEMLIMIT goes down to 1.5 x the live heap, not "implausible"; memory.max
// lowered while memory.high is under the usage is still honoured, under the
// live-heap floor too.
func TestHighUnderUsage(t *testing.T) {
	keepMemoryLimit(t)
	c := &v2Cgroup{max: gib, high: cgroupfs.NoLimit, rss: 120 * mib, live: 100 * mib}
	rec := &recorder{}
	m, d, err := start(t, c.cfg(rec))
	require.NoError(t, err)
	assert.Equal(t, ratioOf(gib), d.GoMemLimit)

	c.set(func(c *v2Cgroup) { c.high = 16 * mib })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(150*mib), debug.SetMemoryLimit(-1), "1.5 x the 100 MiB live heap")
	assert.True(t, d.LiveFloor)
	assert.Equal(t, 16*mib, d.High)
	assert.Equal(t, gib, d.MemoryLimit, "the hard limit is still memory.max")
	assert.Contains(t, d.Reason, "held at 1.5 x the live heap of 100.0 MiB")
	assert.Zero(t, rec.count(slog.LevelWarn), "a memory.high under the usage is a target, not a malformed file")

	// memory.max lowered to 512 MiB: the target (150 MiB) is still lower.
	c.set(func(c *v2Cgroup) { c.max = 512 * mib })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(150*mib), d.GoMemLimit)
	assert.Equal(t, 512*mib, d.MemoryLimit)

	// memory.max lowered under the live-heap floor: memory.max wins.
	c.set(func(c *v2Cgroup) { c.max = 160 * mib })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ratioOf(160*mib), debug.SetMemoryLimit(-1), "memory.max is honoured whatever memory.high says")
	assert.Equal(t, 160*mib, d.MemoryLimit)

	// memory.high removed, memory.max raised: back to 0.9 x memory.max.
	c.set(func(c *v2Cgroup) { c.high, c.max = cgroupfs.NoLimit, gib })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ratioOf(gib), debug.SetMemoryLimit(-1))
	assert.Zero(t, d.High)

	// A memory.high over the live-heap floor is followed as a target.
	c.set(func(c *v2Cgroup) { c.high = 512 * mib })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ratioOf(512*mib), debug.SetMemoryLimit(-1))
	assert.False(t, d.LiveFloor)
}

// TestHighMalformed: memory.high 0, 1 or garbage is a malformed file
// (WARN, naming it) and memory.max is honoured without it.
func TestHighMalformed(t *testing.T) {
	keepMemoryLimit(t)
	for _, tc := range []struct {
		name string
		high int64
		err  error
	}{
		{"zero", 0, nil},
		{"one", 1, nil},
		{"garbage", cgroupfs.NoLimit, assertErr(`cgroupfs: "/sys/fs/cgroup/app/memory.high": malformed limit "lots", want bytes or "max"`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &v2Cgroup{max: 512 * mib, high: tc.high, rss: 40 * mib, live: 20 * mib, highErr: tc.err}
			rec := &recorder{}
			_, d, err := start(t, c.cfg(rec))
			require.NoError(t, err)
			assert.Equal(t, ratioOf(512*mib), debug.SetMemoryLimit(-1), "memory.max honoured: %s", d.Reason)
			assert.Equal(t, 1, rec.count(slog.LevelWarn))
			assert.Contains(t, rec.text(), "memory.high")
		})
	}
}

type assertErr string

func (e assertErr) Error() string { return string(e) }

// TestHighFallingHysteresis: a memory.high lowered step by step by 1% (a
// proactive-reclaim agent) from 2 GiB to 64 MiB is followed in steps of at
// least 5%, each GOMEMLIMIT within 6% of 0.9 x memory.high, and never into
// the live heap: it stops at 1.5 x the 100 MiB live heap (or within 1/20
// above it).
func TestHighFallingHysteresis(t *testing.T) {
	for name, hardMax := range map[string]int64{"under memory.max": 4 * gib, "alone": cgroupfs.NoLimit} {
		t.Run(name, func(t *testing.T) { testHighFalling(t, hardMax) })
	}
}

func testHighFalling(t *testing.T, hardMax int64) {
	keepMemoryLimit(t)
	c := &v2Cgroup{max: hardMax, high: 2 * gib, rss: 150 * mib, live: 100 * mib}
	rec := &recorder{}
	m, d, err := start(t, c.cfg(rec))
	require.NoError(t, err)
	require.Equal(t, ratioOf(2*gib), d.GoMemLimit)
	steps, changes, last := 0, 0, d.GoMemLimit
	for high := 2 * gib; high > 64*mib; high -= high / 100 {
		c.set(func(c *v2Cgroup) { c.high = high })
		d, err := m.Refresh()
		require.NoError(t, err)
		steps++
		got := debug.SetMemoryLimit(-1)
		require.Equal(t, got, d.GoMemLimit)
		require.LessOrEqual(t, got, last, "never raised while memory.high falls")
		if got != last {
			changes++
			assert.GreaterOrEqual(t, last-got, last/20-1, "a step of at least 5%%")
			last = got
		}
		want := max(ratioOf(high), 150*mib)
		require.GreaterOrEqual(t, got, want, "high %d", high)
		require.LessOrEqual(t, float64(got), float64(want)*1.06, "high %d: within 6%% of the target", high)
	}
	// It stops at 1.5 x the live heap, or less than 1/20 above it (the
	// dead band).
	assert.GreaterOrEqual(t, last, 150*mib, "never into the live heap")
	assert.Less(t, float64(last), float64(150*mib)/0.95, "stops within the dead band above 1.5 x the live heap")
	assert.Less(t, changes, steps/4, "%d changes for %d steps", changes, steps)
	t.Logf("memory.high 2 GiB -> 64 MiB in %d steps of 1%%: %d GOMEMLIMIT changes, ending at %d", steps, changes, last)

	// Rising again is followed at once.
	c.set(func(c *v2Cgroup) { c.high = gib })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ratioOf(gib), d.GoMemLimit)
}

// text returns every record's message and attributes, one line each.
func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b []byte
	for _, rec := range r.recs {
		b = append(b, rec.Message...)
		rec.Attrs(func(a slog.Attr) bool {
			b = append(b, ' ')
			b = append(b, a.String()...)
			return true
		})
		b = append(b, '\n')
	}
	return string(b)
}

// TestHighHysteresisUnderMax (attack on issue 18): the dead band that
// holds GOMEMLIMIT while memory.high falls by less than 5% must never hold
// it above what memory.max gives. memory.max 1000 MiB and memory.high
// 980 MiB in one cgroup: GOMEMLIMIT follows memory.high (882 MiB); then 30
// MiB more outside the Go runtime lowers both by 30 MiB, memory.high's
// target by less than 5% (852 MiB) and memory.max's bound to 870 MiB, under
// the 882 MiB held before the fix.
func TestHighHysteresisUnderMax(t *testing.T) {
	keepMemoryLimit(t)
	c := &v2Cgroup{max: 1000 * mib, high: 980 * mib, rss: 150 * mib, live: 100 * mib}
	rec := &recorder{}
	cfg := c.cfg(rec)
	var outside int64
	cfg.deps.usage = func() (int64, int64, error) { return 150*mib + outside, 150 * mib, nil }
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	require.Equal(t, ratioOf(980*mib), d.GoMemLimit, d.Reason)
	outside = 30 * mib
	d, err = m.Refresh()
	require.NoError(t, err)
	hard := ratioOf(1000*mib) - outside
	assert.LessOrEqual(t, debug.SetMemoryLimit(-1), hard, "never over memory.max's bound: %s", d.Reason)
	assert.Equal(t, d.GoMemLimit, debug.SetMemoryLimit(-1))
}

// TestMaxLoweredUnderUsage (attack on issue 18): memory.max lowered at run
// time under the usage (an in-place resize, systemd set-property
// MemoryMax=; the kernel reclaims, or OOM-kills, above it), while
// memory.high sits under the usage too. Before the fix the new memory.max
// was "implausible" and GOMEMLIMIT stayed at 0.9 x the old 1 GiB: memory.max
// stopped being honoured. The same file memctl already follows is now
// followed, with one WARN; at Start (or from another file) a limit under
// the RSS is still a malformed file.
func TestMaxLoweredUnderUsage(t *testing.T) {
	keepMemoryLimit(t)
	c := &v2Cgroup{max: gib, high: 16 * mib, rss: 120 * mib, live: 40 * mib}
	rec := &recorder{}
	m, d, err := start(t, c.cfg(rec))
	require.NoError(t, err)
	require.Equal(t, int64(64*mib), d.GoMemLimit, "memory.high under the usage: the floor; %s", d.Reason)
	c.set(func(c *v2Cgroup) { c.high = cgroupfs.NoLimit })
	d, err = m.Refresh()
	require.NoError(t, err)
	require.Equal(t, ratioOf(gib), d.GoMemLimit)

	for _, lowered := range []int64{100 * mib, 90 * mib} {
		c.set(func(c *v2Cgroup) { c.max = lowered })
		d, err = m.Refresh()
		require.NoError(t, err)
		assert.Equal(t, ratioOf(lowered), debug.SetMemoryLimit(-1), "memory.max %d under the 120 MiB RSS is honoured: %s", lowered, d.Reason)
		assert.Equal(t, lowered, d.MemoryLimit)
	}
	// memory.high under the usage again: its target (the floor) is lower.
	c.set(func(c *v2Cgroup) { c.high = 16 * mib })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(64*mib), debug.SetMemoryLimit(-1), d.Reason)
	assert.Equal(t, 90*mib, d.MemoryLimit)
	assert.Equal(t, 1, rec.count(slog.LevelWarn), "one WARN: %s", rec.text())
	assert.Contains(t, rec.text(), "/sys/fs/cgroup/app/memory.max")

	// Raised back: followed at once.
	c.set(func(c *v2Cgroup) { c.max, c.high = gib, cgroupfs.NoLimit })
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ratioOf(gib), d.GoMemLimit)

	// At Start the same value is a malformed file, as before.
	keepMemoryLimit(t)
	debug.SetMemoryLimit(999 * mib)
	c2 := &v2Cgroup{max: 100 * mib, high: cgroupfs.NoLimit, rss: 120 * mib, live: 40 * mib}
	_, _, err = start(t, c2.cfg(&recorder{}))
	require.ErrorIs(t, err, ErrImplausibleLimit)
	assert.Equal(t, int64(999*mib), debug.SetMemoryLimit(-1))
}
