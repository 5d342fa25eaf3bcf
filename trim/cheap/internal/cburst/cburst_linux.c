//go:build linux && cgo

// The C half of package cburst: the threads that make the bursts.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>
#include "cburst_linux.h"

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
int cburst_run(int threads, long blocks, size_t size, long keep_every) {
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

long cburst_kept(void) {
	long n = 0;
	for (int i = 0; i < cburst_njobs; i++) n += cburst_jobs[i].nkept;
	return n;
}

void cburst_free_kept(void) {
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

int cburst_cross(long n, size_t size) {
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
int cburst_plain_trim(void) {
	int (*f)(size_t) = (int (*)(size_t))dlsym(RTLD_DEFAULT, "malloc_trim");
	if (f == NULL) return -1;
	return f(0);
}

// cburst_glibc_arenas counts the arenas in glibc's malloc_info report: -1
// when malloc_info is missing or fails.
int cburst_glibc_arenas(void) {
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

int cburst_probe_start(void) {
	cburst_probe_max = cburst_probe_n = cburst_probe_at = cburst_probe_size = 0;
	cburst_probe_t0 = cburst_ns();
	atomic_store(&cburst_probe_run, 1);
	return pthread_create(&cburst_probe_tid, NULL, cburst_probe, NULL);
}

void cburst_probe_stop(long long out[4]) {
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

int cburst_churn_start(void) {
	atomic_store(&cburst_churn_max, 0);
	atomic_store(&cburst_churn_n, 0);
	atomic_store(&cburst_churn_at, 0);
	cburst_churn_t0 = cburst_ns();
	atomic_store(&cburst_churn_run, 1);
	return pthread_create(&cburst_churn_tid, NULL, cburst_churn, NULL);
}

// cburst_churn_reset writes the longest round and the rounds since the
// start or the last reset to out, then starts counting again.
void cburst_churn_reset(long long out[3]) {
	out[0] = atomic_exchange(&cburst_churn_max, 0);
	out[1] = atomic_exchange(&cburst_churn_n, 0);
	out[2] = atomic_load(&cburst_churn_at);
}

void cburst_churn_stop(void) {
	atomic_store(&cburst_churn_run, 0);
	pthread_join(cburst_churn_tid, NULL);
}

// cburst_steady: for ms milliseconds, every 10 ms, frees the oldest
// per_tick blocks of a ring of ring live blocks and mallocs as many new
// ones, of 4 KiB to 64 KiB in turn, writing each; then frees the ring.
int cburst_steady(long long ms, long per_tick, long ring) {
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
