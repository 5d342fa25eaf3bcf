//go:build linux && cgo

package cheap

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
