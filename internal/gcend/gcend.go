// Package gcend calls functions at the end of each garbage-collection cycle
// without a goroutine or a timer of its own, so memctl's parts cost nothing
// while the process is idle.
//
// While any subscriber is registered, a dropped sentinel object carries a
// runtime.AddCleanup; the cleanup, run after the next GC, arms the next one
// and calls every subscriber at most once. No allocation means no GC and no
// call (but for runtime.forcegcperiod, two minutes).
//
// Subscribers run one at a time on the runtime's cleanup goroutine: they
// must be short and must not block; anything slow goes to a goroutine the
// subscriber owns. A GC that starts before the cleanup goroutine runs is
// seen with the next cycle's end.
package gcend

import (
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Sample is what the runtime reports at one GC end, read once for every
// subscriber (runtime/metrics; a figure this runtime lacks reads 0). Bytes
// are int64, CPU in seconds since the process started.
type Sample struct {
	Time   time.Time // when the sample was read
	Cycles uint64    // /gc/cycles/total:gc-cycles
	Forced uint64    // /gc/cycles/forced:gc-cycles
	// Live, Goal, GOGC (-1 for off), StackScan, GlobalsScan and HeapScan are
	// /gc/heap/live, /gc/heap/goal, /gc/gogc and /gc/scan/{stack,globals,heap}.
	Live, Goal, GOGC, StackScan, GlobalsScan, HeapScan int64
	// GCCPU, ScavengeCPU and TotalCPU (GOMAXPROCS times the wall time) are
	// /cpu/classes/gc/total, /cpu/classes/scavenge/total, /cpu/classes/total.
	GCCPU, ScavengeCPU, TotalCPU float64
	// LimiterLast is the last cycle the GC CPU limiter was on
	// (/gc/limiter/last-enabled:gc-cycle), 0 never.
	LimiterLast uint64
	// HeapFree, HeapObjects, HeapReleased and Total are the memory classes
	// (/memory/classes/heap/free, heap/objects, heap/released, total).
	HeapFree, HeapObjects, HeapReleased, Total int64
	// GoMemLimit is GOMEMLIMIT (/gc/gomemlimit:bytes; math.MaxInt64: none).
	GoMemLimit int64
	// HeapUnused is /memory/classes/heap/unused:bytes, GCPauseCPU
	// /cpu/classes/gc/pause:cpu-seconds.
	HeapUnused int64
	GCPauseCPU float64
}

// GOGCGoal returns the heap goal GOGC alone would give the cycle
// (runtime/mgcpacer.go), math.MaxInt64 with GOGC off.
func (s *Sample) GOGCGoal() int64 {
	if s.GOGC < 0 {
		return math.MaxInt64
	}
	scan := float64(s.Live) + float64(s.StackScan) + float64(s.GlobalsScan)
	return int64(min(float64(s.Live)+scan*float64(s.GOGC)/100, math.MaxInt64/2))
}

// sampleNames are the metrics Read reads, in the order read uses them.
var sampleNames = [...]string{
	"/gc/cycles/total:gc-cycles", "/gc/cycles/forced:gc-cycles",
	"/gc/heap/live:bytes", "/gc/heap/goal:bytes", "/gc/gogc:percent",
	"/gc/scan/stack:bytes", "/gc/scan/globals:bytes", "/gc/scan/heap:bytes",
	"/cpu/classes/gc/total:cpu-seconds", "/cpu/classes/scavenge/total:cpu-seconds", "/cpu/classes/total:cpu-seconds",
	"/gc/limiter/last-enabled:gc-cycle",
	"/memory/classes/heap/free:bytes", "/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/released:bytes", "/memory/classes/total:bytes",
	"/gc/gomemlimit:bytes", "/memory/classes/heap/unused:bytes", "/cpu/classes/gc/pause:cpu-seconds",
}

// Reader reads Samples into the same runtime/metrics buffers each time:
// no allocation. Not safe for concurrent use.
type Reader struct {
	s [len(sampleNames)]metrics.Sample
}

// Read fills out from runtime/metrics now.
func (r *Reader) Read(out *Sample) {
	if r.s[0].Name == "" {
		for i, n := range sampleNames {
			r.s[i].Name = n
		}
	}
	metrics.Read(r.s[:])
	u := func(i int) uint64 {
		if r.s[i].Value.Kind() == metrics.KindUint64 {
			return r.s[i].Value.Uint64()
		}
		return 0
	}
	b := func(i int) int64 { return int64(min(u(i), math.MaxInt64)) }
	f := func(i int) float64 {
		if r.s[i].Value.Kind() == metrics.KindFloat64 {
			return r.s[i].Value.Float64()
		}
		return 0
	}
	*out = Sample{Time: time.Now(), Cycles: u(0), Forced: u(1), Live: b(2), Goal: b(3), GOGC: b(4),
		StackScan: b(5), GlobalsScan: b(6), HeapScan: b(7), GCCPU: f(8), ScavengeCPU: f(9), TotalCPU: f(10),
		LimiterLast: u(11), HeapFree: b(12), HeapObjects: b(13), HeapReleased: b(14), Total: b(15), GoMemLimit: b(16),
		HeapUnused: b(17), GCPauseCPU: f(18)}
	if g := u(4); g > math.MaxInt32 {
		out.GOGC = -1 // GOGC=off reads as uint64(-1)
	}
}

// Subscription is one registered function. Stop removes it; Stop is
// idempotent and safe for concurrent use.
type Subscription struct {
	fn      func(*Sample) bool
	stopped atomic.Bool
}

var (
	mu      sync.Mutex
	subs    []*Subscription
	armed   bool
	gen     uint64 // the armed sentinel's generation: cycle ignores the others
	pending runtime.Cleanup
	cycles  atomic.Uint64 // GC cycles seen while armed; for tests
	runMu   sync.Mutex    // held while the subscribers of one GC end run; guards reader and sample
	reader  Reader
	sample  Sample
	run     []*Subscription // the subscribers of the GC end running
	// cleanup, set by tests with mu held, replaces cycle in arm.
	cleanup func(gen uint64)
)

// sentinel marks a GC end by its death; the pointer keeps it out of the
// tiny allocator.
type sentinel struct {
	_ *byte
	_ int64
}

// Subscribe registers fn to run at the end of each GC cycle from the next
// one on, until it returns false or Stop is called. fn must not keep the
// Sample pointer. One small allocation per GC cycle while any subscriber
// is registered. Safe for concurrent use; fn may call Subscribe or Stop.
func Subscribe(fn func(s *Sample) (keep bool)) *Subscription {
	s := &Subscription{fn: fn}
	mu.Lock()
	defer mu.Unlock()
	subs = append(subs, s)
	if !armed {
		arm()
	}
	return s
}

// Stop removes the subscription: fn is not called again once Stop returns,
// except for a call already running on the cleanup goroutine.
func (s *Subscription) Stop() {
	if s == nil || s.stopped.Swap(true) {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if i := slices.Index(subs, s); i >= 0 {
		subs = slices.Delete(subs, i, i+1)
	}
	if len(subs) == 0 && armed {
		pending.Stop()
		armed = false
	}
}

// Active reports how many subscriptions are registered.
func Active() int {
	mu.Lock()
	defer mu.Unlock()
	return len(subs)
}

// arm installs the hook for the next GC cycle. Called with mu held.
func arm() {
	gen++
	fn := cleanup
	if fn == nil {
		fn = cycle
	}
	pending = runtime.AddCleanup(new(sentinel), fn, gen)
	armed = true
}

// cycle runs after a GC freed the sentinel of generation g. Cleanup.Stop
// has no effect once a GC queued the cleanup, so a stale generation does
// nothing, or a Subscribe after the last Stop would start a second chain.
func cycle(g uint64) {
	mu.Lock()
	if !armed || g != gen {
		mu.Unlock()
		return
	}
	cycles.Add(1)
	armed = false
	if len(subs) > 0 {
		arm() // before the subscribers: a GC that ends while they run is seen
	}
	mu.Unlock()
	Fire()
}

// Fire runs the subscribers now with one fresh sample, as at a GC end,
// from a copy of the list (subscribers may Subscribe or Stop).
func Fire() {
	runMu.Lock() // the next GC end may come on another cleanup goroutine
	defer runMu.Unlock()
	mu.Lock()
	run = append(run[:0], subs...)
	mu.Unlock()
	reader.Read(&sample)
	for _, s := range run {
		if s.stopped.Load() {
			continue
		}
		if !s.fn(&sample) {
			s.Stop()
		}
	}
}
