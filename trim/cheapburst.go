package trim

import (
	"runtime"
	"time"
)

const (
	// cBurstEvery is the least time between two looks at the C heap.
	cBurstEvery = time.Second
	// cLookFactor spaces looks by this many times a look's CPU (0.5% of a
	// CPU): glibc's mallinfo2 walks every arena's free lists under its lock.
	cLookFactor = 200
)

// lookC finds bursts in the C heap at GC ends, at most once per cBurstEvery
// (and cLookFactor times a look's CPU), with no goroutine or timer: a process
// that allocates nothing in Go is looked at by the runtime's forced GC, every
// 2 minutes. A look reads R, what the C step's release would return
// (cHeap.Retained), and applies the Go heap's rule with F its floor:
//
//   - R ≥ Rise·F and R − F ≥ MinRise is a burst, marked as memory already
//     free (no GC needs to find it dead); R a further MinRise over the last
//     mark marks again, pushing the debounced trim back.
//   - After a trim decision F is what the decision left; otherwise F follows
//     R down.
//
// An allocator that cannot tell (mimalloc: R is -1) shows no burst. It does
// nothing before now, when the next look is due.
func (a *autoBurst) lookC(now time.Time) {
	a.cmu.Lock()
	if now.Before(a.c.next) {
		a.cmu.Unlock()
		return
	}
	n, left := a.cAfter()
	runtime.LockOSThread() // the thread's clock
	cpu0 := threadCPU()
	r := a.cRetained()
	cost := threadCPU() - cpu0
	runtime.UnlockOSThread()
	a.c.next = now.Add(max(cBurstEvery, cLookFactor*cost))
	mark := a.observeC(r, n, left)
	a.cmu.Unlock()
	if mark {
		a.onCBurst()
	}
}

// cState is the C heap's look between GC ends, guarded by autoBurst.cmu.
type cState struct {
	next    time.Time // the earliest next look
	floor   int64     // F
	level   int64     // R at the last mark, or F
	decided int64     // the count of decisions at the last look
	bursts  int64
	free    int64 // R at the last look, -1 unknown
}

// observeC applies the rule (see lookC) and reports whether R is a burst to
// mark. a.cmu must be held.
func (a *autoBurst) observeC(r, decided, left int64) (mark bool) {
	c := &a.c
	c.free = r
	if r < 0 {
		return false
	}
	if decided != c.decided {
		if left < 0 {
			left = r
		}
		c.decided, c.floor, c.level = decided, left, left
	}
	if a.high(r, c.floor) && r-c.floor >= a.minRise && r-c.level >= a.minRise {
		if c.level == c.floor {
			c.bursts++
		}
		c.level = r
		return true
	}
	if r < c.floor {
		c.floor, c.level = r, r
	}
	return false
}
