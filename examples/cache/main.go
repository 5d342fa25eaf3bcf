// Command cache sizes an in-memory cache at a quarter of GOMEMLIMIT and
// shrinks it when the limit goes down (an in-place pod resize): it reads
// the limit with memctl.CurrentMemLimit (no read, no allocation) and hears
// of each change on memctl.WatchMemLimit.
//
// It fills the cache with 1 MiB values and prints a line every 50 ms:
//
//	CACHE=<bytes held> MAX=<bytes allowed> GOMEMLIMIT=<bytes>
//
// Run it in a cgroup and write a lower memory.max (v2) or
// memory.limit_in_bytes (v1): MAX follows within the limiter's bound (at
// once where a write to the file is seen, 10 s at most), and CACHE with it.
package main

import (
	"container/list"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
)

// share is the part of GOMEMLIMIT the cache may hold.
const share = 0.25

func main() {
	ctl, _ := memctl.Start()
	defer ctl.Close()

	c := &cache{max: capOf(memctl.CurrentMemLimit())}
	changes, cancel := memctl.WatchMemLimit(1)
	defer cancel()
	go func() {
		for d := range changes {
			c.resize(capOf(d)) // the last value received is the one in force
		}
	}()

	last := time.Now()
	for {
		c.put(make([]byte, 1<<20))
		time.Sleep(time.Millisecond)
		if time.Since(last) >= 50*time.Millisecond {
			held, allowed := c.size()
			fmt.Printf("CACHE=%d MAX=%d GOMEMLIMIT=%d\n", held, allowed, memctl.CurrentMemLimit().GoMemLimit)
			last = time.Now()
		}
	}
}

// capOf is the cache's room under d: a share of GOMEMLIMIT, or 64 MiB
// where there is none.
func capOf(d limits.MemLimit) int64 {
	if d.GoMemLimit <= 0 || d.GoMemLimit == math.MaxInt64 {
		return 64 << 20
	}
	return int64(float64(d.GoMemLimit) * share)
}

// cache holds values, the oldest evicted first, bounded in bytes.
type cache struct {
	mu    sync.Mutex
	order list.List // of []byte, front: newest
	bytes int64
	max   int64
}

func (c *cache) put(val []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.PushFront(val)
	c.bytes += int64(len(val))
	c.evictLocked()
}

// resize sets the cache's room and evicts down to it at once.
func (c *cache) resize(max int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.max = max
	c.evictLocked()
}

func (c *cache) evictLocked() {
	for c.bytes > c.max && c.order.Len() > 0 {
		c.bytes -= int64(len(c.order.Remove(c.order.Back()).([]byte)))
	}
}

func (c *cache) size() (held, allowed int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, c.max
}
