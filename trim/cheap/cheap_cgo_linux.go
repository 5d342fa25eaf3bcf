//go:build linux && cgo

package cheap

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include <string.h>
#include "cheap_linux.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// malloptCalls counts mallopt calls, for tests.
var malloptCalls atomic.Int64

// mArenaMax is glibc's M_ARENA_MAX parameter of mallopt (malloc.h).
const mArenaMax = -8

// sysStep holds the allocator's entry points found with dlsym; nil where
// absent. They are C function pointers, never Go pointers.
type sysStep struct {
	allocator string

	mallocTrim, mallinfo2, mallopt unsafe.Pointer // glibc
	mallctl                        unsafe.Pointer // jemalloc
	miCollect, miProcessInfo       unsafe.Pointer // mimalloc
	miThreadInit                   unsafe.Pointer
	tcRelease, tcProperty          unsafe.Pointer // tcmalloc
	tcReleaseN                     unsafe.Pointer // MallocExtension_ReleaseToSystem
	tcMalloc, tcFree               unsafe.Pointer // tc_malloc, tc_free: the carve (see carveBytes)

	// handle is the dlopen handle that keeps a non-owner's object loaded while
	// memctl may call it; nil for the owner found through RTLD_DEFAULT.
	handle unsafe.Pointer
}

// sym returns dlsym(RTLD_DEFAULT, name), or dlsym(RTLD_NEXT, name) when next.
func sym(name string, next bool) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	if next {
		return unsafe.Pointer(C.cheap_sym_next(cs))
	}
	return unsafe.Pointer(C.cheap_sym(cs))
}

// where returns the path and load address of the object holding p.
func where(p unsafe.Pointer) (lib string, base unsafe.Pointer, ok bool) {
	var fname *C.char
	var fbase unsafe.Pointer
	if C.cheap_where(p, &fname, &fbase) == 0 {
		return "", nil, false
	}
	if fname != nil {
		lib = C.GoString(fname)
	}
	return lib, fbase, true
}

// symIn returns the address of name when the object loaded at base defines
// it, else nil.
func symIn(name string, base unsafe.Pointer) unsafe.Pointer {
	p := sym(name, false)
	if p == nil {
		return nil
	}
	if _, b, ok := where(p); ok && b == base {
		return p
	}
	return nil
}

// owner returns the allocator whose own entry points live in the object
// loaded at base, or "".
func owner(base unsafe.Pointer) string {
	switch {
	case symIn("mallctl", base) != nil:
		return jemalloc
	case symIn("mi_collect", base) != nil:
		return mimalloc
	case symIn("MallocExtension_ReleaseFreeMemory", base) != nil:
		return tcmalloc
	case symIn("malloc_trim", base) != nil && symIn("gnu_get_libc_version", base) != nil:
		return glibc
	}
	return ""
}

func detect() *Step {
	m := sym("malloc", false)
	if m == nil {
		return &Step{why: "dlsym finds no malloc (a static binary?)"}
	}
	lib, base, ok := where(m)
	if !ok {
		return &Step{why: "dladdr cannot name the object that provides malloc (a static binary?)"}
	}
	alloc := owner(base)
	if alloc == "" && base == C.cheap_self_base() {
		// malloc resolved to this executable: a non-PIE binary's PLT entry (the
		// next definition is the real one) or an allocator linked in, unexported.
		if m2 := sym("malloc", true); m2 != nil {
			if lib2, base2, ok := where(m2); ok {
				if a := owner(base2); a != "" {
					alloc, lib, base = a, lib2, base2
				}
			}
		}
	}
	if alloc == "" {
		why := fmt.Sprintf("malloc is provided by %q, which is not glibc, jemalloc, mimalloc or tcmalloc", lib)
		if sym("gnu_get_libc_version", false) == nil {
			why += " (the C library is not glibc: musl has no call that returns freed memory)"
		}
		return &Step{library: lib, why: why}
	}
	s := &Step{allocator: alloc, library: lib, sys: sysStep{allocator: alloc}, ownerBase: uintptr(base)}
	s.sys.resolve("", func(name string) unsafe.Pointer { return symIn(name, base) }, &s.version, nil)
	return s
}

// release returns free memory to the OS (in slices unless whole); it returns
// the bytes by the allocator's account (-1 unknown), the calls, the longest.
func (s sysStep) release(whole bool) (released int64, slices int64, longest time.Duration, err error) {
	var out [2]C.int64_t
	defer func() { slices, longest = int64(out[0]), time.Duration(out[1]) }()
	wholeC, sliceC := C.int(0), C.size_t(sliceSize)
	if whole {
		wholeC, sliceC = 1, 0
	}
	switch s.allocator {
	case glibc:
		t0 := time.Now()
		C.cheap_glibc_trim(s.mallocTrim)
		out[0], out[1] = 1, C.int64_t(time.Since(t0))
		return -1, 0, 0, nil
	case jemalloc:
		before := s.stats().Resident
		if rc := C.cheap_je_purge_sliced(s.mallctl, wholeC, &out[0]); rc != 0 {
			return 0, 0, 0, fmt.Errorf("cheap: jemalloc mallctl(\"arena.<i>.purge\"): %w", syscall.Errno(rc))
		}
		return diff(before, s.stats().Resident), 0, 0, nil
	case mimalloc:
		before := s.miCommit()
		t0 := time.Now()
		C.cheap_mi_collect(s.miCollect, s.miThreadInit)
		out[0], out[1] = 1, C.int64_t(time.Since(t0))
		return diff(before, s.miCommit()), 0, 0, nil
	case tcmalloc:
		before := s.tcProp(3)
		var carved C.int64_t
		C.cheap_tc_release_sliced(s.tcRelease, s.tcReleaseN, s.tcProperty, s.tcMalloc, s.tcFree,
			sliceC, C.size_t(carveBytes), &out[0], &carved)
		lastCarved.Store(int64(carved))
		return diff(s.tcProp(3), before), 0, 0, nil
	}
	return 0, 0, 0, fmt.Errorf("%w: no allocator", ErrUnavailable)
}

// diff returns a-b, 0 when b grew past a meanwhile, -1 when either is unknown.
func diff(a, b int64) int64 {
	switch {
	case a < 0 || b < 0:
		return -1
	case a < b:
		return 0
	}
	return a - b
}

// resolve fills s's entry points with lookup and reports whether the release
// call was found, setting *version where told. For an allocator other than
// the owner (untrusted not nil), *untrusted gets the reason when they do not
// answer as the allocator's do: s must then never be called.
func (s *sysStep) resolve(prefix string, lookup func(string) unsafe.Pointer, version, untrusted *string) bool {
	switch s.allocator {
	case glibc:
		s.mallocTrim = lookup("malloc_trim")
		s.mallinfo2 = lookup("mallinfo2") // glibc 2.33+
		s.mallopt = lookup("mallopt")
		if v := lookup("gnu_get_libc_version"); v != nil {
			*version = C.GoString(C.cheap_glibc_version(v))
		}
	case jemalloc:
		s.mallctl = lookup(prefix + symMallctl)
		if s.mallctl == nil {
			return false
		}
		// A mallctl may not be jemalloc's (a shim, a stub): before any write or
		// purge it must answer the read-only "version" with a string in its
		// own object's image, as jemalloc's JEMALLOC_VERSION is.
		v := C.cheap_je_version(s.mallctl)
		_, fb, ok := where(s.mallctl)
		_, vb, vok := where(unsafe.Pointer(v))
		if untrusted != nil && (v == nil || !ok || !vok || vb != fb) {
			*untrusted = fmt.Sprintf("%smallctl(\"version\") did not return a version string of the same object, so it is not taken for jemalloc's and is never called", prefix)
			*s = sysStep{allocator: s.allocator}
			return true
		}
		if v != nil {
			*version = C.GoStringN(v, C.int(C.strnlen(v, 128)))
		}
	case mimalloc:
		s.miCollect = lookup(symMiCollect)
		if s.miCollect == nil {
			return false
		}
		s.miProcessInfo = lookup("mi_process_info")
		s.miThreadInit = lookup("mi_thread_init")
		// Likewise mi_collect is trusted only beside an mi_version answering
		// mimalloc's shape (major*100 + minor*10 + patch, 1.x to 9.x).
		v := lookup("mi_version")
		n := 0
		if v != nil {
			n = int(C.cheap_mi_version(v))
		}
		if untrusted != nil && (n < 100 || n >= 1000) {
			*untrusted = fmt.Sprintf("mi_collect has no mi_version beside it answering a mimalloc version (got %d), so it is not taken for mimalloc's and is never called", n)
			*s = sysStep{allocator: s.allocator}
			return true
		}
		if v != nil {
			*version = strconv.Itoa(n)
		}
	case tcmalloc:
		s.tcReleaseN = lookup(symTcRelease)
		s.tcMalloc, s.tcFree = lookup("tc_malloc"), lookup("tc_free")
		s.tcRelease = lookup("MallocExtension_ReleaseFreeMemory")
		s.tcProperty = lookup("MallocExtension_GetNumericProperty")
		if v := lookup("tc_version"); v != nil {
			if cs := C.cheap_tc_version(v); cs != nil {
				*version = C.GoString(cs)
			}
		}
		if s.tcReleaseN == nil || s.tcRelease == nil {
			return false
		}
	default:
		return false
	}
	return true
}

func (s sysStep) miCommit() int64 {
	if s.miProcessInfo == nil {
		return -1
	}
	return int64(C.cheap_mi_commit(s.miProcessInfo))
}

func (s sysStep) tcProp(which int) int64 {
	if s.tcProperty == nil {
		return -1
	}
	return int64(C.cheap_tc_prop(s.tcProperty, C.int(which)))
}

// clampSize converts a size_t to int64, -1 when it does not fit.
func clampSize(v C.size_t) int64 {
	if uint64(v) > 1<<63-1 {
		return -1
	}
	return int64(v)
}

func (s sysStep) stats() Stats {
	st := unknownStats(s.allocator, "")
	switch s.allocator {
	case glibc:
		if s.mallinfo2 == nil {
			return st // glibc before 2.33: mallinfo's int fields wrap at 2 GiB
		}
		mi := C.cheap_glibc_mallinfo2(s.mallinfo2)
		st.Arena = clampSize(mi.arena)
		st.Mapped = clampSize(mi.hblkhd)
		st.InUse = addKnown(clampSize(mi.uordblks), st.Mapped)
		st.Free = clampSize(mi.fordblks)
		st.Releasable = clampSize(mi.keepcost)
		st.Retained = st.Free
	case jemalloc:
		out := [7]C.int64_t{-1, -1, -1, -1, -1, -1, -1}
		if C.cheap_je_stats(s.mallctl, &out[0]) != 0 {
			return st // no epoch: the figures would be stale
		}
		st.InUse, st.Active, st.Resident, st.Arena, st.Page = int64(out[0]), int64(out[1]), int64(out[2]), int64(out[3]), int64(out[4])
		if pages := addKnown(int64(out[5]), int64(out[6])); pages >= 0 && st.Page > 0 && pages <= (1<<63-1)/st.Page {
			st.Releasable = pages * st.Page
		}
		st.Retained = diff(st.Resident, st.InUse)
		st.PageWarning = st.Page > int64(os.Getpagesize())
	case mimalloc:
		st.Arena = s.miCommit()
	case tcmalloc:
		st.InUse = s.tcProp(0)
		st.Arena = s.tcProp(1)
		st.Free = s.tcProp(2)
		st.Releasable = st.Free // what ReleaseToSystem returns: the page heap's free spans
		st.Resident = diff(st.Arena, s.tcProp(3))
		st.Retained = diff(st.Resident, st.InUse)
	}
	return st
}

func (s sysStep) setArenaMax(n int) error {
	if s.mallopt == nil {
		return fmt.Errorf("%w: glibc has no mallopt here", ErrUnavailable)
	}
	if n > 1<<31-1 {
		return fmt.Errorf("cheap: glibc arena cap %d does not fit mallopt's int", n)
	}
	malloptCalls.Add(1)
	if C.cheap_glibc_mallopt(s.mallopt, mArenaMax, C.int(n)) != 1 {
		return fmt.Errorf("cheap: mallopt(M_ARENA_MAX, %d) refused the value", n)
	}
	return nil
}
