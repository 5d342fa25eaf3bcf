package trim

import (
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"golang.org/x/sys/unix"
)

const linux = true

// threadCPU returns the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID,
// clock_gettime(2)), or 0 when the clock cannot be read.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// processCPU returns the process's CPU time (CLOCK_PROCESS_CPUTIME_ID,
// clock_gettime(2)), or -1 when the clock cannot be read.
func processCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return -1
	}
	return time.Duration(ts.Nano())
}

// newThrottleReader returns a reader of the CPU cgroup's throttled time,
// finding the cgroup again when fresh is set.
func newThrottleReader() func(fresh bool) (time.Duration, error) {
	var path string
	return func(fresh bool) (time.Duration, error) {
		if fresh || path == "" {
			p, err := cgroupfs.CPUStatFile("/proc/self/cgroup", "/proc/self/mountinfo", "")
			if err != nil {
				path = ""
				return 0, err
			}
			path = p
		}
		return cgroupfs.ReadThrottled(path)
	}
}
