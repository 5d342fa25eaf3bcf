//go:build !linux

package limits

// threadCPUNanos returns -1: the thread CPU clock is read on Linux only.
func threadCPUNanos() int64 { return -1 }
