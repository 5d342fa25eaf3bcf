// Package thp controls transparent huge pages (THP) for the calling
// process and reads the system's THP settings.
//
// With THP the kernel backs anonymous memory with whole 2 MiB pages (the
// PMD size on x86-64), so a Go heap with sparse spans holds far more
// resident memory than it uses. The opt-out is one call at the top of
// main, before the program allocates:
//
//	if _, err := thp.PolicyDisable.Apply(); err != nil {
//		log.Print(err) // off Linux: matches errors.ErrUnsupported
//	}
//
// A Policy sets the PR_SET_THP_DISABLE flag of prctl(2). The flag belongs
// to the process's address space: it covers every goroutine and cgo
// thread, is inherited across fork(2) and kept across execve(2), and does
// not split huge pages already mapped. PolicyExceptAdvised (Linux 6.18)
// keeps huge pages for memory advised with madvise(MADV_HUGEPAGE). Go's
// GODEBUG=disablethp=1 is narrower: it covers only the Go heap.
//
// Process reads the flag back (PR_GET_THP_DISABLE); another process's
// shows only as THP_enabled in /proc/PID/status, 0 for StateDisabled and 1
// otherwise. System reads /sys/kernel/mm/transparent_hugepage
// (Documentation/admin-guide/mm/transhuge.rst). Off Linux every function
// returns an error matching errors.ErrUnsupported.
package thp
