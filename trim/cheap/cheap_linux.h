// The C half of package cheap (cheap_linux.c: the calls into each
// allocator; heaps_linux.c: the walk of the loaded objects).
#ifndef CHEAP_LINUX_H
#define CHEAP_LINUX_H
#include <link.h>
#include <stddef.h>
#include <stdint.h>

// glibc's struct mallinfo2 (glibc 2.33+), declared here so that the package
// builds against any C library.
struct cheap_mallinfo2 {
	size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};

typedef struct {
	char *name;      // dlpi_name, strdup'ed ("" for the executable)
	uintptr_t addr;  // dlpi_addr: the load bias
	uintptr_t start; // where the first PT_LOAD segment is mapped (dladdr's dli_fbase)
	uintptr_t end;   // the end of the last PT_LOAD segment in memory
	unsigned char id[64]; // the GNU build ID in the loaded image (its first idlen bytes)
	int idlen;
	long ns; // the link-map namespace (Lmid_t): 0 for the main one
} cheap_obj;

typedef struct {
	cheap_obj *v;
	int n, cap, failed;
} cheap_objs;

// The dynamic symbol table of a loaded object, read from its image in
// memory (through the link map of a handle held on it, so that it stays
// mapped): for an object whose file is gone or is not the file loaded.
typedef struct {
	const ElfW(Sym) *sym;
	const char *str;
	size_t strsz, n;
} cheap_dsyms;

const char *cheap_tc_version(void *f);
int cheap_mi_version(void *f);
const char *cheap_je_version(void *f);
int cheap_where(void *p, const char **fname, void **fbase);
void cheap_tc_release_sliced(void *all, void *rel_n, void *prop, void *mal, void *fre, size_t slice, size_t chunk,
	int64_t out[2], int64_t *carved);
int64_t cheap_tc_prop(void *f, int which);
void *cheap_sym_next(const char *name);
void *cheap_sym(const char *name);
void *cheap_self_base(void);
int64_t cheap_mi_commit(void *f);
void cheap_mi_collect(void *f, void *thread_init);
int cheap_je_stats(void *f, int64_t out[7]);
int cheap_je_purge_sliced(void *f, int whole, int64_t out[2]);
const char *cheap_glibc_version(void *f);
int cheap_glibc_trim(void *f);
int cheap_glibc_mallopt(void *f, int param, int value);
struct cheap_mallinfo2 cheap_glibc_mallinfo2(void *f);
void cheap_close(void *h);
void *cheap_ptr(uintptr_t a);
void *cheap_open(const char *name, uintptr_t addr, uintptr_t start);
void cheap_load_counts(unsigned long long out[2]);
void cheap_list_free(cheap_objs o);
cheap_obj cheap_list_at(cheap_objs o, int i);
cheap_objs cheap_list(void);
void *cheap_hsym(void *h, const char *name);
int cheap_dsyms_of(void *h, uintptr_t addr, uintptr_t lo, uintptr_t hi, cheap_dsyms *d);
const char *cheap_dsym_at(cheap_dsyms d, size_t i, uint64_t *value, size_t *len);

#endif
