// Package burst makes the allocation bursts that memctl's tests, demo and
// benchmark harness measure: n bytes as 64 KiB []byte objects with every
// page touched, so that all of them are resident; and the steady small
// garbage of a serving process beside them (Garbage).
package burst

import (
	"runtime"
	"time"
)

// ObjectSize is the size of the objects a burst is made of: large objects
// (over 32 KiB, so each has a span of its own), as the buffers of a real
// burst would be.
const ObjectSize = 64 << 10

// Alloc allocates n bytes (rounded down to ObjectSize) as ObjectSize
// []byte objects with every 4 KiB page written, so all are resident.
func Alloc(n int64) [][]byte {
	if n < ObjectSize {
		return nil
	}
	objs := make([][]byte, 0, n/ObjectSize)
	for range n / ObjectSize {
		b := make([]byte, ObjectSize)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		objs = append(objs, b)
	}
	return objs
}

// Garbage allocates about perSecond bytes a second as 1 KiB objects, every
// 10 ms, until stop is closed: a serving process's small garbage.
func Garbage(perSecond int, stop <-chan struct{}) {
	const every = 10 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	var sink []byte
	for {
		select {
		case <-stop:
			runtime.KeepAlive(sink)
			return
		case <-tick.C:
			for range perSecond / int(time.Second/every) / 1024 {
				sink = make([]byte, 1024)
			}
		}
	}
}
