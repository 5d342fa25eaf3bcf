package trim

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadSysCPU returns the calling thread's system CPU time (getrusage(2),
// RUSAGE_THREAD), or 0 when it cannot be read.
func threadSysCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Stime.Nano())
}
