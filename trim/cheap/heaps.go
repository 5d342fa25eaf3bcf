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

// Heap is one allocator found in the process and what the C heap step did with
// it (Step.Heaps): the owner of malloc or another (a library's bundled
// jemalloc, a prefixed one, one dlopened with RTLD_LOCAL).
type Heap struct {
	Stats             // its figures now; Library is the object that holds its code
	Prefix     string // of its entry points ("je_", "_rjem_", "" for none)
	Version    string // the allocator's version where it tells one, else ""
	OwnsMalloc bool   // true for the allocator Step.Allocator names
	Namespace  int64  // its link-map namespace (0 main, n > 0 dlmopen, -1 unknown)
	Trimmed    bool   // the step can reach its release call (else its figures are -1)
	Note       string // how it was found, or why it is not trimmed

	// Releases, Skipped and Failures count the steps that released it, left it
	// alone (under ReleaseOver's threshold), and failed (LastError).
	Releases, Skipped, Failures int64
	LastError                   string
	LastEstimate                int64 // its estimate before the last release or skip
	// LastReleased is what its last release returned (-1 unknown);
	// TotalReleased sums the known ones.
	LastReleased, TotalReleased int64
	// LastDuration is its last release's wall time, LastSlices the calls that
	// held its locks, LastMaxSlice the longest.
	LastDuration, LastMaxSlice time.Duration
	LastSlices                 int64
}

// String formats the heap for a log line.
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
		released := "(uncounted)"
		if h.LastReleased >= 0 {
			released = formatBytes(h.LastReleased)
		}
		fmt.Fprintf(&b, "; released %s in %v (%d slices, longest %v)", released,
			h.LastDuration.Round(time.Microsecond), h.LastSlices, h.LastMaxSlice.Round(time.Microsecond))
	}
	if h.LastError != "" {
		fmt.Fprintf(&b, "; %d release(s) failed, the last: %s", h.Failures, h.LastError)
	}
	return b.String()
}

// maxPathText is the longest object path, in bytes, that Name and String
// print whole; a longer one is cut in its middle.
const maxPathText = 256

// boundPath cuts p in its middle to about maxPathText bytes.
func boundPath(p string) string {
	if len(p) <= maxPathText {
		return p
	}
	head, tail := maxPathText/2, len(p)-maxPathText/2
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

// sliceSize is what one tcmalloc MallocExtension_ReleaseToSystem call returns:
// it holds the page-heap lock throughout, so slices 1 ms apart let threads in.
const sliceSize = 16 << 20

// carveBytes is the chunk of a tcmalloc carve: its smallest "large" span.
const carveBytes = 1 << 20

var lastCarved atomic.Int64 // bytes the last tcmalloc carve madvised, for tests

// heap is one allocator of a Step's list; the counters in info are guarded by heapList.mu.
type heap struct {
	info Heap // Stats' figures are not kept here: read at each Heaps call
	sys  sysStep
}

// heapList is the allocators found and the loader's counts when found.
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

// noSlice makes releases whole (one call per allocator), for tests.
var noSlice atomic.Bool

// refresh returns the process's allocators, the owner first, scanning new
// objects when the loader's counts changed (read by one dl_iterate_phdr step).
func (s *Step) refresh() []*heap {
	l := &s.list
	l.mu.Lock()
	defer l.mu.Unlock()
	c := loadCounts()
	if l.scanned && c == l.counts {
		return l.heaps
	}
	var found []*heap
	switch {
	case len(l.heaps) > 0 && l.heaps[0].info.OwnsMalloc:
		found = l.heaps[:1:1]
	case s.why == "" && s.allocator != "":
		found = []*heap{{sys: s.sys, info: Heap{Stats: Stats{Allocator: s.allocator, Library: s.library},
			Version: s.version, OwnsMalloc: true, Trimmed: true, LastEstimate: -1, LastReleased: -1,
			Note: "owns malloc: found through dlsym(RTLD_DEFAULT, \"malloc\") and dladdr"}}}
	}
	hs, seen := scanHeaps(s, l.seen)
	l.heaps, l.counts, l.scanned, l.seen = append(found, hs...), c, true, seen
	return l.heaps
}

// heapStats reads h's figures now (glibc's Retained by glibcRetained).
func (s *Step) heapStats(h *heap) Stats {
	st := h.sys.stats()
	st.Allocator, st.Library = h.info.Allocator, h.info.Library
	if s.ownedByGlibc(h) {
		st.Retained = s.glibcRetained(st)
	}
	return st
}

func (s *Step) ownedByGlibc(h *heap) bool { return h.info.OwnsMalloc && s.allocator == glibc }

// heapRetained returns h's release estimate now: Releasable for jemalloc and
// tcmalloc where known, else Retained; -1 when unknown or not trimmed.
func (s *Step) heapRetained(h *heap) int64 {
	if !h.info.Trimmed {
		return -1
	}
	st := s.heapStats(h)
	if (h.info.Allocator == jemalloc || h.info.Allocator == tcmalloc) && st.Releasable >= 0 {
		return st.Releasable
	}
	return st.Retained
}

// Heaps returns every allocator found, the owner of malloc first, with its
// figures now, rescanning the loaded objects when the loader's counts changed;
// each object called into is kept loaded (dlopen).
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
			v.Stats = s.heapStats(h)
		}
		out = append(out, v)
	}
	return out
}

// ReleaseOver releases, in slices where it can and the owner of malloc last,
// every allocator whose estimate reaches minRelease bytes or is unknown (all if
// minRelease < 0), and returns the bytes released by their own accounts (-1
// when none can tell) and the failed calls' errors joined (ErrUnavailable: none
// to release).
func (s *Step) ReleaseOver(minRelease int64) (released int64, err error) {
	if s == nil {
		return 0, s.Err()
	}
	s.list.relMu.Lock()
	defer s.list.relMu.Unlock()
	hs := s.refresh()
	var order []*heap
	for _, h := range hs {
		if h.info.Trimmed && !h.info.OwnsMalloc {
			order = append(order, h)
		}
	}
	if len(hs) > 0 && hs[0].info.OwnsMalloc {
		order = append(order, hs[0])
	}
	if len(order) == 0 {
		return 0, s.Err()
	}
	var errs []error
	known := false
	whole := noSlice.Load()
	for _, h := range order {
		r, err := s.releaseHeap(h, minRelease, whole)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", h.info.Allocator, pathText(h.info.Library), err))
		} else if r >= 0 {
			known = true
			released = addKnown(released, r)
		}
	}
	if !known {
		released = -1
	}
	return released, errors.Join(errs...)
}

// releaseHeap releases h unless its estimate is under minRelease (then it
// returns -1), and counts the outcome in h.info.
func (s *Step) releaseHeap(h *heap, minRelease int64, whole bool) (int64, error) {
	est := s.heapRetained(h)
	if minRelease >= 0 && est >= 0 && est < minRelease {
		s.list.mu.Lock()
		h.info.Skipped++
		h.info.LastEstimate = est
		s.list.mu.Unlock()
		return -1, nil
	}
	var before int64
	var okBefore bool
	if s.ownedByGlibc(h) {
		before, okBefore = cResidentExtra(h.sys.stats().InUse)
	}
	t0 := time.Now()
	r, slices, longest, err := h.sys.release(whole)
	d := time.Since(t0)
	if err == nil && s.ownedByGlibc(h) {
		// malloc_trim returns 0 or 1: measure what it released.
		after, okAfter := cResidentExtra(h.sys.stats().InUse)
		if okAfter {
			s.base.Store(after)
			s.baseSet.Store(true)
		}
		r = glibcReleased(before, okBefore, after, okAfter)
	}
	s.list.mu.Lock()
	defer s.list.mu.Unlock()
	h.info.LastEstimate = est
	if err != nil {
		h.info.Failures++
		h.info.LastError = err.Error()
		return -1, err
	}
	h.info.Releases++
	h.info.LastError = ""
	h.info.LastReleased = r
	h.info.TotalReleased += max(r, 0)
	h.info.LastDuration, h.info.LastSlices, h.info.LastMaxSlice = d, slices, longest
	return r, nil
}

// Name names the heap in a few words ("jemalloc je_ in /usr/lib/libfoo.so"): a
// long path is cut, one that could forge a log line is quoted; Library keeps it
// whole.
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
