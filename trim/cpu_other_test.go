//go:build !linux

package trim

import "time"

// threadSysCPU returns 0: the thread's system CPU is read on Linux only.
func threadSysCPU() time.Duration { return 0 }
