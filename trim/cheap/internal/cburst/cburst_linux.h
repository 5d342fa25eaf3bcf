// The C half of package cburst (cburst_linux.c); see cburst.go for each call.
#ifndef CBURST_LINUX_H
#define CBURST_LINUX_H
#include <stddef.h>

int cburst_run(int threads, long blocks, size_t size, long keep_every);
long cburst_kept(void);
void cburst_free_kept(void);
int cburst_cross(long n, size_t size);
int cburst_plain_trim(void);
int cburst_glibc_arenas(void);
int cburst_probe_start(void);
void cburst_probe_stop(long long out[4]);
int cburst_churn_start(void);
void cburst_churn_reset(long long out[3]);
void cburst_churn_stop(void);
int cburst_steady(long long ms, long per_tick, long ring);

#endif
