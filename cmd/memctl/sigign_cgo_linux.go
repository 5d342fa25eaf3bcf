//go:build cgo

package main

/*
#include <pthread.h>
#include <signal.h>

// memctl_ignored has bit s-1 set for each signal s that was ignored
// (SIG_IGN) when the process started, and memctl_blocked is the signal mask
// then: a constructor runs before the Go runtime, which installs its own
// handler over an inherited SIG_IGN for every signal but SIGHUP and SIGINT,
// and unblocks the signals it needs (SIGSEGV, SIGCHLD, SIGURG, SIGPROF...)
// on every thread.
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

// memctl_restore_signals sets SIG_IGN for every signal inherited ignored
// and the calling thread's mask to the inherited one, right before
// execve(2), which keeps both (signal(7)). sigaction(2) directly: the Go
// runtime's signal.Ignore leaves the signals it needs for itself (SIGILL,
// SIGTRAP, SIGBUS, SIGPROF, SIGSYS...) handled.
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

// inheritedIgnored returns the signals ignored (SIG_IGN) when memctl
// started, bit s-1 for signal s, as a C constructor read them before the Go
// runtime started; exact is true.
func inheritedIgnored() (mask uint64, exact bool) {
	return uint64(C.memctl_inherited_ignored()), true
}

// inheritedBlocked returns the signal mask memctl started with, bit s-1
// for signal s, read by the same constructor; exact is true.
func inheritedBlocked() (mask uint64, exact bool) {
	return uint64(C.memctl_inherited_blocked()), true
}

// restoreSignals ignores again every signal inherited ignored and sets the
// calling thread's signal mask to the inherited one, for execve(2). The
// caller has locked its goroutine to the thread (runtime.LockOSThread) and
// execs from it at once.
func restoreSignals() { C.memctl_restore_signals() }
