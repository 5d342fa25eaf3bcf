package cgroupfs

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

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
	d, err := safefs.OpenDir(dir, safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return Swap{}, fmt.Errorf("cgroupfs: %w", err)
	}
	defer d.Close()
	d.FSTypes = FSTypes
	cur, max := SwapFiles(version)
	return readSwapNames(d, version, cur, max, filepath.Join(dir, cur), filepath.Join(dir, max))
}

// ReadSwapAt reads the swap files of the cgroup directory rel inside root
// (memctl status: the process's root), naming them under full.
func ReadSwapAt(root *safefs.Dir, version int, rel, full string) (Swap, error) {
	cur, max := SwapFiles(version)
	return readSwapNames(root, version, rel+"/"+cur, rel+"/"+max, full+"/"+cur, full+"/"+max)
}

func readSwapNames(d *safefs.Dir, version int, cur, max, curFile, maxFile string) (Swap, error) {
	c, err := d.ReadFile(cur, safefs.MaxCgroupFile)
	if err != nil {
		return Swap{}, fmt.Errorf("cgroupfs: %w", err)
	}
	m, err := d.ReadFile(max, safefs.MaxCgroupFile)
	if err != nil {
		return Swap{}, fmt.Errorf("cgroupfs: %w", err)
	}
	return ParseSwap(version, c, m, curFile, maxFile)
}
