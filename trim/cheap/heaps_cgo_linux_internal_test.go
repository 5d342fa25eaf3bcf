//go:build linux && cgo

package cheap

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("needs gcc to build a library to load: %v", err)
	}
	dir := t.TempDir()
	src, so := filepath.Join(dir, "nothing.c"), filepath.Join(dir, "libnothing21.so")
	require.NoError(t, os.WriteFile(src, []byte("int nothing21(void) { return 21; }\n"), 0o644))
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", so, src).CombinedOutput()
	require.NoError(t, err, "%s", out)

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
