package thp

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/procfs"
)

// Disable stops the kernel from giving the process new transparent huge
// pages: prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) (Linux 3.15 and later). It
// covers the whole process (every goroutine and cgo thread), is inherited
// across fork and execve, and leaves huge pages already mapped in place, so
// call it at the top of main. Safe for concurrent use; the last call of
// Disable, DisableExceptAdvised and Enable wins. The error, if any, wraps the
// errno; on a kernel without the prctl it matches errors.ErrUnsupported.
func Disable() error {
	return setTHPDisable(1, 0, "PR_SET_THP_DISABLE")
}

// DisableExceptAdvised stops new transparent huge pages for the process
// except in regions advised with madvise(MADV_HUGEPAGE):
// prctl(PR_SET_THP_DISABLE, 1, PR_THP_DISABLE_EXCEPT_ADVISED, 0, 0). It needs
// Linux 6.18 or later; on an older kernel (EINVAL) it returns an error that
// matches errors.ErrUnsupported and the flag is unchanged. Process then
// reports StateDisabledExceptAdvised. Scope and inheritance are as for Disable.
func DisableExceptAdvised() error {
	return setTHPDisable(1, unix.PR_THP_DISABLE_EXCEPT_ADVISED, "PR_SET_THP_DISABLE with PR_THP_DISABLE_EXCEPT_ADVISED (Linux 6.18 or later)")
}

// Enable clears the process's THP flag, set by Disable, DisableExceptAdvised
// or inherited from the parent: prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0). The
// process then follows the system mode (System). Huge pages appear again
// only on new faults and khugepaged scans. Safe for concurrent use.
func Enable() error {
	return setTHPDisable(0, 0, "PR_SET_THP_DISABLE")
}

func setTHPDisable(arg2, arg3 uintptr, what string) error {
	err := unix.Prctl(unix.PR_SET_THP_DISABLE, arg2, arg3, 0, 0)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("thp: %s: %w (%w)", what, errors.ErrUnsupported, err)
	}
	return fmt.Errorf("thp: %s: %w", what, err)
}

// Process returns the THP flag of the calling process, read back with
// prctl(PR_GET_THP_DISABLE): StateEnabled, StateDisabled or StateDisabledExceptAdvised. Safe
// for concurrent use. On a kernel without the prctl the error matches
// errors.ErrUnsupported.
func Process() (State, error) {
	n, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return StateEnabled, fmt.Errorf("thp: PR_GET_THP_DISABLE: %w (%w)", errors.ErrUnsupported, err)
		}
		return StateEnabled, fmt.Errorf("thp: PR_GET_THP_DISABLE: %w", err)
	}
	return State(n), nil
}

// System reads the system's THP settings from SysfsDir
// (/sys/kernel/mm/transparent_hugepage; see Settings for the files). Errors
// name the file; on a kernel built without THP the error matches
// errors.ErrUnsupported. Safe for concurrent use.
func System() (Settings, error) {
	return readSettings(SysfsDir)
}

// AnonHugePages returns the bytes of anonymous memory of the calling process
// backed by PMD-sized transparent huge pages: AnonHugePages in
// /proc/self/smaps_rollup (proc(5), Linux 4.14 and later). The error names
// the file. Safe for concurrent use; each call reads the file (about the cost
// of walking the process's mappings).
func AnonHugePages() (int64, error) {
	return readAnonHugePages(procfs.Path(0, "smaps_rollup"))
}

// AnonHugePagesOf is AnonHugePages for the process pid (0 means the calling
// process), from /proc/PID/smaps_rollup. Reading another process's file
// needs ptrace read access to it (same user, or root).
func AnonHugePagesOf(pid int) (int64, error) {
	return readAnonHugePages(procfs.Path(pid, "smaps_rollup"))
}
