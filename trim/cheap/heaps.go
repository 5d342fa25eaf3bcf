package cheap

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
)

// Heap is one allocator found in the process and what the C heap step did
// with it, as Step.Heaps returns it. Sizes are bytes, -1 where unknown.
//
// Beside the allocator that owns malloc, a process can carry others: a
// library that bundles its own jemalloc (RocksDB), a jemalloc linked with a
// prefix (je_ in Badger's jemalloc build, _rjem_ in tikv-jemallocator), an
// allocator that a plugin dlopened with RTLD_LOCAL. Their memory never
// passes through malloc, so malloc_trim does not return it; each is
// released with its own call and its own estimate (see Step.ReleaseOver).
type Heap struct {
	// Stats holds the allocator's figures now (Allocator and Library name
	// it; Library is the object that holds the allocator's code, the
	// executable's path for one linked into it).
	Stats
	// Prefix is the prefix of the allocator's entry points ("je_" for
	// je_mallctl, "_rjem_", "" for none).
	Prefix string
	// Version is the allocator's version where it tells one, else "".
	Version string
	// OwnsMalloc is true for the allocator that serves the process's
	// malloc (the one Step.Allocator names).
	OwnsMalloc bool
	// Namespace is the link-map namespace of its object (glibc's Lmid_t):
	// 0 for the main one, n > 0 for one that dlmopen made (the same path
	// can then be loaded twice), -1 when the loader does not tell.
	Namespace int64
	// Trimmed is true when the C heap step can reach the allocator's
	// release call and runs it; false for an allocator present and not
	// trimmed: a static copy whose entry points the object does not export
	// (found by the messages its code carries), whose figures are then all
	// -1. Note says which.
	Trimmed bool
	// Note says how the allocator was found (its lookup: "dlsym on the
	// object's handle", "the executable's symbol table") or why it is not
	// trimmed.
	Note string

	// Releases counts the C heap steps that released this allocator;
	// Skipped those that left it alone because its estimate (Retained) was
	// below the threshold of Step.ReleaseOver; Failures those whose
	// release call returned an error (LastError, "" after a release that
	// succeeded). A failed release is not counted in Releases and leaves
	// the Last figures as they were, but for LastEstimate.
	Releases, Skipped, Failures int64
	LastError                   string
	// LastEstimate is its Retained read before the last release or skip,
	// -1 when unknown.
	LastEstimate int64
	// LastReleased is what its last release returned by the allocator's own
	// account (see Step.Release), -1 when it cannot tell (glibc) or no
	// release ran; TotalReleased sums the known ones.
	LastReleased, TotalReleased int64
	// LastDuration is the wall time of its last release; LastSlices the
	// number of calls it was made of that take the allocator's locks
	// (jemalloc: one per arena; tcmalloc: the carve's tc_malloc and
	// tc_free of each 1 MiB chunk, and one MallocExtension_ReleaseToSystem
	// per SliceBytes; glibc and mimalloc: 1), and LastMaxSlice the longest
	// of them: the longest time memctl held one of the allocator's locks
	// in that release (the carve's madvise calls hold none and are not
	// counted; see the package doc's Stalls).
	LastDuration, LastMaxSlice time.Duration
	LastSlices                 int64
}

// String formats the heap for a log line, for example
// "jemalloc 5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c (/usr/lib/x86_64-linux-gnu/libjemalloc.so.2): resident 2.1 MiB, retained 0.3 MiB; released 480.2 MiB in 3 ms (8 slices, longest 1 ms)".
func (h Heap) String() string {
	var b strings.Builder
	b.WriteString(h.Allocator)
	if h.Prefix != "" {
		b.WriteString(" (prefix " + h.Prefix + ")")
	}
	if h.Version != "" {
		b.WriteString(" " + h.Version)
	}
	b.WriteString(" (" + strconv.Quote(boundPath(h.Library)))
	if h.Namespace != 0 {
		b.WriteString(", namespace " + strconv.FormatInt(h.Namespace, 10))
	}
	if h.OwnsMalloc {
		b.WriteString(", owns malloc")
	}
	b.WriteString(")")
	if !h.Trimmed {
		b.WriteString(": present, not trimmed: " + h.Note)
		return b.String()
	}
	st := h.Stats
	st.Allocator = "x"
	if s := st.String(); len(s) > 1 {
		b.WriteString(s[1:])
	}
	if h.Releases > 0 {
		b.WriteString("; released ")
		if h.LastReleased >= 0 {
			b.WriteString(formatBytes(h.LastReleased))
		} else {
			b.WriteString("(uncounted)")
		}
		b.WriteString(" in " + h.LastDuration.Round(time.Microsecond).String())
		b.WriteString(" (" + strconv.FormatInt(h.LastSlices, 10) + " slices, longest " + h.LastMaxSlice.Round(time.Microsecond).String() + ")")
	}
	if h.LastError != "" {
		b.WriteString("; " + strconv.FormatInt(h.Failures, 10) + " release(s) failed, the last: " + h.LastError)
	}
	return b.String()
}

// MaxPathText is the longest object path, in bytes, that Heap.Name and
// Heap.String print whole; a longer one keeps its first and last
// MaxPathText/2 bytes around "...".
const MaxPathText = 256

// boundPath cuts p in its middle to at most about MaxPathText bytes (on
// UTF-8 boundaries where p is valid UTF-8).
func boundPath(p string) string {
	if len(p) <= MaxPathText {
		return p
	}
	head, tail := MaxPathText/2, len(p)-MaxPathText/2
	for head > 0 && !utf8.RuneStart(p[head]) {
		head--
	}
	for tail < len(p) && !utf8.RuneStart(p[tail]) {
		tail++
	}
	return p[:head] + "..." + p[tail:]
}

// pathText is p for a line of text: bounded (boundPath), and quoted when it
// holds a byte that could end or forge the line or the list it is in.
func pathText(p string) string {
	p = boundPath(p)
	if !utf8.ValidString(p) || strings.ContainsFunc(p, func(r rune) bool {
		return r < 0x20 || r == 0x7f || r == '"' || r == ';' || r == '\\' || unicode.Is(unicode.Bidi_Control, r) || r == 0x85 || r == 0x2028 || r == 0x2029
	}) {
		return strconv.Quote(p)
	}
	return p
}

// SliceBytes is how much one call of gperftools' MallocExtension_ReleaseToSystem
// is asked to return in a release: 16 MiB. tcmalloc holds its page-heap
// lock for the whole of one call, so a release in slices, 1 ms apart, lets
// a thread that mallocs between two calls through. tcmalloc releases whole
// free spans, so one call can release far more than asked; the carve that
// comes first (see the package doc's Stalls) leaves the spans of 1 MiB and
// more with no resident page, so that a call madvises at most about
// SliceBytes of resident pages.
const SliceBytes = 16 << 20

// carveBytes is the chunk of a tcmalloc carve (see the package doc's
// Stalls): 1 MiB, tcmalloc's smallest "large" span (kMaxPages pages of
// 8 KiB), so that every free span that large is carved, and the madvise
// of one chunk (about 0.1 ms here) is short.
const carveBytes = 1 << 20

// lastCarved is the bytes the last tcmalloc carve madvised, for the tests.
var lastCarved atomic.Int64

// heap is one entry of a Step's list: what is fixed at discovery, the
// allocator's entry points, and the counters (guarded by Step.mu).
type heap struct {
	info Heap // Stats' figures are not kept here: read at each Heaps call
	sys  sysStep
}

// heapList is the part of Step that changes: the allocators found, and the
// loader's counts when they were found.
type heapList struct {
	mu      sync.Mutex // guards heaps, counts and the counters in each heap
	relMu   sync.Mutex // serializes releases
	heaps   []*heap    // the owner first, when there is one
	counts  [2]uint64  // dl_iterate_phdr's dlpi_adds and dlpi_subs at the last scan
	scanned bool
	seen    map[string][]*heap // the allocators of each object scanned, by object (see scanHeaps)
}

// sumKnown returns the sum of the values >= 0 and whether any was < 0.
func sumKnown(vs ...int64) (sum int64, unknown bool) {
	for _, v := range vs {
		if v < 0 {
			unknown = true
			continue
		}
		sum = addKnown(sum, v)
	}
	return sum, unknown
}

// noSlice makes releases whole (one call per allocator): the control of
// the stall harness (BenchmarkReleaseStall).
var noSlice atomic.Bool

// sliceBytes is the tcmalloc slice: 0 (one whole release) when whole.
func sliceBytes(whole bool) int64 {
	if whole {
		return 0
	}
	return SliceBytes
}

// refresh returns the allocators of the process, the owner first, after a
// new scan of the loaded objects when the loader's counts changed since
// the last one (a dl_iterate_phdr call that stops at its first entry:
// about a microsecond). A rescan reads only the objects loaded since, and
// keeps the entries, and counters, of the others.
func (s *Step) refresh() []*heap {
	l := &s.list
	l.mu.Lock()
	defer l.mu.Unlock()
	c := loadCounts()
	if l.scanned && c == l.counts {
		return l.heaps
	}
	var found []*heap
	if s.why == "" && s.allocator != "" {
		if len(l.heaps) > 0 && l.heaps[0].info.OwnsMalloc {
			found = append(found, l.heaps[0])
		} else {
			h := &heap{sys: s.sys}
			h.info = Heap{Version: s.version, OwnsMalloc: true, Trimmed: true,
				Note: "owns malloc: found through dlsym(RTLD_DEFAULT, \"malloc\") and dladdr"}
			h.info.Allocator, h.info.Library = s.allocator, s.library
			h.info.LastEstimate, h.info.LastReleased = -1, -1
			found = append(found, h)
		}
	}
	hs, seen := scanHeaps(s, l.seen)
	found = append(found, hs...)
	l.seen = seen
	l.heaps, l.counts, l.scanned = found, c, true
	return found
}

// heapRetained returns h's release estimate now: its Releasable for
// jemalloc and tcmalloc where known (what their release returns), else its
// Retained (see Stats); -1 when unknown or not trimmed.
func (s *Step) heapRetained(h *heap) int64 {
	if !h.info.Trimmed {
		return -1
	}
	st := h.sys.stats()
	switch {
	case h.info.OwnsMalloc && s.allocator == Glibc:
		return s.glibcRetained(st)
	case (h.info.Allocator == Jemalloc || h.info.Allocator == Tcmalloc) && st.Releasable >= 0:
		return st.Releasable
	}
	return st.Retained
}

// Heaps returns every allocator found in the process: the one that owns
// malloc first (when there is one), then the others in the order of the
// loaded objects, each with its figures read now and what the C heap step
// did with it (see Heap). The objects are scanned again when the loader's
// counts of loaded and unloaded objects changed since the last scan (only
// the new objects are read; see the package doc); else the cost is the
// loader's counts and each allocator's Stats (2.3 µs with glibc alone). memctl holds a reference (dlopen) on
// each object in which it found an allocator to call, so a dlclose of that
// object does not unmap it. An empty list means the step is unavailable or
// found nothing. Safe for concurrent use.
func (s *Step) Heaps() []Heap {
	if s == nil {
		return nil
	}
	hs := s.refresh()
	out := make([]Heap, 0, len(hs))
	for _, h := range hs {
		s.list.mu.Lock()
		v := h.info
		s.list.mu.Unlock()
		if v.Trimmed {
			lib := v.Library
			v.Stats = h.sys.stats()
			v.Stats.Allocator, v.Stats.Library = v.Allocator, lib
			if v.OwnsMalloc && s.allocator == Glibc {
				v.Stats.Retained = s.glibcRetained(v.Stats)
			}
		}
		out = append(out, v)
	}
	return out
}

// ReleaseOver releases every allocator found in the process (see Heaps)
// whose own estimate, its Retained read just before, reaches minRelease
// bytes or is unknown (-1); a negative minRelease releases them all.
// Allocators other than the owner go first, the owner last. Each release
// is made in slices where the allocator allows it (see the package doc's
// Stalls). It returns the sum of the bytes released by the allocators' own
// accounts, or -1 when none could tell (glibc alone), and the errors of the
// calls that failed, joined. When no allocator can be released it returns
// the step's error (matching ErrUnavailable). Each Heap records its
// estimate, what it released, and its slices. Releases are serialized;
// safe for concurrent use.
func (s *Step) ReleaseOver(minRelease int64) (released int64, err error) {
	if s == nil {
		return 0, s.Err()
	}
	s.list.relMu.Lock()
	defer s.list.relMu.Unlock()
	hs := s.refresh()
	order := make([]*heap, 0, len(hs))
	for _, h := range hs {
		if h.info.Trimmed && !h.info.OwnsMalloc {
			order = append(order, h)
		}
	}
	if len(hs) > 0 && hs[0].info.OwnsMalloc {
		order = append(order, hs[0])
	}
	if len(order) == 0 {
		if err := s.Err(); err != nil {
			return 0, err
		}
		return 0, nil
	}
	var errs []error
	known := false
	whole := noSlice.Load()
	for _, h := range order {
		est := s.heapRetained(h)
		if minRelease >= 0 && est >= 0 && est < minRelease {
			s.list.mu.Lock()
			h.info.Skipped++
			h.info.LastEstimate = est
			s.list.mu.Unlock()
			continue
		}
		t0 := time.Now()
		r, slices, longest, err := h.sys.release(whole)
		d := time.Since(t0)
		if err == nil && h.info.OwnsMalloc && s.allocator == Glibc {
			s.setGlibcBase()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", h.info.Allocator, pathText(h.info.Library), err))
			s.list.mu.Lock()
			h.info.Failures++
			h.info.LastEstimate, h.info.LastError = est, err.Error()
			s.list.mu.Unlock()
			continue
		}
		s.list.mu.Lock()
		h.info.Releases++
		h.info.LastError = ""
		h.info.LastEstimate, h.info.LastReleased = est, r
		if r > 0 {
			h.info.TotalReleased += r
		}
		h.info.LastDuration, h.info.LastSlices, h.info.LastMaxSlice = d, slices, longest
		s.list.mu.Unlock()
		if r >= 0 {
			known = true
			released = addKnown(released, r)
		}
	}
	if !known {
		released = -1
	}
	return released, errors.Join(errs...)
}

// Name names the heap in a few words: the allocator, its prefix, its
// object, and whether it owns malloc or is not trimmed, for example
// "jemalloc je_ in /usr/lib/libfoo.so" or "glibc in /lib/x86_64-linux-gnu/libc.so.6 (owns malloc)".
// An object path longer than MaxPathText bytes is cut in its middle, and
// one with a control character, a quote, a ';' (the separator of the
// startup line's list) or invalid UTF-8 is quoted as a Go string, so that a
// hostile file name cannot forge a log line. The full path stays in
// Library.
func (h Heap) Name() string {
	s := h.Allocator
	if h.Prefix != "" {
		s += " " + h.Prefix
	}
	s += " in " + pathText(h.Library)
	if h.Namespace != 0 {
		s += " (namespace " + strconv.FormatInt(h.Namespace, 10) + ")"
	}
	switch {
	case h.OwnsMalloc:
		s += " (owns malloc)"
	case !h.Trimmed:
		s += " (present, not trimmed)"
	}
	return s
}
