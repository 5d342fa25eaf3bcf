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
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/memctl/memctl/internal/cgroupfs"
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
	// RssAnonBytes, RssFileBytes, RssShmemBytes and VmSwapBytes are the
	// lines of /proc/PID/status (null before the kernel wrote them, or for
	// a process without memory): VmSwap is the process's anonymous memory
	// in swap, which VmRSS does not count.
	RssAnonBytes  *int64 `json:"rss_anon_bytes"`
	RssFileBytes  *int64 `json:"rss_file_bytes"`
	RssShmemBytes *int64 `json:"rss_shmem_bytes"`
	VmSwapBytes   *int64 `json:"vm_swap_bytes"`
	// PssBytes is Pss in /proc/PID/smaps_rollup; null, as
	// AnonHugePagesBytes, when SmapsRollup says it was not read.
	PssBytes *int64 `json:"pss_bytes"`
	// SmapsRollup says whether /proc/PID/smaps_rollup was read and why
	// (see smapsRule).
	SmapsRollup smapsRollup `json:"smaps_rollup"`
	// EnvBase64 holds the variables whose name or value is not valid
	// UTF-8, which JSON strings cannot carry: each NAME=value entry of
	// /proc/PID/environ in standard base64 (RFC 4648), sorted. They are
	// not in Env.
	EnvBase64 []string `json:"env_base64,omitempty"`
	// MemoryEvents holds the counters of the cgroup's memory.events (v2:
	// low, high, max, oom, oom_kill, oom_group_kill), read when
	// parseMemoryEvents is set; null otherwise.
	MemoryEvents map[string]int64 `json:"memory_events,omitempty"`
	// Memctl is the state record that the memctl library inside the
	// process published (package internal/state), as the process reported
	// it: null when none was found (the process does not use the library,
	// or an older one). See readRecord.
	Memctl *memctlRecord `json:"memctl"`
	// Unknown names each field that could not be read (by its JSON key)
	// with the reason. Absent when everything was read; then the exit
	// status is 0, and otherwise exitPartial.
	Unknown map[string]string `json:"unknown,omitempty"`

	// envRaw is every variable status shows, valid UTF-8 or not, as
	// read; the table prints it. Not in the JSON document.
	envRaw map[string]string

	// thpState is the THP flag read with PR_GET_THP_DISABLE, which only
	// memctl's own process can read (nil for another process): it tells
	// "enabled" from "disabled except advised", which THP_enabled does not.
	// Not in the JSON document.
	thpState *thp.State
}

// parseMemoryEvents parses a cgroup v2 memory.events file (its content, at
// most safefs.MaxCgroupFile bytes read inside the process's root, and its
// path for errors) with cgroupfs.ParseEvents into the counters the kernel
// wrote (a counter an older kernel lacks is left out, never shown as 0),
// which status shows as "memory_events" and in the table.
func parseMemoryEvents(b []byte, file string) (map[string]int64, error) {
	ev, err := cgroupfs.ParseEvents(bytes.NewReader(b), safefs.Quote(file))
	if err != nil {
		return nil, err
	}
	m := make(map[string]int64, 6)
	for k, v := range ev.All() {
		if v >= 0 {
			m[k] = v
		}
	}
	return m, nil
}

// memctlRecord is the state record in the JSON document: the parsed record's
// keys, after "reported_by" (always "process": the values are what the
// process wrote, not checked against the kernel) and "file" (where it was
// read).
type memctlRecord struct {
	ReportedBy string `json:"reported_by"`
	File       string `json:"file"`
	*state.Record
}

// readRecord reads the process's state record: the memfd named
// state.MemfdName among its descriptors (safefs.Dir.ReadMemfd: through
// /proc/PID/fd, a regular tmpfs file only, at most state.MaxSize bytes),
// parsed with state.Parse, which rejects the whole record on any wrong
// type, size or version. No record is not an error (st.Memctl stays nil);
// a record that cannot be read or parsed is (the field is unknown, exit
// status 3). A process's own record cannot be trusted: every string of it
// is shown quoted and the table labels it "reported by the process".
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
	// View is "process" when the files were read in the process's mount
	// namespace, "memctl" when in memctl's (cgroupfs.ViewCaller: the
	// process's own mounts no hierarchy with its memory controller, as on a
	// hybrid host), "memctl-root" when in memctl's root (ViewCallerRoot: a
	// process chrooted in memctl's mount namespace).
	View string `json:"view"`
	// LimitUnknown is true when no visible cgroup sets a limit but the
	// topmost visible one is not the hierarchy's root (the top of a
	// private cgroup namespace has a memory.max): a limit may be set
	// above it, out of sight (cgroupfs.Limit.TopNotRoot).
	LimitUnknown bool `json:"limit_unknown,omitempty"`
	// Swap is the cgroup's swap accounting (cgroupfs.Swap): v2
	// memory.swap.current and memory.swap.max, v1 memsw (memory plus
	// swap). null when the files are absent (no swap accounting), and
	// SwapNote says so; unknown ("swap") when they cannot be read.
	Swap     *memSwap `json:"swap"`
	SwapNote string   `json:"swap_note,omitempty"`
}

// memSwap is the cgroup's swap in the JSON document.
type memSwap struct {
	CurrentBytes int64  `json:"current_bytes"`
	MaxBytes     *int64 `json:"max_bytes"` // null: no limit ("max")
	CurrentFile  string `json:"current_file"`
	MaxFile      string `json:"max_file"`
	// MemoryPlusSwap is true in v1, whose memsw files count memory and
	// swap together.
	MemoryPlusSwap bool `json:"memory_plus_swap"`
}

// limitUnknownNote is the table's "memory limit" for LimitUnknown.
const limitUnknownNote = "unknown: none up to the top of this cgroup namespace, which is not the root; a limit may be set above it " +
	"(give the process MEMCTL_MEMORY_LIMIT from the downward API, or use memctl's SystemFallback)"

// smapsRollup is the "smaps_rollup" of the JSON document.
type smapsRollup struct {
	Read bool   `json:"read"`
	Why  string `json:"why"`
}

// smapsMaxRSS is the VmRSS, in bytes, under which status reads
// /proc/PID/smaps_rollup without -smaps. The kernel fills smaps_rollup by
// walking the page tables of every mapping while it holds the process's
// mmap lock (for reading); the process's own mmap, munmap and page faults
// that need the lock for writing wait for the walk. The walk's time grows
// with the resident pages, and VmRSS, in /proc/PID/status, costs nothing
// to read (no lock). Measured on this project's 2-core machine (kernel
// 6.18; the target maps and unmaps 1 MiB in a loop, 20 reads): one read
// of smaps_rollup took 0.9-3.8 ms at 256 MiB touched, 1.6-4.3 ms at
// 512 MiB, 3-9.5 ms at 1 GiB, 20-78 ms at 4 GiB and 100-385 ms at 16 GiB;
// the target's worst mmap+munmap during them was 3.5-4.4 ms at 256 MiB,
// 1.8-11 ms at 512 MiB, 8.7-11.7 ms at 1 GiB, 50-75 ms at 4 GiB and
// 322-373 ms at 16 GiB (0.04-2 ms with no reader; reading
// /proc/PID/status: 0.01 ms, no stall). 16 GiB mapped but never touched
// (VmSize 16 GiB, VmRSS a few MiB): 0.02-0.2 ms a read, no stall; the walk
// follows the resident pages, so the rule is on VmRSS, not VmSize. The
// figures come from a probe reading the file in a loop and TestStatusStall
// (MEMCTL_TEST_STALL_MIB=4096 or 16384). 256 MiB keeps the stall under
// half of the 10 ms an operator's look may cost (issue 27 item 9) with
// room for a busier machine.
const smapsMaxRSS = 256 << 20

// smapsRule decides whether status reads /proc/PID/smaps_rollup: always
// with -smaps (force), never for a process without memory (rss nil: a
// kernel thread or a zombie; the caller reads nothing then), and
// otherwise when VmRSS is under smapsMaxRSS. why says which, for the
// output.
func smapsRule(force bool, rss *int64) (read bool, why string) {
	switch {
	case force:
		return true, "read: -smaps"
	case rss == nil:
		return false, "not read: no VmRSS (a kernel thread, a zombie, or VmRSS unknown)"
	case *rss < smapsMaxRSS:
		return true, fmt.Sprintf("read: VmRSS %s is under %s", mib(*rss), mib(smapsMaxRSS))
	}
	return false, fmt.Sprintf("not read: VmRSS %s is not under %s, and reading smaps_rollup would stall the process's mmap and munmap "+
		"while the kernel walks its page tables (about 10-25 ms a GiB); -smaps reads it anyway", mib(*rss), mib(smapsMaxRSS))
}

// mib formats bytes as "N.N MiB".
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// statusOptions are the flags of status that change what is read.
type statusOptions struct {
	// smaps reads /proc/PID/smaps_rollup whatever the process's size.
	smaps bool
}

// readTimeout bounds each read of a file of the process (safefs.Dir.Timeout).
const readTimeout = 5 * time.Second

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
	st, err := readStatusOpts(*pid, statusOptions{smaps: *smaps})
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
		esc := escapeJSON(out.Bytes())
		out.Reset()
		out.Write(esc)
	} else {
		writeTable(&out, st)
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		fmt.Fprintf(stderr, "memctl: %v\n", err)
		return exitError
	}
	if len(st.Unknown) > 0 {
		return exitPartial
	}
	return exitOK
}

// procState is what /proc/PID/stat says of a process's identity: its start
// time (field 22, in clock ticks since boot) and state (field 3).
type procState struct {
	start string
	state byte
}

// readProcState reads /proc/PID/stat through proc. The command, which the
// process chose, is in parentheses and may hold anything: the fields are
// counted after the last ')'.
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

// errExited is the one error of a process that exited (or whose PID was
// reused) while status read it.
func errExited(pid int) error {
	return fmt.Errorf("process %d exited while memctl read it", pid)
}

// readStatus reads everything status shows about pid. A field that cannot
// be read is left nil and named in Unknown with the reason; the error is
// for a process that does not exist, exited while being read, or whose
// /proc/PID/status cannot be read.
func readStatus(pid int) (*statusReport, error) { return readStatusOpts(pid, statusOptions{}) }

// readStatusOpts is readStatus with the flags of o.
func readStatusOpts(pid int, o statusOptions) (*statusReport, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("status is Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
	}
	procName := procfs.Path(pid, "")
	procName = procName[:len(procName)-1]
	// Every file is read through this directory, which stays bound to the
	// process: after it exits, reads fail even when its PID is reused.
	proc, err := safefs.OpenDir(procName, safefs.NoSymlinks)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("process %d does not exist (no %s)", pid, procName)
	}
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	defer proc.Close()
	proc.Timeout = readTimeout
	before, err := readProcState(proc)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return nil, fmt.Errorf("process %d does not exist (no %s)", pid, procName)
	}
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	if testHookAfterStart != nil {
		testHookAfterStart()
	}
	st, err := readFields(pid, proc, o)
	after, err2 := readProcState(proc)
	if err2 != nil || after.start != before.start || (isDead(after.state) && !isDead(before.state)) {
		return nil, errExited(pid)
	}
	return st, err
}

// testHookAfterStart, when set by a test, runs after the process's start
// time is read.
var testHookAfterStart func()

// isDead reports whether a /proc/PID/stat state is a zombie or dead.
func isDead(state byte) bool { return state == 'Z' || state == 'X' || state == 'x' }

// readFields reads the fields of readStatus through proc.
func readFields(pid int, proc *safefs.Dir, o statusOptions) (*statusReport, error) {
	st := &statusReport{PID: pid, Env: map[string]string{}, envRaw: map[string]string{}, Unknown: map[string]string{}}
	unknown := func(key string, err error) { st.Unknown[key] = err.Error() }
	status, err := procfs.ReadFileIn(proc, "status")
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
		unknown("thp_system", err)
	}

	if st.THPEnabled, err = optional(status.Int("THP_enabled")); err != nil {
		unknown("thp_enabled", err)
	}
	if pid == os.Getpid() {
		if s, err := thp.Process(); err == nil {
			st.thpState = &s
		}
	}
	var rssErr error
	if st.VmRSSBytes, rssErr = optional(status.Bytes("VmRSS")); rssErr != nil {
		unknown("vm_rss_bytes", rssErr)
	}
	if st.VmHWMBytes, err = optional(status.Bytes("VmHWM")); err != nil {
		unknown("vm_hwm_bytes", err)
	}
	for _, f := range []struct {
		line, key string
		p         **int64
	}{{"RssAnon", "rss_anon_bytes", &st.RssAnonBytes}, {"RssFile", "rss_file_bytes", &st.RssFileBytes},
		{"RssShmem", "rss_shmem_bytes", &st.RssShmemBytes}, {"VmSwap", "vm_swap_bytes", &st.VmSwapBytes}} {
		if *f.p, err = optional(status.Bytes(f.line)); err != nil {
			unknown(f.key, err)
		}
	}
	// A kernel thread or a zombie has no memory: no VmRSS, an empty
	// smaps_rollup, no environment (ESRCH) and no mountinfo (EINVAL).
	noMemory := st.VmRSSBytes == nil && rssErr == nil
	st.SmapsRollup.Read, st.SmapsRollup.Why = smapsRule(o.smaps && !noMemory, st.VmRSSBytes)
	if !noMemory {
		if st.SmapsRollup.Read {
			readRollup(proc, st)
		}
		if err := readEnv(proc, st); err != nil {
			unknown("env", err)
			st.Env = nil
		}
		if err := readRecord(proc, st); err != nil {
			unknown("memctl", err)
		}
	}

	l, view, err := cgroupfs.OfProc(proc)
	switch {
	case err == nil:
		c := &memCgroup{Version: l.Version, Path: l.Cgroup, Dir: l.Dir, View: "process"}
		if view != cgroupfs.ViewProcess {
			c.View = "memctl"
			if view == cgroupfs.ViewCallerRoot {
				c.View = "memctl-root"
			}
		}
		if l.Bytes != cgroupfs.NoLimit {
			c.LimitBytes, c.LimitFile = &l.Bytes, &l.File
		} else {
			c.LimitUnknown = l.TopNotRoot
		}
		st.Cgroup = c
		if l.Version == 2 {
			if err := readMemoryEvents(proc, l, view, st); err != nil {
				unknown("memory_events", err)
			}
		}
		if err := readSwap(proc, l, view, c); err != nil {
			unknown("swap", err)
		}
	case errors.Is(err, cgroupfs.ErrNoCgroup), noMemory:
		st.CgroupError = err.Error()
	default:
		st.CgroupError = err.Error()
		unknown("cgroup", err)
	}
	if len(st.Unknown) == 0 {
		st.Unknown = nil
	}
	return st, nil
}

// readRollup reads Pss and AnonHugePages of /proc/PID/smaps_rollup into
// st; each that cannot be read is unknown with the reason.
func readRollup(proc *safefs.Dir, st *statusReport) {
	rollup, err := procfs.ReadFileIn(proc, "smaps_rollup")
	if err != nil {
		st.Unknown["anon_huge_pages_bytes"] = err.Error()
		st.Unknown["pss_bytes"] = err.Error()
		return
	}
	if st.AnonHugePagesBytes, err = optional(rollup.Bytes("AnonHugePages")); err != nil {
		st.Unknown["anon_huge_pages_bytes"] = err.Error()
	}
	if st.PssBytes, err = optional(rollup.Bytes("Pss")); err != nil {
		st.Unknown["pss_bytes"] = err.Error()
	}
}

// readEnv reads the memory variables of /proc/PID/environ into st.
func readEnv(proc *safefs.Dir, st *statusReport) error {
	b, err := proc.ReadFile("environ", safefs.MaxEnviron)
	if err != nil {
		return fmt.Errorf("procfs: %w", err)
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
	return nil
}

// readMemoryEvents reads memory.events of the cgroup l, in the mount
// namespace view names, with parseMemoryEvents.
func readMemoryEvents(proc *safefs.Dir, l cgroupfs.Limit, view cgroupfs.View, st *statusReport) error {
	r, rel, err := cgroupRoot(proc, l, view)
	if err != nil {
		return err
	}
	defer r.Close()
	file := l.Dir + "/memory.events"
	b, err := r.ReadFile(rel+"/memory.events", safefs.MaxCgroupFile)
	if err != nil {
		return err
	}
	st.MemoryEvents, err = parseMemoryEvents(b, file)
	return err
}

// cgroupRoot opens the root directory in which the cgroup directory of l
// is read (the process's root, or memctl's for a view other than
// ViewProcess) with RESOLVE_IN_ROOT, no symlinks and cgroup file systems
// only (cgroupfs.FSTypes), and returns it with l.Dir relative to it.
func cgroupRoot(proc *safefs.Dir, l cgroupfs.Limit, view cgroupfs.View) (*safefs.Dir, string, error) {
	root, prefix := proc, proc.Name()+"/root"
	if view != cgroupfs.ViewProcess {
		self, err := safefs.OpenDir("/proc/self", safefs.NoSymlinks)
		if err != nil {
			return nil, "", err
		}
		defer self.Close()
		root = self
	}
	r, err := root.Sub("root", safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return nil, "", err
	}
	r.FSTypes = cgroupfs.FSTypes
	return r, strings.TrimPrefix(l.Dir, prefix), nil
}

// readSwap reads the swap files of the cgroup l (cgroupfs.ReadSwapAt,
// inside the root cgroupRoot opens) into c. Absent files are not an
// error: c.SwapNote says the cgroup has no swap accounting.
func readSwap(proc *safefs.Dir, l cgroupfs.Limit, view cgroupfs.View, c *memCgroup) error {
	r, rel, err := cgroupRoot(proc, l, view)
	if err != nil {
		return err
	}
	defer r.Close()
	sw, err := cgroupfs.ReadSwapAt(r, l.Version, rel, l.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		cur, max := cgroupfs.SwapFiles(l.Version)
		c.SwapNote = fmt.Sprintf("no %s or %s: the kernel does not account swap for this cgroup (the root cgroup has none; "+
			"nor has a kernel built without CONFIG_MEMCG_SWAP or booted with swapaccount=0)", cur, max)
		return nil
	}
	if err != nil {
		return err
	}
	c.Swap = &memSwap{CurrentBytes: sw.Current, CurrentFile: sw.CurrentFile, MaxFile: sw.MaxFile, MemoryPlusSwap: sw.MemoryPlusSwap}
	if sw.Max != cgroupfs.NoLimit {
		c.Swap.MaxBytes = &sw.Max
	}
	return nil
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

// writeTable writes st as an aligned two-column table. Every string the
// process supplied (cgroup path, file names, environment) is shown with
// safefs.Quote; a field that could not be read shows "unknown: " and the
// reason.
func writeTable(w io.Writer, st *statusReport) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	why := func(key string) (string, bool) {
		r, ok := st.Unknown[key]
		return "unknown: " + r, ok
	}
	bytesRow := func(k, key string, n *int64) {
		if r, ok := why(key); ok {
			row(k, r)
			return
		}
		row(k, size(n))
	}
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
	} else if r, ok := why("thp_system"); ok {
		row("THP system", r)
	} else {
		row("THP system", "unavailable (kernel without THP)")
	}
	r, bad := why("thp_enabled")
	switch {
	case bad:
		row("THP_enabled", r)
	case st.THPEnabled == nil && st.VmRSSBytes == nil:
		row("THP_enabled", "unknown")
	case st.THPEnabled == nil:
		row("THP_enabled", "unknown (before Linux 5.0)")
	case *st.THPEnabled == 0:
		row("THP_enabled", "0 (disabled for the process: prctl PR_SET_THP_DISABLE)")
	case *st.THPEnabled != 1:
		row("THP_enabled", strconv.FormatInt(*st.THPEnabled, 10))
	case st.thpState != nil && *st.thpState == thp.StateEnabled:
		row("THP_enabled", "1 (enabled: follows the system mode)")
	case st.thpState != nil && *st.thpState == thp.StateDisabledExceptAdvised:
		row("THP_enabled", "1 (disabled except advised: prctl PR_THP_DISABLE_EXCEPT_ADVISED)")
	default:
		// The kernel writes 1 for a clear flag and for "disabled except
		// advised" (Linux 6.18) alike.
		row("THP_enabled", "1 (enabled, or disabled except advised: /proc cannot tell them apart)")
	}
	_, rssBad := why("vm_rss_bytes")
	if st.VmRSSBytes == nil && !rssBad {
		row("memory", "none (a kernel thread or a zombie)")
	}
	bytesRow("VmRSS", "vm_rss_bytes", st.VmRSSBytes)
	bytesRow("VmHWM", "vm_hwm_bytes", st.VmHWMBytes)
	if st.VmRSSBytes != nil {
		bytesRow("RssAnon", "rss_anon_bytes", st.RssAnonBytes)
		bytesRow("RssFile", "rss_file_bytes", st.RssFileBytes)
		bytesRow("RssShmem", "rss_shmem_bytes", st.RssShmemBytes)
		bytesRow("VmSwap", "vm_swap_bytes", st.VmSwapBytes)
	}
	row("smaps_rollup", st.SmapsRollup.Why)
	if st.SmapsRollup.Read {
		bytesRow("Pss", "pss_bytes", st.PssBytes)
		bytesRow("AnonHugePages", "anon_huge_pages_bytes", st.AnonHugePagesBytes)
	} else if st.VmRSSBytes != nil {
		row("Pss, AnonHugePages", "not read (smaps_rollup)")
	}
	if c := st.Cgroup; c != nil {
		v := fmt.Sprintf("v%d %s", c.Version, safefs.Quote(c.Path))
		switch c.View {
		case "memctl":
			v += " (read in memctl's mount namespace: the process's own mounts no hierarchy with its memory controller)"
		case "memctl-root":
			v += " (read from memctl's root: the process is chrooted in memctl's mount namespace and its root shows no cgroup mount)"
		}
		row("cgroup", v)
		if c.LimitUnknown {
			row("memory limit", limitUnknownNote)
		} else if c.LimitBytes == nil {
			row("memory limit", "none")
		} else {
			row("memory limit", size(c.LimitBytes)+" from "+safefs.Quote(*c.LimitFile))
		}
		if r, ok := why("swap"); ok {
			row("cgroup swap", r)
		} else if sw := c.Swap; sw != nil {
			what := "in swap"
			if sw.MemoryPlusSwap {
				what = "memory plus swap (v1 memsw)"
			}
			lim := "no limit"
			if sw.MaxBytes != nil {
				lim = "limit " + size(sw.MaxBytes)
			}
			row("cgroup swap", fmt.Sprintf("%s %s from %s; %s from %s", size(&sw.CurrentBytes), what, safefs.Quote(sw.CurrentFile), lim, safefs.Quote(sw.MaxFile)))
		} else if c.SwapNote != "" {
			row("cgroup swap", c.SwapNote)
		}
	} else if r, ok := why("cgroup"); ok {
		row("cgroup", r)
	} else {
		row("cgroup", "none: "+st.CgroupError)
	}
	if r, ok := why("memory_events"); ok {
		row("memory.events", r)
	}
	events := slices.Sorted(maps.Keys(st.MemoryEvents))
	for i, k := range events {
		label := ""
		if i == 0 {
			label = "memory.events"
		}
		row(label, safefs.Quote(k)+" "+strconv.FormatInt(st.MemoryEvents[k], 10))
	}
	keys := slices.Sorted(maps.Keys(st.envRaw))
	label := "env"
	for _, k := range keys {
		row(label, safefs.Quote(k+"="+st.envRaw[k]))
		label = ""
	}
	if r, ok := why("env"); ok {
		row(label, r)
	} else if len(keys) == 0 {
		row(label, "none of GOMEMLIMIT, GOGC, GODEBUG, AUTOMEMLIMIT, MEMCTL*, MALLOC_*, MIMALLOC_*, GLIBC_TUNABLES")
	}
	writeRecord(row, st)
	tw.Flush()
}

// escapeJSON returns the JSON text b with every rune that is not printable
// (strconv.IsPrint), outside the indentation's newlines, written as a \u
// escape: encoding/json escapes only C0 controls and U+2028/U+2029, and a
// C1 control such as U+009B (CSI) or a bidirectional override from the
// process's environment must not reach a terminal raw. The JSON value is
// unchanged. encoding/json writes valid UTF-8 only.
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

// writeRecord writes the rows of the state record, each labeled as reported
// by the process; every string in it is quoted (safefs.Quote, cut to 200
// bytes).
func writeRecord(row func(k, v string), st *statusReport) {
	if r, ok := st.Unknown["memctl"]; ok {
		row("memctl", "unknown: "+r)
		return
	}
	m := st.Memctl
	if m == nil {
		row("memctl", "none: no memctl state record (the process does not use the memctl library, or one older than the record)")
		return
	}
	q := safefs.Quote
	r := m.Record
	note := ""
	switch {
	case r.Off:
		note = ", memctl is off (MEMCTL=off)"
	case r.Closed:
		note = ", controller closed"
	}
	row("memctl", fmt.Sprintf("reported by the process (not checked): record %s, version %d, seq %d, updated %s%s",
		q(m.File), r.Version, r.Seq, r.Updated.Format(time.RFC3339), note))
	g := r.GoMemLimit
	lim := "none"
	if g.Bytes != nil {
		lim = size(g.Bytes)
	}
	src := "source " + q(g.Source)
	if g.File != "" {
		src += " " + q(g.File)
	}
	if g.MemoryLimitBytes > 0 {
		src += fmt.Sprintf(", %.2f of %s", g.Ratio, size(&g.MemoryLimitBytes))
	}
	if g.OutsideBytes > 0 {
		src += ", less " + size(&g.OutsideBytes) + " outside the Go runtime"
	}
	refresh := "no refresh"
	if g.RefreshSeconds > 0 {
		refresh = "re-read at GC end at most every " + seconds(g.RefreshSeconds)
	}
	row("  GOMEMLIMIT", lim+"; "+src+"; "+refresh)
	if g.LimitUnknown {
		row("  memory limit", "unknown to the library: none up to the top of its cgroup namespace, which is not the root; a limit may be set above it")
	}
	row("  GOMEMLIMIT reason", q(g.Reason))
	row("  THP", fmt.Sprintf("policy %s, process %s, system %s", q(r.THP.Policy), q(r.THP.State), q(r.THP.System)))
	t := r.Trim
	if t.DelaySeconds <= 0 {
		row("  trims", "off")
	} else {
		row("  trims", fmt.Sprintf("%d run, %d skipped (below the threshold); Go step skipped %d, C step skipped %d; %s released (last %s); %s of CPU; delay %s",
			t.Trims, t.Skipped, t.GoSkipped, t.CSkipped, size(&t.ReleasedBytes), size(&t.LastReleasedBytes),
			seconds(t.CPUSeconds), seconds(t.DelaySeconds)))
		if t.Deferred > 0 || t.EarlyStarts > 0 {
			row("", fmt.Sprintf("%d deferred by the CPU limit, %d started early (CPU cgroup throttled)", t.Deferred, t.EarlyStarts))
		}
	}
	var origins []string
	for _, o := range []struct {
		name string
		o    state.Origin
	}{{"debounced", t.Origins.Debounced}, {"pressure", t.Origins.Pressure}, {"spiral", t.Origins.Spiral}, {"by name", t.Origins.ByName}} {
		origins = append(origins, fmt.Sprintf("%s %d run, %d skipped, %s released, %s of CPU",
			o.name, o.o.Trims, o.o.Skipped, size(&o.o.ReleasedBytes), seconds(o.o.CPUSeconds)))
	}
	row("  trims by origin", strings.Join(origins, "; "))
	sb := t.SkippedBy
	row("  trims skipped by", fmt.Sprintf("min_release %d (too little to release), cost %d (less than the GC is worth), budget %d (2%% CPU budget), running %d (a trim was running)",
		sb.MinRelease, sb.Cost, sb.Budget, sb.Running))
	a := r.AutoBurst
	row("  auto-burst", fmt.Sprintf("%d bursts detected at GC end, %d marked for a trim, %d settled as growth, %d collected outside one; floor %s; %d GC ends seen",
		a.Bursts, a.Marks, a.Settled, a.Drops, size(&a.FloorBytes), a.GCEnds))
	if len(r.Pools) == 0 {
		row("  pools", "none")
	}
	for i, p := range r.Pools {
		label := ""
		if i == 0 {
			label = "  pools"
		}
		lim := "unlimited"
		if p.LimitBytes != nil {
			lim = size(p.LimitBytes)
		}
		row(label, fmt.Sprintf("%s %s, limit %s; used %s, peak %s, %d in flight; %d refused, %d observed, %d canceled",
			q(p.Name), q(p.Mode), lim, size(&p.UsedBytes), size(&p.PeakBytes), p.InFlight, p.Refused, p.Observed, p.Canceled))
		if pk := p.Peaks; pk.Count > 0 {
			row("", fmt.Sprintf("request peaks: %d, p50 %s, p99 %s, max %s", pk.Count, peakBound(pk.P50Bytes), peakBound(pk.P99Bytes), peakBound(pk.MaxBytes)))
		}
		if p.Undercharged > 0 {
			row("", fmt.Sprintf("undercharged: %d GC ends saw far more live heap than the requests were charged (their charges look too small)", p.Undercharged))
		}
	}
	if r.PoolsOmitted > 0 {
		row("", fmt.Sprintf("and %d more", r.PoolsOmitted))
	}
	pr := r.Pressure
	row("  pressure", fmt.Sprintf("%s; %d signals, %d acted on, %d left to the kernel (mostly page cache), %d cancels held; %d GC death spirals, %d GOMEMLIMIT lifts (lifted by %s now)",
		q(pr.Source), pr.Signals, pr.Acted, pr.LeftToKernel, pr.CancelsHeld, pr.Spirals, pr.Lifts, size(&pr.LiftedBytes)))
	if w := r.Swap; w != nil {
		v := "VmSwap " + size(w.VmSwapBytes)
		switch {
		case w.CgroupVersion == 0:
			v += "; cgroup swap not read: " + q(w.Note)
		case w.MemoryPlusSwap:
			v += "; cgroup memory plus swap (v1 memsw) " + size(w.CurrentBytes)
		default:
			v += "; cgroup swap " + size(w.CurrentBytes)
		}
		if w.CgroupVersion != 0 {
			if w.MaxBytes != nil {
				v += ", limit " + size(w.MaxBytes)
			} else {
				v += ", no limit"
			}
			v += " (" + q(w.File) + ")"
		}
		row("  swap", v+"; as of the record's update")
	}
	row("  C heap", q(r.CHeap))
	for i, h := range r.CHeaps {
		label := ""
		if i == 0 {
			label = "  C heaps"
		}
		var what []string
		if h.OwnsMalloc {
			what = append(what, "owns malloc")
		}
		if h.Trimmed {
			what = append(what, "trimmed")
		} else {
			what = append(what, "not trimmed")
		}
		retained := "unknown"
		if h.RetainedBytes >= 0 {
			retained = size(&h.RetainedBytes)
		}
		v := fmt.Sprintf("%s in %s, %s; %d releases, %d skipped, %s released; retained %s",
			q(h.Allocator), q(h.Library), strings.Join(what, ", "), h.Releases, h.Skipped, size(&h.ReleasedBytes), retained)
		if h.Note != "" {
			v += "; " + q(h.Note)
		}
		row(label, v)
	}
	if r.CHeapsOmitted > 0 {
		row("", fmt.Sprintf("and %d more", r.CHeapsOmitted))
	}
}

// peakBound formats the upper bound of a peak histogram's bucket.
func peakBound(b int64) string {
	if b == math.MaxInt64 {
		return "over 64 GiB"
	}
	return "<= " + size(&b)
}

// seconds formats a count of seconds (float64) as a duration.
func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}
