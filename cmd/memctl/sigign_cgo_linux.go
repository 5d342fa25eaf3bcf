//go:build cgo

package main

/*
#include <pthread.h>
#include <signal.h>

// memctl_ignored (bit s-1 for signal s ignored) and memctl_blocked are the
// dispositions and mask the process started with, read by a constructor
// before the Go runtime replaces an inherited SIG_IGN and unblocks signals.
static unsigned long long memctl_ignored;
static sigset_t memctl_blocked;

__attribute__((constructor)) static void memctl_record_signals(void) {
	for (int s = 1; s <= 64; s++) {
		struct sigaction sa;
		if (sigaction(s, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN) {
			memctl_ignored |= 1ULL << (s - 1);
		}
	}
	pthread_sigmask(SIG_SETMASK, NULL, &memctl_blocked);
}

static unsigned long long memctl_inherited_ignored(void) { return memctl_ignored; }

static unsigned long long memctl_inherited_blocked(void) {
	unsigned long long m = 0;
	for (int s = 1; s <= 64; s++) {
		if (sigismember(&memctl_blocked, s) == 1) {
			m |= 1ULL << (s - 1);
		}
	}
	return m;
}

// memctl_restore_signals sets both back for execve(2), which keeps them.
static void memctl_restore_signals(void) {
	struct sigaction sa = {0};
	sa.sa_handler = SIG_IGN;
	sigemptyset(&sa.sa_mask);
	for (int s = 1; s <= 64; s++) {
		if (memctl_ignored & (1ULL << (s - 1))) {
			sigaction(s, &sa, NULL);
		}
	}
	pthread_sigmask(SIG_SETMASK, &memctl_blocked, NULL);
}
*/
import "C"

// inheritedIgnored returns the signals ignored when memctl started, bit s-1
// for signal s; exact is true.
func inheritedIgnored() (mask uint64, exact bool) {
	return uint64(C.memctl_inherited_ignored()), true
}

// inheritedBlocked returns the signal mask memctl started with.
func inheritedBlocked() (mask uint64, exact bool) {
	return uint64(C.memctl_inherited_blocked()), true
}

// restoreSignals sets the inherited dispositions and mask on the calling
// thread, which the caller has locked and execs from at once.
func restoreSignals() { C.memctl_restore_signals() }
