//go:build linux && cgo

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
#include "cheap_linux.h"


void *cheap_sym(const char *name) { return dlsym(RTLD_DEFAULT, name); }

// cheap_sym_next looks name up in the objects after this one: the real
// definition when this object (the executable) holds only a PLT entry.
void *cheap_sym_next(const char *name) { return dlsym(RTLD_NEXT, name); }

int cheap_where(void *p, const char **fname, void **fbase) {
	Dl_info info;
	if (p == NULL || dladdr(p, &info) == 0) return 0;
	*fname = info.dli_fname;
	*fbase = info.dli_fbase;
	return 1;
}

void *cheap_self_base(void) {
	Dl_info info;
	if (dladdr((void *)&cheap_self_base, &info) == 0) return NULL;
	return info.dli_fbase;
}

// glibc
int cheap_glibc_trim(void *f) { return ((int (*)(size_t))f)(0); }
struct cheap_mallinfo2 cheap_glibc_mallinfo2(void *f) { return ((struct cheap_mallinfo2 (*)(void))f)(); }
int cheap_glibc_mallopt(void *f, int param, int value) { return ((int (*)(int, int))f)(param, value); }
const char *cheap_glibc_version(void *f) { return ((const char *(*)(void))f)(); }

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
int cheap_je_purge_sliced(void *f, int whole, int64_t out[2]) {
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
int cheap_je_stats(void *f, int64_t out[7]) {
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

const char *cheap_je_version(void *f) {
	const char *v = NULL;
	size_t sz = sizeof v;
	if (((cheap_mallctl_fn)f)("version", &v, &sz, NULL, 0) != 0) return NULL;
	return v;
}

// mimalloc
// cheap_mi_collect runs mi_collect(true) on this thread after making sure the
// thread has a mimalloc heap: on a thread that never called malloc,
// mi_collect returns at once without collecting anything.
void cheap_mi_collect(void *f, void *thread_init) {
	if (thread_init != NULL) {
		((void (*)(void))thread_init)();
	} else {
		free(malloc(16));
	}
	((void (*)(_Bool))f)(1);
}
int cheap_mi_version(void *f) { return ((int (*)(void))f)(); }
int64_t cheap_mi_commit(void *f) {
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
void cheap_tc_release_sliced(void *all, void *rel_n, void *prop, void *mal, void *fre, size_t slice, size_t chunk,
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
		// again, so without a pause it waits for the whole loop
		// (docs/benchmarks.md). 1 ms lets it through.
		if (fr > 0) usleep(1000);
	}
}
const char *cheap_tc_version(void *f) {
	int major = 0, minor = 0;
	const char *patch = NULL;
	return ((const char *(*)(int *, int *, const char **))f)(&major, &minor, &patch);
}
int64_t cheap_tc_prop(void *f, int which) {
	static const char *names[4] = {
		"generic.current_allocated_bytes", "generic.heap_size",
		"tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes",
	};
	size_t v = 0;
	if (which < 0 || which > 3) return -1;
	if (!((int (*)(const char *, size_t *))f)(names[which], &v) || v > (size_t)INT64_MAX) return -1;
	return (int64_t)v;
}
