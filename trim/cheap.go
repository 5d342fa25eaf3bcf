package trim

import "github.com/memctl/memctl/trim/cheap"

// ErrCHeapUnavailable is matched (errors.Is) by the error of a C heap step
// that cannot run in this build or process: cgo off, not Linux, or no
// known allocator owns malloc. It is cheap.ErrUnavailable.
var ErrCHeapUnavailable = cheap.ErrUnavailable

// cHeap is the C heap step of a trim (*cheap.Step); safe for concurrent use.
type cHeap interface {
	// Allocator names the allocator that owns malloc ("none": unavailable).
	Allocator() string
	// Retained returns what a release can return, in bytes, -1 unknown.
	Retained() int64
	// ReleaseOver releases each allocator whose estimate reaches min
	// (every one for a negative min) and returns the bytes released.
	ReleaseOver(min int64) (released int64, err error)
}
