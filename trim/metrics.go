package trim

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
)

// The runtime/metrics the Trimmer reads (all present since Go 1.21).
const (
	metricHeapFree     = "/memory/classes/heap/free:bytes"     // free spans, resident, not yet released
	metricHeapObjects  = "/memory/classes/heap/objects:bytes"  // live objects and dead ones not yet swept
	metricHeapReleased = "/memory/classes/heap/released:bytes" // free spans returned to the OS
	metricHeapLive     = "/gc/heap/live:bytes"                 // heap marked live by the last GC
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

// estimateReleasable returns an estimate of the bytes a trim would release
// now, or -1 when runtime/metrics cannot be read; see WithMinRelease.
// t.run must be held.
func (t *Trimmer) estimateReleasable() int64 {
	h, ok := readHeap()
	if !ok {
		return -1
	}
	live := min(h.live, t.liveFloor)
	est := h.free + max(h.objects-live, 0)
	if t.cheap != nil {
		if r := t.cheap.Retained(); r > 0 {
			est += r
		}
	}
	return est
}
