//go:build linux && cgo

package cheap_test

import (
	"os"
	"runtime/metrics"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/trim/cheap"
	"github.com/memctl/memctl/trim/cheap/internal/cburst"
)

// Issue 34 item 2: a C heap burst with memctl.Start() alone. 8 C threads
// each malloc 1,600 × 64 KiB, write them and free all but one in 64; the
// Go heap is flat. The C heap is looked at on GC ends (at most once a
// second), so the child makes 4 MiB/s of small Go garbage, as a serving
// process does: a GC end about every second. A process that allocates
// nothing in Go is looked at by the runtime's forced GC, 2 minutes at the
// latest after the burst.
const (
	cBurstThreads = 8
	cBurstBlocks  = 1600
	cBurstSize    = 64 << 10
	cBurstKeep    = 64
	cBurstAfter   = 5 * time.Second // the bound, from the last free
	cBurstHang    = 30 * time.Second
	cBurstShare   = 0.10 // the share of the burst that may stay resident
	cSteadyFor    = 30 * time.Second
)

// cBurstEnv is what the parent clears in the children of these tests.
var cBurstEnv = []string{"LD_PRELOAD", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "GOGC", "GOMEMLIMIT", "AUTOMEMLIMIT", "GODEBUG",
	"MEMCTL", "MEMCTL_AUTOBURST", "MEMCTL_TRIM_DELAY", "MEMCTL_THP", "MEMCTL_PRESSURE", "MEMCTL_ARENA_MAX"}

func vmRSS() int64 {
	n, err := procfs.RSS(0)
	if err != nil {
		childtest.Fail("%v", err)
	}
	return n
}

// startMemctl runs memctl.Start and the Go garbage, and returns what stops
// both.
func startMemctl() (stop func()) {
	c, err := memctl.Start()
	if err != nil {
		childtest.Fail("%v", err)
	}
	done := make(chan struct{})
	go burst.Garbage(4<<20, done)
	time.Sleep(2 * time.Second) // Start's own work done
	return func() {
		close(done)
		c.Close()
	}
}

// childCBurstStart runs the burst and reports VmRSS before it, after its
// last free and cBurstAfter later, and memctl's trims.
func childCBurstStart() {
	defer startMemctl()()
	gcs := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	before := vmRSS()
	if err := cburst.Burst(cBurstThreads, cBurstBlocks, cBurstSize, cBurstKeep); err != nil {
		childtest.Fail("%v", err)
	}
	t0 := time.Now()
	metrics.Read(gcs)
	gc0 := gcs[0].Value.Uint64()
	peak := vmRSS()
	// The C heap is looked at on GC ends, and a loaded machine may run the
	// due trim later (up to the max wait): with the detector on, RSS is
	// read cBurstAfter after the free or once the trim has run, whichever
	// is later (cBurstHang bounds a hang).
	on := os.Getenv("MEMCTL_AUTOBURST") != "off"
	trimAt, gcAt := time.Duration(-1), time.Duration(-1)
	for {
		el := time.Since(t0)
		if gcAt < 0 {
			if metrics.Read(gcs); gcs[0].Value.Uint64() > gc0 {
				gcAt = el
			}
		}
		if trimAt < 0 && memctl.CurrentStats().Trim.Trims > 0 {
			trimAt = el
		}
		if el >= cBurstAfter && (!on || trimAt >= 0 || el >= cBurstHang) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	after := vmRSS()
	childtest.Say("AFTER_MS", time.Since(t0).Milliseconds())
	childtest.Say("FIRST_GC_MS", gcAt.Milliseconds())
	metrics.Read(gcs)
	s := memctl.CurrentStats()
	childtest.Say("ALLOCATOR", s.Trim.CHeapAllocator)
	childtest.Say("BEFORE", before)
	childtest.Say("PEAK", peak)
	childtest.Say("AFTER", after)
	childtest.Say("GCS", gcs[0].Value.Uint64()-gc0)
	childtest.Say("TRIM_AFTER_MS", trimAt.Milliseconds())
	childtest.Say("TRIMS", s.Trim.Trims)
	childtest.Say("RELEASED", s.Trim.TotalReleased)
	childtest.Say("C_BURSTS", s.AutoBurst.CBursts)
	childtest.Say("C_FREE", s.AutoBurst.CFree)
	cburst.FreeKept()
}

// childCSteady churns about 20 MiB/s in the C heap with no burst
// (cburst.Steady: a ring of 20 MiB live) for cSteadyFor and reports the
// trims and the process's CPU time over it.
func childCSteady() {
	defer startMemctl()()
	s0 := memctl.CurrentStats()
	cpu0, t0 := processCPU(), time.Now()
	if err := cburst.Steady(cSteadyFor, 6, 600); err != nil {
		childtest.Fail("%v", err)
	}
	cpu, wall := processCPU()-cpu0, time.Since(t0)
	s := memctl.CurrentStats()
	childtest.Say("ALLOCATOR", s.Trim.CHeapAllocator)
	childtest.Say("CPU_NS", cpu.Nanoseconds())
	childtest.Say("WALL_NS", wall.Nanoseconds())
	childtest.Say("TRIMS", s.Trim.Trims-s0.Trim.Trims)
	childtest.Say("TRIM_CPU_NS", (s.Trim.TotalCPU - s0.Trim.TotalCPU).Nanoseconds())
	childtest.Say("C_BURSTS", s.AutoBurst.CBursts-s0.AutoBurst.CBursts)
	childtest.Say("C_FREE", s.AutoBurst.CFree)
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		childtest.Fail("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func init() {
	cheap.ExtraChildren["cburst-start"] = childCBurstStart
	cheap.ExtraChildren["csteady-start"] = childCSteady
}

// skipRSS skips a test that reads RSS or CPU time where they say nothing.
func skipRSS(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("a long real-effect test: skipped in -short")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS and timing say nothing")
	}
	if os.Getenv("LD_PRELOAD") != "" {
		t.Skip("LD_PRELOAD is set for the tests themselves")
	}
}

// Issue 34 item 2: with memctl.Start() alone, VmRSS cBurstAfter after the
// burst's last free is at most the RSS before it and cBurstShare of the
// burst, for glibc and for jemalloc through its own stats; the same
// program with MEMCTL_AUTOBURST=off, run at the same time, keeps more
// than that, so the bound measures the detection.
func TestCHeapBurstFoundWithoutCode(t *testing.T) {
	skipRSS(t)
	for _, tc := range []struct{ name, so, why string }{
		{"glibc", "", ""},
		{"jemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", ""},
		{"mimalloc", "", "mimalloc does not tell its free bytes (the C step's estimate is unknown): its C heap bursts are not found without AfterBurst"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.why != "" {
				t.Skip(tc.why)
			}
			env := []string{"MEMCTL_PRESSURE=off"}
			if tc.so != "" {
				if _, err := os.Stat(tc.so); err != nil {
					t.Skipf("%s is missing (install its Debian package): %v", tc.so, err)
				}
				env = append(env, "LD_PRELOAD="+tc.so)
			}
			reps := childtest.Reports(t,
				childtest.Command(t, "cburst-start", cBurstEnv, env...),
				childtest.Command(t, "cburst-start", cBurstEnv, append(env, "MEMCTL_AUTOBURST=off")...))
			for i, name := range []string{"Start()", "MEMCTL_AUTOBURST=off"} {
				r := reps[i]
				num := func(k string) int64 { return childtest.RequireInt(t, r, k) }
				before, peak, after := num("BEFORE"), num("PEAK"), num("AFTER")
				t.Logf("%s, %s: VmRSS %.0f -> %.0f MiB, %.0f MiB %d ms after the last free (%d GC ends, the first %d ms after it); trims %d (first %d ms after the free), released %.0f MiB; C bursts %d, C free now %.1f MiB",
					r["ALLOCATOR"], name, inMiB(before), inMiB(peak), inMiB(after), num("AFTER_MS"), num("GCS"), num("FIRST_GC_MS"), num("TRIMS"), num("TRIM_AFTER_MS"),
					inMiB(num("RELEASED")), num("C_BURSTS"), inMiB(num("C_FREE")))
				require.Equal(t, tc.name, r["ALLOCATOR"])
				burst := peak - before
				// jemalloc's own decay returns part of the burst (a varying
				// part) while its threads still free: the bound asks for
				// four times the rule's MinRise (32 MiB) resident.
				if burst <= 4*32<<20 {
					t.Skipf("%s: the freed burst left only %.0f MiB resident (the allocator's own decay returned the rest while a loaded machine made it slowly): nothing for the detector to find", name, inMiB(burst))
				}
				keep := before + int64(cBurstShare*float64(burst))
				if i == 0 {
					if ms := num("TRIM_AFTER_MS"); ms > cBurstAfter.Milliseconds() {
						t.Logf("%s: the trim came %d ms after the free, past the issue's %v: the first GC end after the free came at %d ms (the C heap is looked at on GC ends) and the trim may wait up to the max wait on a loaded machine", name, ms, cBurstAfter, num("FIRST_GC_MS"))
					}
					assert.LessOrEqual(t, after, keep, "%s: VmRSS within %.0f%% of the burst over the RSS before it", name, 100*cBurstShare)
					assert.Equal(t, int64(1), num("C_BURSTS"))
				} else {
					assert.Greater(t, after, keep, "%s: the freed burst stays resident", name)
				}
			}
		})
	}
}

// Issue 34 item 2: a steady 20 MiB/s through the C heap with no burst is
// trimmed at most once a minute, and memctl's CPU, the process's beside
// the same program with MEMCTL_AUTOBURST=off run at the same time, stays
// within the trim budget of 2% of one CPU; for glibc and jemalloc.
func TestCHeapSteadyChurnNotTrimmed(t *testing.T) {
	skipRSS(t)
	for _, tc := range []struct{ name, so string }{
		{"glibc", ""},
		{"jemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Both allocators' pairs run at once: each child uses well
			// under 1% of a CPU, and each pair's figures are compared
			// only with each other.
			t.Parallel()
			env := []string{"MEMCTL_PRESSURE=off"}
			if tc.so != "" {
				if _, err := os.Stat(tc.so); err != nil {
					t.Skipf("%s is missing (install its Debian package): %v", tc.so, err)
				}
				env = append(env, "LD_PRELOAD="+tc.so)
			}
			reps := childtest.Reports(t,
				childtest.Command(t, "csteady-start", cBurstEnv, env...),
				childtest.Command(t, "csteady-start", cBurstEnv, append(env, "MEMCTL_AUTOBURST=off")...))
			on, off := reps[0], reps[1]
			n := func(r map[string]string, k string) int64 { return childtest.RequireInt(t, r, k) }
			for i, name := range []string{"Start()", "MEMCTL_AUTOBURST=off"} {
				r := reps[i]
				t.Logf("%s, %s: CPU %v over %v, trims %d (%v), C bursts %d, C free %.1f MiB", r["ALLOCATOR"], name,
					time.Duration(n(r, "CPU_NS")), time.Duration(n(r, "WALL_NS")), n(r, "TRIMS"), time.Duration(n(r, "TRIM_CPU_NS")),
					n(r, "C_BURSTS"), inMiB(n(r, "C_FREE")))
				require.Equal(t, tc.name, r["ALLOCATOR"])
			}
			perMinute := int64(cSteadyFor/time.Minute) + 1
			assert.LessOrEqual(t, n(on, "TRIMS"), perMinute, "at most one trim a minute")
			assert.LessOrEqual(t, n(on, "C_BURSTS"), perMinute)
			extra := time.Duration(n(on, "CPU_NS") - n(off, "CPU_NS"))
			assert.LessOrEqual(t, extra, time.Duration(0.02*float64(n(on, "WALL_NS"))), "memctl's CPU within 2% of one CPU")
		})
	}
}

func inMiB(n int64) float64 { return float64(n) / (1 << 20) }
