package auto_test

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/childtest"
)

const (
	oneBuffer = 150 << 20
	// trimMinRelease is trim.Config.MinRelease's default (8 MiB), which
	// the auto import runs with: the releasable bytes a trim's step
	// deems too few to act on, and so what a trim may leave resident.
	trimMinRelease = 8 << 20
)

// heapInUse returns the Go heap's bytes in use: objects (collected or
// not), the free space inside their spans, and goroutine stacks, which
// no trim returns. The heap's free pages, what a trim returns, are not
// in it.
func heapInUse() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	var n int64
	for _, x := range s {
		n += int64(x.Value.Uint64())
	}
	return n
}

// heapFree returns the Go heap's free pages not yet returned to the OS.
func heapFree() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// oneBufferChild is a new user's first trial (only the auto import): one
// request holds one 150 MiB buffer with no pointers (a []int64, each page
// touched) over an 8 MiB live heap, and drops it; no GC runs after the
// drop, so the GC that saw the buffer saw it live. It reports VmRSS
// before, at the peak and 4 s after the drop (later if the due trim has
// not run by then), the Go heap in use and free at before and after, and
// the forced GC cycles.
func oneBufferChild() {
	live := burst.Alloc(8 << 20)
	time.Sleep(500 * time.Millisecond)
	before, nonHeapBefore, inUseBefore, freeBefore := rss(), nonHeap(), heapInUse(), heapFree()
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
	lastGC := sayDrop()
	cyclesAtDrop, _ := gcSeen()
	time.Sleep(4 * time.Second)
	pending := waitDueTrim(lastGC)
	after, nonHeapAfter, inUseAfter, freeAfter := rss(), nonHeap(), heapInUse(), heapFree()
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
	childtest.Say("HEAP_INUSE_GROWTH", inUseAfter-inUseBefore)
	childtest.Say("HEAP_FREE_BEFORE", freeBefore)
	childtest.Say("HEAP_FREE_AFTER", freeAfter)
	childtest.Say("FORCED", s[0].Value.Uint64()-forced0)
	childtest.Say("TRIMS", st.Trim.Trims)
	childtest.Say("BURSTS", st.AutoBurst.Bursts)
	childtest.Say("PENDING", pending)
	childtest.Say("EARLY_STARTS", st.Trim.EarlyStarts)
}

// A burst the detector saw whose garbage no GC has collected (one large
// buffer, live at the GC that saw it) is trimmed when its GC is cheap (a
// heap with little to scan): 4 s after the drop (once the due trim has
// run, on a loaded machine), RSS is back to before plus what no trim
// returns, the runtime's non-heap growth and the growth of the Go heap in
// use (objects, their spans' free space, stacks), plus the trim's
// MinRelease (8 MiB by default: the releasable bytes a trim's step deems
// too few to act on); the buffer itself is not in the heap in use, as
// its GC collected it. The MEMCTL_AUTOBURST=off control, run after it,
// still holds more than half the buffer. The expensive case (a
// pointer-rich heap that only grew) is TestGrownHeapIsNotTrimmed: no
// forced GC there.
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
	const m = 1 << 20
	t.Logf("auto: RSS %.1f MiB above before; non-heap growth %.1f MiB, heap in use growth %.1f MiB, heap free %.1f MiB before and %.1f MiB after; MinRelease %d MiB",
		float64(num(t, auto, "AFTER")-num(t, auto, "BEFORE"))/m, float64(num(t, auto, "NONHEAP_GROWTH"))/m, float64(num(t, auto, "HEAP_INUSE_GROWTH"))/m,
		float64(num(t, auto, "HEAP_FREE_BEFORE"))/m, float64(num(t, auto, "HEAP_FREE_AFTER"))/m, trimMinRelease>>20)
	// Were the buffer still in the heap in use (no GC collected it), the
	// bound below would hold whatever the trim did.
	assert.Less(t, num(t, auto, "HEAP_INUSE_GROWTH"), int64(oneBuffer/2), "the trim's GC collected the buffer")
	assert.LessOrEqual(t, num(t, auto, "AFTER"), num(t, auto, "BEFORE")+max(num(t, auto, "NONHEAP_GROWTH"), 0)+max(num(t, auto, "HEAP_INUSE_GROWTH"), 0)+trimMinRelease,
		"RSS before + the runtime's non-heap growth + the heap in use's growth + the trim's MinRelease: the buffer is returned")
}
