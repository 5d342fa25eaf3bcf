//go:build linux && cgo

package dlburst

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "dlburst_linux.h"
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
