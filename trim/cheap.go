package trim

import "github.com/memctl/memctl/trim/cheap"

// ErrCHeapUnavailable is matched (with errors.Is) by the error of a C heap
// step that cannot run in this build or process: cgo is off, the C library is
// not glibc and no known allocator owns malloc, or the OS is not Linux.
// It is cheap.ErrUnavailable, so either name matches.
var ErrCHeapUnavailable = cheap.ErrUnavailable

// CHeap is the C heap step of a trim: it returns memory that the allocator
// owning malloc holds but no live block uses. Implementations are safe for
// concurrent use.
type CHeap interface {
	// Allocator names the allocator that owns malloc in this process:
	// "glibc", "jemalloc", "mimalloc", "tcmalloc", or "none" when the step is
	// unavailable.
	Allocator() string
	// Retained returns the bytes the allocator holds that no live block uses,
	// or -1 when it cannot tell; 0 when the step has nothing it can release
	// (a due trim's C step runs when Retained reaches Config.MinRelease or
	// is -1).
	Retained() int64
	// Release asks the allocator to return freed memory to the OS and
	// returns the bytes it released by its own account (-1 when it cannot
	// tell). The error matches ErrCHeapUnavailable when the step cannot run.
	Release() (released int64, err error)
}

// CHeapStater is a CHeap that also reads the allocator's statistics (arena,
// in use, free, resident and retained bytes, jemalloc's page size and its
// warning); the step of DefaultCHeap is one. See cheap.Stats for each figure
// and its source.
type CHeapStater interface {
	CHeap
	Stats() (cheap.Stats, error)
}

// CHeapOver is a CHeap that holds several allocators (the step of
// DefaultCHeap is one: see cheap.Step.Heaps) and releases each one whose
// own estimate reaches a threshold. A due trim runs its C step when
// Retained, the sum of the estimates, reaches Config.MinRelease (or is
// unknown), and then calls ReleaseOver(Config.MinRelease), so an allocator
// with little to give is left alone; TrimNow calls ReleaseOver(-1).
type CHeapOver interface {
	CHeap
	ReleaseOver(minRelease int64) (released int64, err error)
}
