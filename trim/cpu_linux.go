package trim

import (
	"os"
	"time"

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

// processCPU returns the process's CPU time, all threads
// (CLOCK_PROCESS_CPUTIME_ID, clock_gettime(2)), or -1 when the clock cannot
// be read.
func processCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return -1
	}
	return time.Duration(ts.Nano())
}

func getenvGODEBUG() string { return os.Getenv("GODEBUG") }
