// Package cheap is the C heap step of memctl's trim: it finds, at run time,
// every allocator in the process (glibc, jemalloc with any prefix, mimalloc,
// gperftools' tcmalloc), asks each to return freed memory to the OS, reads
// their statistics, and caps glibc's arenas:
//
//	s := cheap.Detect()
//	released, err := s.Release() // after a burst, not on a hot path
//
// Nothing is linked at build time (dlsym, dladdr, the loaded objects' symbol
// tables). Without cgo, off Linux, under musl or with no known allocator the
// step's errors match ErrUnavailable. Costs: docs/benchmarks.md.
package cheap

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/memctl/memctl/internal/arenamax"
	"github.com/memctl/memctl/internal/procfs"
)

// ErrUnavailable is matched (errors.Is) by the errors of a step that
// cannot run in this build or process; the error text says why.
var ErrUnavailable = errors.New("cheap: C heap step unavailable")

// Allocator names, as Step.Allocator returns them.
const (
	glibc    = "glibc"
	jemalloc = "jemalloc"
	mimalloc = "mimalloc"
	tcmalloc = "tcmalloc" // gperftools
	none     = "none"     // the step is unavailable
)

// Step is the C heap step of this process: the allocator that owns malloc, and
// every other allocator found (see Heaps). A Step is safe for concurrent use;
// releases are serialized. The zero value is an unavailable step.
type Step struct {
	allocator string // one of the names above
	library   string // path of the object that provides malloc, as dladdr names it
	version   string // the allocator's version where it tells, else ""
	why       string // why the step is unavailable; "" when it is available
	unsup     bool   // unavailable because of the OS: the error matches errors.ErrUnsupported
	sys       sysStep
	ownerBase uintptr  // load address of the owner's object, as dladdr gives it
	list      heapList // every allocator found, the owner first (see Heaps)

	// glibc: the resident excess right after the last Release (glibcRetained).
	base    atomic.Int64
	baseSet atomic.Bool
}

var (
	detectOnce sync.Once
	detected   *Step
)

// Detect returns the C heap step of this process, the same *Step on every call.
// It never fails: a step that cannot run says why through Err.
func Detect() *Step {
	detectOnce.Do(func() { detected = detect() })
	return detected
}

// Allocator names the allocator that owns malloc: "glibc", "jemalloc",
// "mimalloc", "tcmalloc", or "none" when the step is unavailable.
func (s *Step) Allocator() string {
	if s == nil || s.why != "" || s.allocator == "" {
		return none
	}
	return s.allocator
}

// Library returns the path of the shared object that provides malloc, as
// dladdr(3) names it ("/lib/x86_64-linux-gnu/libc.so.6"), or "".
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
// (and, off Linux, errors.ErrUnsupported) that says why not.
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

// Release is ReleaseOver(-1): it releases every allocator found and returns the
// bytes they released by their own accounts (glibc's measured from RssAnon), -1
// when none can tell.
func (s *Step) Release() (released int64, err error) { return s.ReleaseOver(-1) }

// glibcReleased returns the fall of cResidentExtra, 0 when it grew, -1 when unknown.
func glibcReleased(before int64, okBefore bool, after int64, okAfter bool) int64 {
	if !okBefore || !okAfter {
		return -1
	}
	return max(before-after, 0)
}

// Retained returns the bytes a release can return: the sum of the allocators'
// estimates (Releasable for jemalloc and tcmalloc, else Retained), -1 when one
// cannot tell (mimalloc), 0 with no allocator.
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

// Stats reads the statistics of the allocator that owns malloc now (glibc's
// walk its arenas). The error matches ErrUnavailable when the step cannot run.
func (s *Step) Stats() (Stats, error) {
	if err := s.Err(); err != nil {
		return unknownStats(none, s.Library()), err
	}
	return s.heapStats(&heap{sys: s.sys, info: Heap{Stats: Stats{Allocator: s.allocator, Library: s.library}, OwnsMalloc: true}}), nil
}

// glibcRetained returns glibc's resident free bytes: the growth of
// cResidentExtra since the last Release, capped at fordblks (which also
// counts what malloc_trim returned). Before a Release: fordblks.
func (s *Step) glibcRetained(st Stats) int64 {
	if st.Free < 0 || !s.baseSet.Load() {
		return st.Free
	}
	extra, ok := cResidentExtra(st.InUse)
	if !ok {
		return st.Free
	}
	return min(max(extra-s.base.Load(), 0), st.Free)
}

// cResidentExtra returns RssAnon less the Go runtime's resident bytes less
// glibc's live blocks (inUse): its fall across malloc_trim (which returns 0
// or 1) is the release. ok is false when a figure is unknown.
func cResidentExtra(inUse int64) (extra int64, ok bool) {
	anon, err := procfs.ReadBytes("/proc/self/status", "RssAnon")
	if inUse < 0 || err != nil {
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

// Stats is a snapshot of an allocator's heap by its own account
// (docs/benchmarks.md). Sizes are bytes, -1 where not reported.
type Stats struct {
	Allocator string // as Step.Allocator
	Library   string // as Step.Library

	Arena      int64 // bytes the allocator obtained from the OS for its heap (glibc: non-mmapped arena bytes)
	Mapped     int64 // glibc: bytes in blocks that malloc mmapped on their own
	InUse      int64 // bytes in live blocks
	Free       int64 // bytes in free blocks the allocator keeps
	Releasable int64 // what a release returns (jemalloc, tcmalloc); glibc: the top of the main arena
	Active     int64 // jemalloc: bytes in active pages (live blocks and the slabs around them)
	Resident   int64 // bytes of the heap resident in RAM by the allocator's account
	Retained   int64 // bytes the allocator holds that no live block uses
	Page       int64 // jemalloc: the allocator's page size in bytes

	PageWarning bool // jemalloc's page is larger than the kernel's: partly filled slabs keep more
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

// String formats the statistics for a log line ("glibc: arena 420.1 MiB, in use
// 6.7 MiB, ..."), leaving unknown figures out.
func (st Stats) String() string {
	var parts []string
	names := [...]string{"arena", "mmapped", "in use", "free", "active", "resident", "retained"}
	for i, v := range [...]int64{st.Arena, st.Mapped, st.InUse, st.Free, st.Active, st.Resident, st.Retained} {
		if v >= 0 {
			parts = append(parts, names[i]+" "+formatBytes(v))
		}
	}
	if st.Page > 0 {
		parts = append(parts, "page "+strconv.FormatInt(st.Page, 10)+" B")
	}
	if st.PageWarning {
		parts = append(parts, fmt.Sprintf("warning: jemalloc page %d B > kernel page %d B, partly filled slabs keep more memory", st.Page, os.Getpagesize()))
	}
	s := cmp.Or(st.Allocator, none)
	if len(parts) > 0 {
		s += ": " + strings.Join(parts, ", ")
	}
	return s
}

// formatBytes writes n bytes in B, KiB, MiB or GiB with one decimal.
func formatBytes(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, unit := float64(n)/1024, "KiB"
	for _, u := range [...]string{"MiB", "GiB"} {
		if v >= 1024 {
			v, unit = v/1024, u
		}
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit
}

// SetArenaMax caps glibc's malloc arenas at n (mallopt M_ARENA_MAX); it stops
// new arenas only, so call it early. It returns an error naming n when n < 1 or
// mallopt refuses it, one matching ErrUnavailable when glibc does not own
// malloc, and, setting nothing, one saying so when the operator capped the
// arenas (MALLOC_ARENA_MAX, glibc.malloc.arena_max in GLIBC_TUNABLES). Safe for
// concurrent use.
func SetArenaMax(n int) error {
	if n < 1 {
		return fmt.Errorf("cheap: glibc arena cap must be at least 1, got %d", n)
	}
	if name, val, ok := arenamax.Operator(os.Getenv); ok {
		return fmt.Errorf("%w: %s=%s", arenamax.ErrOperatorSet, name, val)
	}
	s := Detect()
	if err := s.Err(); err != nil {
		return err
	}
	if s.allocator != glibc {
		return fmt.Errorf("%w: malloc belongs to %s (%s), not glibc: no arenas to cap", ErrUnavailable, s.allocator, s.library)
	}
	return s.sys.setArenaMax(n)
}
