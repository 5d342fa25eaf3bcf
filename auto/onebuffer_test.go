package auto_test

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/childtest"
)

const oneBuffer = 150 << 20

// oneBufferChild is a new user's first trial (only the auto import): one
// request holds one 150 MiB buffer with no pointers (a []int64, each page
// touched) over an 8 MiB live heap, and drops it; no GC runs after the
// drop, so the GC that saw the buffer saw it live. It reports VmRSS
// before, at the peak and 4 s after the drop (later if the due trim has
// not run by then), and the forced GC cycles.
func oneBufferChild() {
	live := burst.Alloc(8 << 20)
	time.Sleep(500 * time.Millisecond)
	before, nonHeapBefore := rss(), nonHeap()
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	forced0 := s[0].Value.Uint64()
	cycles0, seen0 := gcSeen()
	buf := make([]int64, oneBuffer/8)
	for i := range buf {
		buf[i] = int64(i)
	}
	peak := rss()
	runtime.KeepAlive(buf)
	buf = nil
	atDrop := memctl.CurrentStats().Trim
	cyclesAtDrop, _ := gcSeen()
	var gs0 debug.GCStats
	debug.ReadGCStats(&gs0)
	childtest.Say("DROP_AFTER_LAST_GC", time.Since(gs0.LastGC).Round(time.Millisecond))
	childtest.Say("DECIDED_BEFORE_DROP", atDrop.Trims+atDrop.Skipped)
	time.Sleep(4 * time.Second)
	pending := waitDueTrim(gs0.LastGC)
	after, nonHeapAfter := rss(), nonHeap()
	runtime.KeepAlive(live)
	metrics.Read(s)
	st := memctl.CurrentStats()
	_, seen := gcSeen()
	childtest.Say("GC_CYCLES_WITH", cyclesAtDrop-cycles0)
	childtest.Say("GC_ENDS_SEEN_SINCE", seen-seen0)
	childtest.Say("BEFORE", before)
	childtest.Say("PEAK", peak)
	childtest.Say("AFTER", after)
	childtest.Say("NONHEAP_GROWTH", nonHeapAfter-nonHeapBefore)
	childtest.Say("FORCED", s[0].Value.Uint64()-forced0)
	childtest.Say("TRIMS", st.Trim.Trims)
	childtest.Say("BURSTS", st.AutoBurst.Bursts)
	childtest.Say("PENDING", pending)
}

// A burst the detector saw whose garbage no GC has collected (one large
// buffer, live at the GC that saw it) is trimmed when its GC is cheap (a
// heap with little to scan): 4 s after the drop (once the due trim has
// run, on a loaded machine), RSS is back to before
// plus the runtime's non-heap growth and 2 MiB (the contract of
// TestImportTrimsBurstWithoutAfterBurst), while the MEMCTL_AUTOBURST=off
// control, run after it, still holds more than half the buffer. The
// expensive case (a pointer-rich heap that only grew) is
// TestGrownHeapIsNotTrimmed: no forced GC there.
func TestImportTrimsOneUncollectedBuffer(t *testing.T) {
	skipLong(t)
	auto := childtest.Report(t, childtest.Command(t, "onebuffer", childEnv, "MEMCTL_PRESSURE=off"))
	off := childtest.Report(t, childtest.Command(t, "onebuffer", childEnv, "MEMCTL_PRESSURE=off", "MEMCTL_AUTOBURST=off"))
	t.Logf("auto: %v; MEMCTL_AUTOBURST=off: %v", auto, off)
	assert.Greater(t, num(t, off, "AFTER"), num(t, off, "BEFORE")+oneBuffer/2, "the control keeps its buffer")
	assert.Zero(t, num(t, off, "TRIMS"))
	skipIfScenarioMissed(t, auto, "buffer")
	assert.Equal(t, "false", auto["PENDING"], "the due trim ran within the max wait")
	assert.Equal(t, int64(1), num(t, auto, "BURSTS"), "the detector saw the buffer")
	assert.Equal(t, int64(1), num(t, auto, "FORCED"), "one GC, the trim's")
	assert.LessOrEqual(t, num(t, auto, "AFTER"), num(t, auto, "BEFORE")+num(t, auto, "NONHEAP_GROWTH")+2<<20,
		"RSS before + the runtime's non-heap growth + 2 MiB: the buffer is returned")
}
