// Package thp controls transparent huge pages (THP) for the calling
// process and reads the system's THP settings.
//
// With THP the kernel backs anonymous memory with 2 MiB pages, so a Go heap
// with sparse spans holds far more resident memory than it uses. The
// opt-out is one call at the top of main, before allocating:
//
//	if _, err := thp.PolicyDisable.Apply(); err != nil {
//		log.Print(err) // off Linux: matches errors.ErrUnsupported
//	}
//
// A Policy sets prctl(2)'s PR_SET_THP_DISABLE flag, which belongs to the
// address space: it covers every thread, is inherited across fork(2), kept
// across execve(2), and splits no huge page already mapped.
// GODEBUG=disablethp=1 covers only the Go heap. Process reads the flag
// back (another process's shows only as THP_enabled in /proc/PID/status,
// 0 for StateDisabled); System reads /sys/kernel/mm/transparent_hugepage
// (Documentation/admin-guide/mm/transhuge.rst). Off Linux every function
// returns an error matching errors.ErrUnsupported.
package thp
