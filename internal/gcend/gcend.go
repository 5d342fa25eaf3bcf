// Package gcend calls functions at the end of each garbage-collection cycle
// without a goroutine or a timer of its own, so that memctl's parts can
// re-check the heap, the memory limit or the GC's CPU share only when the
// process allocates, and cost nothing while it is idle.
//
// The mechanism: while at least one subscriber is registered, one sentinel
// object is allocated and dropped at once with a runtime.AddCleanup on it.
// The next GC cycle finds it unreachable and the runtime runs the cleanup on
// its cleanup goroutine, which calls every subscriber and arms the next
// sentinel. A process that does not allocate runs no GC cycle and so no
// subscriber (the runtime still forces a GC every two minutes,
// runtime.forcegcperiod). All subscribers share one sentinel.
//
// Subscribers run one after another on the runtime's cleanup goroutine: they
// must be short and must not block (no I/O that can hang, no lock held
// across a GC); anything slow is handed to a goroutine the subscriber owns.
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
	pending runtime.Cleanup
	cycles  atomic.Uint64 // GC cycles seen while armed; for tests
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
	pending = runtime.AddCleanup(new(sentinel), cycle, 0)
	armed = true
}

// cycle runs on the runtime's cleanup goroutine after a GC cycle.
func cycle(int) {
	cycles.Add(1)
	mu.Lock()
	armed = false
	run := append([]*Subscription(nil), subs...)
	mu.Unlock()
	for _, s := range run {
		if s.stopped.Load() {
			continue
		}
		if !s.fn() {
			s.Stop()
		}
	}
	mu.Lock()
	if len(subs) > 0 && !armed {
		arm()
	}
	mu.Unlock()
}

func remove(s *Subscription) {
	for i, x := range subs {
		if x == s {
			subs = append(subs[:i], subs[i+1:]...)
			return
		}
	}
}
