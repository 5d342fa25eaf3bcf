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

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/thpflag"
)

// State is the THP flag of a process as PR_GET_THP_DISABLE returns it
// (prctl(2)); a value a later kernel adds prints as "State(N)".
type State int

const (
	StateEnabled               State = 0 // the process follows the system mode
	StateDisabled              State = 1 // no new huge pages (PolicyDisable)
	StateDisabledExceptAdvised State = 3 // none except in madvise(MADV_HUGEPAGE) regions
)

var stateWords = map[State]string{StateEnabled: "enabled", StateDisabled: "disabled", StateDisabledExceptAdvised: "disabled-except-advised"}

// String returns "enabled", "disabled", "disabled-except-advised", or
// "State(N)" for any other value.
func (s State) String() string {
	if w, ok := stateWords[s]; ok {
		return w
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText returns String's word.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Policy is what to do with the process's THP flag at start-up: the
// operator's word in MEMCTL_THP. The zero value is PolicyKeep.
type Policy int

const (
	PolicyKeep          Policy = iota // "keep": leave the flag as inherited
	PolicyDisable                     // "disable": no new huge pages
	PolicyExceptAdvised               // "except-advised": none except advised regions (Linux 6.18)
)

var policyWords = [...]string{PolicyKeep: "keep", PolicyDisable: "disable", PolicyExceptAdvised: "except-advised"}

// ParsePolicy parses "keep", "disable" or "except-advised" (any case,
// surrounding spaces ignored); any other word, "" included, is an error
// that quotes it.
func ParsePolicy(s string) (Policy, error) {
	w := strings.ToLower(strings.TrimSpace(s))
	for p, word := range policyWords {
		if w == word {
			return Policy(p), nil
		}
	}
	return PolicyKeep, fmt.Errorf("thp: unknown policy %q, want keep, disable or except-advised", s)
}

// String returns the policy's word, or "Policy(N)" for another value.
func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyWords) {
		return policyWords[p]
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// MarshalText returns the policy's word; another value is an error.
func (p Policy) MarshalText() ([]byte, error) {
	if p < 0 || int(p) >= len(policyWords) {
		return nil, fmt.Errorf("thp: invalid policy %d", int(p))
	}
	return []byte(policyWords[p]), nil
}

// UnmarshalText parses a word as ParsePolicy does (for flag.TextVar).
func (p *Policy) UnmarshalText(b []byte) error {
	v, err := ParsePolicy(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// Apply carries out the policy on the calling process (PolicyKeep does
// nothing) and returns the state read back with Process; on error, the
// state read back after the failed call (StateEnabled if that failed too).
// PolicyExceptAdvised on a kernel before 6.18 fails with an error matching
// errors.ErrUnsupported and leaves the flag unchanged. Safe for concurrent
// use; the last call wins.
func (p Policy) Apply() (State, error) {
	var err error
	switch p {
	case PolicyKeep:
	case PolicyDisable:
		err = thpflag.Set(thpflag.Disabled)
	case PolicyExceptAdvised:
		err = thpflag.Set(thpflag.DisabledExceptAdvised)
	default:
		return StateEnabled, fmt.Errorf("thp: invalid policy %d", int(p))
	}
	s, gerr := Process()
	if err != nil {
		if gerr != nil {
			s = StateEnabled
		}
		return s, err
	}
	return s, gerr
}

// Process returns the THP flag of the calling process
// (PR_GET_THP_DISABLE). Safe for concurrent use.
func Process() (State, error) {
	n, err := thpflag.Get()
	return State(n), err
}

// Settings are the THP settings under /sys/kernel/mm/transparent_hugepage
// (transhuge.rst) for every process without its own flag. Words are the
// bracketed choice, as the kernel writes them.
type Settings struct {
	// Enabled is the top-level mode, from "enabled": "always",
	// "madvise" or "never".
	Enabled string
	// PMDEnabled is the mode for PMD-sized pages, from
	// "hugepages-<PMDSize/1024>kB/enabled" (Linux 6.8): a mode or
	// "inherit"; "" without per-size controls.
	PMDEnabled string
	// Defrag is how hard a fault tries for a huge page, from "defrag":
	// "always", "defer", "defer+madvise", "madvise" or "never".
	Defrag string
	// PMDSize is the bytes of a PMD-sized huge page, from "hpage_pmd_size";
	// 0 when absent.
	PMDSize int64
	// MaxPTEsNone is how many unmapped 4 KiB pages khugepaged may fill to
	// collapse a range, from "khugepaged/max_ptes_none"; -1 when absent.
	MaxPTEsNone int
}

// PMDMode returns the mode that governs PMD-sized huge pages: PMDEnabled
// unless it is "" or "inherit", else Enabled.
func (s Settings) PMDMode() string {
	if s.PMDEnabled == "" || s.PMDEnabled == "inherit" {
		return s.Enabled
	}
	return s.PMDEnabled
}

// sysfsDir is the directory System reads.
const sysfsDir = "/sys/kernel/mm/transparent_hugepage"

// System reads the system's THP settings. Errors name the file; on a
// kernel without THP, or off Linux, the error matches
// errors.ErrUnsupported. Safe for concurrent use.
func System() (Settings, error) {
	if runtime.GOOS != "linux" {
		return Settings{}, fmt.Errorf("thp: transparent huge pages are Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
	}
	return readSettings(sysfsDir)
}

// readSettings reads the settings under dir: enabled and defrag must exist,
// the others may be absent; all must be well formed. Errors name the file;
// without "enabled" (no THP) the error matches errors.ErrUnsupported and
// fs.ErrNotExist.
func readSettings(dir string) (Settings, error) {
	s := Settings{}
	var err error
	if s.Enabled, err = readChoice(filepath.Join(dir, "enabled")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: kernel without THP: %w", err, errors.ErrUnsupported)
		}
		return Settings{}, err
	}
	if s.Defrag, err = readChoice(filepath.Join(dir, "defrag")); err != nil {
		return Settings{}, err
	}
	s.PMDSize, err = readInt(filepath.Join(dir, "hpage_pmd_size"), 0, func(n int64) bool { return n > 0 && n%4096 == 0 })
	if err != nil {
		return Settings{}, err
	}
	ptes, err := readInt(filepath.Join(dir, "khugepaged", "max_ptes_none"), -1, func(n int64) bool { return n >= 0 && n <= 1<<20 })
	if err != nil {
		return Settings{}, err
	}
	s.MaxPTEsNone = int(ptes)
	if s.PMDSize > 0 {
		w, err := readChoice(filepath.Join(dir, "hugepages-"+strconv.FormatInt(s.PMDSize/1024, 10)+"kB", "enabled"))
		switch {
		case err == nil:
			s.PMDEnabled = w
		case !errors.Is(err, fs.ErrNotExist):
			return Settings{}, err
		}
	}
	return s, nil
}

// readChoice returns the bracketed word of a choice file ("always [madvise] never").
func readChoice(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("thp: %w", err)
	}
	w, err := parseChoice(string(b))
	if err != nil {
		return "", fmt.Errorf("thp: %s: %w", path, err)
	}
	return w, nil
}

// parseChoice returns the one bracketed word of a sysfs choice line. Words
// are lower-case letters, digits, '+', '-' and '_'; anything else, no
// bracketed word, or more than one, is an error quoting the input.
func parseChoice(s string) (string, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return "", errors.New("empty, want a choice like \"always [madvise] never\"")
	}
	var chosen string
	n := 0
	for _, f := range fields {
		w := f
		if strings.HasPrefix(f, "[") && strings.HasSuffix(f, "]") && len(f) > 2 {
			w = f[1 : len(f)-1]
			chosen = w
			n++
		}
		if !isWord(w) {
			return "", fmt.Errorf("malformed choice %q", strings.TrimSpace(s))
		}
	}
	if n != 1 {
		return "", fmt.Errorf("want exactly one [bracketed] choice, got %d in %q", n, strings.TrimSpace(s))
	}
	return chosen, nil
}

func isWord(w string) bool {
	return w != "" && strings.Trim(w, "abcdefghijklmnopqrstuvwxyz0123456789+-_") == ""
}

// readInt reads a file of one decimal integer, which valid must accept;
// absent is the value when the file does not exist.
func readInt(path string, absent int64, valid func(int64) bool) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return absent, nil
	}
	if err != nil {
		return 0, fmt.Errorf("thp: %w", err)
	}
	v := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || !valid(n) {
		return 0, fmt.Errorf("thp: %s: malformed or out of range: %q", path, v)
	}
	return n, nil
}
