// Package cheap is the C heap step of memctl's trim: it finds, at run time,
// which allocator owns malloc in this process (glibc, jemalloc, mimalloc or
// gperftools' tcmalloc), asks it to return freed memory to the OS, reads its
// statistics, and caps glibc's arenas.
//
// "Pure Go" services still carry C memory through cgo (SQLite, RocksDB, image
// and compression libraries). glibc keeps what a burst of threads freed
// inside its per-thread arenas (up to 8 per core) until malloc_trim; jemalloc
// and mimalloc ignore malloc_trim and need their own purge.
//
// # How the allocator is found
//
// Nothing is linked at build time: the package looks up malloc with
// dlsym(RTLD_DEFAULT, "malloc"), names its library with dladdr, and takes as
// owner the allocator whose own entry point lives in that same library:
//
//	jemalloc  mallctl                            release: mallctl("arena.4096.purge"), 4096 = MALLCTL_ARENAS_ALL
//	mimalloc  mi_collect                         release: mi_collect(true)
//	tcmalloc  MallocExtension_ReleaseFreeMemory  release: MallocExtension_ReleaseFreeMemory()
//	glibc     malloc_trim, gnu_get_libc_version  release: malloc_trim(0)
//
// Every call goes through a function pointer from dlsym, so the package builds
// with or without these libraries. The step is unavailable (its errors match
// ErrUnavailable) when cgo is off, off Linux (the error also matches
// errors.ErrUnsupported), under musl, in a static binary, and when malloc
// belongs to no allocator above.
//
// # Every allocator, not only malloc's owner
//
// A process can carry allocators besides the one that owns malloc: a
// library that bundles jemalloc (RocksDB), a jemalloc linked with a prefix
// (je_mallctl in Badger's jemalloc build, _rjem_mallctl from
// tikv-jemallocator), one a plugin dlopened with RTLD_LOCAL. Their freed
// memory never passes through malloc. Step.Heaps lists them all; the C step
// releases each with its own estimate (Step.ReleaseOver), and memctl's
// Report, Stats, startup line and metrics name each. They are found by
// walking the loaded objects (dl_iterate_phdr) and reading each object's
// dynamic symbol table from its file: every defined p+"mallctl" that has a
// p+"mallctlnametomib" beside it is a jemalloc with prefix p (any prefix, ""
// included), mi_collect a mimalloc, MallocExtension_ReleaseToSystem a
// tcmalloc. Each entry point is then looked up by the object's own handle
// (dlopen with RTLD_NOLOAD, then dlsym on that handle, so that an object
// loaded with RTLD_LOCAL is reached) and kept only where dladdr places it in
// that object. memctl keeps that handle: the object stays mapped while
// memctl may call it, and a later dlclose of it does not unload it. When
// the file is not the loaded image (deleted after the dlopen, a memfd
// closed since, a relative name opened from a directory the process has
// left, or another build renamed over it: its GNU build ID differs from
// the loaded one's), the dynamic symbols are read from the loaded image
// instead (its dynamic section's hash table), and the Note says so. A
// mallctl is trusted only when it answers the read-only "version" with a
// string of its own object's image, as jemalloc's does; otherwise it is
// reported present and not trimmed and nothing else is called in it. A
// release call that fails is counted in Heap.Failures with its error,
// not as a release.
//
// The executable is also searched in its full symbol table (.symtab): a Go
// program links its C code statically and exports none of it, so a
// statically linked je_ jemalloc is reached by address there, unless the
// binary was stripped (go build -ldflags=-s, and go test's binaries). An
// object that exports no entry point but whose read-only data holds an
// allocator's messages (jemalloc's "<jemalloc>: " prefix, mimalloc's and
// tcmalloc's own) is searched the same way, and when that fails it is
// reported present and not trimmed (Heap.Trimmed false), never as handled:
// a library that bundles a hidden copy and is stripped, as Debian strips
// its libraries. The hint reads the file, not memory, so it faults nothing
// in. It does not see a copy whose messages were compiled out. Reading
// the figures of a jemalloc found this way that never served an
// allocation initializes it, as any of its calls does. A namespace made
// with dlmopen is not listed by dl_iterate_phdr (glibc lists the caller's
// namespace only): its objects are found on glibc's chain of namespaces
// (r_debug_extended, glibc 2.35+; not seen before 2.35), opened in their
// namespace, and reported with it (Heap.Namespace).
//
// The objects are scanned at Detect and again whenever the loader's counts
// of loaded and unloaded objects (dlpi_adds, dlpi_subs: one dl_iterate_phdr
// entry, about a microsecond) changed since the last scan, at the next
// Heaps, Retained or Release; never from trim.Trimmer.AfterBurst. A rescan
// reads only the objects loaded since. Reading an object (its symbol
// tables and read-only data, from its file) costs: the nine objects of this
// package's test binary took 3.3 ms and 0.9 MB of short-lived Go heap
// (BenchmarkScan); Heaps with nothing new loaded 2.3 µs (BenchmarkHeaps).
//
// # Stalls
//
// A release holds the allocator's locks, and a C thread that calls malloc
// meanwhile waits. Each release is made in slices where the allocator
// allows it, and Heap.LastSlices and LastMaxSlice report them:
//
//	jemalloc  one arena.<i>.purge per arena (arenas.narenas); a thread of another arena never waits
//	tcmalloc  the carve (below), then MallocExtension_ReleaseToSystem(SliceBytes), 1 ms apart, while the page heap's free bytes fall; instead of ReleaseFreeMemory, which holds the page-heap lock for the whole heap
//	glibc     malloc_trim(0): not sliceable from outside; it locks one arena at a time, so a thread waits for its own arena's trim only
//	mimalloc  mi_collect(true): one call
//
// tcmalloc (gperftools 2.10) releases whole free spans
// (PageHeap::ReleaseAtLeastNPages; its source notes that a large span is
// not split), and the spans a burst frees merge: one
// ReleaseToSystem(16 MiB) released a span of 600+ MiB, madvising all of it
// under the page-heap lock for 79-203 ms. No setting splits a span:
// TCMALLOC_RELEASE_RATE paces only the incremental scavenger, which
// releases whole spans too, and tcmalloc.aggressive_memory_decommit
// madvises each span as it is freed, not those already free (and a span
// freed beside an unmapped one then madvises its whole free neighbour under
// the lock). So memctl carves the free spans first: it allocates the
// page heap's free pages in 1 MiB chunks with the allocator's own
// tc_malloc (a request above 256 KiB is carved from the best-fitting free
// span of at least 1 MiB: a split under the lock, microseconds), madvises
// each chunk served from free pages (MADV_DONTNEED, on memory it owns,
// outside tcmalloc's locks: about 0.1 ms a chunk here), holds the chunks
// until fewer than 1 MiB of free pages are left, then frees them (a merge
// under the lock each). The spans are then free again with no resident
// page. Best fit may serve a chunk from an unmapped span instead; freed,
// it merges the resident free spans beside it (which it kept apart) into
// one, so a carve that took any is made once more, and that one takes
// the merged spans apart. The ReleaseToSystem slices that follow madvise
// the carved spans in microseconds; they stop when
// tcmalloc.pageheap_free_bytes has not reached a new low in 8 calls
// expected to release (another thread's
// mallocs and frees move it both ways; a call that unmapped more than it
// asked makes tcmalloc skip the next ones, which are not counted), and
// after 2 × free/SliceBytes + 64 calls. The bound is on work: each hold of
// the page-heap lock is one chunk's split or merge (and the incremental
// scavenge tcmalloc may run in a free, on carved spans), or one ReleaseToSystem
// call that madvises at most SliceBytes plus one span smaller than 1 MiB
// of resident pages (spans under 1 MiB, as a fragmented heap leaves, are
// not carved) plus the resident pages of spans other threads freed since
// the carve. The carve holds the free pages for its duration (0.1-0.3 s
// per GiB here): another thread that needs pages meanwhile grows the
// heap, and the carve's own last request may grow it by one chunk of
// address space. There is no carve, and the release is the slices alone, when tc_malloc
// and tc_free are not found, under a heap limit (TCMALLOC_HEAP_LIMIT_MB:
// taking an unmapped span can then release others under the lock), and
// when the heap (committed + unmapped) is within 768 KiB of a multiple of
// 128 MiB (a request that grows the heap across one makes tcmalloc release
// every free page at once: kForcedCoalesceInterval in PageHeap::New; within
// 1.25 MiB of one, the chunks are made smaller, down to 512 KiB, so that
// none can cross it); the carve also stops at the first request that grew
// the heap.
//
// Measured on issue 26's workload (BenchmarkTcmallocChurn: a C thread
// loops malloc(64)/free and malloc(512 KiB)/free 50 µs apart while 16
// threads malloc and free 2 GiB in 1 KiB blocks, then the release; 10 runs
// interleaved with main bd95786 built with the same harness, at load
// averages of 8-20; the first 6 before the second carve and the smaller
// chunks were added):
//
//	go test -run '^$' -bench TcmallocChurn -benchtime 1x -count 6 ./trim/cheap/
//
// the sliced release returned 98.9-99.1% of what the burst left within
// 4 s (main: 6.8-19% in 6 of 10 runs: its slice loop stopped when the
// churn kept tcmalloc.pageheap_unmapped_bytes from growing), in 0.18-0.74
// s and 3,400-7,500 calls; the churn's worst round across it was 0.17-40
// ms, under 4.1 ms in 8 of 10 runs (main's slices: 1.6-427 ms; the whole
// release, ReleaseFreeMemory: 92-843 ms, as long as the release itself;
// the control, 500 ms with no release: 0.03-0.64 ms). After the carve,
// each ReleaseToSystem call lowered RSS by at most 2.5 MB (statm read
// around each call, 6 runs), and the longest calls, 4 ms, released
// nothing: the longer holds are the busy machine preempting the thread
// that holds the lock, which makes the waiters wait with it. With the stall
// harness (BenchmarkReleaseStall: 16 threads leave 2 GiB free, every 64th
// 16 KiB block live, no arena cap; a C thread mallocs and frees 2 KiB to
// 512 KiB blocks across the release; 7 runs, 4 interleaved with main):
// the longest slice 1.4-15 ms and the worst wait 1.4-20 ms (main: 7.1-58
// ms and 6.3-76 ms; the control with no release: 8-25 ms); with one carve
// only, 5.5-576 ms. Before the carve, on a quieter machine: 63-80 slices
// of at most 2-13 ms 1 ms apart (tcmalloc's page heap lock is not fair,
// and without the pause the waiter slept through all the slices, 104-108
// ms), a worst wait of 2.3-8 ms against 88-131 ms for the whole
// release. Figures on this repository's 2-core test machine, shared with
// other load: they vary with it. glibc's
// malloc_trim took 280-580 ms in all and made it wait 14-44 ms (the control
// without a release, on the shared machine: 5-44 ms): its own arena's
// share of 2 GiB over 16 arenas. When one arena holds it all (one thread
// made the burst; or arenas capped at 2), that arena's threads wait for
// its whole trim: 0.2-0.5 s for 2 GiB in one arena here, up to 1.8 s while
// the machine was loaded (glibc-1arena in the harness). That cannot be
// sliced without glibc's internals: malloc_trim takes no arena and no
// size, and its free-chunk walk runs under the arena's lock. jemalloc's
// purge does not block malloc in the same way (it takes the decayed
// extents out under the arena's lock and madvises them outside it): the
// probe waited 5-25 ms whether the 8 arenas were purged in one call or
// one by one (the control: 0.3-70 ms).
//
// # What a release can return
//
// Every allocator returns only whole free pages: glibc's malloc_trim
// madvises the free pages inside its arenas, jemalloc's purge and mimalloc's
// collect return only slabs or pages that hold no live block. A fragmented
// heap (a few live blocks spread over many pages) therefore keeps most of its
// memory after jemalloc's or mimalloc's release, and Stats.Retained is what
// shows it. Measured in this package's tests (8 C threads, each allocating
// 200,000 blocks of 256 bytes, on a 2-core x86-64 with glibc 2.36):
//
//	glibc, every 64th block kept:     443 MB resident after the burst, 136 MB after malloc_trim(0) (55-66 ms)
//	jemalloc 5.3, every block freed:   76 MB, 25 MB after the purge (6-9 ms); malloc_trim(0) releases nothing
//	mimalloc 2.0.9, every block freed: 334-434 MB, 8 MB after mi_collect(true) (30-170 ms); malloc_trim(0) releases nothing
//	tcmalloc (gperftools 2.10), freed: 399-409 MB, 16 MB after ReleaseFreeMemory (33-37 ms); 21 MB after the sliced release (carve and slices, 38-46 ms)
//	jemalloc, every 64th block kept:  167 MB, 127 MB after the purge; retained 109 MiB
//	mimalloc, every 64th block kept:  430 MB, 420-430 MB after mi_collect(true)
//
// A call returns what the allocator can reach from the calling thread:
// blocks parked in other live threads' caches (glibc's tcache, jemalloc's
// tcache, mimalloc's thread-local heaps) go back as those threads run or
// exit. mimalloc's collect returns nothing at all on a thread that never
// called malloc, so Release first sets up the calling thread's heap
// (mi_thread_init).
//
// # Cost
//
// Detection runs once per process (Detect) and takes a few milliseconds
// (the owner's lookup, about 0.1 ms; then the scan of every loaded object,
// above). A release takes from a
// few to about a hundred milliseconds on a heap of a few hundred megabytes
// and holds the allocator's locks meanwhile: call it after a burst, not on a
// hot path. Stats takes about a microsecond on a small heap and under a
// millisecond on the fragmented glibc heap above (mallinfo2 walks the free
// lists of every arena).
package cheap

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/memctl/memctl/internal/procfs"
)

// ErrUnavailable is matched (with errors.Is) by the errors of a step that
// cannot run in this build or process: cgo is off, the OS is not Linux, or
// no known allocator owns malloc. The error text says which.
var ErrUnavailable = errors.New("cheap: C heap step unavailable")

// ErrOperatorSet is matched by the error of SetArenaMax when the operator
// set the arena cap (MALLOC_ARENA_MAX, or glibc.malloc.arena_max in
// GLIBC_TUNABLES): memctl leaves it alone.
var ErrOperatorSet = errors.New("cheap: glibc arena cap set by the operator")

// Allocator names, as returned by Step.Allocator.
const (
	Glibc    = "glibc"
	Jemalloc = "jemalloc"
	Mimalloc = "mimalloc"
	Tcmalloc = "tcmalloc" // gperftools
	None     = "none"     // the step is unavailable
)

// Step is the C heap step of this process: the allocator found to own malloc
// and its calls, and every other allocator found (see Heaps). A Step is
// safe for concurrent use; its list of allocators is rescanned under its
// own lock, releases are serialized, and the allocators' own calls take
// their locks. The zero value is an unavailable step.
type Step struct {
	allocator string // one of the names above
	library   string // path of the object that provides malloc, as dladdr names it
	version   string // the allocator's version where it tells, else ""
	why       string // why the step is unavailable; "" when it is available
	unsup     bool   // unavailable because of the OS: the error matches errors.ErrUnsupported
	sys       sysStep
	ownerBase uintptr // load address of the owner's object, as dladdr gives it

	// list holds every allocator found (the owner first), rescanned when
	// the loader's counts change (see Heaps).
	list heapList

	// glibc: the C heap's resident bytes beyond its live blocks right
	// after the last Release (see glibcRetained); valid when baseSet.
	base    atomic.Int64
	baseSet atomic.Bool
}

var (
	detectOnce sync.Once
	detected   *Step
)

// Detect returns the C heap step of this process. It finds the allocator on
// the first call and returns the same *Step afterwards; it never fails: a
// step that cannot run reports why through Err.
func Detect() *Step {
	detectOnce.Do(func() { detected = detect() })
	return detected
}

// Allocator names the allocator that owns malloc: "glibc", "jemalloc",
// "mimalloc", "tcmalloc", or "none" when the step is unavailable.
func (s *Step) Allocator() string {
	if s == nil || s.why != "" || s.allocator == "" {
		return None
	}
	return s.allocator
}

// Library returns the path of the shared object that provides malloc, as
// dladdr(3) names it (for example "/lib/x86_64-linux-gnu/libc.so.6"), or ""
// when it is not known.
func (s *Step) Library() string {
	if s == nil {
		return ""
	}
	return s.library
}

// Version returns the allocator's version where it tells one
// (gnu_get_libc_version, jemalloc's "version", mi_version), else "".
func (s *Step) Version() string {
	if s == nil {
		return ""
	}
	return s.version
}

// Err returns nil when the step can run, or an error matching ErrUnavailable
// that says why it cannot (and matching errors.ErrUnsupported off Linux).
func (s *Step) Err() error {
	switch {
	case s == nil || (s.why == "" && s.allocator == ""):
		return fmt.Errorf("%w: no step detected", ErrUnavailable)
	case s.why == "":
		return nil
	case s.unsup:
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, s.why, errors.ErrUnsupported)
	default:
		return fmt.Errorf("%w: %s", ErrUnavailable, s.why)
	}
}

// Release asks every allocator found in the process (see Heaps: the one
// that owns malloc, and any other one whose entry points memctl can reach)
// to return freed memory to the OS (see the package doc for each
// allocator's call) and returns the bytes released by the allocators' own
// accounts: jemalloc's stats.resident before minus after, tcmalloc's
// unmapped page heap bytes after minus before, mimalloc's committed bytes
// before minus after, summed. glibc's malloc_trim does not count what it
// returns, so released is -1 when glibc alone was released; read RSS
// around the call to measure it. The error matches ErrUnavailable when the
// step cannot run, and otherwise names the calls that failed. It is
// ReleaseOver(-1). Safe for concurrent use.
func (s *Step) Release() (released int64, err error) { return s.ReleaseOver(-1) }

// setGlibcBase records the C heap's resident excess right after glibc's
// release (see glibcRetained).
func (s *Step) setGlibcBase() {
	if st := s.sys.stats(); st.InUse >= 0 {
		if extra, ok := cResidentExtra(st.InUse); ok {
			s.base.Store(extra)
			s.baseSet.Store(true)
		}
	}
}

// Retained returns the bytes that a release of the allocators found in the
// process (see Heaps) can return: the sum of their estimates (Releasable
// for jemalloc and tcmalloc, where they tell it, else Retained; see
// Stats), or -1 when one of them cannot tell (mimalloc). Allocators
// present and not trimmed are left out, so a step with no allocator it can
// release (unavailable: cgo off, no known allocator) returns 0: a trim's C
// step has nothing to do, and an automatic trim is not run for it (before,
// -1 there made every pressure signal of a CGO_ENABLED=0 service run a
// trim of nothing). It is the C estimate of a trim (trim.CHeap).
func (s *Step) Retained() int64 {
	if s == nil {
		return 0
	}
	var vs []int64
	for _, h := range s.refresh() {
		if h.info.Trimmed {
			vs = append(vs, s.heapRetained(h))
		}
	}
	sum, unknown := sumKnown(vs...)
	if unknown {
		return -1
	}
	return sum
}

// Stats reads the allocator's statistics now. Figures the allocator does not
// report are -1. The error matches ErrUnavailable when the step cannot run.
// For glibc it costs a walk of every arena's free lists under their locks
// (mallinfo2) and, after the first Release, a read of /proc/self/status
// (tens of microseconds) for Retained; for jemalloc an epoch advance and
// five mallctl reads.
func (s *Step) Stats() (Stats, error) {
	if err := s.Err(); err != nil {
		return unknownStats(None, s.Library()), err
	}
	st := s.sys.stats()
	st.Allocator, st.Library = s.allocator, s.library
	if s.allocator == Glibc {
		st.Retained = s.glibcRetained(st)
	}
	return st, nil
}

// glibcRetained returns the free bytes of glibc's arenas that are resident,
// a figure that comes down after malloc_trim, unlike fordblks (which counts
// the free pages malloc_trim returned to the OS too). glibc does not say
// which of its free bytes are resident, so it is measured: the C heap's
// resident bytes are RssAnon (/proc/self/status) minus what the Go runtime
// holds resident (/memory/classes/total:bytes −
// /memory/classes/heap/released:bytes); what exceeds the live blocks (InUse)
// beyond the same excess measured right after the last Release (which
// absorbs what is neither Go's nor malloc's: thread stacks, other mappings)
// is retained, capped at fordblks. Before the first Release, or when RssAnon
// cannot be read, it is fordblks.
func (s *Step) glibcRetained(st Stats) int64 {
	if st.Free < 0 || st.InUse < 0 || !s.baseSet.Load() {
		return st.Free
	}
	extra, ok := cResidentExtra(st.InUse)
	if !ok {
		return st.Free
	}
	return min(max(extra-s.base.Load(), 0), st.Free)
}

// cResidentExtra returns RssAnon minus the Go runtime's resident bytes minus
// inUse: the anonymous resident memory that is neither Go's nor in live C
// blocks. ok is false when a figure cannot be read.
func cResidentExtra(inUse int64) (extra int64, ok bool) {
	anon, err := procfs.ReadBytes("/proc/self/status", "RssAnon")
	if err != nil {
		return 0, false
	}
	m := [...]metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(m[:])
	if m[0].Value.Kind() != metrics.KindUint64 || m[1].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	goRes := int64(m[0].Value.Uint64()) - int64(m[1].Value.Uint64())
	return anon - goRes - inUse, true
}

// Stats is a snapshot of the C heap as the allocator that owns malloc
// accounts for it. Sizes are bytes; -1 means the allocator does not report
// the figure. Sources, per allocator:
//
//	field      glibc (mallinfo2)     jemalloc (mallctl)        tcmalloc (numeric properties)                  mimalloc
//	Arena      arena                 stats.mapped              generic.heap_size                              current_commit (mi_process_info)
//	Mapped     hblkhd                -1                        -1                                             -1
//	InUse      uordblks + hblkhd     stats.allocated           generic.current_allocated_bytes                -1
//	Free       fordblks              -1                        tcmalloc.pageheap_free_bytes                   -1
//	Releasable keepcost              (pdirty + pmuzzy) × page  tcmalloc.pageheap_free_bytes                   -1
//	Active     -1                    stats.active              -1                                             -1
//	Resident   -1                    stats.resident            heap_size - tcmalloc.pageheap_unmapped_bytes   -1
//	Retained   see below             resident - allocated      Resident - InUse                               -1
//	Page       -1                    arenas.page               -1                                             -1
//
// The estimate of a release (Heap.LastEstimate, Step.Retained, the floor
// of Step.ReleaseOver) is Releasable for jemalloc and tcmalloc, where the
// allocator tells it, else Retained: their Retained also counts what no
// release returns (partly filled slabs, thread and central caches), which
// stays after a release (a fragmented heap: 108 MiB of jemalloc's, 190 MiB
// of tcmalloc's, with nothing left to purge).
//
// glibc's Free (fordblks) counts the free bytes inside its arenas,
// including free pages that malloc_trim already returned to the OS (mallinfo2
// cannot tell them apart), so it does not drop after a release; its Retained
// is therefore measured from RssAnon after the first Release (see
// Step.Stats) and drops after each release, as jemalloc's and tcmalloc's do.
// mimalloc's Retained is -1 (unknown): a trim then runs its C step. mimalloc's release builds count no live bytes, only the
// memory they committed (Arena), which is not what is resident: a page
// committed but never touched is not in RSS.
type Stats struct {
	Allocator string // as Step.Allocator
	Library   string // as Step.Library

	Arena      int64 // bytes the allocator obtained from the OS for its heap (glibc: non-mmapped arena bytes)
	Mapped     int64 // glibc: bytes in blocks that malloc mmapped on their own
	InUse      int64 // bytes in live blocks
	Free       int64 // bytes in free blocks the allocator keeps
	Releasable int64 // glibc: bytes at the top of the main arena that malloc_trim can unmap; jemalloc: its dirty and muzzy pages (stats.arenas.<all>.pdirty and .pmuzzy), what a purge returns; tcmalloc: its page heap's free bytes, what a release returns
	Active     int64 // jemalloc: bytes in active pages (live blocks and the slabs around them)
	Resident   int64 // bytes of the heap resident in RAM by the allocator's account
	Retained   int64 // bytes the allocator holds that no live block uses
	Page       int64 // jemalloc: the allocator's page size in bytes

	// PageWarning is true when jemalloc's page (Page) is larger than the
	// kernel's page (os.Getpagesize): slabs are then coarser and a partly
	// filled slab keeps more memory, which shows as Active far above InUse.
	PageWarning bool
}

// addKnown returns a+b, or -1 when either is unknown or the sum overflows.
func addKnown(a, b int64) int64 {
	if a < 0 || b < 0 || a > 1<<63-1-b {
		return -1
	}
	return a + b
}

func unknownStats(allocator, library string) Stats {
	return Stats{
		Allocator: allocator, Library: library,
		Arena: -1, Mapped: -1, InUse: -1, Free: -1, Releasable: -1,
		Active: -1, Resident: -1, Retained: -1, Page: -1,
	}
}

// String formats the statistics for a log line, for example
// "glibc: arena 420.1 MiB, in use 6.7 MiB, free 413.4 MiB, retained 413.4 MiB".
// Figures that are unknown are left out.
func (st Stats) String() string {
	var b strings.Builder
	b.WriteString(st.Allocator)
	if b.Len() == 0 {
		b.WriteString(None)
	}
	sep := ": "
	add := func(name string, v int64) {
		if v < 0 {
			return
		}
		b.WriteString(sep)
		b.WriteString(name)
		b.WriteByte(' ')
		b.WriteString(formatBytes(v))
		sep = ", "
	}
	add("arena", st.Arena)
	add("mmapped", st.Mapped)
	add("in use", st.InUse)
	add("free", st.Free)
	add("active", st.Active)
	add("resident", st.Resident)
	add("retained", st.Retained)
	if st.Page > 0 {
		b.WriteString(sep)
		b.WriteString("page " + strconv.FormatInt(st.Page, 10) + " B")
		sep = ", "
	}
	if st.PageWarning {
		b.WriteString(sep)
		fmt.Fprintf(&b, "warning: jemalloc page %d B > kernel page %d B, partly filled slabs keep more memory", st.Page, os.Getpagesize())
	}
	return b.String()
}

// formatBytes writes n bytes in B, KiB, MiB or GiB with one decimal.
func formatBytes(n int64) string {
	const k = 1024
	switch {
	case n < k:
		return strconv.FormatInt(n, 10) + " B"
	case n < k*k:
		return strconv.FormatFloat(float64(n)/k, 'f', 1, 64) + " KiB"
	case n < k*k*k:
		return strconv.FormatFloat(float64(n)/(k*k), 'f', 1, 64) + " MiB"
	default:
		return strconv.FormatFloat(float64(n)/(k*k*k), 'f', 1, 64) + " GiB"
	}
}

// SetArenaMax caps the number of glibc malloc arenas at n with
// mallopt(M_ARENA_MAX, n). glibc creates up to 8 arenas per core, one for
// each thread that mallocs while fewer exist, and each keeps what a burst
// freed in it; 2 arenas is the usual cure. The cap stops new arenas only:
// those that exist stay, and later threads share them. A cgo program already
// has a few when main starts (3 to 6 in this package's tests, made by the
// threads of the Go runtime), so call it as early as possible; only
// MALLOC_ARENA_MAX in the environment caps them from the first malloc.
// Measured here, 16 threads that each allocate 200,000 blocks of 256 bytes
// and keep every 64th leave 682-782 MB resident with the cap against
// 829-863 MB without it.
//
// It returns nil when the cap was applied, and otherwise an error that says
// why not:
//
//   - matching ErrOperatorSet when the operator capped the arenas with
//     MALLOC_ARENA_MAX or glibc.malloc.arena_max in GLIBC_TUNABLES, with a
//     value glibc applies (see OperatorArenaMax): the operator wins and
//     mallopt is not called;
//   - matching ErrUnavailable when glibc does not own malloc (jemalloc,
//     mimalloc or tcmalloc preloaded, musl, cgo off, not Linux);
//   - naming n when n < 1, or when mallopt refuses the value.
//
// Safe for concurrent use (mallopt takes glibc's lock).
func SetArenaMax(n int) error {
	if n < 1 {
		return fmt.Errorf("cheap: glibc arena cap must be at least 1, got %d", n)
	}
	if name, val, ok := OperatorArenaMax(os.Getenv); ok {
		return fmt.Errorf("%w: %s=%s", ErrOperatorSet, name, val)
	}
	s := Detect()
	if err := s.Err(); err != nil {
		return err
	}
	if s.allocator != Glibc {
		return fmt.Errorf("%w: malloc belongs to %s (%s), not glibc: no arenas to cap", ErrUnavailable, s.allocator, s.library)
	}
	return s.sys.setArenaMax(n)
}

// OperatorArenaMax reports whether the environment read through getenv
// caps glibc's arenas, by glibc's own rules (elf/dl-tunables.c), and
// returns the variable that does and its value:
//
//   - GLIBC_TUNABLES (colon-separated name=value pairs, tunables(7)) whose
//     glibc.malloc.arena_max entry has a valid value: the name must match
//     exactly (" glibc.malloc.arena_max=4" is another, unknown tunable) and,
//     when the name appears more than once, the last entry counts. It wins
//     over MALLOC_ARENA_MAX, as in glibc; value is the whole variable.
//   - otherwise MALLOC_ARENA_MAX with a valid value.
//
// A valid value is what glibc's number parser (_dl_strtoul) reads in full
// as at least 1 and at most SIZE_MAX: optional leading spaces or tabs, an
// optional sign, then decimal digits, octal after a leading 0, or hex after
// 0x. An empty value, 0, "abc" or "-0" is no cap: glibc rejects them (the
// tunable's minimum is 1) and runs with its default of 8 arenas per core.
// A negative value is a cap of SIZE_MAX+1-n, as glibc reads it.
//
// Where glibc versions disagree, the answer is "no cap", so that a caller
// applies its own cap rather than leave the process with none: glibc 2.39
// and later ignore a value with trailing characters ("4x", "4 ") or past
// 2^64, and ignore the whole of a GLIBC_TUNABLES that has a value
// containing '=' or that ends without a value (a trailing ':' or a bare
// name), while 2.26 to 2.38 apply what they read before. Measured with
// ld.so --list-tunables of glibc 2.36 (this package's tests compare with it
// where it is installed). It runs on every OS and is pure.
func OperatorArenaMax(getenv func(string) string) (name, value string, ok bool) {
	if tun := getenv("GLIBC_TUNABLES"); tunablesArenaMax(tun) {
		return "GLIBC_TUNABLES", tun, true
	}
	if v := getenv("MALLOC_ARENA_MAX"); validArenaMax(v) {
		return "MALLOC_ARENA_MAX", v, true
	}
	return "", "", false
}

// arenaTunable is the name of glibc's arena cap in GLIBC_TUNABLES.
const arenaTunable = "glibc.malloc.arena_max"

// tunablesArenaMax reports whether every glibc since 2.26 sets its arena
// cap from the GLIBC_TUNABLES value tun. It parses tun as glibc 2.39's
// parse_tunables_string does, the strictest: an entry up to '=' is a name
// (an entry that reaches ':' first is skipped), and its value runs to the
// next ':'; a value holding '=', or the end of the string reached inside a
// name, makes glibc 2.39 ignore the whole variable. The last arena_max
// entry is the one glibc 2.39 applies (and 2.36 applies it last).
func tunablesArenaMax(tun string) bool {
	last, found := "", false
	for rest := tun; rest != ""; {
		i := strings.IndexAny(rest, "=:")
		if i < 0 {
			return false // a name without a value at the end
		}
		if rest[i] == ':' {
			rest = rest[i+1:]
			continue
		}
		name := rest[:i]
		rest = rest[i+1:]
		v := rest
		j := strings.IndexAny(rest, "=:")
		switch {
		case j >= 0 && rest[j] == '=':
			return false // a value holding '='
		case j >= 0:
			v, rest = rest[:j], rest[j+1:]
			if rest == "" {
				return false // a trailing ':' leaves an empty name at the end
			}
		default:
			rest = ""
		}
		if name == arenaTunable {
			last, found = v, true
		}
	}
	return found && validArenaMax(last)
}

// validArenaMax reports whether glibc's _dl_strtoul (elf/dl-misc.c) reads
// all of v as a number in [1, SIZE_MAX], the range of
// glibc.malloc.arena_max.
func validArenaMax(v string) bool {
	s := strings.TrimLeft(v, " \t")
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	base := uint64(10)
	if s[0] == '0' {
		base = 8
		if len(s) > 1 && (s[1] == 'x' || s[1] == 'X') {
			base = 16
			s = s[2:]
		}
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		d := digitValue(s[i])
		if d >= base {
			return false // glibc 2.39 rejects what follows the number
		}
		if n >= (math.MaxUint64-d)/base {
			return false // glibc's overflow check: 2.39 rejects it
		}
		n = n*base + d
	}
	if neg {
		n = -n
	}
	return n >= 1 && n <= math.MaxUint // math.MaxUint: SIZE_MAX
}

// digitValue returns the value of the digit c in bases up to 16, or 16 for
// a byte that is no digit.
func digitValue(c byte) uint64 {
	switch {
	case '0' <= c && c <= '9':
		return uint64(c - '0')
	case 'a' <= c && c <= 'f':
		return uint64(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return uint64(c-'A') + 10
	}
	return 16
}
