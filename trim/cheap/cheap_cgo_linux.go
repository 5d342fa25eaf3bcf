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
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

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

static int64_t cheap_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// cheap_slice records one call that took d ns in out: out[0] counts the
// calls, out[1] keeps the longest.
static void cheap_slice(int64_t out[2], int64_t d) {
	out[0]++;
	if (d > out[1]) out[1] = d;
}

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

// cheap_je_purge_sliced purges one arena at a time (arena.<i>.purge for i
// below arenas.narenas), so that a thread of another arena never waits for
// this one; whole (or a jemalloc without arenas.narenas) purges all arenas
// in one call. out gets the calls and the longest (see cheap_slice). It
// returns the first error of a call, 0 when all succeeded.
static int cheap_je_purge_sliced(void *f, int whole, int64_t out[2]) {
	cheap_mallctl_fn mallctl = (cheap_mallctl_fn)f;
	unsigned n = 0;
	size_t sz = sizeof n;
	if (!whole && mallctl("arenas.narenas", &n, &sz, NULL, 0) == 0 && n > 0) {
		int rc = 0;
		for (unsigned i = 0; i < n; i++) {
			char name[48];
			snprintf(name, sizeof name, "arena.%u.purge", i);
			int64_t t0 = cheap_now_ns();
			int r = mallctl(name, NULL, NULL, NULL, 0);
			cheap_slice(out, cheap_now_ns() - t0);
			if (r != 0 && rc == 0) rc = r;
		}
		return rc;
	}
	int64_t t0 = cheap_now_ns();
	int rc = cheap_je_purge(f);
	cheap_slice(out, cheap_now_ns() - t0);
	return rc;
}

// cheap_je_stats advances the epoch and reads stats.allocated, stats.active,
// stats.resident, stats.mapped, arenas.page, and the dirty and muzzy pages
// of all arenas merged (stats.arenas.4096.pdirty and .pmuzzy, 4096 =
// MALLCTL_ARENAS_ALL: what a purge returns) into out; a figure jemalloc
// does not give (a build without stats, jemalloc 4) is left as it was. It
// returns the error of the epoch write.
static int cheap_je_stats(void *f, int64_t out[7]) {
	cheap_mallctl_fn mallctl = (cheap_mallctl_fn)f;
	uint64_t epoch = 1;
	size_t sz = sizeof epoch;
	int rc = mallctl("epoch", &epoch, &sz, &epoch, sz);
	static const char *names[7] = {"stats.allocated", "stats.active", "stats.resident", "stats.mapped", "arenas.page",
		"stats.arenas.4096.pdirty", "stats.arenas.4096.pmuzzy"};
	for (int i = 0; i < 7; i++) {
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
typedef int (*cheap_tc_prop_fn)(const char *, size_t *);

// cheap_tc_get reads tcmalloc's numeric property name into *v.
static int cheap_tc_get(cheap_tc_prop_fn get, const char *name, size_t *v) {
	return get != NULL && get(name, v);
}

// cheap_tc_carve is the first part of a sliced release: it takes the free
// pages of tcmalloc's page heap out of RSS without holding tcmalloc's
// page-heap lock across a madvise. tcmalloc releases whole free spans
// (PageHeap::ReleaseAtLeastNPages, gperftools 2.10), and the free spans
// of a burst merge into spans of hundreds of MiB: one
// MallocExtension_ReleaseToSystem call then madvises all of one under the
// lock. Instead, memctl allocates the free pages in chunks of chunk bytes
// with the allocator's own malloc (tc_malloc: a request above 256 KiB is
// carved from the best-fitting free span, a short hold of the lock), and
// madvises each chunk it got from the free pages (MADV_DONTNEED, on
// memory memctl owns, outside the allocator's locks), holding them all
// until the free pages are taken (so that the next request is not served
// the same pages); then it frees them (each free merges back, a short
// hold). The spans are then free and hold no resident page, and the
// release calls that follow madvise them in microseconds.
//
// A request that tcmalloc cannot serve from its free spans grows the heap;
// one that grows it across a multiple of 128 MiB while much is free makes
// tcmalloc release every free page at once, under its lock
// (kForcedCoalesceInterval in PageHeap::New): a chunk is made smaller
// (down to 512 KiB) so that the heap (committed + unmapped bytes) plus the
// chunk plus 256 KiB (the largest tcmalloc page) stays below the next
// multiple (tcmalloc's heap often ends 1 MiB below one), and the carve
// stops at the first request that grew the heap. It stops too when fewer
// than a chunk's bytes are free, after 1024 requests in a row served from unmapped spans
// (best fit may prefer one), and at (free + unmapped)/chunk + 64
// requests; there is none under a heap limit (see below). out gets the
// calls that take the lock (see cheap_slice); *carved the bytes madvised.
// It returns the chunks served from unmapped spans.
static size_t cheap_tc_carve(void *mal, void *fre, cheap_tc_prop_fn get, size_t chunk, int64_t out[2], int64_t *carved) {
	const size_t interval = (size_t)128 << 20, margin = (size_t)256 << 10;
	size_t fr = 0, co = 0, un = 0, limit = 0;
	// Under a heap limit (TCMALLOC_HEAP_LIMIT_MB), a chunk taken from an
	// unmapped span can make tcmalloc release free spans under its lock
	// to stay within the limit (PageHeap::EnsureLimit): no carve then.
	if (cheap_tc_get(get, "tcmalloc.heap_limit_mb", &limit) && limit > 0) return 0;
	if (mal == NULL || fre == NULL || chunk == 0 ||
		!cheap_tc_get(get, "tcmalloc.pageheap_free_bytes", &fr) ||
		!cheap_tc_get(get, "tcmalloc.pageheap_committed_bytes", &co) ||
		!cheap_tc_get(get, "tcmalloc.pageheap_unmapped_bytes", &un)) return 0;
	size_t cap = (fr + un) / chunk + 64;
	// The list of chunks held is mapped, not malloc'ed: malloc may be the
	// allocator being released.
	void **held = mmap(NULL, cap * sizeof(void *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (held == MAP_FAILED) return 0;
	long page = sysconf(_SC_PAGESIZE);
	if (page <= 0) page = 4096;
	size_t n = 0, misses = 0, unmapped = 0;
	while (n < cap && misses < 1024) {
		size_t sys = co + un;
		// The largest request that cannot cross a multiple of 128 MiB,
		// at most chunk, in 64 KiB steps; none under 512 KiB (requests
		// of 256 KiB and less are served from tcmalloc's size classes).
		size_t c = interval - sys % interval - margin - 1;
		c = (c < chunk ? c : chunk) & ~(((size_t)64 << 10) - 1);
		if (sys % interval + margin >= interval || c < ((size_t)512 << 10) || fr < c) break;
		int64_t t0 = cheap_now_ns();
		void *p = ((void *(*)(size_t))mal)(c);
		cheap_slice(out, cheap_now_ns() - t0);
		if (p == NULL) break;
		held[n++] = p;
		size_t fr1 = 0;
		if (!cheap_tc_get(get, "tcmalloc.pageheap_free_bytes", &fr1) ||
			!cheap_tc_get(get, "tcmalloc.pageheap_committed_bytes", &co) ||
			!cheap_tc_get(get, "tcmalloc.pageheap_unmapped_bytes", &un)) break;
		if (co + un > sys) break; // the heap grew: no free span was large enough
		if (fr1 + c / 2 <= fr) {
			// Served from the free pages: return them (whole pages
			// inside the chunk).
			uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
			uintptr_t hi = ((uintptr_t)p + c) & ~((uintptr_t)page - 1);
			if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0) *carved += (int64_t)(hi - lo);
			misses = 0;
		} else {
			misses++;
			unmapped++;
		}
		fr = fr1;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t t0 = cheap_now_ns();
		((void (*)(void *))fre)(held[i]);
		cheap_slice(out, cheap_now_ns() - t0);
	}
	munmap(held, cap * sizeof(void *));
	return unmapped;
}

// cheap_tc_release_sliced returns the page heap's free pages in slices:
// first the carve (cheap_tc_carve, when mal, fre and chunk are given),
// then MallocExtension_ReleaseToSystem(slice) calls, 1 ms apart, while
// tcmalloc.pageheap_free_bytes says pages are free. Another thread's
// allocations and frees move that figure both ways, so the loop ends when
// it has not reached a new low in 8 calls that were expected to release
// (a call that unmaps a span larger than asked makes tcmalloc count the
// surplus against the next calls, which then release nothing: those are
// not counted), and after 2 × free/slice + 64 calls in all. Without rel_n,
// prop or a slice it calls MallocExtension_ReleaseFreeMemory once. out
// gets the calls that take the page-heap lock and the longest (see
// cheap_slice); *carved what the carve madvised.
static void cheap_tc_release_sliced(void *all, void *rel_n, void *prop, void *mal, void *fre, size_t slice, size_t chunk,
	int64_t out[2], int64_t *carved) {
	cheap_tc_prop_fn get = (cheap_tc_prop_fn)prop;
	size_t fr = 0;
	if (rel_n == NULL || prop == NULL || slice == 0 || !get("tcmalloc.pageheap_free_bytes", &fr)) {
		int64_t t0 = cheap_now_ns();
		((void (*)(void))all)();
		cheap_slice(out, cheap_now_ns() - t0);
		return;
	}
	// A chunk served from an unmapped span comes back as a free span with
	// no resident page, and merges with its free neighbours: free spans
	// that an unmapped one kept apart, resident, now form one. A second
	// carve takes those apart again.
	for (int pass = 0; pass < 2 && fr >= chunk / 2; pass++) {
		size_t unmapped = cheap_tc_carve(mal, fre, get, chunk, out, carved);
		if (!get("tcmalloc.pageheap_free_bytes", &fr)) return;
		if (unmapped == 0) break;
	}
	size_t calls = 2 * (fr / slice) + 64, low = fr, surplus = 0;
	int idle = 0;
	for (size_t i = 1; i <= calls && fr > 0 && idle < 8; i++) {
		size_t before = fr;
		int expect = slice > surplus; // else tcmalloc only takes the slice off its surplus
		int64_t t0 = cheap_now_ns();
		((void (*)(size_t))rel_n)(slice);
		cheap_slice(out, cheap_now_ns() - t0);
		if (!get("tcmalloc.pageheap_free_bytes", &fr)) break;
		size_t dropped = before > fr ? before - fr : 0;
		if (!expect) {
			surplus -= slice;
		} else {
			surplus = dropped > slice - surplus ? dropped - (slice - surplus) : 0;
		}
		if (fr < low) {
			low = fr;
			idle = 0;
		} else if (expect) {
			idle++;
		}
		// tcmalloc's page-heap SpinLock is not fair: a waiter woken by
		// the unlock finds it taken again by the next call and sleeps
		// again, so without a pause it waits for the whole loop (measured:
		// 104-108 ms of 112-116 ms). 1 ms lets it through.
		if (fr > 0) usleep(1000);
	}
}
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
	"time"
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
	tcReleaseN                     unsafe.Pointer // MallocExtension_ReleaseToSystem
	tcMalloc, tcFree               unsafe.Pointer // tc_malloc, tc_free: the carve (see carveBytes)

	// handle is the dlopen handle held on the object of an allocator found
	// by its own handle (it keeps the object loaded while memctl may call
	// into it); nil for the owner found through RTLD_DEFAULT.
	handle unsafe.Pointer
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
	s := &Step{allocator: alloc, library: lib, sys: sysStep{allocator: alloc}, ownerBase: uintptr(base)}
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
		s.sys.tcReleaseN = symIn("MallocExtension_ReleaseToSystem", base)
		s.sys.tcMalloc, s.sys.tcFree = symIn("tc_malloc", base), symIn("tc_free", base)
		s.sys.tcProperty = symIn("MallocExtension_GetNumericProperty", base)
		if v := symIn("tc_version", base); v != nil {
			if cs := C.cheap_tc_version(v); cs != nil {
				s.version = C.GoString(cs)
			}
		}
	}
	return s
}

// release returns the allocator's free memory to the OS (in slices unless
// whole) and returns what it released by its own account (-1 unknown), the
// calls it made and the longest of them.
func (s sysStep) release(whole bool) (released int64, slices int64, longest time.Duration, err error) {
	var out [2]C.int64_t
	defer func() { slices, longest = int64(out[0]), time.Duration(out[1]) }()
	switch s.allocator {
	case Glibc:
		t0 := time.Now()
		C.cheap_glibc_trim(s.mallocTrim)
		out[0], out[1] = 1, C.int64_t(time.Since(t0))
		return -1, 0, 0, nil
	case Jemalloc:
		before := s.stats().Resident
		if rc := C.cheap_je_purge_sliced(s.mallctl, boolInt(whole), &out[0]); rc != 0 {
			return 0, 0, 0, fmt.Errorf("cheap: jemalloc mallctl(\"arena.<i>.purge\"): %w", syscall.Errno(rc))
		}
		return diff(before, s.stats().Resident), 0, 0, nil
	case Mimalloc:
		before := s.miCommit()
		t0 := time.Now()
		C.cheap_mi_collect(s.miCollect, s.miThreadInit)
		out[0], out[1] = 1, C.int64_t(time.Since(t0))
		return diff(before, s.miCommit()), 0, 0, nil
	case Tcmalloc:
		before := s.tcProp(3)
		var carved C.int64_t
		C.cheap_tc_release_sliced(s.tcRelease, s.tcReleaseN, s.tcProperty, s.tcMalloc, s.tcFree,
			C.size_t(sliceBytes(whole)), C.size_t(carveBytes), &out[0], &carved)
		lastCarved.Store(int64(carved))
		return diff(s.tcProp(3), before), 0, 0, nil
	}
	return 0, 0, 0, fmt.Errorf("%w: no allocator", ErrUnavailable)
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
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

// resolve fills the entry points of s's allocator with lookup and reports
// whether the release call was found; it sets *version where the allocator
// tells one. untrusted is set, with the reason, when the entry points are
// there but do not answer as the allocator's do: s must then not be called.
func (s *sysStep) resolve(prefix string, lookup func(string) unsafe.Pointer, version, untrusted *string) bool {
	switch s.allocator {
	case Jemalloc:
		s.mallctl = lookup(prefix + symMallctl)
		if s.mallctl == nil {
			return false
		}
		// A function named mallctl is not always jemalloc's (a shim, a
		// stub, another library's control call): before any call that
		// writes or purges, it must answer the read-only "version" with a
		// string that lives in the same object's image, as jemalloc's
		// does (its JEMALLOC_VERSION constant).
		v := C.cheap_je_version(s.mallctl)
		_, fb, ok := where(s.mallctl)
		_, vb, vok := where(unsafe.Pointer(v))
		if v == nil || !ok || !vok || vb != fb {
			*untrusted = fmt.Sprintf("%smallctl(\"version\") did not return a version string of the same object, so it is not taken for jemalloc's and is never called", prefix)
			*s = sysStep{allocator: s.allocator}
			return true
		}
		*version = C.GoStringN(v, C.int(C.strnlen(v, 128)))
	case Mimalloc:
		s.miCollect = lookup(symMiCollect)
		if s.miCollect == nil {
			return false
		}
		s.miProcessInfo = lookup("mi_process_info")
		s.miThreadInit = lookup("mi_thread_init")
		// As for mallctl: a function named mi_collect is trusted only
		// beside mimalloc's mi_version answering a version of mimalloc's
		// shape (major*100 + minor*10 + patch, 1.x to 9.x).
		v := lookup("mi_version")
		n := 0
		if v != nil {
			n = int(C.cheap_mi_version(v))
		}
		if n < 100 || n >= 1000 {
			*untrusted = fmt.Sprintf("mi_collect has no mi_version beside it answering a mimalloc version (got %d), so it is not taken for mimalloc's and is never called", n)
			*s = sysStep{allocator: s.allocator}
			return true
		}
		*version = strconv.Itoa(n)
	case Tcmalloc:
		s.tcReleaseN = lookup(symTcRelease)
		s.tcMalloc, s.tcFree = lookup("tc_malloc"), lookup("tc_free")
		s.tcRelease = lookup("MallocExtension_ReleaseFreeMemory")
		s.tcProperty = lookup("MallocExtension_GetNumericProperty")
		if s.tcReleaseN == nil || s.tcRelease == nil {
			return false
		}
		if v := lookup("tc_version"); v != nil {
			if cs := C.cheap_tc_version(v); cs != nil {
				*version = C.GoString(cs)
			}
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
	case Mimalloc:
		st.Arena = s.miCommit()
	case Tcmalloc:
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
