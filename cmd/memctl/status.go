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
	"syscall"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/safefs"
	"github.com/memctl/memctl/internal/state"
	"github.com/memctl/memctl/thp"
)

const statusUsage = `usage: memctl status [-pid PID] [-json] [-smaps]

Show the THP settings, RSS, swap, cgroup memory limit and memory environment
of a process, and what the memctl library inside it reported deciding.
/proc/PID/smaps_rollup (Pss, AnonHugePages) is read only for a process whose
VmRSS is under 256 MiB, or with -smaps: reading it stalls the process's
mmap and munmap while the kernel walks its page tables. Flags:
`

// smapsMaxRSS is the VmRSS under which status reads smaps_rollup without
// -smaps (docs/benchmarks.md, "Reading smaps_rollup").
const smapsMaxRSS = 256 << 20

// smapsRule decides whether status reads /proc/PID/smaps_rollup (-smaps, or
// VmRSS under smapsMaxRSS), and why.
func smapsRule(force bool, rss *int64) (read bool, why string) {
	switch {
	case force:
		return true, "read: -smaps"
	case rss == nil:
		return false, "not read: no VmRSS (a kernel thread, a zombie, or VmRSS unknown)"
	case *rss < smapsMaxRSS:
		return true, fmt.Sprintf("read: VmRSS %s is under %s", logattr.MiB(*rss), logattr.MiB(smapsMaxRSS))
	}
	return false, fmt.Sprintf("not read: VmRSS %s is not under %s, and reading smaps_rollup would stall the process's mmap and munmap "+
		"while the kernel walks its page tables (about 10-25 ms a GiB); -smaps reads it anyway", logattr.MiB(*rss), logattr.MiB(smapsMaxRSS))
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	pid := fs.Int("pid", 0, "show process `PID` (default: memctl itself)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	smaps := fs.Bool("smaps", false, "read /proc/PID/smaps_rollup (Pss, AnonHugePages) whatever the process's size: it stalls the process's mmap and munmap while the kernel walks its page tables (about 10-25 ms a GiB of RSS)")
	if done, status := parseFlags(fs, args, statusUsage, stdout, stderr); done {
		return status
	}
	if fs.NArg() > 0 {
		return usageError(fs, statusUsage, stderr, "unexpected argument %s", safefs.Quote(fs.Arg(0)))
	}
	if *pid < 0 {
		return usageError(fs, statusUsage, stderr, "-pid %d: want a process ID", *pid)
	}
	if *pid == 0 {
		*pid = os.Getpid()
	}
	st, err := readStatus(*pid, *smaps)
	var out bytes.Buffer
	if err == nil && *asJSON {
		var b []byte
		b, err = json.MarshalIndent(st, "", "  ")
		out.Write(append(escapeJSON(b), '\n'))
	} else if err == nil {
		writeTable(&out, st)
	}
	if err == nil {
		_, err = stdout.Write(out.Bytes())
	}
	if err != nil {
		fmt.Fprintf(stderr, "memctl: %v\n", err)
		return exitError
	}
	if len(st.Unknown) > 0 {
		return exitPartial
	}
	return exitOK
}

// procState is /proc/PID/stat's start time (field 22, ticks) and state (3).
type procState struct {
	start string
	state byte
}

// readProcState reads /proc/PID/stat, counting fields after the last ')'
// (the command in parentheses may hold anything).
func readProcState(proc *safefs.Dir) (procState, error) {
	b, err := proc.ReadFile("stat", safefs.MaxProcFile)
	if err != nil {
		return procState{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 20 || len(f[0]) != 1 {
		return procState{}, fmt.Errorf("%s/stat: malformed", proc.Name())
	}
	return procState{start: f[19], state: f[0][0]}, nil
}

// isDead reports whether a /proc/PID/stat state is a zombie or dead.
func isDead(state byte) bool { return state == 'Z' || state == 'X' || state == 'x' }

// readStatus reads everything status shows about pid (smaps: -smaps). A
// field that cannot be read is nil and named in Unknown; the error is for a
// process that does not exist, exited while read, or whose /proc/PID/status
// cannot be read.
func readStatus(pid int, smaps bool) (*statusReport, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("status is Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
	}
	procName := strings.TrimSuffix(procfs.Path(pid, ""), "/")
	// Bound to the process: after it exits, reads fail even if the PID is reused.
	proc, err := safefs.OpenDir(procName, safefs.NoSymlinks)
	if err == nil {
		defer proc.Close()
		proc.Timeout = 5 * time.Second
	}
	var before procState
	if err == nil {
		before, err = readProcState(proc)
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return nil, fmt.Errorf("process %d does not exist (no %s)", pid, procName)
	}
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	if testHookAfterStart != nil {
		testHookAfterStart()
	}
	st, err := readFields(pid, proc, smaps)
	after, err2 := readProcState(proc)
	if err2 != nil || after.start != before.start || (isDead(after.state) && !isDead(before.state)) {
		return nil, fmt.Errorf("process %d exited while memctl read it", pid)
	}
	return st, err
}

// testHookAfterStart, set by tests, runs after the start time is read.
var testHookAfterStart func()

// readFields reads the fields of readStatus through proc.
func readFields(pid int, proc *safefs.Dir, smaps bool) (*statusReport, error) {
	st := &statusReport{PID: pid, Env: map[string]string{}, envRaw: map[string]string{}, Unknown: map[string]string{}}
	status, err := procfs.ReadFileIn(proc, "status")
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	sys, err := thp.System()
	switch {
	case err == nil:
		st.THPSystem = thpSystemOf(sys)
	case !errors.Is(err, errors.ErrUnsupported):
		st.Unknown["thp_system"] = err.Error()
	}
	if pid == os.Getpid() {
		if s, err := thp.Process(); err == nil {
			st.thpState = &s
		}
	}
	readBytes(status, nil, st, byteField{"VmRSS", "vm_rss_bytes", &st.VmRSSBytes}, byteField{"VmHWM", "vm_hwm_bytes", &st.VmHWMBytes},
		byteField{"RssAnon", "rss_anon_bytes", &st.RssAnonBytes}, byteField{"RssFile", "rss_file_bytes", &st.RssFileBytes},
		byteField{"RssShmem", "rss_shmem_bytes", &st.RssShmemBytes}, byteField{"VmSwap", "vm_swap_bytes", &st.VmSwapBytes})
	if st.THPEnabled, err = optional(status.Int("THP_enabled")); err != nil {
		st.Unknown["thp_enabled"] = err.Error()
	}
	// A kernel thread or a zombie has no memory: no VmRSS, an empty
	// smaps_rollup, no environment (ESRCH) and no mountinfo (EINVAL).
	_, rssBad := st.Unknown["vm_rss_bytes"]
	noMemory := st.VmRSSBytes == nil && !rssBad
	st.SmapsRollup.Read, st.SmapsRollup.Why = smapsRule(smaps && !noMemory, st.VmRSSBytes)
	if !noMemory {
		if st.SmapsRollup.Read {
			rollup, err := procfs.ReadFileIn(proc, "smaps_rollup")
			readBytes(rollup, err, st, byteField{"AnonHugePages", "anon_huge_pages_bytes", &st.AnonHugePagesBytes},
				byteField{"Pss", "pss_bytes", &st.PssBytes})
		}
		if err := readEnv(proc, st); err != nil {
			st.Unknown["env"] = err.Error()
			st.Env = nil
		}
		if err := readRecord(proc, st); err != nil {
			st.Unknown["memctl"] = err.Error()
		}
	}
	readCgroup(proc, st, noMemory)
	if len(st.Unknown) == 0 {
		st.Unknown = nil
	}
	return st, nil
}

// byteField is a line of a /proc file, the JSON key and the field it fills.
type byteField struct {
	line, key string
	p         **int64
}

// readBytes reads fields from f, whose read failed with readErr if not nil,
// naming each that cannot be read in st.Unknown.
func readBytes(f procfs.Fields, readErr error, st *statusReport, fields ...byteField) {
	for _, b := range fields {
		err := readErr
		if err == nil {
			*b.p, err = optional(f.Bytes(b.line))
		}
		if err != nil {
			st.Unknown[b.key] = err.Error()
		}
	}
}

// readEnv reads environ's memory variables into st; the first wins (getenv(3)).
func readEnv(proc *safefs.Dir, st *statusReport) error {
	b, err := proc.ReadFile("environ", safefs.MaxEnviron)
	if err != nil {
		return fmt.Errorf("procfs: %w", err)
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		k, v, ok := strings.Cut(kv, "=")
		if _, seen := st.envRaw[k]; !ok || seen || !memoryVar(k) {
			continue
		}
		st.envRaw[k] = v
		if utf8.ValidString(kv) {
			st.Env[k] = v
		} else {
			st.EnvBase64 = append(st.EnvBase64, base64.StdEncoding.EncodeToString([]byte(kv)))
		}
	}
	slices.Sort(st.EnvBase64)
	return nil
}

// readRecord reads the process's state record (safefs.Dir.ReadMemfd, then
// state.Parse). No record is not an error: st.Memctl stays nil.
func readRecord(proc *safefs.Dir, st *statusReport) error {
	path, b, err := proc.ReadMemfd(state.MemfdName, state.MaxSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	r, err := state.Parse(b)
	if err != nil {
		// Quoted: a parse error may hold bytes of the record.
		return fmt.Errorf("state record %s rejected: %s", safefs.Quote(path), safefs.Quote(err.Error()))
	}
	st.Memctl = &memctlRecord{ReportedBy: "process", File: path, Record: r}
	return nil
}

// memoryVar reports whether status shows the environment variable k.
func memoryVar(k string) bool {
	switch k {
	case "GOMEMLIMIT", "GOGC", "GODEBUG", "AUTOMEMLIMIT", "GLIBC_TUNABLES":
		return true
	}
	return strings.HasPrefix(k, "MEMCTL") || strings.HasPrefix(k, "MALLOC_") || strings.HasPrefix(k, "MIMALLOC_")
}

// optional returns &n, nil for procfs.ErrMissing, or the error.
func optional(n int64, err error) (*int64, error) {
	if errors.Is(err, procfs.ErrMissing) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// statusReport is what "memctl status -json" prints (docs/command.md);
// pointers are null when the value is not available.
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
	RssAnonBytes       *int64            `json:"rss_anon_bytes"`
	RssFileBytes       *int64            `json:"rss_file_bytes"`
	RssShmemBytes      *int64            `json:"rss_shmem_bytes"`
	VmSwapBytes        *int64            `json:"vm_swap_bytes"`
	PssBytes           *int64            `json:"pss_bytes"`
	SmapsRollup        smapsRollup       `json:"smaps_rollup"`
	EnvBase64          []string          `json:"env_base64,omitempty"` // NAME=value not valid UTF-8
	MemoryEvents       map[string]int64  `json:"memory_events,omitempty"`
	MemoryEventsNote   string            `json:"memory_events_note,omitempty"`
	Memctl             *memctlRecord     `json:"memctl"`
	Unknown            map[string]string `json:"unknown,omitempty"` // JSON key: reason

	envRaw   map[string]string // every variable shown, valid UTF-8 or not
	thpState *thp.State        // PR_GET_THP_DISABLE: memctl's own process only
}

// memctlRecord is the state record, after "reported_by" and "file".
type memctlRecord struct {
	ReportedBy string `json:"reported_by"`
	File       string `json:"file"`
	*state.Record
}

// thpSystem is thp.Settings in the JSON document; null for absent files.
type thpSystem struct {
	Enabled      string `json:"enabled"`
	PMDEnabled   string `json:"pmd_enabled"`
	Defrag       string `json:"defrag"`
	PMDSizeBytes *int64 `json:"pmd_size_bytes"`
	MaxPTEsNone  *int   `json:"max_ptes_none"`
}

// thpSystemOf returns the JSON document's view of s.
func thpSystemOf(s thp.Settings) *thpSystem {
	t := &thpSystem{Enabled: s.Enabled, PMDEnabled: s.PMDEnabled, Defrag: s.Defrag}
	if s.PMDSize > 0 {
		t.PMDSizeBytes = &s.PMDSize
	}
	if s.MaxPTEsNone >= 0 {
		t.MaxPTEsNone = &s.MaxPTEsNone
	}
	return t
}

// memCgroup is the process's memory cgroup in the JSON document.
type memCgroup struct {
	Version      int      `json:"version"`
	Path         string   `json:"path"`
	Dir          string   `json:"dir"`
	LimitBytes   *int64   `json:"limit_bytes"`
	LimitFile    *string  `json:"limit_file"`
	View         string   `json:"view"`                    // "process", "memctl" or "memctl-root"
	LimitUnknown bool     `json:"limit_unknown,omitempty"` // cgroupfs.Limit.TopNotRoot
	Swap         *memSwap `json:"swap"`                    // null when absent: SwapNote says so
	SwapNote     string   `json:"swap_note,omitempty"`
}

// memSwap is the cgroup's swap (cgroupfs.Swap) in the JSON document.
type memSwap struct {
	CurrentBytes   int64  `json:"current_bytes"`
	MaxBytes       *int64 `json:"max_bytes"` // null: no limit ("max")
	CurrentFile    string `json:"current_file"`
	MaxFile        string `json:"max_file"`
	MemoryPlusSwap bool   `json:"memory_plus_swap"` // v1 memsw
}

// smapsRollup is the "smaps_rollup" of the JSON document.
type smapsRollup struct {
	Read bool   `json:"read"`
	Why  string `json:"why"`
}

// escapeJSON returns the JSON text b with every unprintable rune but
// newlines written as a \u escape, so none reaches a terminal raw.
func escapeJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == '\n' || strconv.IsPrint(r) {
			out = append(out, b[i:i+n]...)
		} else if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += n
	}
	return out
}

// seconds formats a count of seconds as a duration.
func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}
