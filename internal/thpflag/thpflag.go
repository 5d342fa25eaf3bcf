// Package thpflag sets and reads the process's transparent huge page flag
// (prctl(2) PR_SET_THP_DISABLE, PR_GET_THP_DISABLE), for package thp and
// for tests that restore the flag they found. Off Linux every call fails
// with an error matching errors.ErrUnsupported.
package thpflag

// The flag's values, as PR_GET_THP_DISABLE returns them (thp.State).
const (
	Enabled               = 0
	Disabled              = 1
	DisabledExceptAdvised = 3 // PR_THP_DISABLE_EXCEPT_ADVISED (2) or'ed with 1, Linux 6.18
)
