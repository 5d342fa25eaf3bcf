//go:build linux && cgo

// Package chold holds C heap memory for tests: Hold mallocs and touches
// bytes outside the Go runtime, as a cgo library (SQLite, a C codec) does,
// and Release frees it and returns it to the OS with malloc_trim where glibc
// owns malloc. Without cgo, or off Linux, both return an error matching
// errors.ErrUnsupported.
package chold

/*
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

static void **chold_blocks;
static long chold_n;

// chold_hold mallocs and writes n blocks of size bytes; returns how many it got.
static long chold_hold(long n, size_t size) {
	chold_blocks = malloc((size_t)n * sizeof(void *));
	if (chold_blocks == NULL) return 0;
	for (chold_n = 0; chold_n < n; chold_n++) {
		void *p = malloc(size);
		if (p == NULL) break;
		memset(p, 0xa5, size);
		chold_blocks[chold_n] = p;
	}
	return chold_n;
}

static void chold_release(void) {
	for (long i = 0; i < chold_n; i++) free(chold_blocks[i]);
	free(chold_blocks);
	chold_blocks = NULL;
	chold_n = 0;
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}
*/
import "C"

import (
	"fmt"
	"sync"
)

// block is the size of each malloc: under glibc's mmap threshold (128 KiB
// at first), so the blocks come from a malloc arena and freeing them needs
// malloc_trim to return the pages, as with a real C library's small objects.
const block = 64 << 10

var mu sync.Mutex

// Hold mallocs about bytes of C heap in 64 KiB blocks and touches every
// page. Call Release before holding again. Safe for concurrent use.
func Hold(bytes int64) error {
	mu.Lock()
	defer mu.Unlock()
	n := C.long((bytes + block - 1) / block)
	if got := C.chold_hold(n, block); got != n {
		C.chold_release()
		return fmt.Errorf("chold: malloc failed after %d of %d blocks", got, n)
	}
	return nil
}

// Release frees what Hold holds and calls malloc_trim(0) (glibc). Safe for
// concurrent use; without a Hold it does nothing.
func Release() error {
	mu.Lock()
	defer mu.Unlock()
	C.chold_release()
	return nil
}
