package thp

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/procfs"
)

// State is the THP flag of a process as PR_GET_THP_DISABLE returns it
// (prctl(2)): 0 enabled, 1 disabled, 3 disabled except advised. A value the
// kernel may add later is kept as is and printed as "State(N)". THP_enabled
// in /proc/PID/status is 0 for StateDisabled and 1 for the other two.
type State int

const (
	// StateEnabled means the process follows the system mode (the flag is clear).
	StateEnabled State = 0
	// StateDisabled means no new huge pages for the process (Disable).
	StateDisabled State = 1
	// StateDisabledExceptAdvised means no new huge pages except in regions
	// advised with madvise(MADV_HUGEPAGE) (DisableExceptAdvised, Linux 6.18).
	// It is PR_THP_DISABLE_EXCEPT_ADVISED (2) or'ed with 1.
	StateDisabledExceptAdvised State = 3
)

// String returns "enabled", "disabled", "disabled-except-advised", or
// "State(N)" for any other value.
func (s State) String() string {
	switch s {
	case StateEnabled:
		return "enabled"
	case StateDisabled:
		return "disabled"
	case StateDisabledExceptAdvised:
		return "disabled-except-advised"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText returns String's word, so that JSON and text encodings of a
// State read "disabled" rather than 1.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Policy is what to do with the process's THP flag at start-up: the
// operator's word in MEMCTL_THP. The zero value is PolicyKeep. A Policy is a plain
// value, safe to copy and to use from several goroutines.
type Policy int

const (
	// PolicyKeep leaves the flag as inherited ("keep").
	PolicyKeep Policy = iota
	// PolicyDisable calls Disable ("disable").
	PolicyDisable
	// PolicyExceptAdvised calls DisableExceptAdvised ("except-advised").
	PolicyExceptAdvised
)

var policyWords = [...]string{PolicyKeep: "keep", PolicyDisable: "disable", PolicyExceptAdvised: "except-advised"}

// ParsePolicy parses "keep", "disable" or "except-advised" (any case,
// surrounding spaces ignored). Any other word, including the empty string,
// gives an error that quotes it and lists the accepted words; callers decide
// what an unset variable means.
func ParsePolicy(s string) (Policy, error) {
	w := strings.ToLower(strings.TrimSpace(s))
	for p, word := range policyWords {
		if w == word {
			return Policy(p), nil
		}
	}
	return PolicyKeep, fmt.Errorf("thp: unknown policy %q, want keep, disable or except-advised", s)
}

// String returns the policy's word ("keep", "disable", "except-advised"), or
// "Policy(N)" for a value outside the constants.
func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyWords) {
		return policyWords[p]
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// MarshalText returns the policy's word; it fails for a value outside the
// constants.
func (p Policy) MarshalText() ([]byte, error) {
	if p < 0 || int(p) >= len(policyWords) {
		return nil, fmt.Errorf("thp: invalid policy %d", int(p))
	}
	return []byte(policyWords[p]), nil
}

// UnmarshalText parses a word as ParsePolicy does, so a Policy can be used
// with flag.TextVar and encoding packages.
func (p *Policy) UnmarshalText(b []byte) error {
	v, err := ParsePolicy(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// Apply carries out the policy on the calling process (PolicyKeep does nothing,
// PolicyDisable calls Disable, PolicyExceptAdvised calls
// DisableExceptAdvised) and returns the state read back with Process. On
// error the returned state is the one read back after the failed call, or
// StateEnabled if that read failed too. An except-advised policy on a kernel
// older than 6.18 fails with an error matching errors.ErrUnsupported and
// leaves the flag unchanged; falling back to Disable is the caller's choice.
// Safe for concurrent use; the last call wins.
func (p Policy) Apply() (State, error) {
	var err error
	switch p {
	case PolicyKeep:
	case PolicyDisable:
		err = Disable()
	case PolicyExceptAdvised:
		err = DisableExceptAdvised()
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

// Mode is a system THP mode: the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled, or of a per-size
// hugepages-<size>kB/enabled file. Words are kept as the kernel writes them,
// so a word a later kernel adds is reported, not rejected.
type Mode string

// The modes of transhuge.rst.
const (
	ModeAlways  Mode = "always"  // huge pages wherever they fit
	ModeMadvise Mode = "madvise" // only in madvise(MADV_HUGEPAGE) regions
	ModeNever   Mode = "never"   // no huge pages
	ModeInherit Mode = "inherit" // per-size files only: follow the top-level mode
)

// Defrag is the bracketed word of /sys/kernel/mm/transparent_hugepage/defrag:
// how hard a page fault tries to find a free huge page (direct reclaim and
// compaction). Words are kept as the kernel writes them.
type Defrag string

// The defrag settings of transhuge.rst.
const (
	DefragAlways       Defrag = "always"        // stall, reclaim and compact on every fault
	DefragDefer        Defrag = "defer"         // wake kswapd and kcompactd, fall back to small pages
	DefragDeferMadvise Defrag = "defer+madvise" // stall for madvised regions, defer for the rest
	DefragMadvise      Defrag = "madvise"       // stall for madvised regions only (the default)
	DefragNever        Defrag = "never"         // never stall
)

// Settings are the system's THP settings, read from
// /sys/kernel/mm/transparent_hugepage (transhuge.rst). They apply to every
// process that has not set its own flag (see Process).
type Settings struct {
	// Enabled is the top-level mode, from "enabled".
	Enabled Mode
	// PMDEnabled is the mode for PMD-sized pages from
	// "hugepages-<PMDSize/1024>kB/enabled" (Linux 6.8 and later); it may be
	// ModeInherit. Empty when the kernel has no per-size controls.
	PMDEnabled Mode
	// Defrag is the fault-time defrag setting, from "defrag".
	Defrag Defrag
	// PMDSize is the size in bytes of a PMD-sized huge page, from
	// "hpage_pmd_size" (2 MiB on x86-64); 0 when the file is absent.
	PMDSize int64
	// MaxPTEsNone is how many unmapped 4 KiB pages khugepaged may fill with
	// zeros to collapse a range into one huge page, from
	// "khugepaged/max_ptes_none" (511 by default, PMDSize/4096-1: any range
	// with one touched page); -1 when the file is absent.
	MaxPTEsNone int
}

// PMDMode returns the mode that governs PMD-sized huge pages (the ones
// counted in AnonHugePages): PMDEnabled unless it is empty or ModeInherit,
// else Enabled.
func (s Settings) PMDMode() Mode {
	if s.PMDEnabled == "" || s.PMDEnabled == ModeInherit {
		return s.Enabled
	}
	return s.PMDEnabled
}

// SysfsDir is the directory System reads.
const SysfsDir = "/sys/kernel/mm/transparent_hugepage"

// readSettings reads the settings under dir. enabled and defrag must exist
// and be well formed; the other files may be absent but must be well formed
// when present. Every error names the file. When dir or its "enabled" file
// does not exist (a kernel built without THP), the error matches both
// errors.ErrUnsupported and fs.ErrNotExist.
func readSettings(dir string) (Settings, error) {
	s := Settings{MaxPTEsNone: -1}
	enabled := filepath.Join(dir, "enabled")
	w, err := readChoice(enabled)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Settings{}, fmt.Errorf("%w: kernel without THP: %w", err, errors.ErrUnsupported)
		}
		return Settings{}, err
	}
	s.Enabled = Mode(w)
	if w, err = readChoice(filepath.Join(dir, "defrag")); err != nil {
		return Settings{}, err
	}
	s.Defrag = Defrag(w)
	if n, ok, err := readInt(filepath.Join(dir, "hpage_pmd_size")); err != nil {
		return Settings{}, err
	} else if ok {
		if n <= 0 || n%4096 != 0 {
			return Settings{}, fmt.Errorf("thp: %s: implausible huge page size %d", filepath.Join(dir, "hpage_pmd_size"), n)
		}
		s.PMDSize = n
	}
	if n, ok, err := readInt(filepath.Join(dir, "khugepaged", "max_ptes_none")); err != nil {
		return Settings{}, err
	} else if ok {
		if n < 0 || n > 1<<20 {
			return Settings{}, fmt.Errorf("thp: %s: out of range: %d", filepath.Join(dir, "khugepaged", "max_ptes_none"), n)
		}
		s.MaxPTEsNone = int(n)
	}
	if s.PMDSize > 0 {
		p := filepath.Join(dir, "hugepages-"+strconv.FormatInt(s.PMDSize/1024, 10)+"kB", "enabled")
		w, err := readChoice(p)
		switch {
		case err == nil:
			s.PMDEnabled = Mode(w)
		case !errors.Is(err, fs.ErrNotExist):
			return Settings{}, err
		}
	}
	return s, nil
}

// readChoice reads a sysfs choice file such as "always [madvise] never" and
// returns the bracketed word. The error names path.
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
	if w == "" {
		return false
	}
	for _, c := range w {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// readInt reads a sysfs file holding one decimal integer. ok is false when
// the file does not exist. The error names path.
func readInt(path string) (n int64, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("thp: %w", err)
	}
	v := strings.TrimSpace(string(b))
	n, err = strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("thp: %s: malformed integer %q", path, v)
	}
	return n, true, nil
}

// readAnonHugePages returns the AnonHugePages field of the smaps_rollup file
// at path, in bytes. The error names path.
func readAnonHugePages(path string) (int64, error) {
	n, err := procfs.ReadBytes(path, "AnonHugePages")
	if err != nil {
		return 0, fmt.Errorf("thp: %w", err)
	}
	return n, nil
}
