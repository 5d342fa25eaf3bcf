package trim

import "fmt"

// DefaultCHeap returns the C heap step for this process. In this build the
// step is unavailable: its Release returns an error that matches
// ErrCHeapUnavailable.
func DefaultCHeap() CHeap { return unavailableCHeap{why: "not built yet"} }

// unavailableCHeap is the C heap step where none can run; why says why.
type unavailableCHeap struct{ why string }

func (unavailableCHeap) Allocator() string { return "none" }
func (unavailableCHeap) Retained() int64   { return -1 }
func (u unavailableCHeap) Release() (int64, error) {
	return 0, fmt.Errorf("%w: %s", ErrCHeapUnavailable, u.why)
}
