package trim

import (
	"runtime"
	"sync"
	"time"
)

const (
	// cBurstEvery is the least time between two looks at the C heap.
	cBurstEvery = time.Second
	// cLookFactor spaces looks by this many times a look's CPU (0.5% of a
	// CPU): glibc's mallinfo2 walks every arena's free lists under its lock.
	cLookFactor = 200
)

// cBurst finds bursts in the C heap at GC ends, at most once per cBurstEvery
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
// An allocator that cannot tell (mimalloc: R is -1) shows no burst. Safe for
// concurrent use.
type cBurst struct {
	retained func() int64           // the C step's Retained
	after    func() (n, left int64) // Trimmer.cAfter
	onBurst  func()
	rise     float64
	minRise  int64

	mu      sync.Mutex // guards the fields below
	next    time.Time  // the earliest next look
	floor   int64      // F
	level   int64      // R at the last mark, or F
	decided int64      // the count of decisions at the last look
	bursts  int64
	free    int64 // R at the last look, -1 unknown
}

// newCBurst returns a detector over retained with a's rule, its floor R now.
func newCBurst(a *autoBurst, retained func() int64, after func() (n, left int64), onBurst func()) *cBurst {
	c := &cBurst{retained: retained, after: after, onBurst: onBurst, rise: a.rise, minRise: a.minRise}
	c.decided, _ = after()
	c.free = retained()
	c.floor, c.level = max(c.free, 0), max(c.free, 0)
	return c
}

// look reads R unless now is before the next look is due, and marks a burst.
func (c *cBurst) look(now time.Time) {
	c.mu.Lock()
	if now.Before(c.next) {
		c.mu.Unlock()
		return
	}
	n, left := c.after()
	runtime.LockOSThread() // the thread's clock
	cpu0 := threadCPU()
	r := c.retained()
	cost := threadCPU() - cpu0
	runtime.UnlockOSThread()
	c.next = now.Add(max(cBurstEvery, cLookFactor*cost))
	mark := c.observe(r, n, left)
	c.mu.Unlock()
	if mark {
		c.onBurst()
	}
}

// observe applies the rule (see cBurst) and reports whether R is a burst to
// mark. c.mu must be held.
func (c *cBurst) observe(r, decided, left int64) (mark bool) {
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
	if float64(r) >= c.rise*float64(c.floor) && r-c.floor >= c.minRise && r-c.level >= c.minRise {
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

// stats returns the bursts found and R at the last look (-1 unknown); a
// nil *cBurst returns 0, -1.
func (c *cBurst) stats() (bursts, free int64) {
	if c == nil {
		return 0, -1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bursts, c.free
}
