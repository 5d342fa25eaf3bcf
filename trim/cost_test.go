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
// MEMCTL_TEST_TRIM_COST=1:
//
//	MEMCTL_TEST_TRIM_COST=1 go test ./trim/ -run TestTrimCost -v -count 1
func TestTrimCost(t *testing.T) {
	if os.Getenv("MEMCTL_TEST_TRIM_COST") != "1" {
		t.Skip("set MEMCTL_TEST_TRIM_COST=1 to measure (about 2.5 GiB, a minute)")
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
			h := readSample()
			if h.HeapFree < 8<<20 {
				break
			}
			// goal = 2L − ready − nonheap (runtime/mgcpacer.go
			// memoryLimitHeapGoal), less 3% headroom: with L = ready −
			// free/2 + objects/20 it is about 1.07 × the heap in use.
			l := readyBytes() - h.HeapFree/2 + h.HeapObjects/20
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
			c0 := readCPU(true)
			t0 := time.Now()
			m.run()
			wall := time.Since(t0)
			cpu := c0.charge(readCPU(false))
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
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}

// scanNode is the pointer-rich live heap of TestScanCost (and of issue
// 17's case 1): two pointers and 48 bytes.
type scanNode struct {
	a, b *scanNode
	_    [48]byte
}

// TestScanCost measures the figures behind the cost rule (see
// releasePerCPUSecond and defaultScanCost): the GC CPU of a full GC
// (runtime.GC, as the trim's FreeOSMemory runs one) with about 1 GiB live,
// first as 64 KiB []byte objects (nothing to scan), then as 16.7M nodes of
// two pointers and 48 bytes, against /gc/scan/total:bytes. It needs about
// 2 GiB and half a minute, so it runs only with MEMCTL_TEST_SCAN_COST=1:
//
//	MEMCTL_TEST_SCAN_COST=1 go test ./trim/ -run TestScanCost -v -count 1
func TestScanCost(t *testing.T) {
	if os.Getenv("MEMCTL_TEST_SCAN_COST") != "1" {
		t.Skip("set MEMCTL_TEST_SCAN_COST=1 to measure (about 2 GiB, half a minute)")
	}
	if raceEnabled {
		t.Skip("the race detector distorts CPU")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	gcCPU := func() time.Duration {
		s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
		metrics.Read(s)
		return time.Duration(s[0].Value.Float64() * 1e9)
	}
	measure := func(name string) (cost time.Duration, scan int64) {
		runtime.GC()
		for i := range 3 {
			c0, m0 := gcCPU(), readCPU(true)
			runtime.GC()
			c, m1 := gcCPU()-c0, readCPU(false)
			scan = scanBytes()
			h := readSample()
			// The charge of a trim: GC CPU, at most the process's CPU (the
			// GC figure counts workers' time off CPU on a loaded machine).
			ch := m0.charge(m1)
			t.Logf("%s: GC %d: %v of GC CPU, %v charged (process CPU %v), live %d MiB, scannable %d MiB",
				name, i, c, ch, m1.process-m0.process, h.Live>>20, scan>>20)
			cost = max(cost, ch)
		}
		return cost, scan
	}
	var bufs [][]byte
	for range 16384 {
		bufs = append(bufs, make([]byte, 64<<10))
	}
	noscan, _ := measure("1 GiB of 64 KiB []byte")
	runtime.KeepAlive(bufs)
	bufs = nil
	var head *scanNode
	for i := range 16_700_000 {
		x := &scanNode{a: head}
		if i%3 == 0 && head != nil {
			x.b = head.a
		}
		head = x
	}
	rich, scan := measure("1 GiB of 16.7M two-pointer nodes")
	runtime.KeepAlive(head)
	t.Logf("charged CPU per scannable byte: %.1f ns (defaultScanCost %v); noscan heap %v, pointer-rich %v: %.0fx",
		float64(rich)/float64(scan), defaultScanCost, noscan, rich, float64(rich)/float64(max(noscan, 1)))
	require.Greater(t, rich, 10*noscan, "the GC's cost follows the pointers, not the bytes")
}
