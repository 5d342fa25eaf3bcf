//go:build linux && cgo

package cheap

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
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
} cheap_obj;

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
	uintptr_t low = UINTPTR_MAX;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type == PT_LOAD && info->dlpi_phdr[i].p_vaddr < low) low = info->dlpi_phdr[i].p_vaddr;
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
	o->n++;
	return 0;
}

// cheap_list returns the loaded objects (free it with cheap_list_free).
static cheap_objs cheap_list(void) {
	cheap_objs o = {0};
	dl_iterate_phdr(cheap_list_cb, &o);
	return o;
}

static void cheap_list_free(cheap_objs o) {
	for (int i = 0; i < o.n; i++) free(o.v[i].name);
	free(o.v);
}

static cheap_obj cheap_list_at(cheap_objs o, int i) { return o.v[i]; }

// cheap_open returns a new reference to the loaded object name ("" the
// executable) without loading anything, or NULL.
static void *cheap_open(const char *name) { return dlopen(name[0] ? name : NULL, RTLD_LAZY | RTLD_NOLOAD); }
static void *cheap_hsym(void *h, const char *name) { return dlsym(h, name); }
static void cheap_close(void *h) { dlclose(h); }
static void *cheap_ptr(uintptr_t a) { return (void *)a; }
*/
import "C"

import (
	"bytes"
	"debug/elf"
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
	name        string // "" for the executable
	addr, start uintptr
}

func listObjects() []object {
	o := C.cheap_list()
	defer C.cheap_list_free(o)
	out := make([]object, 0, int(o.n))
	for i := 0; i < int(o.n); i++ {
		e := C.cheap_list_at(o, C.int(i))
		out = append(out, object{name: C.GoString(e.name), addr: uintptr(e.addr), start: uintptr(e.start)})
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

// scanHeaps walks the loaded objects and returns the allocators found in
// each, other than the owner; an object listed in seen (by name and load
// address: the same object, still loaded) is not scanned again, its
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
		key := o.name + "\x00" + strconv.FormatUint(uint64(o.addr), 16)
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
	f, err := elf.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	dyn, _ := f.DynamicSymbols()
	cands := candidates(funcSymbols(dyn), false)
	var marks []string
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
	var out []*heap
	var handle unsafe.Pointer
	have := map[string]bool{}
	for _, c := range cands {
		if o.start == s.ownerBase && c.allocator == s.allocator && c.prefix == "" {
			have[c.allocator] = true
			continue // the owner, found through RTLD_DEFAULT
		}
		h := &heap{}
		h.info = Heap{Prefix: c.prefix, Trimmed: true, LastEstimate: -1, LastReleased: -1}
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
			if handle == nil {
				cs := C.CString(o.name)
				handle = C.cheap_open(cs)
				C.free(unsafe.Pointer(cs))
				if handle == nil {
					break // unloaded meanwhile
				}
			}
			h.info.Note = "found by dlsym on the object's own handle (dlopen RTLD_NOLOAD)"
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
		if !h.sys.resolve(c.prefix, lookup, &h.info.Version) {
			continue
		}
		have[c.allocator] = true
		out = append(out, h)
	}
	if handle != nil && len(out) == 0 {
		C.cheap_close(handle)
	}
	for _, a := range marks {
		if have[a] {
			continue
		}
		h := &heap{}
		h.info = Heap{Stats: unknownStats(a, lib), LastEstimate: -1, LastReleased: -1,
			Note: "its messages are in the object's read-only data but it exports no entry point and its file has no symbol table naming one (a static, hidden copy)"}
		h.sys = sysStep{allocator: a}
		out = append(out, h)
	}
	return out
}
