package thpflag

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Set sets the process-wide flag to v (inherited across fork and execve).
// Where the kernel lacks the prctl or value (EINVAL) the error matches
// errors.ErrUnsupported and the flag is unchanged.
func Set(v int) error {
	var arg2, arg3 uintptr
	what := "PR_SET_THP_DISABLE"
	switch v {
	case Enabled:
	case Disabled:
		arg2 = 1
	case DisabledExceptAdvised:
		arg2, arg3 = 1, unix.PR_THP_DISABLE_EXCEPT_ADVISED
		what += " with PR_THP_DISABLE_EXCEPT_ADVISED (Linux 6.18 or later)"
	default:
		return fmt.Errorf("thp: no flag value %d", v)
	}
	return wrap(what, unix.Prctl(unix.PR_SET_THP_DISABLE, arg2, arg3, 0, 0))
}

// Get returns the flag.
func Get() (int, error) {
	n, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0)
	return n, wrap("PR_GET_THP_DISABLE", err)
}

func wrap(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("thp: %s: %w (%w)", what, errors.ErrUnsupported, err)
	}
	return fmt.Errorf("thp: %s: %w", what, err)
}
