package memctl

import (
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gcendtest"
	"github.com/memctl/memctl/internal/poolwire"
	"github.com/memctl/memctl/internal/safefs"
	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
)

// ownRecord reads this process's state record as memctl status does.
func ownRecord(t *testing.T) *state.Record {
	t.Helper()
	proc, err := safefs.OpenDir("/proc/self", safefs.NoSymlinks)
	require.NoError(t, err)
	defer proc.Close()
	_, b, err := proc.ReadMemfd(state.MemfdName, state.MaxSize)
	require.NoError(t, err)
	r, err := state.Parse(b)
	require.NoError(t, err)
	return r
}

// waitRecord waits up to 10 s, running a GC cycle each time, for a record
// that ok accepts.
func waitRecord(t *testing.T, what string, ok func(*state.Record) bool) *state.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := ownRecord(t)
		if ok(r) || time.Now().After(deadline) {
			require.True(t, ok(r), "%s: record %+v", what, r)
			return r
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// recordTest skips off Linux (the state record is Linux only) and restores
// GOMEMLIMIT and the process's THP flag, which Start changes, when t ends.
func recordTest(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the state record is Linux only")
	}
	prevLimit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prevLimit) })
	if prev, err := thp.Process(); err == nil {
		t.Cleanup(func() { restoreTHP(prev) })
	}
}

// The record follows the controller: Start, a trim, a skipped trim, a
// GOMEMLIMIT change and a new pool seen at the end of a GC cycle, Close.
func TestStateRecord(t *testing.T) {
	recordTest(t)
	for _, k := range []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "GOMEMLIMIT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("MEMCTL_PRESSURE", "off") // no pressure trims from other processes' PSI: the counts are exact
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Hour))
	require.NoError(t, err)
	rep := ctl.Report()
	r := ownRecord(t)
	assert.Equal(t, os.Getpid(), r.PID)
	assert.False(t, r.Closed)
	assert.Equal(t, rep.MemLimit.Source.String(), r.GoMemLimit.Source)
	assert.Equal(t, rep.MemLimit.Reason, r.GoMemLimit.Reason)
	assert.Equal(t, rep.THPPolicy.String(), r.THP.Policy)
	assert.Equal(t, rep.THPState.String(), r.THP.State)
	assert.Equal(t, 3600.0, r.Trim.DelaySeconds)
	assert.Equal(t, rep.Pressure, r.Pressure.Source)
	assert.Equal(t, rep.CHeap, r.CHeap)
	seq := r.Seq

	// A trim publishes at once, with its counters.
	_, err = ctl.trimmer.TrimNow()
	require.NoError(t, err)
	r = ownRecord(t)
	assert.Equal(t, int64(1), r.Trim.Trims)
	assert.Equal(t, ctl.Stats().Trim.TotalReleased, r.Trim.ReleasedBytes)
	assert.Greater(t, r.Seq, seq)
	// By origin (issue 17): the trim by name, nothing else.
	assert.Equal(t, int64(1), r.Trim.Origins.ByName.Trims)
	assert.Equal(t, ctl.Stats().Trim.ByName.Released, r.Trim.Origins.ByName.ReleasedBytes)
	assert.Zero(t, r.Trim.Origins.Debounced.Trims+r.Trim.Origins.Pressure.Trims+r.Trim.Origins.Spiral.Trims)
	// The C heaps (issue 21) as Stats lists them, the owner of malloc first.
	heaps := ctl.Stats().CHeaps
	require.Len(t, r.CHeaps, min(len(heaps), state.MaxCHeaps))
	for i, h := range r.CHeaps {
		assert.Equal(t, heaps[i].Allocator, h.Allocator)
		assert.Equal(t, heaps[i].Library, h.Library)
		assert.Equal(t, heaps[i].OwnsMalloc, h.OwnsMalloc)
		assert.Equal(t, heaps[i].Trimmed, h.Trimmed)
		assert.Equal(t, heaps[i].Releases, h.Releases)
	}
	// A skipped request (issue 17): counted by reason, published at once.
	trimwire.Request(ctl.trimmer, trimwire.Pressure)
	st := ctl.Stats().Trim
	r = ownRecord(t)
	assert.Equal(t, st.Pressure.Trims, r.Trim.Origins.Pressure.Trims)
	assert.Equal(t, st.Pressure.Skipped, r.Trim.Origins.Pressure.Skipped)
	assert.Equal(t, st.SkippedMinRelease, r.Trim.SkippedBy.MinRelease)
	assert.Equal(t, st.SkippedBudget, r.Trim.SkippedBy.Budget)
	assert.Equal(t, st.SkippedCost, r.Trim.SkippedBy.Cost)
	assert.Equal(t, int64(1), r.Trim.Origins.Pressure.Trims+r.Trim.Origins.Pressure.Skipped, "one request")

	// GOMEMLIMIT changed by the program and a pool opened: the next GC
	// cycle's end publishes them.
	debug.SetMemoryLimit(1 << 40)
	p, err := limits.NewPool(limits.PoolConfig{Name: "state-test", Limit: 64 << 20, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	r = waitRecord(t, "GOMEMLIMIT and the pool", func(r *state.Record) bool {
		return r.GoMemLimit.Bytes != nil && *r.GoMemLimit.Bytes == 1<<40 && len(r.Pools) > 0
	})
	var found bool
	for _, sp := range r.Pools {
		if sp.Name == "state-test" {
			found = true
			require.NotNil(t, sp.LimitBytes)
			assert.Equal(t, int64(64<<20), *sp.LimitBytes)
			assert.Equal(t, p.Mode().String(), sp.Mode)
		}
	}
	assert.True(t, found, "pools %+v", r.Pools)

	// Requests (issue 20): peaks of 1, 3 and 5 MiB and one refused at the
	// pool's 64 MiB; the next GC end publishes the counters and the
	// histogram, whose quantiles are the pool's own.
	for _, n := range []int64{1 << 20, 3 << 20, 5 << 20, 100 << 20} {
		a, err := p.Open("req", limits.Unlimited)
		require.NoError(t, err)
		_ = a.Grow(n)
		a.Close()
	}
	ps := p.Stats()
	require.Equal(t, int64(1), ps.Refused)
	r = waitRecord(t, "the pool's requests", func(r *state.Record) bool {
		for _, sp := range r.Pools {
			if sp.Name == "state-test" {
				return sp.Peaks.Count == ps.Peaks.Count && sp.Refused == 1
			}
		}
		return false
	})
	for _, sp := range r.Pools {
		if sp.Name == "state-test" {
			assert.Equal(t, ps.Peaks.Counts[:], sp.Peaks.Counts)
			assert.Equal(t, ps.Peaks.Quantile(0.5), sp.Peaks.P50Bytes)
			assert.Equal(t, ps.Peaks.Quantile(0.99), sp.Peaks.P99Bytes)
			assert.Equal(t, ps.Peaks.Quantile(1), sp.Peaks.MaxBytes)
			assert.Equal(t, ps.Peak, sp.PeakBytes)
			assert.Zero(t, sp.InFlight)
		}
	}
	p.Close()
	waitRecord(t, "the pool closed", func(r *state.Record) bool {
		for _, sp := range r.Pools {
			if sp.Name == "state-test" {
				return false
			}
		}
		return true
	})

	// Close: the last record says so and keeps the counters.
	require.NoError(t, ctl.Close())
	r = ownRecord(t)
	assert.True(t, r.Closed)
	assert.Equal(t, int64(1), r.Trim.Trims)
}

// Idle means idle: publishing happens on decisions only, so an idle
// controller's record does not change.
func TestStateRecordIdle(t *testing.T) {
	recordTest(t)
	// No pressure watch: system PSI from other processes would trim, and a
	// trim is a decision that is published.
	t.Setenv("MEMCTL_PRESSURE", "off")
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer ctl.Close()
	// Pools dropped by earlier tests leave the list at a GC end, and the
	// counters it changed are published when countersEvery ends: wait for
	// both, the events, not a time.
	gcendtest.Seen(t)
	waitNoFlush(t, ctl)
	r0 := ownRecord(t)
	time.Sleep(300 * time.Millisecond)
	gcendtest.Seen(t) // GC cycles with nothing changed publish nothing
	r1 := ownRecord(t)
	assert.Equal(t, r0.Seq, r1.Seq)
}

// waitNoFlush waits, at most 10 s, until c has no held-back counters to
// publish (its one-shot timer has fired and published, or none is armed).
func waitNoFlush(t *testing.T, c *Controller) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.rec.watchMu.Lock()
		pending := c.rec.flush != nil
		c.rec.watchMu.Unlock()
		if !pending {
			return
		}
		require.True(t, time.Now().Before(deadline), "held-back counters not published in 10 s")
	}
}

// MEMCTL=off: one record that says so, and no GC-end watch (memctl does
// nothing at all).
func TestStateRecordOff(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the state record is Linux only")
	}
	t.Setenv("MEMCTL", "off")
	before := gcend.Active()
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer ctl.Close()
	assert.Equal(t, before, gcend.Active(), "no watch while off")
	r := ownRecord(t)
	assert.True(t, r.Off)
	assert.Equal(t, "keep", r.THP.Policy)
}

// The record carries a limit the library could not see (issue 18's
// limit_unknown) as a field, and cuts the strings of a report to
// state.MaxString: a limit file or reason of 10 KiB still publishes.
func TestStateRecordLimitUnknownAndCut(t *testing.T) {
	long := strings.Repeat("/deep", 2000)
	c := &Controller{report: Report{MemLimit: limits.MemLimit{Source: limits.SourceNone, LimitUnknown: true,
		File: long, Reason: "no cgroup memory limit up to /, the top of this cgroup namespace: the limit is unknown" + long}}}
	r := c.record()
	assert.True(t, r.GoMemLimit.LimitUnknown)
	assert.LessOrEqual(t, len(r.GoMemLimit.File), state.MaxString)
	assert.LessOrEqual(t, len(r.GoMemLimit.Reason), state.MaxString)
	assert.True(t, strings.HasSuffix(r.GoMemLimit.Reason, "..."))
	r.Updated = time.Now() // as Publish sets it
	b, err := state.Encode(r)
	require.NoError(t, err)
	got, err := state.Parse(b)
	require.NoError(t, err)
	assert.True(t, got.GoMemLimit.LimitUnknown)
}

// A pool named with 100 KiB (NewPool takes any name) made the record longer
// than state.MaxSize: Publish failed and the record stayed stale. The name
// is cut and the record publishes.
func TestStateRecordLongPoolName(t *testing.T) {
	recordTest(t)
	t.Setenv("MEMCTL_PRESSURE", "off")
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Hour))
	require.NoError(t, err)
	defer ctl.Close()
	name := strings.Repeat("p", 100<<10)
	p, err := limits.NewPool(limits.PoolConfig{Name: name, Limit: 1 << 20, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Close()
	r := waitRecord(t, "the long-named pool", func(r *state.Record) bool {
		for _, sp := range r.Pools {
			if strings.HasPrefix(sp.Name, "ppp") {
				return true
			}
		}
		return false
	})
	for _, sp := range r.Pools {
		if strings.HasPrefix(sp.Name, "ppp") {
			assert.Equal(t, state.Cut(name), sp.Name)
		}
	}
}

// BenchmarkFingerprint measures what the record's GC-end watch costs each
// GC cycle with two pools open: the fingerprint of GOMEMLIMIT, the pools'
// limits, names and counters and the detectors' counters, beside the
// earlier one of GOMEMLIMIT and the pools' limits and names alone.
func BenchmarkFingerprint(b *testing.B) {
	for _, name := range []string{"bench-a", "bench-b"} {
		p, err := limits.NewPool(limits.PoolConfig{Name: name, Limit: 64 << 20, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(b, err)
		defer p.Close()
	}
	c := &Controller{}
	var sink uint64
	b.Run("record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d, n := c.fingerprint()
			sink += d + n
		}
	})
	b.Run("limits-and-names", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h := uint64(debug.SetMemoryLimit(-1))
			for _, v := range poolwire.Pools() {
				p := v.(*limits.Pool)
				h = h*31 + uint64(p.Limit()) + uint64(len(p.Name()))<<1
			}
			sink += h
		}
	})
	_ = sink
}

// The record's peak buckets are limits.PeakHistogram's: same count, same
// bounds (internal/state cannot import limits).
func TestStatePeakBucketsMatchLimits(t *testing.T) {
	require.Equal(t, len(limits.PeakHistogram{}.Counts), state.PeakCounts)
	for i := range state.PeakCounts {
		assert.Equal(t, limits.PeakBucketBound(i), state.PeakBound(i), "bucket %d", i)
	}
}

// Counters that change at every GC cycle (a request per cycle) publish at
// most once per countersEvery, not once per cycle; the last change is
// published by the one-shot timer at the end of the window, with no GC.
func TestStateRecordCountersRateLimited(t *testing.T) {
	recordTest(t)
	t.Setenv("MEMCTL_PRESSURE", "off")
	t.Setenv("MEMCTL_AUTOBURST", "off")
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)), WithTrimDelay(time.Hour))
	require.NoError(t, err)
	defer ctl.Close()
	p, err := limits.NewPool(limits.PoolConfig{Name: "rate-test", Limit: 64 << 20, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Close()
	waitRecord(t, "the pool", func(r *state.Record) bool { return len(r.Pools) > 0 })
	seq0 := ownRecord(t).Seq
	start := time.Now()
	const cycles = 40
	for range cycles {
		a, err := p.Open("req", limits.Unlimited)
		require.NoError(t, err)
		require.NoError(t, a.Grow(1<<20))
		a.Close()
		runtime.GC()
	}
	elapsed := time.Since(start)
	published := ownRecord(t).Seq - seq0
	// One per countersEvery elapsed, plus one at each end of the window.
	bound := int64(elapsed/countersEvery) + 2
	assert.LessOrEqual(t, published, bound, "%d records for %d GC cycles in %v", published, cycles, elapsed)
	t.Logf("%d records for %d cycles with a change each, in %v", published, cycles, elapsed)
	// The last count reaches the record within countersEvery with no GC
	// cycle: the one-shot timer publishes what was held back.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var count int64
		for _, sp := range ownRecord(t).Pools {
			if sp.Name == "rate-test" {
				count = sp.Peaks.Count
			}
		}
		if count == cycles {
			break
		}
		require.True(t, time.Now().Before(deadline), "the last count (%d) never reached the record without a GC", count)
		time.Sleep(20 * time.Millisecond) // polling a file; no GC is run here
	}
}
