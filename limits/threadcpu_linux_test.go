package limits

import (
	"syscall"
	"unsafe"
)

// threadCPUNanos returns the calling thread's CPU time in nanoseconds
// (clock_gettime(CLOCK_THREAD_CPUTIME_ID), clock_gettime(2)), or -1.
func threadCPUNanos() int64 {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return -1
	}
	return ts.Nano()
}
