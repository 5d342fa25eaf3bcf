//go:build unix

package main

import (
	"bufio"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/childtest"
	"golang.org/x/sys/unix"
)

// stallChild is issue 27 item 9's target: it maps and touches
// $MEMCTL_TEST_STALL_MIB MiB of anonymous memory in one mapping, says PID
// and READY, and then maps and unmaps 1 MiB in a loop (100 µs apart),
// timing each mmap+munmap pair. For each line read on its standard input it
// says WORST, the longest pair in nanoseconds since the line before; it
// exits when its standard input is closed.
func stallChild() {
	mib, err := strconv.Atoi(os.Getenv(envStallMiB))
	if err != nil || mib <= 0 {
		childtest.Fail("%s=%q: want MiB", envStallMiB, os.Getenv(envStallMiB))
	}
	b, err := unix.Mmap(-1, 0, mib<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		childtest.Fail("mmap %d MiB: %v", mib, err)
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	var worst atomic.Int64
	go func() {
		for {
			t := time.Now()
			m, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
			if err != nil {
				childtest.Fail("mmap 1 MiB: %v", err)
			}
			if err := unix.Munmap(m); err != nil {
				childtest.Fail("munmap: %v", err)
			}
			d := int64(time.Since(t))
			for w := worst.Load(); d > w && !worst.CompareAndSwap(w, d); w = worst.Load() {
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	childtest.Say("PID", os.Getpid())
	childtest.Say("READY", 1)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		childtest.Say("WORST", worst.Swap(0))
	}
}
