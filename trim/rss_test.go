package trim

import (
	"github.com/memctl/memctl/internal/burst"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childtest.EnvVar) != "" {
		childtest.Main(m, map[string]func(){
			"burst-trim":         func() { burstChild(true) },
			"burst-notrim":       func() { burstChild(false) },
			"lazy":               lazyChild,
			"throttled":          throttledChild,
			"load-nogc":          func() { loadChild(false) },
			"load-freeosmemory":  func() { loadChild(true) },
			"limiter-last-cycle": limiterChild,
		})
	}
	goleak.VerifyTestMain(m)
}

const (
	liveBytes  = 20 << 20
	burstBytes = 256 << 20
	settle     = 3 * time.Second
)

func childRSS() int64 {
	r, err := procfs.RSS(0)
	if err != nil {
		childtest.Fail("%v", err)
	}
	return r
}

// burstChild holds 20 MiB live, allocates and drops a 256 MiB burst, calls
// AfterBurst on a Trimmer with the default Config when trim is set, waits
// 3 s (with a Trimmer, and until its trim is decided) and reports VmRSS
// before the burst, at its peak and then.
func burstChild(trim bool) {
	live := burst.Alloc(liveBytes)
	var tr *Trimmer
	if trim {
		var err error
		if tr, err = New(Config{}); err != nil {
			childtest.Fail("%v", err)
		}
	}
	before := childRSS()
	burst := burst.Alloc(burstBytes)
	peak := childRSS()
	runtime.KeepAlive(burst) // dropped from here on
	t0 := time.Now()
	tr.AfterBurst()
	// With a Trimmer, until its trim is decided (a loaded machine may run
	// it late), up to the max wait and a delay more; in each arm at least
	// settle.
	for s := tr.Stats(); tr != nil && s.Trims+s.Skipped == 0 && time.Since(t0) < tr.MaxWait()+tr.Delay(); s = tr.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Until(t0.Add(settle)))
	after := childRSS()
	runtime.KeepAlive(live)
	s := tr.Stats()
	if err := tr.Close(); err != nil {
		childtest.Fail("%v", err)
	}
	childtest.Say("BEFORE", before)
	childtest.Say("PEAK", peak)
	childtest.Say("AFTER", after)
	childtest.Say("TRIMS", s.Trims)
	childtest.Say("SKIPPED", s.Skipped)
	childtest.Say("RELEASED", s.TotalReleased)
	childtest.Say("ESTIMATE", s.LastEstimate)
	childtest.Say("TOOK", int64(s.LastDuration))
	childtest.Say("CHEAP", s.CHeapAllocator)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// lazyChild drops a 256 MiB burst, runs TrimNow and reports what the
// Trimmer says and what VmRSS and LazyFree say.
func lazyChild() {
	tr, err := New(Config{NoCHeap: true})
	if err != nil {
		childtest.Fail("%v", err)
	}
	defer tr.Close()
	before := childRSS()
	b := burst.Alloc(burstBytes)
	runtime.KeepAlive(b)
	b = nil
	if _, err := tr.TrimNow(); err != nil {
		childtest.Fail("%v", err)
	}
	s := tr.Stats()
	childtest.Say("BEFORE", before)
	childtest.Say("AFTER", childRSS())
	childtest.Say("LAZYFREE", lazyFreeBytes())
	childtest.Say("LAZY", s.Lazy)
	childtest.Say("WHY", s.LazyReason)
	childtest.Say("RELEASED", s.LastReleased)
	childtest.Say("LAZY_RELEASED", s.LastLazy)
}

// Issue 13 input 6: under GODEBUG=madvdontneed=0 the trim releases with
// MADV_FREE, RSS stays up, and the Trimmer says so: Stats.Lazy, and the
// bytes released lazily counted apart. With the default, nothing is lazy.
func TestLazyReleaseRSS(t *testing.T) {
	t.Parallel() // child processes only
	if runtime.GOOS != "linux" {
		t.Skip("reads VmRSS and LazyFree from /proc: Linux only")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS say nothing")
	}
	if _, err := os.Stat("/proc/self/smaps_rollup"); err != nil {
		t.Skipf("needs /proc/self/smaps_rollup (Linux 4.14): %v", err)
	}
	num := func(r map[string]string, k string) int64 {
		t.Helper()
		return childtest.RequireInt(t, r, k)
	}
	unset := []string{"GOGC", "GOMEMLIMIT", "GODEBUG"}
	reps := reportsAtOnce(t, childtest.Command(t, "lazy", unset, "GODEBUG=madvdontneed=0"), childtest.Command(t, "lazy", unset))
	lazy, eager := reps[0], reps[1]
	for name, r := range map[string]map[string]string{"madvdontneed=0": lazy, "default": eager} {
		t.Logf("%s: RSS before %.1f MiB, after the trim %.1f MiB, LazyFree %.1f MiB; Stats: lazy %s (%s), released %.1f MiB, of which lazily %.1f MiB",
			name, mib(num(r, "BEFORE")), mib(num(r, "AFTER")), mib(num(r, "LAZYFREE")), r["LAZY"], r["WHY"],
			mib(num(r, "RELEASED")), mib(num(r, "LAZY_RELEASED")))
	}
	assert.Equal(t, "true", lazy["LAZY"])
	assert.Equal(t, "GODEBUG=madvdontneed=0", lazy["WHY"])
	assert.Greater(t, num(lazy, "AFTER"), num(lazy, "BEFORE")+200<<20, "RSS stays up without memory pressure")
	assert.Greater(t, num(lazy, "LAZY_RELEASED"), int64(200<<20), "the burst counted as released lazily")
	assert.LessOrEqual(t, num(lazy, "LAZY_RELEASED"), num(lazy, "RELEASED"))

	assert.Equal(t, "false", eager["LAZY"])
	assert.Zero(t, num(eager, "LAZY_RELEASED"))
	assert.Less(t, num(eager, "AFTER"), num(eager, "BEFORE")+32<<20, "the default returns the burst at once")
}

// TestTrimRSS runs the burst in two child processes, with and without
// AfterBurst, and compares their RSS 3 s after the burst.
func TestTrimRSS(t *testing.T) {
	t.Parallel() // child processes only
	if runtime.GOOS != "linux" {
		t.Skip("reads VmRSS from /proc: Linux only")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory (2-3x the heap) is not returned by a trim, so RSS says nothing")
	}
	if testing.Short() {
		t.Skip("runs two 3.5 s child processes")
	}
	unset := []string{"GOGC", "GOMEMLIMIT", "GODEBUG"}
	reports := reportsAtOnce(t, childtest.Command(t, "burst-trim", unset), childtest.Command(t, "burst-notrim", unset))
	num := func(r map[string]string, k string) int64 {
		t.Helper()
		return childtest.RequireInt(t, r, k)
	}
	with, without := reports[0], reports[1]
	for _, arm := range []struct {
		name string
		r    map[string]string
	}{{"AfterBurst", with}, {"plain", without}} {
		t.Logf("%-10s RSS before %.1f MiB, peak %.1f MiB, 3 s after %.1f MiB",
			arm.name, mib(num(arm.r, "BEFORE")), mib(num(arm.r, "PEAK")), mib(num(arm.r, "AFTER")))
	}
	t.Logf("trim: %s trims, %s skipped, released %.1f MiB (estimate %.1f MiB) in %v, C heap %q",
		with["TRIMS"], with["SKIPPED"], mib(num(with, "RELEASED")), mib(num(with, "ESTIMATE")),
		time.Duration(num(with, "TOOK")), with["CHEAP"])

	assert.Greater(t, num(with, "PEAK"), num(with, "BEFORE")+200<<20, "the burst is resident at its peak")
	assert.LessOrEqual(t, num(with, "AFTER"), num(with, "BEFORE")+32<<20,
		"with AfterBurst, RSS after the trim is within 32 MiB of RSS before it")
	assert.Equal(t, int64(1), num(with, "TRIMS"))
	assert.Equal(t, int64(0), num(with, "SKIPPED"))
	assert.Greater(t, num(with, "RELEASED"), int64(200<<20))
	assert.Greater(t, num(without, "AFTER"), int64(200<<20),
		"without AfterBurst, RSS 3 s after the burst is still above 200 MiB")
}
