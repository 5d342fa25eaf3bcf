package cgroupfs

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// Swap is the swap accounting of one cgroup: what it has in swap and the
// swap it may use. memory.max does not count swap in cgroup v2 (a heap the
// kernel pushed to swap is under memory.max but still the process's), so
// GOMEMLIMIT is never taken from these files: they are shown, so that an
// operator sees a heap pushed to swap (Kubernetes NodeSwap).
//
// The files are the kernel's (Documentation/admin-guide/cgroup-v2.rst,
// "memory.swap.current", "memory.swap.max"; cgroup-v1/memory.rst, 2.4
// "swap extension"):
//
//   - v2: Current is memory.swap.current, the swap used by the cgroup and
//     its descendants; Max is the cgroup's own memory.swap.max ("max" is
//     NoLimit). An ancestor's memory.swap.max may be tighter; it is not
//     read here.
//   - v1: Current is memory.memsw.usage_in_bytes and Max
//     memory.memsw.limit_in_bytes (NoLimit when unset): memory plus swap
//     together (MemoryPlusSwap is true), not swap alone.
//
// The files are absent where the kernel does not account swap per cgroup
// (built without CONFIG_MEMCG_SWAP, booted with swapaccount=0, or v1
// without the memsw files): the error of ReadSwap then matches
// fs.ErrNotExist.
type Swap struct {
	// Version is the cgroup version, 1 or 2.
	Version int
	// Current is in bytes, never negative.
	Current int64
	// Max is in bytes, NoLimit (-1) when no limit is set.
	Max int64
	// CurrentFile and MaxFile are the files read.
	CurrentFile, MaxFile string
	// MemoryPlusSwap is true in v1, whose files count memory and swap
	// together.
	MemoryPlusSwap bool
}

// SwapFiles returns the base names of the swap files of a cgroup of the
// given version (1 or 2): usage first, then limit.
func SwapFiles(version int) (current, max string) {
	if version == 1 {
		return "memory.memsw.usage_in_bytes", "memory.memsw.limit_in_bytes"
	}
	return "memory.swap.current", "memory.swap.max"
}

// ParseSwap parses the contents of the two swap files of a cgroup of the
// given version (1 or 2): current, read from currentFile, and max, read
// from maxFile (the names are used in errors and kept in the result). A
// usage must be decimal bytes and a newline; a limit decimal bytes or, in
// v2, "max" (v1 writes an unset limit as a number of 4 EiB or more, which
// is NoLimit, as for memory.limit_in_bytes). Anything else, a value over
// math.MaxInt64, or a version other than 1 or 2, is an error that names
// the file and quotes the value.
func ParseSwap(version int, current, max []byte, currentFile, maxFile string) (Swap, error) {
	if version != 1 && version != 2 {
		return Swap{}, fmt.Errorf("cgroupfs: swap: cgroup version %d, want 1 or 2", version)
	}
	s := Swap{Version: version, CurrentFile: currentFile, MaxFile: maxFile, MemoryPlusSwap: version == 1}
	var err error
	if s.Current, err = ParseKmemUsage(string(current), currentFile); err != nil {
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

// ReadSwap reads the swap files of the cgroup directory dir of the given
// version (see Swap) as ReadMemoryStat reads memory.stat (through package
// safefs: no symlink, regular files of a cgroup file system only, at most
// safefs.MaxCgroupFile bytes each) and parses them with ParseSwap. The
// error names the file, and matches fs.ErrNotExist when a file is absent
// (no swap accounting). It only reads, so it is safe for concurrent use;
// it costs two small reads (tens of microseconds).
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

// ReadSwapAt reads the swap files of a cgroup named by their paths rel
// relative to root (RESOLVE_IN_ROOT in the caller's Dir), naming them
// with full, for memctl status: root is the process's root, rel its
// cgroup directory.
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
