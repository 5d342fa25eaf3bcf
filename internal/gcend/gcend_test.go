package gcend

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitFor runs GC cycles until cond holds or a few seconds pass.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met after GC cycles")
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestSubscribeRunsAtGCEnd(t *testing.T) {
	var a, b atomic.Int64
	sa := Subscribe(func(*Sample) bool { a.Add(1); return true })
	sb := Subscribe(func(*Sample) bool { b.Add(1); return b.Load() < 3 })
	waitFor(t, func() bool { return a.Load() >= 5 })
	require.Equal(t, int64(3), b.Load(), "a subscriber that returns false is not called again")
	sa.Stop()
	sa.Stop() // idempotent
	sb.Stop()
	require.Equal(t, 0, Active())
	n := a.Load()
	for range 3 {
		runtime.GC()
	}
	drain(t)
	require.Equal(t, n, a.Load(), "no call after Stop")
}

func TestNoSubscriberNoHook(t *testing.T) {
	require.Equal(t, 0, Active())
	c := Cycles()
	for range 3 {
		runtime.GC()
	}
	drain(t)
	require.Equal(t, c, Cycles(), "the hook is disarmed with no subscriber")
}

// drain waits until every cleanup queued so far (those of the GC cycles
// that have ended) has run: /gc/cleanups/executed:cleanups reaches
// /gc/cleanups/queued:cleanups as read now. The runtime counts a block of
// cleanups as executed once all of them have returned.
func drain(t *testing.T) {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/cleanups/queued:cleanups"}, {Name: "/gc/cleanups/executed:cleanups"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Skip("this runtime has no /gc/cleanups metrics (Go 1.25)")
	}
	queued := s[0].Value.Uint64()
	deadline := time.Now().Add(10 * time.Second) // a bound on a hang, not a timing
	for s[1].Value.Uint64() < queued {
		if time.Now().After(deadline) {
			t.Fatalf("cleanups queued %d, executed %d after 10 s", queued, s[1].Value.Uint64())
		}
		runtime.Gosched()
		metrics.Read(s)
	}
}

// A last Stop after a GC cycle had queued the sentinel's cleanup cannot
// cancel it (runtime.Cleanup.Stop has no effect then). A Subscribe before
// that cleanup ran armed a second sentinel, and the stale cleanup re-armed
// its own: two sentinels, every subscriber called twice per GC end with
// the same figures (a trim.Trimmer then saw the live heap of one GC as
// that of the last two; trim's TestRequestEstimateFloor failed on a loaded
// machine). The stale cleanup must do nothing.
func TestStopThenSubscribeLeavesOneSentinel(t *testing.T) {
	require.Equal(t, 0, Active())
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // only the test's GC cycles
	held, gate := make(chan uint64, 1), make(chan struct{})
	var first atomic.Bool
	mu.Lock()
	cleanup = func(g uint64) {
		if first.CompareAndSwap(false, true) {
			held <- g
			<-gate
		}
		cycle(g)
	}
	mu.Unlock()
	defer func() { mu.Lock(); cleanup = nil; mu.Unlock() }()

	s1 := Subscribe(func(*Sample) bool { return true })
	runtime.GC()
	<-held // the first sentinel's cleanup is queued and held back
	s1.Stop()
	var calls atomic.Int64
	s2 := Subscribe(func(*Sample) bool { calls.Add(1); return true })
	defer s2.Stop()
	close(gate)
	drain(t)
	require.Zero(t, calls.Load(), "the GC that freed the stopped sentinel ended before the Subscribe")
	for i := range int64(3) {
		runtime.GC()
		drain(t)
		require.Equal(t, i+1, calls.Load(), "one call per GC end")
	}
}

// The next sentinel is armed before the subscribers run, so a GC cycle
// that ends while they run is seen (the hook used to arm it after them,
// and missed that cycle), and the subscribers of two GC ends never run at
// once, even with the several cleanup goroutines of a larger GOMAXPROCS.
func TestGCEndWhileSubscribersRun(t *testing.T) {
	require.Equal(t, 0, Active())
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // only the test's GC cycles
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))  // two cleanup goroutines
	in, gate := make(chan struct{}, 1), make(chan struct{})
	var calls, inside, overlaps atomic.Int64
	s := Subscribe(func(*Sample) bool {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer inside.Add(-1)
		if calls.Add(1) == 1 {
			in <- struct{}{}
			<-gate
		}
		return true
	})
	defer s.Stop()
	runtime.GC()
	<-in         // the first GC end's call is running, held
	runtime.GC() // ends while it runs
	close(gate)
	deadline := time.Now().Add(10 * time.Second) // a bound on a hang, not a timing
	for calls.Load() < 2 {
		require.True(t, time.Now().Before(deadline), "the GC end during the subscriber was missed")
		runtime.Gosched()
	}
	drain(t)
	require.Equal(t, int64(2), calls.Load(), "one call per GC end")
	require.Zero(t, overlaps.Load(), "subscribers of two GC ends ran at once")
}

// Every subscriber of a GC end sees the one sample read at it: the cycle
// that ended and GOMEMLIMIT as the runtime has them.
func TestSampleAtGCEnd(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(1 << 40))
	got := make(chan Sample, 4)
	s := Subscribe(func(s *Sample) bool {
		select {
		case got <- *s:
		default:
		}
		return true
	})
	defer s.Stop()
	before := Sample{}
	var r Reader
	r.Read(&before)
	runtime.GC()
	var first Sample
	select {
	case first = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no GC end seen in 10 s")
	}
	assert.Greater(t, first.Cycles, before.Cycles)
	assert.Positive(t, first.Live)
	assert.GreaterOrEqual(t, first.Goal, first.Live)
	assert.Equal(t, int64(1<<40), first.GoMemLimit)
	assert.Greater(t, first.Total, first.HeapReleased, "the runtime maps more than it released")
	assert.Zero(t, testing.AllocsPerRun(100, func() { r.Read(&before) }), "a read allocates nothing")
}

// Cycles reports how many GC-cycle ends the hook has seen.
func Cycles() uint64 { return cycles.Load() }
