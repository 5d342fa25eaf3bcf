//go:build linux && cgo

package cheap

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
static void cheap_load_counts(unsigned long long out[2]) {
	out[0] = out[1] = 0;
	dl_iterate_phdr(cheap_counts_cb, out);
}

typedef struct {
	char *name;      // dlpi_name, strdup'ed ("" for the executable)
	uintptr_t addr;  // dlpi_addr: the load bias
	uintptr_t start; // where the first PT_LOAD segment is mapped (dladdr's dli_fbase)
	uintptr_t end;   // the end of the last PT_LOAD segment in memory
	unsigned char id[64]; // the GNU build ID in the loaded image (its first idlen bytes)
	int idlen;
	long ns; // the link-map namespace (Lmid_t): 0 for the main one
} cheap_obj;

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

typedef struct {
	cheap_obj *v;
	int n, cap, failed;
} cheap_objs;

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
static cheap_objs cheap_list(void) {
	cheap_objs o = {0};
#ifdef CHEAP_NS
	cheap_ns_walk w = {&o, dlsym(RTLD_DEFAULT, "_r_debug"), (cheap_find_fn)dlsym(RTLD_DEFAULT, "_dl_find_object"), 0};
	dl_iterate_phdr(cheap_list_all_cb, &w);
#else
	dl_iterate_phdr(cheap_list_cb, &o);
#endif
	return o;
}

static void cheap_list_free(cheap_objs o) {
	for (int i = 0; i < o.n; i++) free(o.v[i].name);
	free(o.v);
}

static cheap_obj cheap_list_at(cheap_objs o, int i) { return o.v[i]; }

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
static void *cheap_open(const char *name, uintptr_t addr, uintptr_t start) {
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
static void *cheap_hsym(void *h, const char *name) { return dlsym(h, name); }
static void cheap_close(void *h) { dlclose(h); }
static void *cheap_ptr(uintptr_t a) { return (void *)a; }

// The dynamic symbol table of a loaded object, read from its image in
// memory (through the link map of a handle held on it, so that it stays
// mapped): for an object whose file is gone or is not the file loaded.
typedef struct {
	const ElfW(Sym) *sym;
	const char *str;
	size_t strsz, n;
} cheap_dsyms;

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
static int cheap_dsyms_of(void *h, uintptr_t addr, uintptr_t lo, uintptr_t hi, cheap_dsyms *d) {
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
static const char *cheap_dsym_at(cheap_dsyms d, size_t i, uint64_t *value, size_t *len) {
	const ElfW(Sym) *s = &d.sym[i];
	if ((s->st_info & 0xf) != STT_FUNC || s->st_shndx == SHN_UNDEF || s->st_value == 0 || s->st_name >= d.strsz) return NULL;
	*value = s->st_value;
	*len = strnlen(d.str + s->st_name, d.strsz - s->st_name);
	return d.str + s->st_name;
}
*/
import "C"

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"
)

// objectScans counts the objects scanned, for the tests.
var objectScans atomic.Int64

func loadCounts() [2]uint64 {
	var out [2]C.ulonglong
	C.cheap_load_counts(&out[0])
	return [2]uint64{uint64(out[0]), uint64(out[1])}
}

// object is one loaded object as dl_iterate_phdr lists it.
type object struct {
	name             string // "" for the executable
	addr, start, end uintptr
	buildID          []byte // the GNU build ID of the loaded image, nil when it has none
	ns               int64  // the link-map namespace: 0 the main one, -1 unknown
}

func listObjects() []object {
	o := C.cheap_list()
	defer C.cheap_list_free(o)
	out := make([]object, 0, int(o.n))
	for i := 0; i < int(o.n); i++ {
		e := C.cheap_list_at(o, C.int(i))
		ob := object{name: C.GoString(e.name), addr: uintptr(e.addr), start: uintptr(e.start), end: uintptr(e.end), ns: int64(e.ns)}
		if e.idlen > 0 {
			ob.buildID = C.GoBytes(unsafe.Pointer(&e.id[0]), e.idlen)
		}
		out = append(out, ob)
	}
	return out
}

// The entry points looked for in each object (after the prefix, for
// jemalloc).
const (
	symMallctl   = "mallctl"
	symMiCollect = "mi_collect"
	symTcRelease = "MallocExtension_ReleaseToSystem"
)

// candidate is an allocator whose entry points an object's symbol table
// names.
type candidate struct {
	allocator, prefix string
	static            bool // from .symtab only: not exported, reached by address
	addrs             map[string]uintptr
}

// funcSymbols returns the defined functions of syms, by name, with their
// values.
func funcSymbols(syms []elf.Symbol) map[string]uint64 {
	m := map[string]uint64{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && s.Value != 0 {
			m[s.Name] = s.Value
		}
	}
	return m
}

// jemallocPrefixes returns the prefixes p for which funcs holds p+"mallctl"
// and p+"mallctlnametomib" (jemalloc's control calls; the second tells
// jemalloc from another function named *mallctl), "" first.
func jemallocPrefixes(funcs map[string]uint64) []string {
	var out []string
	for name := range funcs {
		p, ok := strings.CutSuffix(name, symMallctl)
		if !ok || !cIdent(p) {
			continue
		}
		if _, ok := funcs[p+"mallctlnametomib"]; ok {
			out = append(out, p)
		}
	}
	sortStrings(out)
	return out
}

// cIdent reports whether p can start a C identifier's name (empty, or
// letters, digits and '_').
func cIdent(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// candidates returns the allocators that funcs names.
func candidates(funcs map[string]uint64, static bool) []candidate {
	var out []candidate
	for _, p := range jemallocPrefixes(funcs) {
		out = append(out, candidate{allocator: Jemalloc, prefix: p, static: static})
	}
	if _, ok := funcs[symMiCollect]; ok {
		out = append(out, candidate{allocator: Mimalloc, static: static})
	}
	if _, ok := funcs[symTcRelease]; ok {
		out = append(out, candidate{allocator: Tcmalloc, static: static})
	}
	return out
}

// markers are texts that each allocator's code prints in its messages, as
// jemalloc's "<jemalloc>: " and tcmalloc's "tcmalloc: large alloc"; one
// in an object's read-only data is the hint that the object carries a
// copy of that allocator. They are built at run time so that this
// package's own read-only data does not hold them.
var markers = func() map[string][]byte {
	mk := func(s string, c byte) []byte { b := []byte(s); b[len(b)-1] = c; return b }
	return map[string][]byte{
		Jemalloc: mk("<jemalloc>:?", ' '),
		Mimalloc: mk("mimalloc: warning:?", ' '),
		Tcmalloc: mk("tcmalloc: large allo?", 'c'),
	}
}()

// markersIn returns the allocators whose markers the read-only data
// sections of f hold (read from the file, not from memory, so that the
// scan faults nothing into RSS), reading at most 256 MiB.
func markersIn(f *elf.File) []string {
	found := map[string]bool{}
	budget := int64(256 << 20)
	buf := make([]byte, 1<<16)
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_ALLOC == 0 || sec.Flags&(elf.SHF_WRITE|elf.SHF_EXECINSTR) != 0 ||
			!strings.HasPrefix(sec.Name, ".rodata") || budget <= 0 {
			continue
		}
		r := io.LimitReader(sec.Open(), budget)
		carry := 0
		for {
			n, err := r.Read(buf[carry:])
			budget -= int64(n)
			data := buf[:carry+n]
			for a, m := range markers {
				if !found[a] && bytes.Contains(data, m) {
					found[a] = true
				}
			}
			keep := min(len(data), 32)
			copy(buf, data[len(data)-keep:])
			carry = keep
			if err != nil || n == 0 {
				break
			}
		}
	}
	var out []string
	for _, a := range []string{Jemalloc, Mimalloc, Tcmalloc} {
		if found[a] {
			out = append(out, a)
		}
	}
	return out
}

// openObject returns a new reference to the loaded object o (in its own
// link-map namespace), nil when it is not loaded any more.
func openObject(o object) unsafe.Pointer {
	cs := C.CString(o.name)
	defer C.free(unsafe.Pointer(cs))
	return C.cheap_open(cs, C.uintptr_t(o.addr), C.uintptr_t(o.start))
}

func closeObject(h unsafe.Pointer) { C.cheap_close(h) }

// errString is err's text with a path in it kept as it is.
func errString(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return "its file " + strconv.Quote(boundPath(pe.Path)) + ": " + pe.Err.Error()
	}
	return "its file is " + err.Error()
}

// buildID returns the GNU build ID of the ELF file f (its NT_GNU_BUILD_ID
// note in a PT_NOTE segment), nil when it has none.
func buildID(f *elf.File) []byte {
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > 1<<20 {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			continue
		}
		for len(b) >= 12 {
			namesz, descsz, typ := f.ByteOrder.Uint32(b), f.ByteOrder.Uint32(b[4:]), f.ByteOrder.Uint32(b[8:])
			n, d := (uint64(namesz)+3)&^3, (uint64(descsz)+3)&^3
			if 12+n+d > uint64(len(b)) {
				break
			}
			if typ == 3 && namesz == 4 && string(b[12:15]) == "GNU" { // NT_GNU_BUILD_ID
				return b[12+n : 12+n+uint64(descsz)]
			}
			b = b[12+n+d:]
		}
	}
	return nil
}

// sameImage reports whether f is the file o was loaded from, as far as the
// build IDs tell: when the loaded image carries one, f must carry the same
// one (a file replaced on disk by another build does not); when it carries
// none there is nothing to compare and f is taken.
func sameImage(f *elf.File, o object) bool {
	if len(o.buildID) == 0 {
		return true
	}
	return bytes.Equal(buildID(f), o.buildID)
}

// memorySymbols returns the defined functions of the dynamic symbol table
// of the object that h holds, read from its loaded image, by name with
// their values; false when h holds another object than o or the image has
// no table to read.
func memorySymbols(h unsafe.Pointer, o object) (map[string]uint64, bool) {
	var d C.cheap_dsyms
	if C.cheap_dsyms_of(h, C.uintptr_t(o.addr), C.uintptr_t(o.start), C.uintptr_t(o.end), &d) != 0 {
		return nil, false
	}
	m := map[string]uint64{}
	for i := C.size_t(0); i < d.n; i++ {
		var v C.uint64_t
		var n C.size_t
		if p := C.cheap_dsym_at(d, i, &v, &n); p != nil {
			m[C.GoStringN(p, C.int(n))] = uint64(v)
		}
	}
	return m, true
}

// scanHeaps walks the loaded objects and returns the allocators found in
// each, other than the owner; an object listed in seen (by name, load
// address, extent and build ID: the same object, still loaded) is not scanned again, its
// allocators are taken from there. next is seen for the objects loaded now (the object at s.ownerBase with s's
// allocator). For each object it reads the dynamic symbol table from the
// object's file; for every allocator entry point it names, it takes a new
// reference to the object (dlopen with RTLD_NOLOAD) and looks the entry
// point up by that handle (dlsym), so that an object loaded with
// RTLD_LOCAL is found too; dladdr must place the address in the object
// itself. An object with no exported entry point whose read-only data holds
// an allocator's marker is searched in its full symbol table (.symtab,
// where the file has one: not stripped), and reported present and not
// trimmed when that does not find the entry point either. That is how the
// executable is searched too: a Go program links its C code statically and
// exports none of it, so a statically linked jemalloc is found only in
// .symtab, and only once its messages showed it is there (a Go binary's
// .symtab is large).
func scanHeaps(s *Step, seen map[string][]*heap) (out []*heap, next map[string][]*heap) {
	next = map[string][]*heap{}
	for _, o := range listObjects() {
		if strings.HasPrefix(o.name, "linux-vdso") || strings.HasPrefix(o.name, "linux-gate") {
			continue
		}
		// The same object, still loaded: the same name, address, extent and
		// build (another build loaded from the same path after a dlclose
		// may land at the same address).
		key := o.name + "\x00" + strconv.FormatUint(uint64(o.addr), 16) + "-" + strconv.FormatUint(uint64(o.end), 16) + "\x00" + strconv.FormatInt(o.ns, 10) + "\x00" + string(o.buildID)
		hs, ok := seen[key]
		if !ok {
			objectScans.Add(1)
			hs = scanObject(s, o)
		}
		next[key] = hs
		out = append(out, hs...)
	}
	return out, next
}

func scanObject(s *Step, o object) []*heap {
	path, lib := o.name, o.name
	if o.name == "" {
		path = "/proc/self/exe"
		if exe, err := os.Executable(); err == nil {
			lib = exe
		}
	}
	var handle unsafe.Pointer
	openHandle := func() unsafe.Pointer {
		if handle == nil {
			handle = openObject(o)
		}
		return handle
	}
	var cands []candidate
	var marks []string
	memNote := ""
	f, err := elf.Open(path)
	if err == nil && !sameImage(f, o) {
		f.Close()
		f, err = nil, errors.New("not the loaded build")
	}
	if err != nil {
		// The file is gone (deleted after the dlopen, a memfd closed since),
		// is another build (replaced on disk), or the name is relative to
		// a directory the process has left: read the exported symbols from
		// the loaded image itself, through a handle that keeps it mapped.
		// There is no .symtab and no read-only data to search then.
		h := openHandle()
		if h == nil {
			return nil // unloaded meanwhile
		}
		funcs, ok := memorySymbols(h, o)
		if !ok {
			C.cheap_close(h)
			return nil
		}
		cands = candidates(funcs, false)
		memNote = fmt.Sprintf("; symbols read from the loaded image (%v)", errString(err))
	} else {
		defer f.Close()
		dyn, _ := f.DynamicSymbols()
		cands = candidates(funcSymbols(dyn), false)
		if len(cands) == 0 {
			marks = markersIn(f)
		}
		if len(cands) == 0 && len(marks) > 0 {
			if syms, err := f.Symbols(); err == nil {
				fs := funcSymbols(syms)
				cands = candidates(fs, true)
				for i := range cands {
					cands[i].addrs = map[string]uintptr{}
					for name, v := range fs {
						cands[i].addrs[name] = o.addr + uintptr(v)
					}
				}
			}
		}
	}
	var out []*heap
	called := false // an allocator of the object will be called
	have := map[string]bool{}
	for _, c := range cands {
		if o.start == s.ownerBase && c.allocator == s.allocator && c.prefix == "" {
			have[c.allocator] = true
			continue // the owner, found through RTLD_DEFAULT
		}
		h := &heap{}
		h.info = Heap{Prefix: c.prefix, Trimmed: true, LastEstimate: -1, LastReleased: -1, Namespace: o.ns}
		h.info.Allocator, h.info.Library = c.allocator, lib
		var lookup func(name string) unsafe.Pointer
		if c.static {
			h.info.Note = "found in the symbol table of the object's file (not exported), called by address"
			lookup = func(name string) unsafe.Pointer {
				a, ok := c.addrs[name]
				if !ok {
					return nil
				}
				p := C.cheap_ptr(C.uintptr_t(a))
				if _, b, ok := where(p); !ok || uintptr(b) != o.start {
					return nil
				}
				return p
			}
		} else {
			if openHandle() == nil {
				break // unloaded meanwhile
			}
			h.info.Note = "found by dlsym on the object's own handle (dlopen RTLD_NOLOAD)" + memNote
			hd := handle
			lookup = func(name string) unsafe.Pointer {
				cs := C.CString(name)
				defer C.free(unsafe.Pointer(cs))
				p := unsafe.Pointer(C.cheap_hsym(hd, cs))
				if p == nil {
					return nil
				}
				if _, b, ok := where(p); !ok || uintptr(b) != o.start {
					return nil // defined in another object the handle reaches
				}
				return p
			}
		}
		h.sys = sysStep{allocator: c.allocator, handle: handle}
		untrusted := ""
		if !h.sys.resolve(c.prefix, lookup, &h.info.Version, &untrusted) {
			continue
		}
		have[c.allocator] = true
		if untrusted != "" {
			h.info.Stats = unknownStats(c.allocator, lib)
			h.info.Trimmed, h.info.Note = false, untrusted
			out = append(out, h)
			continue
		}
		called = true
		out = append(out, h)
	}
	if handle != nil && !called {
		C.cheap_close(handle) // nothing of it will be called: the object may be unloaded
	}
	for _, a := range marks {
		if have[a] {
			continue
		}
		h := &heap{}
		h.info = Heap{Stats: unknownStats(a, lib), LastEstimate: -1, LastReleased: -1, Namespace: o.ns,
			Note: "its messages are in the object's read-only data but it exports no entry point and its file has no symbol table naming one (a static, hidden copy)"}
		h.sys = sysStep{allocator: a}
		out = append(out, h)
	}
	return out
}
