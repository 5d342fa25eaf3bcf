// The C half of package dlburst (dlburst_linux.c).
#ifndef DLBURST_LINUX_H
#define DLBURST_LINUX_H
#include <stddef.h>
#include <stdint.h>

const char *dlburst_dlerror(void);
void *dlburst_load(const char *path, int local);
int dlburst_dl_burst(const char *path, int local, const char *prefix, long long total, size_t min, size_t max);
int dlburst_unload(uintptr_t h);
#endif
