//go:build linux && cgo

package cburst

/*
#cgo LDFLAGS: -ldl -lpthread
#include "cburst_linux.h"
*/
import "C"

import (
	"fmt"
	"time"
)

// Burst runs threads C threads at once; each allocates blocks blocks of size
// bytes with malloc, writes them, then frees every block except every
// keepEvery-th (keepEvery 0 frees all). The kept blocks stay live until
// FreeKept. It returns when all threads have exited.
func Burst(threads int, blocks int64, size int64, keepEvery int64) error {
	if threads < 1 || blocks < 1 || size < 1 || keepEvery < 0 {
		return fmt.Errorf("cburst: bad burst threads=%d blocks=%d size=%d keepEvery=%d", threads, blocks, size, keepEvery)
	}
	if rc := C.cburst_run(C.int(threads), C.long(blocks), C.size_t(size), C.long(keepEvery)); rc != 0 {
		return fmt.Errorf("cburst: burst failed (code %d)", int(rc))
	}
	return nil
}

// CrossThread mallocs blocks blocks of size bytes in one C thread, writes
// them, and frees them all in another thread; it returns when both have
// exited.
func CrossThread(blocks, size int64) error {
	if blocks < 1 || size < 1 {
		return fmt.Errorf("cburst: bad cross-thread burst blocks=%d size=%d", blocks, size)
	}
	if rc := C.cburst_cross(C.long(blocks), C.size_t(size)); rc != 0 {
		return fmt.Errorf("cburst: cross-thread burst failed (code %d)", int(rc))
	}
	return nil
}

// Kept returns the number of blocks the last Burst kept live.
func Kept() int64 { return int64(C.cburst_kept()) }

// FreeKept frees the blocks the last Burst kept.
func FreeKept() { C.cburst_free_kept() }

// PlainMallocTrim calls malloc_trim(0) as the process resolves it, without
// memctl: glibc's, even when another allocator owns malloc. It returns
// malloc_trim's result (1 when glibc released memory), or -1 when there is
// no malloc_trim.
func PlainMallocTrim() int { return int(C.cburst_plain_trim()) }

// GlibcArenas returns the number of glibc malloc arenas, counted in
// malloc_info's report, or -1 when it cannot tell.
func GlibcArenas() int { return int(C.cburst_glibc_arenas()) }

// StartProbe starts a C thread that mallocs and frees blocks of 2 KiB,
// 16 KiB, 100 KiB and 512 KiB in turn, as fast as it can, timing each pair,
// until StopProbe. One probe at a time.
func StartProbe() error {
	if rc := C.cburst_probe_start(); rc != 0 {
		return fmt.Errorf("cburst: pthread_create: %d", int(rc))
	}
	return nil
}

// StopProbe stops the probe StartProbe started and returns the longest
// pair, the pairs made, when the longest began (since StartProbe) and its
// block size.
func StopProbe() (longest time.Duration, pairs int64, at time.Duration, size int64) {
	var out [4]C.longlong
	C.cburst_probe_stop(&out[0])
	return time.Duration(out[0]), int64(out[1]), time.Duration(out[2]), int64(out[3])
}

// StartChurn starts a C thread that loops, until StopChurn, over
// malloc(64)/free and malloc(512 KiB)/free with a 50 µs pause after each
// round, timing each round (the two pairs). One churn at a time.
func StartChurn() error {
	if rc := C.cburst_churn_start(); rc != 0 {
		return fmt.Errorf("cburst: pthread_create: %d", int(rc))
	}
	return nil
}

// ChurnReset returns the churn's longest round and its rounds since
// StartChurn or the last ChurnReset, and when the longest began (since
// StartChurn), then counts afresh.
func ChurnReset() (longest time.Duration, rounds int64, at time.Duration) {
	var out [3]C.longlong
	C.cburst_churn_reset(&out[0])
	return time.Duration(out[0]), int64(out[1]), time.Duration(out[2])
}

// Steady churns the C heap for d in the calling thread: every 10 ms it
// frees the oldest perTick blocks of a ring of ring live blocks and mallocs
// as many new ones, of 4 KiB to 64 KiB in turn (34 KiB on average),
// writing each; then it frees the ring. perTick 6 is about 20 MiB/s.
func Steady(d time.Duration, perTick, ring int64) error {
	if d <= 0 || perTick < 1 || ring < 1 {
		return fmt.Errorf("cburst: bad steady churn d=%v perTick=%d ring=%d", d, perTick, ring)
	}
	if rc := C.cburst_steady(C.longlong(d.Milliseconds()), C.long(perTick), C.long(ring)); rc != 0 {
		return fmt.Errorf("cburst: steady churn failed (code %d)", int(rc))
	}
	return nil
}

// StopChurn stops the thread StartChurn started.
func StopChurn() { C.cburst_churn_stop() }
