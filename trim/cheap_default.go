package trim

import "github.com/memctl/memctl/trim/cheap"

// DefaultCHeap returns the C heap step of this process: the one that
// package cheap finds, once per process, for the allocator owning malloc
// (glibc malloc_trim(0), jemalloc's purge of all arenas, mimalloc
// mi_collect(true), gperftools' ReleaseFreeMemory). Without cgo, off Linux,
// under musl or with an unknown allocator its Allocator is "none" and its
// Release returns an error matching ErrCHeapUnavailable that says why. The
// step also implements CHeapStater. Safe for concurrent use.
//
// To cap glibc's arenas, call cheap.SetArenaMax early in main.
func DefaultCHeap() CHeap { return cheap.Detect() }
