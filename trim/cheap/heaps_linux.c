//go:build linux && cgo

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cheap_linux.h"

static int cheap_counts_cb(struct dl_phdr_info *info, size_t size, void *data) {
	unsigned long long *out = data;
	if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
		out[0] = info->dlpi_adds;
		out[1] = info->dlpi_subs;
	}
	return 1; // the counts are the same in every entry: stop at the first
}

// cheap_load_counts writes the loader's counts of objects loaded and
// unloaded since the start (dlpi_adds, dlpi_subs) to out.
void cheap_load_counts(unsigned long long out[2]) {
	out[0] = out[1] = 0;
	dl_iterate_phdr(cheap_counts_cb, out);
}


// cheap_build_id copies the NT_GNU_BUILD_ID note of the loaded image to e
// (called under dl_iterate_phdr, so the image stays mapped).
static void cheap_build_id(struct dl_phdr_info *info, cheap_obj *e) {
	e->idlen = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_NOTE) continue;
		const unsigned char *p = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr);
		size_t left = ph->p_memsz;
		while (left >= sizeof(ElfW(Nhdr))) {
			const ElfW(Nhdr) *n = (const ElfW(Nhdr) *)p;
			size_t namesz = (n->n_namesz + 3) & ~(size_t)3, descsz = (n->n_descsz + 3) & ~(size_t)3;
			size_t sz = sizeof *n + namesz + descsz;
			if (namesz < n->n_namesz || descsz < n->n_descsz || sz > left) break;
			if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && memcmp(p + sizeof *n, "GNU", 4) == 0 &&
				n->n_descsz > 0 && n->n_descsz <= sizeof e->id) {
				memcpy(e->id, p + sizeof *n + namesz, n->n_descsz);
				e->idlen = (int)n->n_descsz;
				return;
			}
			p += sz;
			left -= sz;
		}
	}
}


static int cheap_list_cb(struct dl_phdr_info *info, size_t size, void *data) {
	cheap_objs *o = data;
	if (o->n == o->cap) {
		int cap = o->cap ? 2 * o->cap : 32;
		cheap_obj *v = realloc(o->v, (size_t)cap * sizeof *v);
		if (v == NULL) {
			o->failed = 1;
			return 1;
		}
		o->v = v;
		o->cap = cap;
	}
	uintptr_t low = UINTPTR_MAX, high = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD) continue;
		if (ph->p_vaddr < low) low = ph->p_vaddr;
		if (ph->p_vaddr + ph->p_memsz > high) high = ph->p_vaddr + ph->p_memsz;
	}
	if (low == UINTPTR_MAX) return 0;
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	cheap_obj *e = &o->v[o->n];
	e->name = strdup(info->dlpi_name ? info->dlpi_name : "");
	if (e->name == NULL) {
		o->failed = 1;
		return 1;
	}
	e->addr = info->dlpi_addr;
	e->start = info->dlpi_addr + (low & ~(page - 1));
	e->end = info->dlpi_addr + high;
	e->ns = 0;
	cheap_build_id(info, e);
	o->n++;
	return 0;
}

// The objects of the link-map namespaces other than the first (those
// dlmopen made), which dl_iterate_phdr does not list: glibc 2.35+ chains
// one r_debug_extended per namespace from _r_debug (r_version 2). The walk
// runs inside a dl_iterate_phdr callback, where the loader's list lock is
// held, so no link map is freed under it; and so it calls nothing there
// that takes the loader's other lock (dlsym, dladdr: a concurrent dlopen
// takes the two in the other order). _dl_find_object is lock-free, and
// dlinfo's RTLD_DI_LMID reads the link map.
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 35)
#define CHEAP_NS 1
typedef int (*cheap_find_fn)(void *, struct dl_find_object *);

typedef struct {
	cheap_objs *o;
	struct r_debug_extended *r;
	cheap_find_fn find;
	int done;
} cheap_ns_walk;

static void cheap_list_ns(cheap_ns_walk *w) {
	cheap_objs *o = w->o;
	if (w->r == NULL || w->find == NULL || w->r->base.r_version < 2) return;
	long page = sysconf(_SC_PAGESIZE);
	int guard = 0;
	for (struct r_debug_extended *r = w->r->r_next; r != NULL && guard < 1 << 16; r = r->r_next, guard++) {
		for (struct link_map *lm = r->base.r_map; lm != NULL && guard < 1 << 16; lm = lm->l_next, guard++) {
			struct dl_find_object fo;
			if (lm->l_name == NULL || lm->l_name[0] == 0 || lm->l_ld == NULL) continue;
			if (w->find((void *)lm->l_ld, &fo) != 0 || fo.dlfo_link_map != lm || fo.dlfo_map_start == NULL) continue;
			// The ELF header and program headers, in the first page of
			// the first mapping (file offset 0 for any object ld makes).
			const ElfW(Ehdr) *eh = fo.dlfo_map_start;
			if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_phentsize != sizeof(ElfW(Phdr)) || eh->e_phnum == 0 ||
				eh->e_phoff + (size_t)eh->e_phnum * sizeof(ElfW(Phdr)) > (size_t)page) continue;
			struct dl_phdr_info pi;
			memset(&pi, 0, sizeof pi);
			pi.dlpi_addr = lm->l_addr;
			pi.dlpi_name = lm->l_name;
			pi.dlpi_phdr = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
			pi.dlpi_phnum = eh->e_phnum;
			int n = o->n;
			if (cheap_list_cb(&pi, offsetof(struct dl_phdr_info, dlpi_adds), o) != 0) return;
			Lmid_t ns = -1;
			if (o->n > n) {
				if (dlinfo(lm, RTLD_DI_LMID, &ns) != 0) ns = -1; // a glibc handle is its link map
				o->v[n].ns = (long)ns;
			}
		}
	}
}

static int cheap_list_all_cb(struct dl_phdr_info *info, size_t size, void *data) {
	cheap_ns_walk *w = data;
	int r = cheap_list_cb(info, size, w->o);
	if (!w->done) {
		w->done = 1;
		cheap_list_ns(w);
	}
	return r;
}
#endif

// cheap_list returns the loaded objects of every namespace (free it with
// cheap_list_free).
cheap_objs cheap_list(void) {
	cheap_objs o = {0};
#ifdef CHEAP_NS
	cheap_ns_walk w = {&o, dlsym(RTLD_DEFAULT, "_r_debug"), (cheap_find_fn)dlsym(RTLD_DEFAULT, "_dl_find_object"), 0};
	dl_iterate_phdr(cheap_list_all_cb, &w);
#else
	dl_iterate_phdr(cheap_list_cb, &o);
#endif
	return o;
}

void cheap_list_free(cheap_objs o) {
	for (int i = 0; i < o.n; i++) free(o.v[i].name);
	free(o.v);
}

cheap_obj cheap_list_at(cheap_objs o, int i) { return o.v[i]; }

// cheap_is_at reports whether handle h holds the object loaded at bias
// addr (a handle is closed when it does not).
static int cheap_is_at(void *h, uintptr_t addr) {
	struct link_map *lm = NULL;
	if (h == NULL) return 0;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_addr == addr) return 1;
	dlclose(h);
	return 0;
}

// cheap_open returns a new reference to the loaded object name ("" the
// executable) at bias addr whose first segment starts at start, without
// loading anything, or NULL. By name in the main namespace first; an
// object of another link-map namespace (dlmopen), or one whose name the
// main namespace gives to another object, is opened in its own namespace,
// found from its address (glibc).
void *cheap_open(const char *name, uintptr_t addr, uintptr_t start) {
	void *h = dlopen(name[0] ? name : NULL, RTLD_LAZY | RTLD_NOLOAD);
	if (cheap_is_at(h, addr)) return h;
#ifdef __GLIBC__
	Dl_info info;
	struct link_map *at = NULL;
	Lmid_t ns = 0;
	if (name[0] == 0 || dladdr1((void *)start, &info, (void **)&at, RTLD_DL_LINKMAP) == 0 || at == NULL || at->l_addr != addr) return NULL;
	if (dlinfo(at, RTLD_DI_LMID, &ns) != 0) return NULL; // a glibc handle is its link map
	h = dlmopen(ns, name, RTLD_LAZY | RTLD_NOLOAD);
	if (cheap_is_at(h, addr)) return h;
#endif
	return NULL;
}
void *cheap_hsym(void *h, const char *name) { return dlsym(h, name); }
void cheap_close(void *h) { dlclose(h); }
void *cheap_ptr(uintptr_t a) { return (void *)a; }


// cheap_dptr returns the address a d_ptr value of the dynamic section
// points to: glibc relocates those of a writable dynamic section in place
// (adds the load bias), not those of a read-only one, so a value inside
// the image [lo, hi) is taken as it is, else the bias is added.
static uintptr_t cheap_dptr(uintptr_t v, uintptr_t bias, uintptr_t lo, uintptr_t hi) {
	if (v >= lo && v < hi) return v;
	return v + bias;
}

// cheap_gnu_count returns the number of symbols of a DT_GNU_HASH table
// (one past the last symbol of the longest chain), 0 when it is malformed.
static size_t cheap_gnu_count(const uint32_t *gh, uintptr_t lo, uintptr_t hi) {
	uint32_t nbuckets = gh[0], symoffset = gh[1], bloom = gh[2];
	const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gh + 4) + bloom);
	const uint32_t *chain = buckets + nbuckets;
	if ((uintptr_t)(chain) < lo || (uintptr_t)chain > hi) return 0;
	uint32_t last = 0;
	for (uint32_t i = 0; i < nbuckets; i++) {
		if (buckets[i] > last) last = buckets[i];
	}
	if (last < symoffset) return symoffset;
	for (;;) {
		const uint32_t *c = &chain[last - symoffset];
		if ((uintptr_t)(c + 1) > hi) return 0;
		if (*c & 1) return (size_t)last + 1;
		last++;
	}
}

// cheap_dsyms_of fills d from the dynamic section of the object that h
// holds, when it is the object loaded at bias addr spanning [lo, hi); it
// returns 0 on success, -1 when the handle holds another object or the
// section lacks a table.
int cheap_dsyms_of(void *h, uintptr_t addr, uintptr_t lo, uintptr_t hi, cheap_dsyms *d) {
	struct link_map *lm = NULL;
	memset(d, 0, sizeof *d);
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL || lm->l_addr != addr || lm->l_ld == NULL) return -1;
	const uint32_t *hash = NULL, *gnu = NULL;
	for (const ElfW(Dyn) *dyn = lm->l_ld; dyn->d_tag != DT_NULL; dyn++) {
		uintptr_t v = (uintptr_t)dyn->d_un.d_ptr;
		switch (dyn->d_tag) {
		case DT_SYMTAB: d->sym = (const ElfW(Sym) *)cheap_dptr(v, addr, lo, hi); break;
		case DT_STRTAB: d->str = (const char *)cheap_dptr(v, addr, lo, hi); break;
		case DT_STRSZ: d->strsz = (size_t)dyn->d_un.d_val; break;
		case DT_HASH: hash = (const uint32_t *)cheap_dptr(v, addr, lo, hi); break;
		case DT_GNU_HASH: gnu = (const uint32_t *)cheap_dptr(v, addr, lo, hi); break;
		}
	}
	if (d->sym == NULL || d->str == NULL || (uintptr_t)d->sym < lo || (uintptr_t)d->sym >= hi ||
		(uintptr_t)d->str < lo || (uintptr_t)d->str >= hi || d->strsz > hi - (uintptr_t)d->str) return -1;
	if (hash != NULL && (uintptr_t)hash >= lo && (uintptr_t)hash + 8 <= hi) {
		d->n = hash[1]; // nchain: one entry per symbol
	} else if (gnu != NULL && (uintptr_t)gnu >= lo && (uintptr_t)gnu + 16 <= hi) {
		d->n = cheap_gnu_count(gnu, lo, hi);
	}
	if (d->n > (hi - (uintptr_t)d->sym) / sizeof(ElfW(Sym))) d->n = (hi - (uintptr_t)d->sym) / sizeof(ElfW(Sym));
	return d->n > 0 ? 0 : -1;
}

// cheap_dsym_at returns symbol i's name (its length in *len) when it is a
// defined function, with its value in *value; else NULL.
const char *cheap_dsym_at(cheap_dsyms d, size_t i, uint64_t *value, size_t *len) {
	const ElfW(Sym) *s = &d.sym[i];
	if ((s->st_info & 0xf) != STT_FUNC || s->st_shndx == SHN_UNDEF || s->st_value == 0 || s->st_name >= d.strsz) return NULL;
	*value = s->st_value;
	*len = strnlen(d.str + s->st_name, d.strsz - s->st_name);
	return d.str + s->st_name;
}
