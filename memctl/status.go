package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/thp"
)

const statusUsage = `usage: memctl status [-pid PID] [-json]

Show the THP settings, RSS, cgroup memory limit and memory environment of a
process. Flags:
`

// statusReport is the document "memctl status -json" prints; see the
// package doc. Pointers are null when the value is not available.
type statusReport struct {
	PID                int               `json:"pid"`
	THPSystem          *thpSystem        `json:"thp_system"`
	THPEnabled         *int64            `json:"thp_enabled"`
	AnonHugePagesBytes *int64            `json:"anon_huge_pages_bytes"`
	VmRSSBytes         *int64            `json:"vm_rss_bytes"`
	VmHWMBytes         *int64            `json:"vm_hwm_bytes"`
	Cgroup             *memCgroup        `json:"cgroup"`
	CgroupError        string            `json:"cgroup_error,omitempty"`
	Env                map[string]string `json:"env"`
	// EnvBase64 holds the variables whose name or value is not valid
	// UTF-8, which JSON strings cannot carry: each NAME=value entry of
	// /proc/PID/environ in standard base64 (RFC 4648), sorted. They are
	// not in Env.
	EnvBase64 []string `json:"env_base64,omitempty"`

	// envRaw is every variable status shows, valid UTF-8 or not, as
	// read; the table prints it. Not in the JSON document.
	envRaw map[string]string

	// thpState is the THP flag read with PR_GET_THP_DISABLE, which only
	// memctl's own process can read (nil for another process): it tells
	// "enabled" from "disabled except advised", which THP_enabled does not.
	// Not in the JSON document.
	thpState *thp.State
}

// thpSystem is thp.Settings in the JSON document.
type thpSystem struct {
	Enabled      string `json:"enabled"`
	PMDEnabled   string `json:"pmd_enabled"`
	Defrag       string `json:"defrag"`
	PMDSizeBytes int64  `json:"pmd_size_bytes"`
	MaxPTEsNone  int    `json:"max_ptes_none"`
}

// memCgroup is the process's memory cgroup in the JSON document.
type memCgroup struct {
	Version    int     `json:"version"`
	Path       string  `json:"path"`
	Dir        string  `json:"dir"`
	LimitBytes *int64  `json:"limit_bytes"`
	LimitFile  *string `json:"limit_file"`
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	pid := fs.Int("pid", 0, "show process `PID` (default: memctl itself)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	if done, status := parseFlags(fs, args, statusUsage, stdout, stderr); done {
		return status
	}
	if fs.NArg() > 0 {
		return usageError(fs, statusUsage, stderr, "unexpected argument %q", fs.Arg(0))
	}
	if *pid < 0 {
		return usageError(fs, statusUsage, stderr, "-pid %d: want a process ID", *pid)
	}
	if *pid == 0 {
		*pid = os.Getpid()
	}
	st, err := readStatus(*pid)
	if err != nil {
		fmt.Fprintf(stderr, "memctl: %v\n", err)
		return exitError
	}
	var out bytes.Buffer
	if *asJSON {
		enc := json.NewEncoder(&out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			fmt.Fprintf(stderr, "memctl: %v\n", err)
			return exitError
		}
	} else {
		writeTable(&out, st)
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		fmt.Fprintf(stderr, "memctl: %v\n", err)
		return exitError
	}
	return exitOK
}

// readStatus reads everything status shows about pid. Errors name the
// process and the file.
func readStatus(pid int) (*statusReport, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("status is Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
	}
	st := &statusReport{PID: pid, Env: map[string]string{}, envRaw: map[string]string{}}
	status, err := procfs.ReadFile(procfs.StatusPath(pid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("process %d does not exist (no %s)", pid, procfs.StatusPath(pid))
	}
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}

	sys, err := thp.System()
	switch {
	case err == nil:
		st.THPSystem = &thpSystem{
			Enabled:      string(sys.Enabled),
			PMDEnabled:   string(sys.PMDEnabled),
			Defrag:       string(sys.Defrag),
			PMDSizeBytes: sys.PMDSize,
			MaxPTEsNone:  sys.MaxPTEsNone,
		}
	case !errors.Is(err, errors.ErrUnsupported):
		return nil, err
	}

	if st.THPEnabled, err = optional(status.Int("THP_enabled")); err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	if pid == os.Getpid() {
		if s, err := thp.Process(); err == nil {
			st.thpState = &s
		}
	}
	if st.VmRSSBytes, err = optional(status.Bytes("VmRSS")); err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	if st.VmHWMBytes, err = optional(status.Bytes("VmHWM")); err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	// A kernel thread or a zombie has no memory: no VmRSS, and an empty
	// smaps_rollup.
	if st.VmRSSBytes != nil {
		n, err := thp.AnonHugePagesOf(pid)
		if st.AnonHugePagesBytes, err = optional(n, err); err != nil {
			return nil, fmt.Errorf("process %d: %w", pid, err)
		}
	}

	// Without memory there is no environment either (ESRCH).
	var b []byte
	if st.VmRSSBytes != nil {
		if b, err = os.ReadFile(procfs.Path(pid, "environ")); err != nil {
			return nil, fmt.Errorf("process %d: %w", pid, err)
		}
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		k, v, ok := strings.Cut(kv, "=")
		if _, seen := st.envRaw[k]; !ok || seen || !memoryVar(k) {
			continue // the first wins, as getenv(3)
		}
		st.envRaw[k] = v
		if utf8.ValidString(kv) {
			st.Env[k] = v
		} else {
			st.EnvBase64 = append(st.EnvBase64, base64.StdEncoding.EncodeToString([]byte(kv)))
		}
	}
	slices.Sort(st.EnvBase64)

	l, err := cgroupfs.Of(pid)
	switch {
	case err == nil:
		c := &memCgroup{Version: l.Version, Path: l.Cgroup, Dir: l.Dir}
		if l.Bytes != cgroupfs.NoLimit {
			c.LimitBytes, c.LimitFile = &l.Bytes, &l.File
		}
		st.Cgroup = c
	case errors.Is(err, cgroupfs.ErrNoCgroup), st.VmRSSBytes == nil:
		// A zombie has no mountinfo (EINVAL) either.
		st.CgroupError = err.Error()
	default:
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	return st, nil
}

// optional returns &n, nil for a value, nil, nil for a key the kernel does
// not write (procfs.ErrMissing), and the error otherwise.
func optional(n int64, err error) (*int64, error) {
	if errors.Is(err, procfs.ErrMissing) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// memoryVar reports whether status shows the environment variable k.
func memoryVar(k string) bool {
	switch k {
	case "GOMEMLIMIT", "GOGC", "GODEBUG", "AUTOMEMLIMIT", "GLIBC_TUNABLES":
		return true
	}
	return strings.HasPrefix(k, "MEMCTL") || strings.HasPrefix(k, "MALLOC_") || strings.HasPrefix(k, "MIMALLOC_")
}

// writeTable writes st as an aligned two-column table.
func writeTable(w io.Writer, st *statusReport) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("pid", strconv.Itoa(st.PID))
	if s := st.THPSystem; s != nil {
		mode := s.Enabled
		if s.PMDEnabled != "" {
			mode += fmt.Sprintf(" (hugepages-%dkB: %s)", s.PMDSizeBytes/1024, s.PMDEnabled)
		}
		row("THP system", mode)
		row("THP defrag", s.Defrag)
		ptes := "absent"
		if s.MaxPTEsNone >= 0 {
			ptes = strconv.Itoa(s.MaxPTEsNone)
		}
		row("khugepaged/max_ptes_none", ptes)
	} else {
		row("THP system", "unavailable (kernel without THP)")
	}
	switch {
	case st.THPEnabled == nil && st.VmRSSBytes == nil:
		row("THP_enabled", "unknown")
	case st.THPEnabled == nil:
		row("THP_enabled", "unknown (before Linux 5.0)")
	case *st.THPEnabled == 0:
		row("THP_enabled", "0 (disabled for the process: prctl PR_SET_THP_DISABLE)")
	case *st.THPEnabled != 1:
		row("THP_enabled", strconv.FormatInt(*st.THPEnabled, 10))
	case st.thpState != nil && *st.thpState == thp.Enabled:
		row("THP_enabled", "1 (enabled: follows the system mode)")
	case st.thpState != nil && *st.thpState == thp.DisabledExceptAdvised:
		row("THP_enabled", "1 (disabled except advised: prctl PR_THP_DISABLE_EXCEPT_ADVISED)")
	default:
		// The kernel writes 1 for a clear flag and for "disabled except
		// advised" (Linux 6.18) alike.
		row("THP_enabled", "1 (enabled, or disabled except advised: /proc cannot tell them apart)")
	}
	if st.VmRSSBytes == nil {
		row("memory", "none (a kernel thread or a zombie)")
	}
	row("AnonHugePages", size(st.AnonHugePagesBytes))
	row("VmRSS", size(st.VmRSSBytes))
	row("VmHWM", size(st.VmHWMBytes))
	if c := st.Cgroup; c != nil {
		row("cgroup", fmt.Sprintf("v%d %s", c.Version, printable(c.Path)))
		if c.LimitBytes == nil {
			row("memory limit", "none")
		} else {
			row("memory limit", size(c.LimitBytes)+" from "+printable(*c.LimitFile))
		}
	} else {
		row("cgroup", "unknown: "+printable(st.CgroupError))
	}
	keys := make([]string, 0, len(st.envRaw))
	for k := range st.envRaw {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	label := "env"
	for _, k := range keys {
		row(label, printable(k)+"="+printable(st.envRaw[k]))
		label = ""
	}
	if len(keys) == 0 {
		row(label, "none of GOMEMLIMIT, GOGC, GODEBUG, AUTOMEMLIMIT, MEMCTL*, MALLOC_*, MIMALLOC_*, GLIBC_TUNABLES")
	}
	tw.Flush()
}

// printable returns s as it is when it is valid UTF-8 and every rune in it
// is printable (strconv.IsPrint: no control character, C0 or C1 such as
// ESC or U+009B, no format character), and otherwise strconv.Quote(s), a
// Go string literal: what another process put in its environment (or in a
// cgroup name) must not reach the terminal as an escape sequence.
func printable(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return s
	}
	return strconv.Quote(s)
}

// size formats a byte count as "N bytes (1.5 MiB)"; "unknown" for nil.
func size(n *int64) string {
	if n == nil {
		return "unknown"
	}
	b := *n
	if b < 1024 {
		return strconv.FormatInt(b, 10) + " bytes"
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	f, i := float64(b)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return fmt.Sprintf("%d bytes (%.1f %s)", b, f, units[i])
}
