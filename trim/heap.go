package trim

import (
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/procfs"
)

// freeOSMemory is the Go step with a GC (debug.FreeOSMemory). It returns the
// growth of /memory/classes/heap/released:bytes across it, at least 0.
func freeOSMemory() int64 {
	before := readSample().HeapReleased
	debug.FreeOSMemory()
	return max(readSample().HeapReleased-before, 0)
}

// estimateGo returns the bytes the Go step with a GC would release now: free
// heap plus heap objects less the live heap the last GC saw. When marked, the
// program's word makes the burst garbage: live is the least of the last two
// GC ends' and the floor. sure is the part that is garbage whatever the
// program does next: the free heap, or est when marked. t.run must be held.
func (t *Trimmer) estimateGo(marked bool) (est, sure int64) {
	h := readSample()
	if !marked {
		return h.HeapFree + max(h.HeapObjects-h.Live, 0), h.HeapFree
	}
	live := min(h.Live, t.gc.previous(h.Live), t.gc.floor.Load())
	est = h.HeapFree + max(h.HeapObjects-live, 0)
	return est, est
}

// scanBytes returns /gc/scan/total:bytes (heap, stacks and globals).
func scanBytes() int64 {
	s := readSample()
	return s.HeapScan + s.StackScan + s.GlobalsScan
}

// cpuMark is a reading of the clocks a trim is charged by (see readCPU).
type cpuMark struct {
	gc      time.Duration // GC and scavenger CPU from runtime/metrics
	thread  time.Duration // the calling thread's CPU time
	process time.Duration // the process's CPU time, -1 if unknown
}

// readCPU reads the clocks a trim is charged by, on a locked OS thread; the
// process clock's window holds the thread clock's.
func readCPU(start bool) cpuMark {
	var m cpuMark
	if start {
		m.process = processCPU()
	}
	s := readSample()
	m.gc, m.thread = time.Duration((s.GCCPU+s.ScavengeCPU)*1e9), threadCPU()
	if !start {
		m.process = processCPU()
	}
	return m
}

// charge returns the CPU a trim between m and now is charged: the growth of
// the GC and scavenger CPU plus the calling thread's, capped by the process's
// (a CPU quota inflates the runtime's GC estimates); each bounds the cost.
func (m cpuMark) charge(now cpuMark) time.Duration {
	c := max(now.gc-m.gc+now.thread-m.thread, 0)
	if m.process >= 0 && now.process >= 0 {
		c = min(c, max(now.process-m.process, 0))
	}
	return c
}

// lazyFreeBytes returns the LazyFree bytes of /proc/self/smaps_rollup
// (pages released with MADV_FREE that the kernel has not reclaimed), or -1
// when it cannot be read (not Linux, a kernel before 4.14).
func lazyFreeBytes() int64 {
	n, err := procfs.ReadBytes("/proc/self/smaps_rollup", "LazyFree")
	if err != nil {
		return -1
	}
	return n
}

// lazyFrom reports whether the Go runtime releases memory with MADV_FREE:
// madvdontneed=0 in GODEBUG (env) or in the build's DefaultGODEBUG (build:
// //go:debug, go.mod godebug); env wins, and the last setting in each
// (runtime/runtime1.go parsedebugvars). Linux only; why names the source.
func lazyFrom(env, build string) (lazy bool, why string) {
	if !linux {
		return false, ""
	}
	if v, ok := godebugInt(env, "madvdontneed"); ok {
		return v == 0, "GODEBUG=madvdontneed=" + strconv.Itoa(v)
	}
	if v, ok := godebugInt(build, "madvdontneed"); ok {
		return v == 0, "DefaultGODEBUG madvdontneed=" + strconv.Itoa(v) + " (//go:debug or go.mod godebug)"
	}
	return false, ""
}

// godebugInt returns the last value of key in GODEBUG string s as the runtime
// reads it (parsegodebug: no trimming, non-int32 values ignored).
func godebugInt(s, key string) (v int, ok bool) {
	for f := range strings.SplitSeq(s, ",") {
		k, val, found := strings.Cut(f, "=")
		if !found || k != key {
			continue
		}
		if n, err := strconv.ParseInt(val, 10, 32); err == nil {
			v, ok = int(n), true
		}
	}
	return v, ok
}

func buildGODEBUG() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "DefaultGODEBUG" {
			return s.Value
		}
	}
	return ""
}
