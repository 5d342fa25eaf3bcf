//go:build !linux

package trim

import (
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
)

const linux = false

// threadCPU returns 0 off Linux: the trim is charged with the GC and
// scavenger CPU of runtime/metrics only.
func threadCPU() time.Duration { return 0 }

// processCPU returns -1 (unknown) off Linux.
func processCPU() time.Duration { return -1 }

// newThrottleReader returns a reader that never knows: CPU cgroups are
// Linux only.
func newThrottleReader() func(fresh bool) (time.Duration, error) {
	return func(bool) (time.Duration, error) { return 0, cgroupfs.ErrNoThrottleCounter }
}
