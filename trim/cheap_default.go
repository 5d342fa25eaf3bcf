package trim

import "github.com/memctl/memctl/trim/cheap"

// DefaultCHeap returns the C heap step of this process: the one that
// package cheap finds, once per process, for the allocator owning malloc
// (glibc malloc_trim(0), jemalloc's purge of each arena, mimalloc
// mi_collect(true), gperftools' ReleaseToSystem in slices), which also
// releases every other allocator found in the process (a library's own
// jemalloc, one dlopened with RTLD_LOCAL, a prefixed copy; see
// cheap.Step.Heaps), each with its own estimate. Without cgo, off Linux,
// under musl or with an unknown allocator its Allocator is "none" and its
// Release returns an error matching ErrCHeapUnavailable that says why. The
// step also implements CHeapStater and CHeapOver. Safe for concurrent use.
//
// To cap glibc's arenas, call cheap.SetArenaMax early in main.
func DefaultCHeap() CHeap { return cheap.Detect() }
