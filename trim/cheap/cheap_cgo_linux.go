//go:build linux && cgo

package cheap

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// glibc's struct mallinfo2 (glibc 2.33+), declared here so that the package
// builds against any C library.
struct cheap_mallinfo2 {
	size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};

static void *cheap_sym(const char *name) { return dlsym(RTLD_DEFAULT, name); }

// cheap_sym_next looks name up in the objects after this one: the real
// definition when this object (the executable) holds only a PLT entry.
static void *cheap_sym_next(const char *name) { return dlsym(RTLD_NEXT, name); }

static int cheap_where(void *p, const char **fname, void **fbase) {
	Dl_info info;
	if (p == NULL || dladdr(p, &info) == 0) return 0;
	*fname = info.dli_fname;
	*fbase = info.dli_fbase;
	return 1;
}

static void *cheap_self_base(void) {
	Dl_info info;
	if (dladdr((void *)&cheap_self_base, &info) == 0) return NULL;
	return info.dli_fbase;
}

// glibc
static int cheap_glibc_trim(void *f) { return ((int (*)(size_t))f)(0); }
static struct cheap_mallinfo2 cheap_glibc_mallinfo2(void *f) { return ((struct cheap_mallinfo2 (*)(void))f)(); }
static int cheap_glibc_mallopt(void *f, int param, int value) { return ((int (*)(int, int))f)(param, value); }
static const char *cheap_glibc_version(void *f) { return ((const char *(*)(void))f)(); }

// jemalloc
typedef int (*cheap_mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static int cheap_je_purge(void *f) {
	cheap_mallctl_fn mallctl = (cheap_mallctl_fn)f;
	int rc = mallctl("arena.4096.purge", NULL, NULL, NULL, 0); // 4096 = MALLCTL_ARENAS_ALL
	if (rc == 0) return 0;
	// jemalloc before 5.0 names all arenas arena.<narenas>.
	unsigned n;
	size_t sz = sizeof n;
	if (mallctl("arenas.narenas", &n, &sz, NULL, 0) != 0) return rc;
	char name[48];
	snprintf(name, sizeof name, "arena.%u.purge", n);
	return mallctl(name, NULL, NULL, NULL, 0);
}

// cheap_je_stats advances the epoch and reads stats.allocated, stats.active,
// stats.resident, stats.mapped and arenas.page into out; a figure jemalloc
// does not give (a build without stats) is left as it was. It returns the
// error of the epoch write.
static int cheap_je_stats(void *f, int64_t out[5]) {
	cheap_mallctl_fn mallctl = (cheap_mallctl_fn)f;
	uint64_t epoch = 1;
	size_t sz = sizeof epoch;
	int rc = mallctl("epoch", &epoch, &sz, &epoch, sz);
	static const char *names[5] = {"stats.allocated", "stats.active", "stats.resident", "stats.mapped", "arenas.page"};
	for (int i = 0; i < 5; i++) {
		size_t v;
		sz = sizeof v;
		if (mallctl(names[i], &v, &sz, NULL, 0) == 0 && sz == sizeof v && v <= (size_t)INT64_MAX) out[i] = (int64_t)v;
	}
	return rc;
}

static const char *cheap_je_version(void *f) {
	const char *v = NULL;
	size_t sz = sizeof v;
	if (((cheap_mallctl_fn)f)("version", &v, &sz, NULL, 0) != 0) return NULL;
	return v;
}

// mimalloc
// cheap_mi_collect runs mi_collect(true) on this thread after making sure the
// thread has a mimalloc heap: on a thread that never called malloc,
// mi_collect returns at once without collecting anything.
static void cheap_mi_collect(void *f, void *thread_init) {
	if (thread_init != NULL) {
		((void (*)(void))thread_init)();
	} else {
		free(malloc(16));
	}
	((void (*)(_Bool))f)(1);
}
static int cheap_mi_version(void *f) { return ((int (*)(void))f)(); }
static int64_t cheap_mi_commit(void *f) {
	size_t elapsed = 0, user = 0, sys = 0, rss = 0, peak_rss = 0, commit = 0, peak_commit = 0, faults = 0;
	((void (*)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *))f)(
		&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
	return commit <= (size_t)INT64_MAX ? (int64_t)commit : -1;
}

// gperftools tcmalloc
static void cheap_tc_release(void *f) { ((void (*)(void))f)(); }
static const char *cheap_tc_version(void *f) {
	int major = 0, minor = 0;
	const char *patch = NULL;
	return ((const char *(*)(int *, int *, const char **))f)(&major, &minor, &patch);
}
static int64_t cheap_tc_prop(void *f, int which) {
	static const char *names[4] = {
		"generic.current_allocated_bytes", "generic.heap_size",
		"tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes",
	};
	size_t v = 0;
	if (which < 0 || which > 3) return -1;
	if (!((int (*)(const char *, size_t *))f)(names[which], &v) || v > (size_t)INT64_MAX) return -1;
	return (int64_t)v;
}
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// malloptCalls counts the calls of mallopt, for the tests to show that an
// operator's cap is left alone.
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
}

func sym(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return unsafe.Pointer(C.cheap_sym(cs))
}

func symNext(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return unsafe.Pointer(C.cheap_sym_next(cs))
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
	p := sym(name)
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
		return Jemalloc
	case symIn("mi_collect", base) != nil:
		return Mimalloc
	case symIn("MallocExtension_ReleaseFreeMemory", base) != nil:
		return Tcmalloc
	case symIn("malloc_trim", base) != nil && symIn("gnu_get_libc_version", base) != nil:
		return Glibc
	}
	return ""
}

func detect() *Step {
	m := sym("malloc")
	if m == nil {
		return &Step{why: "dlsym finds no malloc (a static binary?)"}
	}
	lib, base, ok := where(m)
	if !ok {
		return &Step{why: "dladdr cannot name the object that provides malloc (a static binary?)"}
	}
	alloc := owner(base)
	if alloc == "" && base == C.cheap_self_base() {
		// malloc resolved to this executable: a PLT entry of a non-PIE
		// binary, or an allocator linked in without its entry points
		// exported. The next definition is the real one in the first case.
		if m2 := symNext("malloc"); m2 != nil {
			if lib2, base2, ok := where(m2); ok {
				if a := owner(base2); a != "" {
					alloc, lib, base = a, lib2, base2
				}
			}
		}
	}
	if alloc == "" {
		why := fmt.Sprintf("malloc is provided by %q, which is not glibc, jemalloc, mimalloc or tcmalloc", lib)
		if sym("gnu_get_libc_version") == nil {
			why += " (the C library is not glibc: musl has no call that returns freed memory)"
		}
		return &Step{library: lib, why: why}
	}
	s := &Step{allocator: alloc, library: lib, sys: sysStep{allocator: alloc}}
	switch alloc {
	case Glibc:
		s.sys.mallocTrim = symIn("malloc_trim", base)
		s.sys.mallinfo2 = symIn("mallinfo2", base) // glibc 2.33+
		s.sys.mallopt = symIn("mallopt", base)
		if v := symIn("gnu_get_libc_version", base); v != nil {
			s.version = C.GoString(C.cheap_glibc_version(v))
		}
	case Jemalloc:
		s.sys.mallctl = symIn("mallctl", base)
		if v := C.cheap_je_version(s.sys.mallctl); v != nil {
			s.version = C.GoString(v)
		}
	case Mimalloc:
		s.sys.miCollect = symIn("mi_collect", base)
		s.sys.miProcessInfo = symIn("mi_process_info", base)
		s.sys.miThreadInit = symIn("mi_thread_init", base)
		if v := symIn("mi_version", base); v != nil {
			s.version = strconv.Itoa(int(C.cheap_mi_version(v)))
		}
	case Tcmalloc:
		s.sys.tcRelease = symIn("MallocExtension_ReleaseFreeMemory", base)
		s.sys.tcProperty = symIn("MallocExtension_GetNumericProperty", base)
		if v := symIn("tc_version", base); v != nil {
			if cs := C.cheap_tc_version(v); cs != nil {
				s.version = C.GoString(cs)
			}
		}
	}
	return s
}

func (s sysStep) release() (int64, error) {
	switch s.allocator {
	case Glibc:
		C.cheap_glibc_trim(s.mallocTrim)
		return -1, nil
	case Jemalloc:
		before := s.stats().Resident
		if rc := C.cheap_je_purge(s.mallctl); rc != 0 {
			return 0, fmt.Errorf("cheap: jemalloc mallctl(\"arena.4096.purge\"): %w", syscall.Errno(rc))
		}
		return diff(before, s.stats().Resident), nil
	case Mimalloc:
		before := s.miCommit()
		C.cheap_mi_collect(s.miCollect, s.miThreadInit)
		return diff(before, s.miCommit()), nil
	case Tcmalloc:
		before := s.tcProp(3)
		C.cheap_tc_release(s.tcRelease)
		return diff(s.tcProp(3), before), nil
	}
	return 0, fmt.Errorf("%w: no allocator", ErrUnavailable)
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
	case Glibc:
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
	case Jemalloc:
		out := [5]C.int64_t{-1, -1, -1, -1, -1}
		if C.cheap_je_stats(s.mallctl, &out[0]) != 0 {
			return st // no epoch: the figures would be stale
		}
		st.InUse, st.Active, st.Resident, st.Arena, st.Page = int64(out[0]), int64(out[1]), int64(out[2]), int64(out[3]), int64(out[4])
		st.Retained = diff(st.Resident, st.InUse)
		st.PageWarning = st.Page > int64(os.Getpagesize())
	case Mimalloc:
		st.Arena = s.miCommit()
	case Tcmalloc:
		st.InUse = s.tcProp(0)
		st.Arena = s.tcProp(1)
		st.Free = s.tcProp(2)
		st.Resident = diff(st.Arena, s.tcProp(3))
		st.Retained = diff(st.Resident, st.InUse)
	}
	return st
}

// addKnown returns a+b, or -1 when either is unknown or the sum overflows.
func addKnown(a, b int64) int64 {
	if a < 0 || b < 0 || a > 1<<63-1-b {
		return -1
	}
	return a + b
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
