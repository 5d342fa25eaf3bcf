//go:build unix

package auto_test

import (
	"syscall"
	"time"

	"github.com/memctl/memctl/internal/childtest"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		childtest.Fail("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
