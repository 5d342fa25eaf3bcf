package trim

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/gcendtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pressure Request with no mark in the pending period (none ever, or an
// earlier period's: found by a review of gcSinceMark), 200 MiB of garbage
// no GC has collected and a cheap GC, runs that GC. Reading the count of
// GC ends at the last mark ever seen, it took two GC ends in the process's
// life for "a GC since the mark" and a busy process, took the path
// without a GC, found 2 MiB free and was skipped.
func TestPressureRequestIgnoresAnOldPeriodsMark(t *testing.T) {
	f := &fakeStep{}
	cfg := fakeConfig(f)
	cfg.scan = func() int64 { return 1 << 20 }         // a GC of about 2 ms: cheap
	cfg.estimate = func() int64 { return 200 << 20 }   // with a GC: the uncollected garbage
	cfg.noGCEstimate = func() int64 { return 2 << 20 } // without: the free heap
	var noGC int
	cfg.noGCStep = func() (int64, int, abortReason, bool) { noGC++; return 2 << 20, 1, abortNone, false }
	tr := mustNew(t, cfg)
	defer tr.Close()
	tr.gcEnd() // two GC ends, long before the garbage; no mark in this period
	tr.gcEnd()
	r := tr.request(originPressure)
	t.Logf("%+v; steps without a GC %d", r, noGC)
	assert.True(t, r.ran, "the Request ran")
	assert.False(t, r.noGC, "with a GC")
	assert.Len(t, f.starts(), 1, "FreeOSMemory ran")
}

// A peak of the live heap left by an earlier burst that no trim ran for
// (a skip: the background scavenger had returned it) made the straddling
// GC end of the next burst look like its collection (the live heap a
// quarter under that old peak): the path without a GC, nothing free, the
// burst kept (0 of 48 MiB returned). A decision now resets the peak as a
// trim does.
func TestStalePeakAfterASkip(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory keeps RSS up after a trim")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	runtime.GC()
	cfg := testConfig{Config: Config{Delay: 250 * time.Millisecond, MaxWait: 10 * time.Second, NoCHeap: true}}
	cfg.scan = func() int64 { return 32 << 20 } // a GC of about 67 ms: not cheap
	tr, err := newT(cfg)
	require.NoError(t, err)
	defer tr.Close()
	a := burst.Alloc(128 << 20)
	runtime.GC() // sees A live: the peak
	runtime.KeepAlive(a)
	a = nil
	runtime.GC()         // collects A
	debug.FreeOSMemory() // returns it, as the background scavenger would
	require.Eventually(t, func() bool { return tr.gc.ends.Load() >= 3 }, 5*time.Second, time.Millisecond)
	tr.AfterBurst() // A's trim: nothing left to return
	require.Eventually(t, func() bool { return tr.Stats().Skipped > 0 }, 10*time.Second, 10*time.Millisecond)
	end := tr.Begin() // B in flight: the GC ends that see it do not make it the floor
	b := burst.Alloc(48 << 20)
	gcendtest.Seen(t) // sees B live, the end delivered before the drop (see TestNoGCNeedsACycleAfterTheDrop)
	runtime.KeepAlive(b)
	b = nil
	released0 := readSample().HeapReleased
	end()
	awaitMark(t, tr)
	straddle(t, tr) // the cycle that straddled B's drop ends
	require.Eventually(t, func() bool { return tr.Stats().Trims > 0 || tr.Stats().Skipped > 1 }, 20*time.Second, 10*time.Millisecond)
	s := tr.Stats()
	got := int64(readSample().HeapReleased) - int64(released0)
	t.Logf("trims %d, skipped %d (cost %d), no GC %d, released %d MiB", s.Trims, s.Skipped, s.SkippedCost, s.NoGC, got>>20)
	assert.GreaterOrEqual(t, got, int64(36<<20), "B was returned")
}
