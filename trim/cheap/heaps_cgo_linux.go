//go:build linux && cgo

package cheap

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include <string.h>
#include "cheap_linux.h"
*/
import "C"

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
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

// The entry points looked for in each object (after jemalloc's prefix).
const (
	symMallctl   = "mallctl"
	symMiCollect = "mi_collect"
	symTcRelease = "MallocExtension_ReleaseToSystem"
)

// candidate is an allocator whose entry points an object's symbol table names.
type candidate struct {
	allocator, prefix string
	// static is .symtab's functions when the copy exports nothing (reached by
	// address), else nil.
	static map[string]uint64
}

// funcSymbols returns the defined functions of syms by name, with their values.
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
	slices.Sort(out)
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

// candidates returns the allocators that funcs names.
func candidates(funcs map[string]uint64, static bool) []candidate {
	var out []candidate
	var st map[string]uint64
	if static {
		st = funcs
	}
	for _, p := range jemallocPrefixes(funcs) {
		out = append(out, candidate{allocator: jemalloc, prefix: p, static: st})
	}
	if _, ok := funcs[symMiCollect]; ok {
		out = append(out, candidate{allocator: mimalloc, static: st})
	}
	if _, ok := funcs[symTcRelease]; ok {
		out = append(out, candidate{allocator: tcmalloc, static: st})
	}
	return out
}

// markers are texts of each allocator's messages; one in an object's read-only
// data hints at a copy of that allocator. Built at run time so that this
// package's own read-only data does not hold them.
var markers = func() map[string][]byte {
	mk := func(s string, c byte) []byte { b := []byte(s); b[len(b)-1] = c; return b }
	return map[string][]byte{
		jemalloc: mk("<jemalloc>:?", ' '),
		mimalloc: mk("mimalloc: warning:?", ' '),
		tcmalloc: mk("tcmalloc: large allo?", 'c'),
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
	for _, a := range []string{jemalloc, mimalloc, tcmalloc} {
		if found[a] {
			out = append(out, a)
		}
	}
	return out
}

// openObject returns a new reference to the loaded object o (in its own
// link-map namespace), nil when it is unloaded.
func openObject(o object) unsafe.Pointer {
	cs := C.CString(o.name)
	defer C.free(unsafe.Pointer(cs))
	return C.cheap_open(cs, C.uintptr_t(o.addr), C.uintptr_t(o.start))
}

// closeObject drops a reference openObject returned.
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

// sameImage reports whether f is the file o was loaded from, as far as build
// IDs tell (a file replaced by another build is not); without one, true.
func sameImage(f *elf.File, o object) bool {
	if len(o.buildID) == 0 {
		return true
	}
	return bytes.Equal(buildID(f), o.buildID)
}

// memorySymbols returns the defined functions of the dynamic symbol table in
// h's loaded image; false when h holds another object than o or has no table.
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

// scanHeaps returns the allocators of the loaded objects but the owner; an
// object in seen is not read again. next is seen for the objects loaded now.
func scanHeaps(s *Step, seen map[string][]*heap) (out []*heap, next map[string][]*heap) {
	next = map[string][]*heap{}
	for _, o := range listObjects() {
		if strings.HasPrefix(o.name, "linux-vdso") || strings.HasPrefix(o.name, "linux-gate") {
			continue
		}
		// Still loaded: the same name, address, extent, namespace and build
		// (another build of the same path may land at the same address).
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

// objectFile names o's file, and the object for Heap.Library.
func objectFile(o object) (path, lib string) {
	path, lib = o.name, o.name
	if o.name == "" {
		path = "/proc/self/exe"
		if exe, err := os.Executable(); err == nil {
			lib = exe
		}
	}
	return path, lib
}

// objectCandidates returns the allocators whose entry points o names, and
// those whose messages its read-only data holds (marks). It reads .symtab (a
// Go executable's static C code) only when marks show an allocator that
// exports nothing; when the file is gone or another build, it reads the
// loaded image through openHandle, and note says so. An object unloaded
// meanwhile has none.
func objectCandidates(o object, openHandle func() unsafe.Pointer) (cands []candidate, marks []string, note string) {
	path, _ := objectFile(o)
	f, err := elf.Open(path)
	if err == nil && !sameImage(f, o) {
		f.Close()
		f, err = nil, errors.New("not the loaded build")
	}
	if err != nil {
		h := openHandle()
		if h == nil {
			return nil, nil, ""
		}
		funcs, ok := memorySymbols(h, o)
		if !ok {
			return nil, nil, ""
		}
		return candidates(funcs, false), nil, fmt.Sprintf("; symbols read from the loaded image (%v)", errString(err))
	}
	defer f.Close()
	dyn, _ := f.DynamicSymbols()
	if cands = candidates(funcSymbols(dyn), false); len(cands) > 0 {
		return cands, nil, ""
	}
	if marks = markersIn(f); len(marks) == 0 {
		return nil, nil, ""
	}
	if syms, err := f.Symbols(); err == nil {
		cands = candidates(funcSymbols(syms), true)
	}
	return cands, marks, ""
}

// entryLookup returns how c's entry points are looked up in o: by address
// from .symtab for a static copy, else by dlsym on the object's own handle
// hd; either way dladdr must place the address in o itself.
func entryLookup(c candidate, o object, hd unsafe.Pointer) func(name string) unsafe.Pointer {
	in := func(p unsafe.Pointer) unsafe.Pointer {
		if _, b, ok := where(p); p == nil || !ok || uintptr(b) != o.start {
			return nil // defined in another object the handle reaches
		}
		return p
	}
	if c.static != nil {
		return func(name string) unsafe.Pointer {
			v, ok := c.static[name]
			if !ok {
				return nil
			}
			return in(C.cheap_ptr(C.uintptr_t(o.addr + uintptr(v))))
		}
	}
	return func(name string) unsafe.Pointer {
		cs := C.CString(name)
		defer C.free(unsafe.Pointer(cs))
		return in(unsafe.Pointer(C.cheap_hsym(hd, cs)))
	}
}

// scanObject returns the allocators of the loaded object o but the owner.
func scanObject(s *Step, o object) []*heap {
	_, lib := objectFile(o)
	var handle unsafe.Pointer
	openHandle := func() unsafe.Pointer {
		if handle == nil {
			handle = openObject(o)
		}
		return handle
	}
	cands, marks, memNote := objectCandidates(o, openHandle)
	var out []*heap
	called := false // an allocator of the object will be called
	have := map[string]bool{}
	for _, c := range cands {
		if o.start == s.ownerBase && c.allocator == s.allocator && c.prefix == "" {
			have[c.allocator] = true
			continue // the owner, found through RTLD_DEFAULT
		}
		h := &heap{info: Heap{Stats: Stats{Allocator: c.allocator, Library: lib}, Prefix: c.prefix, Trimmed: true,
			LastEstimate: -1, LastReleased: -1, Namespace: o.ns,
			Note: "found in the symbol table of the object's file (not exported), called by address"}}
		if c.static == nil {
			if openHandle() == nil {
				break // unloaded meanwhile
			}
			h.info.Note = "found by dlsym on the object's own handle (dlopen RTLD_NOLOAD)" + memNote
		}
		h.sys = sysStep{allocator: c.allocator, handle: handle}
		untrusted := ""
		if !h.sys.resolve(c.prefix, entryLookup(c, o, handle), &h.info.Version, &untrusted) {
			continue
		}
		have[c.allocator] = true
		if untrusted != "" {
			h.info.Stats = unknownStats(c.allocator, lib)
			h.info.Trimmed, h.info.Note = false, untrusted
		} else {
			called = true
		}
		out = append(out, h)
	}
	if handle != nil && !called {
		closeObject(handle) // nothing of it will be called: the object may be unloaded
	}
	for _, a := range marks {
		if !have[a] {
			h := &heap{sys: sysStep{allocator: a}}
			h.info = Heap{Stats: unknownStats(a, lib), LastEstimate: -1, LastReleased: -1, Namespace: o.ns,
				Note: "its messages are in the object's read-only data but it exports no entry point and its file has no symbol table naming one (a static, hidden copy)"}
			out = append(out, h)
		}
	}
	return out
}
