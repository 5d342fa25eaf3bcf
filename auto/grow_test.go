package auto_test

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/childtest"
)

const (
	growLive = 256 << 20
	growIdle = 10 * time.Second
)

// growNode is one object of a pointer-rich heap: 64 bytes, two pointers.
type growNode struct {
	a, b *growNode
	_    [48]byte
}

// growChild is issue 26's item 1 program: memctl started (the auto
// import), then a 256 MiB pointer-rich live heap built (a cache filled at
// start), then idle for 10 s. It reports the forced GC cycles and the
// process's CPU time over the idle time, and memctl's trims and skips.
func growChild() {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	forced0 := s[0].Value.Uint64()
	size, idle := int64(growLive), growIdle
	// The full figures by hand: MEMCTL_TEST_GROW=512MiB,30s.
	if v := os.Getenv("MEMCTL_TEST_GROW"); v == "512MiB,30s" {
		size, idle = 512<<20, 30*time.Second
	}
	nodes := make([]*growNode, size/64)
	for i := range nodes {
		nodes[i] = &growNode{a: nodes[i/2], b: nodes[i/3]}
	}
	g := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/scavenge/total:cpu-seconds"}}
	metrics.Read(g)
	cycles0, gcCPU0, scav0 := g[0].Value.Uint64(), g[1].Value.Float64(), g[2].Value.Float64()
	cpu0 := cpuTime()
	time.Sleep(idle)
	cpu := cpuTime() - cpu0
	metrics.Read(g)
	childtest.Say("IDLE_GC_CYCLES", g[0].Value.Uint64()-cycles0)
	childtest.Say("IDLE_GC_CPU_NS", int64((g[1].Value.Float64()-gcCPU0)*1e9))
	childtest.Say("IDLE_SCAVENGE_CPU_NS", int64((g[2].Value.Float64()-scav0)*1e9))
	metrics.Read(s)
	runtime.KeepAlive(nodes)
	st := memctl.CurrentStats()
	childtest.Say("FORCED", s[0].Value.Uint64()-forced0)
	childtest.Say("IDLE_CPU_NS", int64(cpu))
	childtest.Say("TRIMS", st.Trim.Trims)
	childtest.Say("SKIPPED", st.Trim.Skipped)
	childtest.Say("ESTIMATE", st.Trim.LastEstimate)
	childtest.Say("BURSTS", st.AutoBurst.Bursts)
}

// Issue 26 item 1: a heap that only grew is not a burst to trim. memctl
// started, a 256 MiB pointer-rich live heap built, 10 s idle (the issue's
// figure is 512 MiB and 30 s; see the report of this change for that
// run): no forced GC cycle, and the CPU over the idle time within 2% of one
// CPU of the same program with MEMCTL_AUTOBURST=off, run after it. The GC
// cycle that the build started may end inside the idle time of either arm
// (more often on a loaded machine, where marking the heap takes longer):
// its CPU is the runtime's, not memctl's, and larger than the bound, so
// the CPU is compared only where no GC cycle ran in either arm's idle
// time; the pair is run once more when one did, and the test skips,
// saying so, when it did again.
func TestGrownHeapIsNotTrimmed(t *testing.T) {
	skipLong(t)
	for attempt := 1; ; attempt++ {
		auto := childtest.Report(t, childtest.Command(t, "grow", childEnv, "MEMCTL_PRESSURE=off"))
		off := childtest.Report(t, childtest.Command(t, "grow", childEnv, "MEMCTL_PRESSURE=off", "MEMCTL_AUTOBURST=off"))
		t.Logf("auto: %v; MEMCTL_AUTOBURST=off: %v", auto, off)
		assert.Zero(t, num(t, auto, "FORCED"), "no forced GC cycle")
		assert.Zero(t, num(t, auto, "TRIMS"), "no trim")
		if a, o := num(t, auto, "IDLE_GC_CYCLES"), num(t, off, "IDLE_GC_CYCLES"); a+o > 0 {
			if attempt < 2 {
				continue
			}
			t.Skipf("a GC cycle of the built heap ended in the idle time again (auto %d, control %d; CPU %v and %v): the runtime's CPU, not memctl's, so the comparison says nothing",
				a, o, time.Duration(num(t, auto, "IDLE_CPU_NS")), time.Duration(num(t, off, "IDLE_CPU_NS")))
		}
		diff := time.Duration(num(t, auto, "IDLE_CPU_NS") - num(t, off, "IDLE_CPU_NS"))
		assert.LessOrEqual(t, diff, growIdle/50, "CPU within 2%% of one CPU of the control")
		return
	}
}
