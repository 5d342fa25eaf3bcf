package realsvc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// 100 on Linux (proc(5): sysconf(_SC_CLK_TCK)).
const clockTick = 10 * time.Millisecond

// CPUTime returns the CPU time the process has used, utime + stime from
// /proc/PID/stat (fields 14 and 15, counted after the command name's
// closing parenthesis).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseCPUTime(b)
}

func parseCPUTime(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("realsvc: /proc/PID/stat: no ')' in %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("realsvc: /proc/PID/stat: %d fields after the name", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || u < 0 || s < 0 {
		return 0, fmt.Errorf("realsvc: /proc/PID/stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(u+s) * clockTick, nil
}

// Status holds the memory lines of /proc/PID/status, in bytes.
type Status struct {
	VmRSS, VmHWM, RssAnon, RssFile, RssShmem int64
}

// ReadStatus reads /proc/PID/status.
func ReadStatus(pid int) (Status, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Status{}, err
	}
	var s Status
	fields := map[string]*int64{"VmRSS": &s.VmRSS, "VmHWM": &s.VmHWM, "RssAnon": &s.RssAnon, "RssFile": &s.RssFile, "RssShmem": &s.RssShmem}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		p := fields[k]
		if !ok || p == nil {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return s, fmt.Errorf("realsvc: /proc/%d/status: %q", pid, sc.Text())
		}
		*p = kb << 10
	}
	if s.VmRSS == 0 {
		return s, fmt.Errorf("realsvc: /proc/%d/status: no VmRSS (a zombie?)", pid)
	}
	return s, nil
}

// Stat reads a cgroup v1 memory.stat: the hierarchical total_ figures
// under their plain names (rss, cache, shmem, mapped_file, ...), in bytes.
func Stat(dir string) (map[string]int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("realsvc: %s/memory.stat: %q", dir, line)
		}
		if name, total := strings.CutPrefix(k, "total_"); total {
			m[name] = n
		} else if _, seen := m[k]; !seen {
			m[k] = n
		}
	}
	return m, nil
}

// Held is what a cgroup holds outside the Go runtime of the one pure-Go
// process in it, in bytes, as the kernel accounts it:
//
//   - AnonOutside: anonymous memory of the cgroup not mapped by the
//     process (memory.stat total_rss less its RssAnon). A pure-Go
//     process's own anonymous memory is all the Go runtime's (heap,
//     stacks, runtime metadata): no C heap to count.
//   - Shmem: shmem and tmpfs (total_shmem); the kernel cannot reclaim it
//     without swap.
//   - Kernel: kernel memory (memory.kmem.usage_in_bytes). v1 does not say
//     which part of it is reclaimable slab (dentries, inodes), so it is
//     counted whole as the upper end and not at all as the lower.
//
// Not held: page cache (total_cache less shmem), mapped or not
// (MappedFile is shown apart): the kernel reclaims it at the limit.
type Held struct {
	AnonOutside, Shmem, Kernel int64
	// Shown, not held.
	MappedFile, Cache, Usage int64
}

// Low is what is surely held: AnonOutside + Shmem.
func (h Held) Low() int64 { return h.AnonOutside + h.Shmem }

// High adds all of the kernel memory: Low + Kernel.
func (h Held) High() int64 { return h.Low() + h.Kernel }

func (h Held) String() string {
	return fmt.Sprintf("anon outside the process %s + shmem %s + kernel %s (mapped files %s and page cache %s not held; usage %s)",
		MiB(h.AnonOutside), MiB(h.Shmem), MiB(h.Kernel), MiB(h.MappedFile), MiB(h.Cache), MiB(h.Usage))
}

// ReadHeld reads Held for the cgroup v1 directory dir and the process pid
// in it.
func ReadHeld(dir string, pid int) (Held, error) {
	st, err := Stat(dir)
	if err != nil {
		return Held{}, err
	}
	ps, err := ReadStatus(pid)
	if err != nil {
		return Held{}, err
	}
	kmem, err := readInt(filepath.Join(dir, "memory.kmem.usage_in_bytes"))
	if err != nil {
		return Held{}, err
	}
	usage, err := readInt(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return Held{}, err
	}
	return Held{
		AnonOutside: max(st["rss"]-ps.RssAnon, 0),
		Shmem:       st["shmem"],
		Kernel:      kmem,
		MappedFile:  st["mapped_file"],
		Cache:       st["cache"],
		Usage:       usage,
	}, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Record is the part of memctl's state record (`memctl status -json`,
// docs/command.md) that the suite reads.
type Record struct {
	GOMEMLIMIT struct {
		Bytes        int64  `json:"bytes"`
		OutsideBytes int64  `json:"outside_bytes"`
		Reason       string `json:"reason"`
	} `json:"gomemlimit"`
	Trim struct {
		Trims         int64            `json:"trims"`
		Skipped       int64            `json:"skipped"`
		ReleasedBytes int64            `json:"released_bytes"`
		CPUSeconds    float64          `json:"cpu_seconds"`
		SkippedBy     map[string]int64 `json:"skipped_by"`
	} `json:"trim"`
	AutoBurst struct {
		Bursts int64 `json:"bursts"`
	} `json:"auto_burst"`
}

// ReadRecord runs `memctl status -json -pid PID` with the memctl command
// at bin and returns the library's record; an error when the process has
// none.
func ReadRecord(bin string, pid int) (Record, error) {
	var r Record
	out, err := exec.Command(bin, "status", "-json", "-pid", strconv.Itoa(pid)).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%v: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return r, fmt.Errorf("realsvc: memctl status -pid %d: %w", pid, err)
	}
	var doc struct {
		Memctl *json.RawMessage `json:"memctl"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return r, fmt.Errorf("realsvc: memctl status -json: %w", err)
	}
	if doc.Memctl == nil {
		return r, fmt.Errorf("realsvc: memctl status -pid %d: the process has no memctl record", pid)
	}
	if err := json.Unmarshal(*doc.Memctl, &r); err != nil {
		return r, fmt.Errorf("realsvc: memctl status -json: %w", err)
	}
	return r, nil
}

// MiB formats bytes as mebibytes with one decimal.
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", mib(b)) }

func mib(b int64) float64 { return float64(b) / (1 << 20) }
