//go:build linux && cgo

// The C half of package dlburst.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dlburst_linux.h"

static char dlburst_dlerr[512];
const char *dlburst_dlerror(void) { return dlburst_dlerr; }

// dlburst_load opens path (local: 0 RTLD_GLOBAL, 1 RTLD_LOCAL, 2 dlmopen
// into a new namespace); on failure *dlburst_dlerr holds dlerror.
void *dlburst_load(const char *path, int local) {
	void *h = local == 2 ? dlmopen(LM_ID_NEWLM, path, RTLD_NOW) : dlopen(path, RTLD_NOW | (local ? RTLD_LOCAL : RTLD_GLOBAL));
	if (h == NULL) snprintf(dlburst_dlerr, sizeof dlburst_dlerr, "%s", dlerror());
	return h;
}

// dlburst_dl_burst is Run, with block sizes a fixed pseudo-random
// sequence. It returns 0, or -1 when dlopen fails, -2 for a missing
// symbol, -3 when malloc fails.
int dlburst_dl_burst(const char *path, int local, const char *prefix, long long total, size_t min, size_t max) {
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

int dlburst_unload(uintptr_t h) {
	if (dlclose((void *)h) != 0) {
		snprintf(dlburst_dlerr, sizeof dlburst_dlerr, "%s", dlerror());
		return -1;
	}
	return 0;
}
