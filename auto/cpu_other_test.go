//go:build !unix

package auto_test

import "time"

// cpuTime is the process's CPU time where getrusage exists; the child
// that reads it runs on Linux only (its test skips elsewhere).
func cpuTime() time.Duration { return 0 }
