package trim

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/stretchr/testify/assert"
)

// limiterChild, on one P, runs a GC death spiral under a tight GOMEMLIMIT
// until the GC CPU limiter turns on, lifts the limit and runs a GC that
// collects the spiral's garbage; when the limiter was turned on in that
// last cycle (/gc/limiter/last-enabled:gc-cycle equals the cycle count:
// the runtime leaves it on until the next cycle starts), it runs the Go
// step without a GC and reports what it said. It tries up to 5 times for
// a step that released nothing (the limiter still on).
func limiterChild() {
	runtime.GOMAXPROCS(1)
	live := pointerRich(32 << 20)
	defer runtime.KeepAlive(live)
	r := new(noGCReader)
	for attempt := 1; attempt <= 5; attempt++ {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		debug.SetMemoryLimit(int64(ms.HeapAlloc) + 8<<20)
		var sink [][]byte
		for t0 := time.Now(); time.Since(t0) < 3*time.Second; {
			sink = append(sink, make([]byte, 64<<10))
			if len(sink) > 256 {
				sink = sink[:0]
			}
		}
		sink = nil
		debug.SetMemoryLimit(4 << 30)
		runtime.GC()
		f := r.read()
		if f.LimiterLast != f.Cycles || f.HeapFree < 64<<20 {
			continue
		}
		released, steps, why, broken := releaseNoGC()
		if released > 0 && attempt < 5 {
			continue // the limiter had turned off: the step released
		}
		childtest.Say("ATTEMPT", attempt)
		childtest.Say("FREE", f.HeapFree)
		childtest.Say("RELEASED", released)
		childtest.Say("STEPS", steps)
		childtest.Say("WHY", why)
		childtest.Say("BROKEN", broken)
		return
	}
	childtest.Say("ATTEMPT", 0)
}

// The GC CPU limiter turned on in the last GC cycle stays on until the
// next one starts, and the allocation path releases nothing meanwhile: the
// Go step without a GC stops on the limiter, and does not take the runtime
// for one that never releases on that path (broken: every later trim would
// then force a GC). Before the fix the step read the limiter as off (its
// last-enabled cycle was not the one in progress) and said broken; seen on
// a loaded machine, where the GC workers' time off CPU counts as GC CPU.
func TestNoGCStepLimiterOnFromTheLastCycle(t *testing.T) {
	t.Parallel() // child processes only
	if testing.Short() || raceEnabled {
		t.Skip("GC death spirals of 3 s in a child")
	}
	rep := childtest.Report(t, childtest.Command(t, "limiter-last-cycle", []string{"GOGC", "GOMEMLIMIT", "GODEBUG", "GOMAXPROCS"}))
	t.Logf("child: %v", rep)
	if childtest.RequireInt(t, rep, "ATTEMPT") == 0 || childtest.RequireInt(t, rep, "RELEASED") > 0 {
		t.Skip("the limiter was never left on by the last cycle in 5 spirals: nothing to judge")
	}
	assert.Equal(t, "false", rep["BROKEN"], "the limiter explains a step that released nothing")
	assert.Equal(t, abortLimiter.String(), rep["WHY"])
}
