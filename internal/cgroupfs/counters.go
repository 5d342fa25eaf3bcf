package cgroupfs

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/safefs"
)

// maxEventsFile bounds a memory.events file (six short lines).
const maxEventsFile = 64 << 10

// Events holds the counters of a cgroup v2 memory.events file
// (cgroup-v2.rst "memory.events"): counts since the cgroup was created; a
// counter the file lacks (oom_kill before Linux 4.13, oom_group_kill
// before 5.17) is -1, never read as zero.
type Events struct {
	Low          int64 // reclaims while under memory.low
	High         int64 // times over memory.high, throttled
	Max          int64 // times about to go over memory.max
	OOM          int64 // times the limit was reached and allocation failed
	OOMKill      int64 // processes killed by an OOM killer
	OOMGroupKill int64 // group OOM kills (memory.oom.group)
}

// eventKeys are the counters Events holds, in the kernel's order.
var eventKeys = [...]string{"low", "high", "max", "oom", "oom_kill", "oom_group_kill"}

// All yields each counter under its memory.events key, in the kernel's
// order; an absent counter yields -1.
func (e Events) All() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		for _, k := range eventKeys {
			if !yield(k, *e.field(k)) {
				return
			}
		}
	}
}

func (e *Events) field(key string) *int64 {
	if i := slices.Index(eventKeys[:], key); i >= 0 {
		return [...]*int64{&e.Low, &e.High, &e.Max, &e.OOM, &e.OOMKill, &e.OOMGroupKill}[i]
	}
	return nil
}

// ReadEvents reads and parses memory.events at path. Safe for concurrent use.
func ReadEvents(path string) (Events, error) {
	f, err := os.Open(path)
	if err != nil {
		return missingEvents(), fmt.Errorf("cgroupfs: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEventsFile+1))
	if err != nil {
		return missingEvents(), fmt.Errorf("cgroupfs: %s: %w", path, err)
	}
	return ParseEvents(b, path)
}

// ParseEvents parses memory.events lines ("key count") in b; name is used
// in errors. Unknown keys are skipped; a bad or repeated count, no known
// key, or over 64 KiB is an error naming the line, all counters -1.
func ParseEvents(b []byte, name string) (Events, error) {
	fail := func(format string, args ...any) (Events, error) {
		return missingEvents(), fmt.Errorf("cgroupfs: %s: "+format, append([]any{name}, args...)...)
	}
	if len(b) > maxEventsFile {
		return fail("over %d bytes, not a memory.events file", maxEventsFile)
	}
	e, found := missingEvents(), 0
	for n, rest := 1, b; len(rest) > 0; n++ {
		var line []byte
		line, rest = nextLine(rest)
		key, val, ok := strings.Cut(string(line), " ")
		p := e.field(key)
		switch {
		case len(line) == 0:
			continue
		case p == nil && (!ok || key == ""):
			return fail("line %d: malformed, want \"key count\": %q", n, line)
		case p == nil:
			continue
		case !ok || !isDecimal(val):
			return fail("line %d: malformed count, want decimal digits: %q", n, line)
		}
		v, ok := parseDecimal([]byte(val))
		switch {
		case !ok:
			return fail("line %d: count out of range: %q", n, line)
		case *p != -1:
			return fail("line %d: %s given twice", n, key)
		}
		*p, found = v, found+1
	}
	if found == 0 {
		return fail("none of %s: not a memory.events file", strings.Join(eventKeys[:], ", "))
	}
	return e, nil
}

func missingEvents() Events { return Events{-1, -1, -1, -1, -1, -1} }

// Swap is the swap accounting of one cgroup, in bytes (cgroup-v2.rst
// "memory.swap.current", "memory.swap.max"; cgroup-v1/memory.rst 2.4): v2
// Current covers the cgroup and its descendants, Max is the cgroup's own
// limit; v1's memsw files count memory plus swap (MemoryPlusSwap). The
// files are absent without per-cgroup swap accounting.
type Swap struct {
	Version              int   // 1 or 2
	Current              int64 // never negative
	Max                  int64 // NoLimit when unset
	CurrentFile, MaxFile string
	MemoryPlusSwap       bool // v1
}

// SwapFiles returns the base names of the swap files of a cgroup of the
// given version (1 or 2): usage first, then limit.
func SwapFiles(version int) (current, max string) {
	if version == 1 {
		return "memory.memsw.usage_in_bytes", "memory.memsw.limit_in_bytes"
	}
	return "memory.swap.current", "memory.swap.max"
}

// ParseSwap parses the two swap files of a cgroup of version 1 or 2:
// current (decimal bytes and a newline) and max (bytes, or "max" in v2,
// and a newline), read from currentFile and maxFile. Anything else is an
// error that names the file and quotes the value.
func ParseSwap(version int, current, max []byte, currentFile, maxFile string) (Swap, error) {
	if version != 1 && version != 2 {
		return Swap{}, fmt.Errorf("cgroupfs: swap: cgroup version %d, want 1 or 2", version)
	}
	s := Swap{Version: version, CurrentFile: currentFile, MaxFile: maxFile, MemoryPlusSwap: version == 1}
	var err error
	if s.Current, err = ParseKmemUsage(current, currentFile); err != nil {
		return Swap{}, err
	}
	m, ok := strings.CutSuffix(string(max), "\n")
	if !ok || strings.ContainsAny(m, " \t\n") {
		return Swap{}, fmt.Errorf("cgroupfs: %s: malformed limit %s, want one value and a newline",
			safefs.Quote(maxFile), safefs.Quote(string(max)))
	}
	if s.Max, err = parseLimit(m, version == 2); err != nil {
		return Swap{}, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(maxFile), err)
	}
	return s, nil
}

// ReadSwap reads the swap files of the cgroup directory dir as readIn
// reads, and parses them with ParseSwap; the error matches fs.ErrNotExist
// without swap accounting. Safe for concurrent use.
func ReadSwap(version int, dir string) (Swap, error) {
	d, err := openCgroupDir(dir)
	if err != nil {
		return Swap{}, err
	}
	defer d.Close()
	return ReadSwapAt(d, version, ".", dir)
}

// ReadSwapAt reads the swap files of the cgroup directory rel inside root
// (memctl status: the process's root), naming them under full.
func ReadSwapAt(root *safefs.Dir, version int, rel, full string) (Swap, error) {
	cur, max := SwapFiles(version)
	c, err := root.ReadFile(rel+"/"+cur, safefs.MaxCgroupFile)
	if err != nil {
		return Swap{}, fmt.Errorf("cgroupfs: %w", err)
	}
	m, err := root.ReadFile(rel+"/"+max, safefs.MaxCgroupFile)
	if err != nil {
		return Swap{}, fmt.Errorf("cgroupfs: %w", err)
	}
	return ParseSwap(version, c, m, full+"/"+cur, full+"/"+max)
}

// ErrNoThrottleCounter is matched by the error of CPUStatFile when the
// process has no CPU cgroup here, and of ParseThrottled when a cpu.stat
// holds no throttled time (v2 without the cpu controller).
var ErrNoThrottleCounter = errors.New("cgroupfs: no CPU throttling counter")

// CPUStatFile returns the cpu.stat file of the process's CPU cgroup
// (arguments as for Read): v1's when listed and mounted, else v2's; with
// neither the error matches ErrNoThrottleCounter. Safe for concurrent use.
func CPUStatFile(cgroupFile, mountinfoFile, root string) (string, error) {
	s, err := openSource(cgroupFile, mountinfoFile, root)
	if err != nil {
		return "", err
	}
	defer s.close()
	v1, v2, err := s.parseCgroupFile("cpu")
	if err != nil {
		return "", err
	}
	mounts, err := s.parseMountinfoFile()
	if err != nil {
		return "", err
	}
	var why []string
	if v1 != "" {
		cands, err := cgroupDirs(mounts, v1, func(m mount) bool { return isV1(m, "cpu") }, root)
		if err == nil {
			return filepath.Join(cands[0].dir, "cpu.stat"), nil
		}
		why = append(why, "v1 cpu: "+err.Error())
	}
	if v2 != "" {
		cands, err := cgroupDirs(mounts, v2, isV2, root)
		if err == nil {
			return filepath.Join(cands[0].dir, "cpu.stat"), nil
		}
		why = append(why, "v2: "+err.Error())
	}
	if len(why) == 0 {
		why = append(why, cgroupFile+" lists neither the cpu controller nor a cgroup v2 hierarchy")
	}
	return "", fmt.Errorf("%w: %s", ErrNoThrottleCounter, strings.Join(why, "; "))
}

// ReadThrottled reads and parses cpu.stat at path. Safe for concurrent use.
func ReadThrottled(path string) (time.Duration, error) {
	b, err := readIn("/", path)
	if err != nil {
		return 0, err
	}
	return ParseThrottled(b, path)
}

// ParseThrottled parses a cpu.stat file ("key value" lines) and returns
// the time the CFS bandwidth controller held the cgroup throttled, summed
// over CPUs: v1 throttled_time (ns, sched-bwc.rst) or v2 throttled_usec.
// Neither gives ErrNoThrottleCounter; a malformed, negative or overflowing
// value an error quoting the line.
func ParseThrottled(b []byte, name string) (time.Duration, error) {
	for n, rest := 1, b; len(rest) > 0; n++ {
		var raw []byte
		raw, rest = nextLine(rest)
		line := string(raw)
		if line == "" {
			continue
		}
		key, val, ok := strings.Cut(line, " ")
		if !ok || key == "" {
			return 0, fmt.Errorf("cgroupfs: %s: line %d: malformed, want \"key value\": %s", name, n, safefs.Quote(line))
		}
		var unit time.Duration
		switch key {
		case "throttled_time":
			unit = time.Nanosecond
		case "throttled_usec":
			unit = time.Microsecond
		default:
			continue
		}
		v, err := strconv.ParseInt(val, 10, 64)
		if err != nil || v < 0 || v > int64(1<<63-1)/int64(unit) {
			return 0, fmt.Errorf("cgroupfs: %s: line %d: %s is not a count of %v that fits in int64 nanoseconds: %s", name, n, key, unit, safefs.Quote(line))
		}
		return time.Duration(v) * unit, nil
	}
	return 0, fmt.Errorf("%w: %s has neither throttled_time (v1) nor throttled_usec (v2; the cpu controller is not enabled)", ErrNoThrottleCounter, name)
}
