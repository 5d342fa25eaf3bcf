package trim

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
