//go:build linux && cgo

package cheap

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/dlburst"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJemallocPrefixes: any prefix of a C name before mallctl counts when
// mallctlnametomib has the same prefix; other names ending in mallctl do
// not.
func TestJemallocPrefixes(t *testing.T) {
	funcs := map[string]uint64{
		"mallctl": 1, "mallctlnametomib": 2,
		"je_mallctl": 3, "je_mallctlnametomib": 4,
		"_rjem_mallctl": 5, "_rjem_mallctlnametomib": 6,
		"rocksdb_mallctl": 7, // no rocksdb_mallctlnametomib: not jemalloc
		"weird.mallctl":   8, "weird.mallctlnametomib": 9,
	}
	assert.Equal(t, []string{"", "_rjem_", "je_"}, jemallocPrefixes(funcs))
	c := candidates(map[string]uint64{"mi_collect": 1, "MallocExtension_ReleaseToSystem": 2}, false)
	assert.Len(t, c, 2)
}

// TestMarkersNotInOwnBinary: the markers are built at run time, so this
// test binary, which holds memctl's code, is not taken for a copy of an
// allocator.
func TestMarkersNotInOwnBinary(t *testing.T) {
	for _, h := range Detect().Heaps() {
		assert.NotContains(t, h.Library, ".test", "found %s in the test binary", h.Allocator)
	}
}

// TestRescanOnlyWhenLoaded: with no object loaded since the last scan,
// Heaps and Retained scan nothing; after a dlopen, only the new object is
// read.
func TestRescanOnlyWhenLoaded(t *testing.T) {
	so := filepath.Join(t.TempDir(), "libnothing21.so")
	dlburst.Build(t, so, "int nothing21(void) { return 21; }\n")

	s := Detect()
	s.Heaps()
	n := objectScans.Load()
	s.Heaps()
	s.Retained()
	assert.Equal(t, n, objectScans.Load(), "nothing loaded: nothing scanned")
	require.NoError(t, dlburst.Open(so, true))
	s.Heaps()
	assert.Equal(t, n+1, objectScans.Load(), "only the new object is scanned")
}

// BenchmarkHeaps is the cost of Heaps with nothing loaded since the last
// scan: the loader's counts, and each allocator's figures.
func BenchmarkHeaps(b *testing.B) {
	s := Detect()
	for b.Loop() {
		s.Heaps()
	}
}

// BenchmarkScan is one scan of every loaded object (what Detect does, and a
// rescan for each new object).
func BenchmarkScan(b *testing.B) {
	s := Detect()
	for b.Loop() {
		scanHeaps(s, nil)
	}
}

// TestMemorySymbolsMatchFile: for every loaded object whose file is the
// loaded build, the defined functions read from the loaded image's dynamic
// section (hash or GNU hash table) are those of the file's .dynsym.
func TestMemorySymbolsMatchFile(t *testing.T) {
	checked := 0
	for _, o := range listObjects() {
		if strings.HasPrefix(o.name, "linux-vdso") || strings.HasPrefix(o.name, "linux-gate") {
			continue
		}
		path := o.name
		if path == "" {
			path = "/proc/self/exe"
		}
		f, err := elf.Open(path)
		if err != nil {
			continue
		}
		if !sameImage(f, o) {
			f.Close()
			continue
		}
		dyn, _ := f.DynamicSymbols()
		want := funcSymbols(dyn)
		f.Close()
		h := openObject(o)
		require.NotNil(t, h, "dlopen RTLD_NOLOAD %q", o.name)
		got, ok := memorySymbols(h, o)
		closeObject(h)
		if len(want) == 0 && !ok {
			continue
		}
		require.True(t, ok, "%q: no dynamic symbol table read from memory", o.name)
		assert.Equal(t, want, got, "%q", o.name)
		checked++
	}
	t.Logf("%d objects compared", checked)
	assert.GreaterOrEqual(t, checked, 2, "at least the C library and one more object compared")
}

// stubMallctl is a library that exports mallctl and mallctlnametomib but is
// not jemalloc: each variant answers "version" its own way, and aborts the
// process on any other call (epoch, stats, purge), which memctl must then
// never make.
const stubMallctl = `#include <errno.h>
#include <stdlib.h>
#include <string.h>
int mallctlnametomib(const char *n, size_t *m, size_t *ml) { abort(); }
int mallctl(const char *n, void *o, size_t *ol, void *nv, size_t nl) {
	if (strcmp(n, "version") != 0) abort();
#if STUB == 1
	return ENOENT;
#elif STUB == 2
	*(const char **)o = strdup("5.3.0-stub"); // a version, but from the heap, not the object's image
	return 0;
#else
	return 0; // success, and nothing written
#endif
}
`

// stubMiCollect exports mi_collect but is not mimalloc: with STUB 1 it has
// no mi_version, with 2 one that answers 0. mi_collect aborts.
const stubMiCollect = `#include <stdbool.h>
#include <stdlib.h>
void mi_collect(bool force) { abort(); }
#if STUB == 2
int mi_version(void) { return 0; }
#endif
`

// childStubMallctl loads CHEAP_STUB_PATH with RTLD_LOCAL, releases every
// allocator found, and reports the one of that object.
func childStubMallctl() {
	if err := dlburst.Open(os.Getenv("CHEAP_STUB_PATH"), true); err != nil {
		childtest.Fail("%v", err)
	}
	s := Detect()
	_, err := s.ReleaseOver(-1)
	childtest.Say("ERR", fmt.Sprint(err))
	for _, h := range s.Heaps() {
		if h.Library == os.Getenv("CHEAP_STUB_PATH") {
			childtest.Say("STUB", h.String())
			childtest.Say("STUB_TRIMMED", h.Trimmed)
			childtest.Say("STUB_RELEASES", h.Releases)
			childtest.Say("STUB_FAILURES", h.Failures)
			childtest.Say("STUB_LAST_ERROR", h.LastError)
			childtest.Say("STUB_VERSION", h.Version)
			childtest.Say("STUB_RETAINED", h.Retained)
		}
	}
}

func init() { ExtraChildren["stub-mallctl"] = childStubMallctl }

// TestStubMallctlNotTrusted: an object exporting jemalloc's two control
// names whose mallctl does not answer "version" with a string of its own
// image is reported present and not trimmed, and nothing but "version" is
// ever called in it (the stub aborts otherwise); the same for an object
// exporting mi_collect without a mimalloc mi_version beside it. Before the fix it was
// taken for jemalloc: epoch, stats and purge were called (an abort here;
// in a real shim, calls with jemalloc's argument layout into a function of
// another), and it was reported as trimmed.
func TestStubMallctlNotTrusted(t *testing.T) {
	for _, c := range []struct {
		name, src string
		v         int // STUB in src
	}{
		{"mallctl-enoent", stubMallctl, 1}, {"mallctl-heap-string", stubMallctl, 2}, {"mallctl-nothing-written", stubMallctl, 3},
		{"mi_collect-no-version", stubMiCollect, 1}, {"mi_collect-version-0", stubMiCollect, 2},
	} {
		name, v := c.name, c.v
		t.Run(name, func(t *testing.T) {
			so := filepath.Join(t.TempDir(), "libstub21.so")
			dlburst.Build(t, so, c.src, "-DSTUB="+strconv.Itoa(v))
			r := childtest.Report(t, childtest.Command(t, "stub-mallctl", childEnv, "CHEAP_STUB_PATH="+so))
			t.Logf("%s", r["STUB"])
			assert.Equal(t, "<nil>", r["ERR"])
			assert.Equal(t, "false", r["STUB_TRIMMED"])
			assert.Equal(t, "0", r["STUB_RELEASES"])
			assert.Contains(t, r["STUB"], "present, not trimmed")
		})
	}
}

// TestReloadOtherBuildSameAddress: a library reported as carrying a hidden
// jemalloc is unloaded, and another build of it (with no allocator) is
// loaded from the same path, at the same address: the list follows the new
// build. Before the fix the objects already scanned were keyed by name and
// load address only, so the old build's entry was kept.
func TestReloadOtherBuildSameAddress(t *testing.T) {
	dir := t.TempDir()
	so, next := filepath.Join(dir, "libreload21.so"), filepath.Join(dir, "next.so")
	build := func(out, body string) { dlburst.Build(t, out, body, "-Wl,--build-id") }
	// The same size and layout in both builds; only the message differs.
	// Both are built first, so that nothing is mapped between the unload
	// and the load (the new build then takes the hole the old one left).
	build(so, `__attribute__((used)) const char reload21_msg[] = "<jemalloc" ">: a hidden copy";`+"\n")
	build(next, `__attribute__((used)) const char reload21_msg[] = "<no-alloc" ">: a plain message";`+"\n")
	s := Detect()
	h, err := dlburst.Load(so, true)
	require.NoError(t, err)
	addr1, n := loadedAt(so), 0
	for _, hp := range s.Heaps() {
		if hp.Library == so {
			n++
		}
	}
	require.Equal(t, 1, n, "the hidden copy is reported")
	require.NoError(t, os.Rename(next, so))
	require.NoError(t, dlburst.Unload(h))
	h, err = dlburst.Load(so, true)
	require.NoError(t, err)
	defer func() { _ = dlburst.Unload(h) }()
	if addr2 := loadedAt(so); addr2 != addr1 {
		t.Skipf("the new build was loaded at %#x, not at %#x as the old one: the case needs the same address", addr2, addr1)
	}
	for _, hp := range s.Heaps() {
		assert.NotEqual(t, so, hp.Library, "the old build's allocator is still listed: %s", hp)
	}
}

// loadedAt returns the load address of the object named name, 0 if none.
func loadedAt(name string) uintptr {
	for _, o := range listObjects() {
		if o.name == name {
			return o.addr
		}
	}
	return 0
}

// failingJemalloc answers "version" as jemalloc does (a string of its own
// image) and refuses every other call: a jemalloc whose controls fail
// (built without stats, a mallctl that returns errors).
const failingJemalloc = `#include <errno.h>
#include <string.h>
static const char version[] = "5.3.0-failing";
int mallctlnametomib(const char *n, size_t *m, size_t *ml) { return ENOENT; }
int mallctl(const char *n, void *o, size_t *ol, void *nv, size_t nl) {
	if (strcmp(n, "version") == 0 && o != NULL && ol != NULL && *ol == sizeof(const char *)) {
		*(const char **)o = version;
		return 0;
	}
	return EFAULT;
}
`

// TestFailingJemallocReported: a jemalloc whose purge fails is trimmed
// (the release is tried) and the failure is reported as one: ReleaseOver
// returns its error, Failures and LastError say so, Releases stays 0 and
// its figures unknown. Before the fix a failed release counted as a
// release of 0 bytes.
func TestFailingJemallocReported(t *testing.T) {
	so := filepath.Join(t.TempDir(), "libfailing21.so")
	dlburst.Build(t, so, failingJemalloc)
	r := childtest.Report(t, childtest.Command(t, "stub-mallctl", childEnv, "CHEAP_STUB_PATH="+so))
	t.Logf("%s; ReleaseOver: %s", r["STUB"], r["ERR"])
	assert.Contains(t, r["ERR"], "libfailing21.so")
	assert.Equal(t, "true", r["STUB_TRIMMED"])
	assert.Equal(t, "5.3.0-failing", r["STUB_VERSION"])
	assert.Equal(t, "0", r["STUB_RELEASES"])
	assert.Equal(t, "1", r["STUB_FAILURES"])
	assert.Contains(t, r["STUB_LAST_ERROR"], "purge")
	assert.Equal(t, "-1", r["STUB_RETAINED"], "no stats: unknown")
	assert.Contains(t, r["STUB"], "1 release(s) failed")
}
