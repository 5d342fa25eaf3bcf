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

	c := newCache(capOf(memctl.CurrentMemLimit()))
	changes, cancel := memctl.WatchMemLimit(1)
	defer cancel()
	go func() {
		for d := range changes {
			c.resize(capOf(d)) // the last value received is the one in force
		}
	}()

	last := time.Now()
	for key := 0; ; key++ {
		c.put(key, make([]byte, 1<<20))
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

// cache is a least-recently-added cache bounded in bytes.
type cache struct {
	mu    sync.Mutex
	items map[int]*list.Element
	order list.List // front: newest
	bytes int64
	max   int64
}

type entry struct {
	key int
	val []byte
}

func newCache(max int64) *cache { return &cache{items: make(map[int]*list.Element), max: max} }

func (c *cache) put(key int, val []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.items[key] = c.order.PushFront(entry{key, val})
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
		e := c.order.Remove(c.order.Back()).(entry)
		delete(c.items, e.key)
		c.bytes -= int64(len(e.val))
	}
}

func (c *cache) size() (held, allowed int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, c.max
}
