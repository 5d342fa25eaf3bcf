// Package thp controls transparent huge pages (THP) for the calling process
// and reports the system's THP settings and the huge-page bytes a process
// uses.
//
// With THP the kernel backs anonymous memory with whole 2 MiB pages (the PMD
// size on x86-64). A Go heap with sparse spans then holds far more resident
// memory than it uses, since one touched byte can make 2 MiB resident. The
// opt-out is one call:
//
//	func main() {
//		if err := thp.Disable(); err != nil {
//			log.Print(err) // off Linux: matches errors.ErrUnsupported
//		}
//		...
//	}
//
// # What the flag covers
//
// Disable, DisableExceptAdvised and Enable set the PR_SET_THP_DISABLE flag of
// prctl(2). The flag belongs to the process's address space, not to the
// calling thread, so it covers every goroutine and every cgo or C thread of the
// process, and it may be called from any goroutine. It is inherited by
// children created with fork(2) and kept across execve(2), so a command
// started with os/exec inherits it too; call Enable in the child (or before
// starting it) to undo that.
//
// The flag is checked when a page is faulted in and when khugepaged looks for
// pages to collapse. It does not split huge pages that are already mapped:
// memory touched before the call stays huge until it is freed. Call Disable
// at the top of main, before the program allocates.
//
// DisableExceptAdvised (Linux 6.18 and later) disables THP except for memory
// the program asked for with madvise(MADV_HUGEPAGE), for programs that want
// huge pages only for a few large regions (a cache, an arena).
//
// Go's GODEBUG=disablethp=1 is narrower: it marks only the Go heap
// MADV_NOHUGEPAGE and leaves cgo memory, goroutine stacks and other mappings
// as the system mode says.
//
// # Reading the state back
//
// Process reads the flag back with PR_GET_THP_DISABLE. Another process's flag
// shows only as THP_enabled in /proc/PID/status, which reads 0 for StateDisabled
// and 1 otherwise, StateDisabledExceptAdvised included (measured on Linux 6.18).
// System reads the system mode
// from /sys/kernel/mm/transparent_hugepage, and AnonHugePages reads the bytes
// backed by PMD-sized huge pages from /proc/self/smaps_rollup.
//
// Policy is the operator's choice as one word ("keep", "disable",
// "except-advised"), as found in the MEMCTL_THP environment variable.
//
// Sources: prctl(2) (PR_SET_THP_DISABLE, PR_GET_THP_DISABLE), proc(5)
// (AnonHugePages, THP_enabled), and the kernel's
// Documentation/admin-guide/mm/transhuge.rst (system modes, defrag,
// khugepaged, per-size hugepages-<size>kB controls).
//
// Off Linux every function returns an error that matches
// errors.ErrUnsupported; the parsing of words and sysfs files is portable.
package thp
