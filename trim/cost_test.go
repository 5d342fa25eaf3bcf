package trim

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/stretchr/testify/require"
)

// costNode is a small pointer-linked node of the live set: the part of a
// live heap the GC must trace.
type costNode struct {
	next *costNode
	_    [7]int64 // 64 bytes in all
}

// TestTrimCost measures, with 1 GiB live (960 MiB of 64 KiB buffers and
// 64 MiB of 64-byte pointer-linked nodes) and a 512 MiB burst dropped, what
// each way of returning the burst costs against a natural GC cycle: wall
// time, the CPU a trim is charged with (trimCPU: GC and scavenger CPU from
// runtime/metrics plus the calling thread's CPU), GC cycles run and RSS
// after. It needs about 2.5 GiB and a minute, so it runs only with
// MEMCTL_TRIM_COST=1:
//
//	MEMCTL_TRIM_COST=1 go test ./trim/ -run TestTrimCost -v -count 1
func TestTrimCost(t *testing.T) {
	if os.Getenv("MEMCTL_TRIM_COST") != "1" {
		t.Skip("set MEMCTL_TRIM_COST=1 to measure (about 2.5 GiB, a minute)")
	}
	if raceEnabled {
		t.Skip("the race detector distorts CPU and RSS")
	}
	prevLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prevLimit)
	live := burst.Alloc(960 << 20)
	var head *costNode
	for range (64 << 20) / 64 {
		head = &costNode{next: head}
	}
	runtime.GC()
	debug.FreeOSMemory()

	type method struct {
		name string
		pre  func()         // after the burst is dropped, not measured
		run  func() float64 // measured; returns extra GC cycles it saw fit to report, or NaN
	}
	limitTrick := func() float64 {
		// The burst was collected by the pre GC: its pages are free and
		// resident. Lower the memory limit so that the background
		// scavenger's goal (95% of the limit) lies below what is held
		// now, while the heap goal the limit implies stays above the live
		// heap (so that no GC is triggered), halving the excess at each
		// step, then restore the limit.
		defer debug.SetMemoryLimit(prevLimit)
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			h, _ := readHeap()
			if h.free < 8<<20 {
				break
			}
			// goal = 2L − ready − nonheap (runtime/mgcpacer.go
			// memoryLimitHeapGoal), less 3% headroom: with L = ready −
			// free/2 + objects/20 it is about 1.07 × the heap in use.
			l := readyBytes() - h.free/2 + h.objects/20
			debug.SetMemoryLimit(l)
			time.Sleep(100 * time.Millisecond)
		}
		return math.NaN()
	}
	methods := []method{
		{"runtime.GC() (a natural GC cycle)", nil, func() float64 { runtime.GC(); return math.NaN() }},
		{"debug.FreeOSMemory() as the trim", nil, func() float64 { debug.FreeOSMemory(); return math.NaN() }},
		{"debug.FreeOSMemory() right after a GC", runtime.GC, func() float64 { debug.FreeOSMemory(); return math.NaN() }},
		{"lower memory limit after a GC, then restore", runtime.GC, limitTrick},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "| method | wall | CPU charged | GC cycles | RSS before | RSS after |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, m := range methods {
		for rep := range 3 {
			b := burst.Alloc(512 << 20)
			runtime.KeepAlive(b)
			b = nil
			if m.pre != nil {
				m.pre()
			}
			rss0, err := procfs.RSS(0)
			require.NoError(t, err)
			gc0 := numGC()
			runtime.LockOSThread()
			c0 := readCPU()
			t0 := time.Now()
			m.run()
			wall := time.Since(t0)
			cpu := c0.charge(readCPU())
			runtime.UnlockOSThread()
			gcs := numGC() - gc0
			rss1, err := procfs.RSS(0)
			require.NoError(t, err)
			fmt.Fprintf(&table, "| %s (%d) | %v | %v | %d | %d MiB | %d MiB |\n", m.name, rep+1,
				wall.Round(time.Millisecond), cpu.Round(100*time.Microsecond), gcs, rss0>>20, rss1>>20)
			debug.FreeOSMemory() // the same start for the next
		}
	}
	t.Log("\n" + table.String())
	runtime.KeepAlive(live)
	runtime.KeepAlive(head)
}

func numGC() int64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// readyBytes is the memory the Go runtime holds and has not released:
// /memory/classes/total:bytes − /memory/classes/heap/released:bytes.
func readyBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: metricHeapReleased}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}
