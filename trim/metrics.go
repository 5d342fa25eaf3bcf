package trim

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/procfs"
)

// The runtime/metrics the Trimmer reads (all present since Go 1.21).
const (
	metricHeapFree     = "/memory/classes/heap/free:bytes"         // free spans, resident, not yet released
	metricHeapObjects  = "/memory/classes/heap/objects:bytes"      // live objects and dead ones not yet swept
	metricHeapReleased = "/memory/classes/heap/released:bytes"     // free spans returned to the OS
	metricHeapLive     = "/gc/heap/live:bytes"                     // heap marked live by the last GC
	metricGCCPU        = "/cpu/classes/gc/total:cpu-seconds"       // GC CPU, all threads
	metricScavengeCPU  = "/cpu/classes/scavenge/total:cpu-seconds" // background scavenger and assists
)

// heapFigures holds the figures of readHeap, in bytes.
type heapFigures struct {
	free, objects, released, live int64
}

// readHeap reads the Go heap figures from runtime/metrics; ok is false when
// one of them is not supported by the runtime.
func readHeap() (h heapFigures, ok bool) {
	s := [...]metrics.Sample{
		{Name: metricHeapFree},
		{Name: metricHeapObjects},
		{Name: metricHeapReleased},
		{Name: metricHeapLive},
	}
	metrics.Read(s[:])
	var v [len(s)]int64
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return heapFigures{}, false
		}
		v[i] = int64(min(s[i].Value.Uint64(), math.MaxInt64))
	}
	return heapFigures{free: v[0], objects: v[1], released: v[2], live: v[3]}, true
}

// freeOSMemory is the Go heap step: debug.FreeOSMemory (a forced GC, then
// every free span returned to the OS). It returns the growth of
// /memory/classes/heap/released:bytes across the call, or 0 when that cannot
// be read or went down (other goroutines reused released pages meanwhile).
func freeOSMemory() int64 {
	before, ok1 := readHeap()
	debug.FreeOSMemory()
	after, ok2 := readHeap()
	if !ok1 || !ok2 {
		return 0
	}
	return max(after.released-before.released, 0)
}

// estimateGo returns an estimate of the bytes the Go step would release
// with a GC (debug.FreeOSMemory) now, or -1 when runtime/metrics cannot be
// read; see Config.MinRelease. The live heap is what the last GC saw live:
// none of it is counted as garbage. When marked (the program marked the
// burst: AfterBurst, Begin, TrimNow), a burst that the last GCs saw in
// flight is its word's garbage: live is then the smaller of the last two
// GC ends' live heap and the floor before the burst (see gcLive.floor).
// sure is the part that is garbage whatever the program does next: free
// heap, and, when marked, the same as est. t.run must be held.
func (t *Trimmer) estimateGo(marked bool) (est, sure int64) {
	h, ok := readHeap()
	if !ok {
		return -1, -1
	}
	live := h.live
	if marked {
		live = min(live, t.gc.previous(h.live), t.gc.floor.Load())
		est = h.free + max(h.objects-live, 0)
		return est, est
	}
	return h.free + max(h.objects-live, 0), h.free
}

// cpuMark is a reading of the clocks a trim is charged by (see readCPU).
type cpuMark struct {
	gc      time.Duration // GC and scavenger CPU from runtime/metrics
	thread  time.Duration // the calling thread's CPU time
	process time.Duration // the process's CPU time, -1 if unknown
}

// readCPU reads the clocks a trim is charged by. The caller locks its OS
// thread around the two readings of a trim.
func readCPU() cpuMark {
	s := [...]metrics.Sample{{Name: metricGCCPU}, {Name: metricScavengeCPU}}
	metrics.Read(s[:])
	f := func(i int) time.Duration {
		if s[i].Value.Kind() == metrics.KindFloat64 {
			return time.Duration(s[i].Value.Float64() * 1e9)
		}
		return 0
	}
	return cpuMark{gc: f(0) + f(1), thread: threadCPU(), process: processCPU()}
}

// charge returns the CPU a trim between the readings m and now is charged
// with: the growth of the GC and scavenger CPU of runtime/metrics plus the
// calling thread's own CPU time (the forced scavenge of debug.FreeOSMemory
// and the C heap step run on it and are not in those metrics; see
// /work/shared/MEASURED.md, "What a trim costs"), but no more than the
// growth of the whole process's CPU time (CLOCK_PROCESS_CPUTIME_ID). The
// runtime/metrics GC figures are estimates from the time GC workers are
// scheduled and from pause time × GOMAXPROCS, so a CPU quota that throttles
// the process inflates them: measured in this repository's load-contended
// harness scenario (10% quota with a busy loop), one trim of a 1 GiB heap
// read 1.1 s of GC CPU. The process's CPU time is real CPU but counts the
// rest of the program too; each is an upper bound of the trim's cost, so the
// smaller one is charged.
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

// lazyRelease reports whether the Go runtime releases memory with MADV_FREE
// instead of MADV_DONTNEED: GODEBUG madvdontneed=0, set in the environment
// or, as the default of this binary, by a //go:debug directive or the go.mod
// godebug block (DefaultGODEBUG in the build info). The runtime reads the
// build default first and the environment after it, and within each the
// last setting wins (runtime/runtime1.go parsedebugvars). Only Linux has
// the setting. why names the source.
func lazyRelease() (lazy bool, why string) {
	return lazyFrom(getenvGODEBUG(), buildGODEBUG())
}

// lazyFrom is lazyRelease on given GODEBUG strings; pure, for tests.
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

// godebugInt returns the last value of key in the comma-separated GODEBUG
// string s, as the runtime reads its own settings (parsegodebug: no space
// trimmed, a value that is not a 32-bit decimal integer ignored).
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
