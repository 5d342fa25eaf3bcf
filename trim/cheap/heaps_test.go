package cheap

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestHeapNameString(t *testing.T) {
	st := unknownStats(jemalloc, "/x/libfoo.so")
	st.Resident, st.Retained = 8<<20, 6<<20
	h := Heap{Stats: st, Prefix: "je_", Version: "5.3.0", Trimmed: true,
		Releases: 1, LastReleased: 240 << 20, LastDuration: 19 * time.Millisecond, LastSlices: 9, LastMaxSlice: 18 * time.Millisecond}
	assert.Equal(t, "jemalloc je_ in /x/libfoo.so", h.Name())
	assert.Equal(t, `jemalloc (prefix je_) 5.3.0 ("/x/libfoo.so"): resident 8.0 MiB, retained 6.0 MiB; released 240.0 MiB in 19ms (9 slices, longest 18ms)`, h.String())

	g := Heap{Stats: unknownStats(glibc, "/lib/libc.so.6"), OwnsMalloc: true, Trimmed: true, Releases: 1, LastReleased: -1, LastSlices: 1}
	assert.Equal(t, "glibc in /lib/libc.so.6 (owns malloc)", g.Name())
	assert.Contains(t, g.String(), "released (uncounted)")

	hidden := Heap{Stats: unknownStats(jemalloc, "/x/librocks.so"), Note: "a static, hidden copy"}
	assert.Equal(t, "jemalloc in /x/librocks.so (present, not trimmed)", hidden.Name())
	assert.Equal(t, `jemalloc ("/x/librocks.so"): present, not trimmed: a static, hidden copy`, hidden.String())
}

func TestSumKnown(t *testing.T) {
	sum, unknown := sumKnown(3, -1, 4)
	assert.Equal(t, int64(7), sum)
	assert.True(t, unknown)
	sum, unknown = sumKnown()
	assert.Zero(t, sum)
	assert.False(t, unknown)
}

// TestHeapNameHostilePath: an object path with a newline, a ';' (the
// startup line's separator) or invalid UTF-8 is quoted in Name, and one
// longer than maxPathText is cut in its middle in Name and String; Library
// keeps it whole.
func TestHeapNameHostilePath(t *testing.T) {
	for _, p := range []string{"/tmp/x\nlevel=ERROR msg=forged/libjemalloc.so", "/tmp/a; glibc in /lib/libc.so.6 (owns malloc)", "/tmp/\xff.so", "/tmp/\u202eos.cilbil"} {
		h := Heap{Stats: unknownStats(jemalloc, p), Note: "x"}
		assert.Equal(t, "jemalloc in "+strconv.Quote(p)+" (present, not trimmed)", h.Name())
		assert.NotContains(t, h.String(), "\n")
		assert.Equal(t, p, h.Library)
	}
	long := "/" + strings.Repeat("d\u00e9", 2000) + "/libjemalloc.so.2"
	h := Heap{Stats: unknownStats(jemalloc, long), Trimmed: true}
	n := h.Name()
	assert.Less(t, len(n), maxPathText+40)
	assert.True(t, utf8.ValidString(n), "cut on UTF-8 boundaries")
	assert.Contains(t, n, "...")
	assert.True(t, strings.HasSuffix(n, "/libjemalloc.so.2"), "the file name is kept: %s", n)
	assert.Less(t, len(h.String()), maxPathText+60)
	assert.Equal(t, "jemalloc in /usr/lib/libjemalloc.so.2", Heap{Stats: unknownStats(jemalloc, "/usr/lib/libjemalloc.so.2"), Trimmed: true}.Name(), "a plain path is not quoted")
}

// What glibc released is the fall of the resident excess across
// malloc_trim (which returns only 0 or 1); the excess may be negative.
func TestGlibcReleased(t *testing.T) {
	assert.Equal(t, int64(397<<20), glibcReleased(399<<20, true, 2<<20, true))
	assert.Equal(t, int64(3<<20), glibcReleased(1<<20, true, -2<<20, true), "a negative excess is a figure, not unknown")
	assert.Equal(t, int64(0), glibcReleased(1<<20, true, 5<<20, true), "grown meanwhile: nothing released")
	assert.Equal(t, int64(-1), glibcReleased(1<<20, false, 0, true))
	assert.Equal(t, int64(-1), glibcReleased(1<<20, true, 0, false))
}
