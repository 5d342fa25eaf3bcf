// Package gcend calls functions at the end of each garbage-collection cycle
// without a goroutine or a timer of its own, so that memctl's parts can
// re-check the heap, the memory limit or the GC's CPU share only when the
// process allocates, and cost nothing while it is idle.
//
// The mechanism: while at least one subscriber is registered, one sentinel
// object is allocated and dropped at once with a runtime.AddCleanup on it.
// The next GC cycle finds it unreachable and the runtime runs the cleanup on
// its cleanup goroutine, which arms the next sentinel and then calls every
// subscriber. A process that does not allocate runs no GC cycle and so no
// subscriber (the runtime still forces a GC every two minutes,
// runtime.forcegcperiod). All subscribers share one sentinel, and each GC
// cycle calls each subscriber at most once: the cleanup of a sentinel that
// was disarmed (runtime.Cleanup.Stop has no effect once a GC has queued
// the cleanup of an unreachable object, and a sentinel is unreachable from
// the start) does nothing, so a last Stop followed by a Subscribe never
// leaves two sentinels, each calling the subscribers at every GC end.
//
// Subscribers run one after another (never two at once, even when the
// runtime runs cleanups on several goroutines) on the runtime's cleanup
// goroutine: they must be short and must not block (no I/O that can hang,
// no lock held across a GC); anything slow is handed to a goroutine the
// subscriber owns. A GC cycle that ends while they run is seen (the next
// sentinel is armed before they are called), but one that starts before
// the cleanup goroutine gets to run misses the sentinel allocated for it,
// and its end is seen with the next cycle's.
package gcend

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Subscription is one registered function. Stop removes it; Stop is
// idempotent and safe for concurrent use.
type Subscription struct {
	fn      func() bool
	stopped atomic.Bool
}

var (
	mu      sync.Mutex
	subs    []*Subscription
	armed   bool
	gen     uint64 // the armed sentinel's generation: cycle ignores the others
	pending runtime.Cleanup
	cycles  atomic.Uint64 // GC cycles seen while armed; for tests
	runMu   sync.Mutex    // held while the subscribers of one GC end run
	// cleanup, when set (by a test, with mu held), is what arm registers
	// instead of cycle, to hold a queued cleanup back.
	cleanup func(gen uint64)
)

// sentinel is the object whose death marks the end of a GC cycle. It holds
// a pointer so that the tiny allocator does not combine it with others.
type sentinel struct {
	_ *byte
	_ int64
}

// Subscribe registers fn to run at the end of each GC cycle from the next
// one on, until it returns false or Stop is called. It allocates one small
// object per GC cycle while any subscriber is registered and nothing
// otherwise. Safe for concurrent use; fn may call Subscribe or Stop.
func Subscribe(fn func() (keep bool)) *Subscription {
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
	remove(s)
	if len(subs) == 0 && armed {
		pending.Stop()
		armed = false
	}
}

// Active reports how many subscriptions are registered; tests use it to
// check that their owners stopped them.
func Active() int {
	mu.Lock()
	defer mu.Unlock()
	return len(subs)
}

// Cycles reports how many GC-cycle ends the hook has seen.
func Cycles() uint64 { return cycles.Load() }

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

// cycle runs on the runtime's cleanup goroutine after a GC cycle freed the
// sentinel of generation g. A sentinel disarmed by Stop whose cleanup a GC
// had already queued is not the armed one: its cleanup does nothing (before
// this check, a Subscribe after the last Stop armed a second sentinel and
// the stale cleanup re-armed the first: two chains, every subscriber called
// twice per GC end, the second time with the same figures).
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
	run := append([]*Subscription(nil), subs...)
	mu.Unlock()
	runMu.Lock() // the next GC end may come on another cleanup goroutine
	defer runMu.Unlock()
	for _, s := range run {
		if s.stopped.Load() {
			continue
		}
		if !s.fn() {
			s.Stop()
		}
	}
}

func remove(s *Subscription) {
	for i, x := range subs {
		if x == s {
			subs = append(subs[:i], subs[i+1:]...)
			return
		}
	}
}
