//go:build linux && cgo

package cburst

/*
#cgo LDFLAGS: -ldl -lpthread
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	long blocks;
	size_t size;
	long keep_every;
	pthread_barrier_t *start;
	void **kept;
	long nkept;
	int failed;
} cburst_job;

static void *cburst_worker(void *arg) {
	cburst_job *j = arg;
	void **p = malloc((size_t)j->blocks * sizeof(void *));
	if (p == NULL) {
		j->failed = 1;
		pthread_barrier_wait(j->start);
		return NULL;
	}
	pthread_barrier_wait(j->start);
	for (long i = 0; i < j->blocks; i++) {
		p[i] = malloc(j->size);
		if (p[i] == NULL) {
			j->failed = 1;
			j->blocks = i;
			break;
		}
		memset(p[i], 0xa5, j->size);
	}
	long cap = j->keep_every > 0 ? j->blocks / j->keep_every + 1 : 0;
	if (cap > 0) {
		j->kept = malloc((size_t)cap * sizeof(void *));
		if (j->kept == NULL) {
			j->failed = 1;
			cap = 0;
		}
	}
	for (long i = 0; i < j->blocks; i++) {
		if (cap > 0 && i % j->keep_every == 0 && j->nkept < cap) {
			j->kept[j->nkept++] = p[i];
		} else {
			free(p[i]);
		}
	}
	free(p);
	return NULL;
}

static cburst_job *cburst_jobs;
static int cburst_njobs;

// cburst_run starts threads threads that each allocate blocks blocks of size
// bytes, then free them all but every keep_every-th (all when keep_every is
// 0), and waits for them. Kept blocks stay live until cburst_free_kept.
static int cburst_run(int threads, long blocks, size_t size, long keep_every) {
	pthread_barrier_t start;
	pthread_t *tids = calloc((size_t)threads, sizeof(pthread_t));
	cburst_job *jobs = calloc((size_t)threads, sizeof(cburst_job));
	if (tids == NULL || jobs == NULL) return -1;
	if (pthread_barrier_init(&start, NULL, (unsigned)threads) != 0) return -2;
	for (int i = 0; i < threads; i++) {
		jobs[i].blocks = blocks;
		jobs[i].size = size;
		jobs[i].keep_every = keep_every;
		jobs[i].start = &start;
		if (pthread_create(&tids[i], NULL, cburst_worker, &jobs[i]) != 0) return -3;
	}
	int failed = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(tids[i], NULL);
		failed |= jobs[i].failed;
	}
	pthread_barrier_destroy(&start);
	free(tids);
	cburst_jobs = jobs;
	cburst_njobs = threads;
	return failed ? -4 : 0;
}

static long cburst_kept(void) {
	long n = 0;
	for (int i = 0; i < cburst_njobs; i++) n += cburst_jobs[i].nkept;
	return n;
}

static void cburst_free_kept(void) {
	for (int i = 0; i < cburst_njobs; i++) {
		for (long k = 0; k < cburst_jobs[i].nkept; k++) free(cburst_jobs[i].kept[k]);
		free(cburst_jobs[i].kept);
	}
	free(cburst_jobs);
	cburst_jobs = NULL;
	cburst_njobs = 0;
}

// cburst_cross: one thread mallocs n blocks of size bytes and writes them,
// another frees them (mimalloc then frees them lazily, through the owning
// thread's delayed-free list).
typedef struct {
	void **p;
	long n;
	size_t size;
	int failed;
} cburst_cross_job;

static void *cburst_cross_alloc(void *arg) {
	cburst_cross_job *j = arg;
	for (long i = 0; i < j->n; i++) {
		j->p[i] = malloc(j->size);
		if (j->p[i] == NULL) {
			j->failed = 1;
			j->n = i;
			break;
		}
		memset(j->p[i], 0x5a, j->size);
	}
	return NULL;
}

static void *cburst_cross_free(void *arg) {
	cburst_cross_job *j = arg;
	for (long i = 0; i < j->n; i++) free(j->p[i]);
	return NULL;
}

static int cburst_cross(long n, size_t size) {
	cburst_cross_job j = {0};
	j.p = malloc((size_t)n * sizeof(void *));
	if (j.p == NULL) return -1;
	j.n = n;
	j.size = size;
	pthread_t t;
	if (pthread_create(&t, NULL, cburst_cross_alloc, &j) != 0) return -2;
	pthread_join(t, NULL);
	if (pthread_create(&t, NULL, cburst_cross_free, &j) != 0) return -3;
	pthread_join(t, NULL);
	free(j.p);
	return j.failed ? -4 : 0;
}

// cburst_plain_trim calls whatever malloc_trim the process resolves (glibc's
// when another allocator is preloaded): -1 when there is none.
static int cburst_plain_trim(void) {
	int (*f)(size_t) = (int (*)(size_t))dlsym(RTLD_DEFAULT, "malloc_trim");
	if (f == NULL) return -1;
	return f(0);
}

// cburst_glibc_arenas counts the arenas in glibc's malloc_info report: -1
// when malloc_info is missing or fails.
static int cburst_glibc_arenas(void) {
	int (*f)(int, FILE *) = (int (*)(int, FILE *))dlsym(RTLD_DEFAULT, "malloc_info");
	if (f == NULL) return -1;
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	if (m == NULL) return -1;
	int rc = f(0, m);
	fclose(m);
	if (rc != 0 || buf == NULL) {
		free(buf);
		return -1;
	}
	int n = 0;
	for (char *s = buf; (s = strstr(s, "<heap nr=")) != NULL; s++) n++;
	free(buf);
	return n;
}

// The prober: one C thread that mallocs and frees blocks of 2 KiB to
// 512 KiB in turn (past glibc's tcache and tcmalloc's thread cache for the
// larger ones, so that it takes the allocator's locks) and keeps the
// longest malloc+free pair.
#include <stdatomic.h>
#include <time.h>
static atomic_int cburst_probe_run;
static pthread_t cburst_probe_tid;
static long long cburst_probe_max, cburst_probe_n, cburst_probe_t0, cburst_probe_at, cburst_probe_size;

static long long cburst_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *cburst_probe(void *arg) {
	static const size_t sizes[4] = {2 << 10, 16 << 10, 100 << 10, 512 << 10};
	(void)arg;
	for (long i = 0; atomic_load(&cburst_probe_run); i++) {
		long long t0 = cburst_ns();
		void *p = malloc(sizes[i & 3]);
		if (p != NULL) *(volatile char *)p = 1;
		free(p);
		long long d = cburst_ns() - t0;
		if (d > cburst_probe_max) {
			cburst_probe_max = d;
			cburst_probe_at = t0 - cburst_probe_t0;
			cburst_probe_size = (long long)sizes[i & 3];
		}
		cburst_probe_n++;
	}
	return NULL;
}

static int cburst_probe_start(void) {
	cburst_probe_max = cburst_probe_n = cburst_probe_at = cburst_probe_size = 0;
	cburst_probe_t0 = cburst_ns();
	atomic_store(&cburst_probe_run, 1);
	return pthread_create(&cburst_probe_tid, NULL, cburst_probe, NULL);
}

static void cburst_probe_stop(long long out[4]) {
	atomic_store(&cburst_probe_run, 0);
	pthread_join(cburst_probe_tid, NULL);
	out[0] = cburst_probe_max;
	out[1] = cburst_probe_n;
	out[2] = cburst_probe_at;
	out[3] = cburst_probe_size;
}
// The churn: one C thread that loops malloc(64)/free, then
// malloc(512 KiB)/free (past tcmalloc's thread cache: the page heap's
// lock), pausing 50 us after each round, and keeps the longest round.
// cburst_churn_reset restarts the longest.
static atomic_int cburst_churn_run;
static pthread_t cburst_churn_tid;
static _Atomic long long cburst_churn_max, cburst_churn_n, cburst_churn_at;
static long long cburst_churn_t0;

static void *cburst_churn(void *arg) {
	(void)arg;
	while (atomic_load(&cburst_churn_run)) {
		long long t0 = cburst_ns();
		void *p = malloc(64);
		if (p != NULL) *(volatile char *)p = 1;
		free(p);
		p = malloc(512 << 10);
		if (p != NULL) *(volatile char *)p = 1;
		free(p);
		long long d = cburst_ns() - t0;
		if (d > atomic_load(&cburst_churn_max)) {
			atomic_store(&cburst_churn_max, d);
			atomic_store(&cburst_churn_at, t0 - cburst_churn_t0);
		}
		atomic_fetch_add(&cburst_churn_n, 1);
		struct timespec ts = {0, 50000};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

static int cburst_churn_start(void) {
	atomic_store(&cburst_churn_max, 0);
	atomic_store(&cburst_churn_n, 0);
	atomic_store(&cburst_churn_at, 0);
	cburst_churn_t0 = cburst_ns();
	atomic_store(&cburst_churn_run, 1);
	return pthread_create(&cburst_churn_tid, NULL, cburst_churn, NULL);
}

// cburst_churn_reset writes the longest round and the rounds since the
// start or the last reset to out, then starts counting again.
static void cburst_churn_reset(long long out[3]) {
	out[0] = atomic_exchange(&cburst_churn_max, 0);
	out[1] = atomic_exchange(&cburst_churn_n, 0);
	out[2] = atomic_load(&cburst_churn_at);
}

static void cburst_churn_stop(void) {
	atomic_store(&cburst_churn_run, 0);
	pthread_join(cburst_churn_tid, NULL);
}

// cburst_steady: for ms milliseconds, every 10 ms, frees the oldest
// per_tick blocks of a ring of ring live blocks and mallocs as many new
// ones, of 4 KiB to 64 KiB in turn, writing each; then frees the ring.
static int cburst_steady(long long ms, long per_tick, long ring) {
	void **p = calloc((size_t)ring, sizeof(void *));
	if (p == NULL) return -1;
	int failed = 0;
	long at = 0, n = 0;
	long long end = cburst_ns() + ms * 1000000;
	while (!failed && cburst_ns() < end) {
		for (long i = 0; i < per_tick; i++, n++) {
			size_t size = (size_t)(n % 16 + 1) << 12;
			free(p[at]);
			p[at] = malloc(size);
			if (p[at] == NULL) {
				failed = 1;
				break;
			}
			memset(p[at], 0x3c, size);
			at = (at + 1) % ring;
		}
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	for (long i = 0; i < ring; i++) free(p[i]);
	free(p);
	return failed ? -2 : 0;
}
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
