//go:build linux && !cgo

package main

import (
	"os/signal"
	"syscall"
)

// inheritedIgnored returns the signals ignored when memctl started (bit s-1
// for signal s) as far as Go alone can know: the runtime keeps an inherited
// SIG_IGN only for SIGHUP and SIGINT. exact is false.
func inheritedIgnored() (mask uint64, exact bool) {
	for s := 1; s <= 64; s++ {
		if signal.Ignored(syscall.Signal(s)) {
			mask |= 1 << (s - 1)
		}
	}
	return mask, false
}

// inheritedBlocked returns 0, false: without cgo nothing runs first.
func inheritedBlocked() (mask uint64, exact bool) { return 0, false }

// restoreSignals does nothing: signal.Ignore is all Go alone can do.
func restoreSignals() {}
