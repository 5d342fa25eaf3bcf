//go:build linux && cgo

package dlburst

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// dlburst_dl_burst is Run (local: 0 RTLD_GLOBAL, 1 RTLD_LOCAL, 2 dlmopen),
// with block sizes a fixed pseudo-random sequence. It returns 0, or -1 when
// dlopen fails (*err holds dlerror), -2 for a missing symbol, -3 when
// malloc fails.
static char dlburst_dlerr[512];
static const char *dlburst_dlerror(void) { return dlburst_dlerr; }

// dlburst_load opens path (local: 0 RTLD_GLOBAL, 1 RTLD_LOCAL, 2 dlmopen
// into a new namespace); on failure *dlburst_dlerr holds dlerror.
static void *dlburst_load(const char *path, int local) {
	void *h = local == 2 ? dlmopen(LM_ID_NEWLM, path, RTLD_NOW) : dlopen(path, RTLD_NOW | (local ? RTLD_LOCAL : RTLD_GLOBAL));
	if (h == NULL) snprintf(dlburst_dlerr, sizeof dlburst_dlerr, "%s", dlerror());
	return h;
}

// dlburst_dl_burst is Run, with block sizes a fixed pseudo-random
// sequence. It returns 0, or -1 when dlopen fails, -2 for a missing
// symbol, -3 when malloc fails.
static int dlburst_dl_burst(const char *path, int local, const char *prefix, long long total, size_t min, size_t max) {
	void *h = dlburst_load(path, local);
	if (h == NULL) return -1;
	char name[64];
	snprintf(name, sizeof name, "%smalloc", prefix);
	void *(*m)(size_t) = (void *(*)(size_t))dlsym(h, name);
	snprintf(name, sizeof name, "%sfree", prefix);
	void (*f)(void *) = (void (*)(void *))dlsym(h, name);
	if (m == NULL || f == NULL) return -2;
	long cap = (long)(total / (long long)min) + 1;
	void **p = calloc((size_t)cap, sizeof(void *));
	if (p == NULL) return -3;
	unsigned long long x = 88172645463325252ull;
	long n = 0;
	for (long long done = 0; done < total && n < cap; n++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		size_t sz = min + (size_t)(x % (unsigned long long)(max - min + 1));
		p[n] = m(sz);
		if (p[n] == NULL) return -3;
		memset(p[n], 0x5a, sz);
		done += (long long)sz;
	}
	for (long i = 0; i < n; i++) f(p[i]);
	free(p);
	return 0;
}

static int dlburst_unload(uintptr_t h) {
	if (dlclose((void *)h) != 0) {
		snprintf(dlburst_dlerr, sizeof dlburst_dlerr, "%s", dlerror());
		return -1;
	}
	return 0;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Run dlopens the library at path (RTLD_LOCAL when local; kept open),
// allocates total bytes in blocks of minSize to maxSize through the
// handle's own prefix+"malloc" (dlsym on the handle), writes them, and
// frees them with its prefix+"free".
func Run(path string, local bool, prefix string, total, minSize, maxSize int64) error {
	return run(path, boolInt(local), prefix, total, minSize, maxSize)
}

// RunNamespace is Run with the library loaded in a new link-map namespace
// (dlmopen with LM_ID_NEWLM), where it gets its own copy of the C library.
func RunNamespace(path, prefix string, total, minSize, maxSize int64) error {
	return run(path, 2, prefix, total, minSize, maxSize)
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func run(path string, mode C.int, prefix string, total, minSize, maxSize int64) error {
	if total < 1 || minSize < 1 || maxSize < minSize {
		return fmt.Errorf("dlburst: bad dlopen burst total=%d min=%d max=%d", total, minSize, maxSize)
	}
	cp, cpre := C.CString(path), C.CString(prefix)
	defer C.free(unsafe.Pointer(cp))
	defer C.free(unsafe.Pointer(cpre))
	switch rc := C.dlburst_dl_burst(cp, mode, cpre, C.longlong(total), C.size_t(minSize), C.size_t(maxSize)); rc {
	case 0:
		return nil
	case -1:
		return fmt.Errorf("dlburst: dlopen %s: %s", path, C.GoString(C.dlburst_dlerror()))
	default:
		return fmt.Errorf("dlburst: dlopen burst through %s failed (code %d)", path, int(rc))
	}
}

// Open dlopens the library at path (RTLD_LOCAL when local) and keeps it
// loaded.
func Open(path string, local bool) error {
	_, err := Load(path, local)
	return err
}

// Load dlopens the library at path (RTLD_LOCAL when local) and returns the
// handle, for Unload.
func Load(path string, local bool) (uintptr, error) { return load(path, boolInt(local)) }

// LoadNamespace is Load into a new link-map namespace (dlmopen).
func LoadNamespace(path string) (uintptr, error) { return load(path, 2) }

func load(path string, mode C.int) (uintptr, error) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	h := C.dlburst_load(cp, mode)
	if h == nil {
		return 0, fmt.Errorf("dlburst: dlopen %s: %s", path, C.GoString(C.dlburst_dlerror()))
	}
	return uintptr(h), nil
}

// Unload drops the reference that Load took (dlclose).
func Unload(h uintptr) error {
	if C.dlburst_unload(C.uintptr_t(h)) != 0 {
		return fmt.Errorf("dlburst: dlclose: %s", C.GoString(C.dlburst_dlerror()))
	}
	return nil
}
