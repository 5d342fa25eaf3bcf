//go:build linux && cgo

package metrics

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/memctl/memctl/internal/dlburst"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCAllocatorObjectNotUTF8: an allocator's object whose path is not
// valid UTF-8 (a Latin-1 directory name) is still scraped: its object label
// has the invalid bytes replaced. Before the fix MustNewConstMetric
// panicked in Collect (Prometheus label values must be UTF-8), which took
// the process down at the first scrape.
func TestCAllocatorObjectNotUTF8(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "caf\xe9")
	require.NoError(t, os.Mkdir(dir, 0o755))
	so := filepath.Join(dir, "libhidden21.so")
	dlburst.Build(t, so, dlburst.HiddenJemalloc)
	require.NoError(t, dlburst.Open(so, true))

	ctl := start(t)
	found := false
	for _, h := range ctl.Stats().CHeaps {
		found = found || h.Library == so
	}
	require.True(t, found, "the hidden copy at %q is in Stats.CHeaps", so)
	c, err := newCollector(ctl)
	require.NoError(t, err)
	mfs := gather(t, c)
	want := strings.ToValidUTF8(so, "\uFFFD")
	assert.True(t, utf8.ValidString(want))
	assert.Equal(t, 1.0, value(t, mfs, "memctl_c_allocator_info", "allocator", "jemalloc", "object", want, "trimmed", "false"))
}

// TestCAllocatorSamePathTwoNamespaces: one library loaded twice from the
// same path, in the main namespace and in one dlmopen made, gives two
// allocators with the same allocator, path and prefix: their series differ
// by the namespace in the object label. Before, the scrape failed (two
// series with the same labels).
func TestCAllocatorSamePathTwoNamespaces(t *testing.T) {
	so := filepath.Join(t.TempDir(), "libhiddenns21.so")
	dlburst.Build(t, so, dlburst.HiddenJemalloc)
	require.NoError(t, dlburst.Open(so, true))
	_, err := dlburst.LoadNamespace(so)
	require.NoError(t, err)

	ctl := start(t)
	var nss []int64
	for _, h := range ctl.Stats().CHeaps {
		if h.Library == so {
			nss = append(nss, h.Namespace)
		}
	}
	require.Len(t, nss, 2, "both copies are listed")
	require.NotEqual(t, nss[0], nss[1])
	c, err := newCollector(ctl)
	require.NoError(t, err)
	mfs := gather(t, c) // fails on two series with the same labels
	assert.Equal(t, 1.0, value(t, mfs, "memctl_c_allocator_info", "allocator", "jemalloc", "object", so, "trimmed", "false"))
	for _, ns := range nss {
		if ns != 0 {
			assert.Equal(t, 1.0, value(t, mfs, "memctl_c_allocator_info", "allocator", "jemalloc", "object", so+" (namespace "+strconv.FormatInt(ns, 10)+")"))
		}
	}
}
