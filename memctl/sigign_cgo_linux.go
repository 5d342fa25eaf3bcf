//go:build cgo

package main

/*
#include <signal.h>

// memctl_ignored has bit s-1 set for each signal s that was ignored
// (SIG_IGN) when the process started: a constructor runs before the Go
// runtime, which installs its own handler over an inherited SIG_IGN for
// every signal but SIGHUP and SIGINT.
static unsigned long long memctl_ignored;

__attribute__((constructor)) static void memctl_record_ignored(void) {
	for (int s = 1; s <= 64; s++) {
		struct sigaction sa;
		if (sigaction(s, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN) {
			memctl_ignored |= 1ULL << (s - 1);
		}
	}
}

static unsigned long long memctl_inherited_ignored(void) { return memctl_ignored; }
*/
import "C"

// inheritedIgnored returns the signals ignored (SIG_IGN) when memctl
// started, bit s-1 for signal s, as a C constructor read them before the Go
// runtime started; exact is true.
func inheritedIgnored() (mask uint64, exact bool) {
	return uint64(C.memctl_inherited_ignored()), true
}
