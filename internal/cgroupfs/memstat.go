package cgroupfs

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// MemoryStat holds the figures of a cgroup's memory.stat that tell what
// the cgroup is charged for, in bytes, under the kernel's names
// (Documentation/admin-guide/cgroup-v2.rst "memory.stat"; cgroup-v1/
// memory.rst 5.2, where a "total_" line, hierarchical, wins over its plain
// twin). A figure the file does not have is -1, never read as zero. The
// zero value is not a parsed file; see ParseMemoryStat.
type MemoryStat struct {
	Version                  int   // 1 ("rss"/"cache" names) or 2 ("anon"/"file")
	Anon                     int64 // v2 "anon", v1 "rss": anonymous memory, not shmem
	File                     int64 // v2 "file", v1 "cache": file-backed, shmem and tmpfs included
	Shmem                    int64 // "shmem": part of File, on the anon LRU lists
	ActiveFile, InactiveFile int64 // the file LRU lists: page cache the kernel reclaims
	ActiveAnon, InactiveAnon int64 // the anon LRU lists, shmem included
	Unevictable              int64 // mlocked pages, ramfs, SHM_LOCK
	// The v2 kernel-memory lines: "kernel" (all of it, Linux 5.18+),
	// "slab_reclaimable", "slab_unreclaimable", "kernel_stack",
	// "pagetables", "sec_pagetables", "percpu", "sock", "vmalloc".
	Kernel, SlabReclaimable, SlabUnreclaimable                    int64
	KernelStack, PageTables, SecPageTables, Percpu, Sock, Vmalloc int64
	// Hugetlb is v2 "hugetlb" (with memory_hugetlb_accounting, Linux
	// 6.6+): in neither Anon nor File, never reclaimed.
	Hugetlb int64
}

// Reclaimable returns the page cache the kernel can reclaim, ActiveFile +
// InactiveFile in bytes (shmem is not on the file lists), or -1 when the
// file has neither.
func (m MemoryStat) Reclaimable() int64 {
	return sumKnown(m.ActiveFile, m.InactiveFile)
}

// KernelUnreclaimable returns the kernel memory charged to the cgroup that
// the kernel cannot reclaim, in bytes: Kernel − SlabReclaimable + Sock
// (sockets are charged beside "kernel", mm/memcontrol.c), or without a
// "kernel" line the sum of the unreclaimable lines there are; -1 when all
// are absent (v1: see ReadKmemUsage).
func (m MemoryStat) KernelUnreclaimable() int64 {
	if m.Kernel >= 0 {
		return max(m.Kernel-max(m.SlabReclaimable, 0), 0) + max(m.Sock, 0)
	}
	return sumKnown(m.SlabUnreclaimable, m.KernelStack, m.PageTables, m.SecPageTables, m.Percpu, m.Vmalloc, m.Sock)
}

// FileUnreclaimable returns the file-backed memory on neither file LRU list
// (shmem, tmpfs, ramfs, mlocked files), which the kernel cannot reclaim as
// page cache, in bytes: File − ActiveFile − InactiveFile, never less than
// Shmem; Shmem without the LRU lines; -1 when the file has none of them.
func (m MemoryStat) FileUnreclaimable() int64 {
	if m.File >= 0 && m.ActiveFile >= 0 && m.InactiveFile >= 0 {
		return max(m.File-m.ActiveFile-m.InactiveFile, m.Shmem, 0)
	}
	return m.Shmem
}

// sumKnown sums the values that are not -1; -1 when all are.
func sumKnown(vs ...int64) int64 {
	sum, any := int64(0), false
	for _, v := range vs {
		if v >= 0 {
			sum, any = sum+v, true
		}
	}
	if !any {
		return -1
	}
	return sum
}

func missingMemoryStat() MemoryStat {
	return MemoryStat{
		Anon: -1, File: -1, Shmem: -1, ActiveFile: -1, InactiveFile: -1,
		ActiveAnon: -1, InactiveAnon: -1, Unevictable: -1, Kernel: -1,
		SlabReclaimable: -1, SlabUnreclaimable: -1, KernelStack: -1,
		PageTables: -1, SecPageTables: -1, Percpu: -1, Sock: -1, Vmalloc: -1,
		Hugetlb: -1,
	}
}

// statFields maps each memory.stat key MemoryStat holds, without any
// "total_" prefix, to its figure and the version whose name it is (0: both).
var statFields = map[string]struct {
	p   func(*MemoryStat) *int64
	ver int
}{
	"anon":               {func(m *MemoryStat) *int64 { return &m.Anon }, 2},
	"rss":                {func(m *MemoryStat) *int64 { return &m.Anon }, 1},
	"file":               {func(m *MemoryStat) *int64 { return &m.File }, 2},
	"cache":              {func(m *MemoryStat) *int64 { return &m.File }, 1},
	"shmem":              {func(m *MemoryStat) *int64 { return &m.Shmem }, 0},
	"active_file":        {func(m *MemoryStat) *int64 { return &m.ActiveFile }, 0},
	"inactive_file":      {func(m *MemoryStat) *int64 { return &m.InactiveFile }, 0},
	"active_anon":        {func(m *MemoryStat) *int64 { return &m.ActiveAnon }, 0},
	"inactive_anon":      {func(m *MemoryStat) *int64 { return &m.InactiveAnon }, 0},
	"unevictable":        {func(m *MemoryStat) *int64 { return &m.Unevictable }, 0},
	"kernel":             {func(m *MemoryStat) *int64 { return &m.Kernel }, 2},
	"slab_reclaimable":   {func(m *MemoryStat) *int64 { return &m.SlabReclaimable }, 2},
	"slab_unreclaimable": {func(m *MemoryStat) *int64 { return &m.SlabUnreclaimable }, 2},
	"kernel_stack":       {func(m *MemoryStat) *int64 { return &m.KernelStack }, 2},
	"pagetables":         {func(m *MemoryStat) *int64 { return &m.PageTables }, 2},
	"sec_pagetables":     {func(m *MemoryStat) *int64 { return &m.SecPageTables }, 2},
	"percpu":             {func(m *MemoryStat) *int64 { return &m.Percpu }, 2},
	"sock":               {func(m *MemoryStat) *int64 { return &m.Sock }, 2},
	"vmalloc":            {func(m *MemoryStat) *int64 { return &m.Vmalloc }, 2},
	"hugetlb":            {func(m *MemoryStat) *int64 { return &m.Hugetlb }, 2},
}

// ParseMemoryStat parses a memory.stat file from r; name is used in
// errors. Each line is "key value" (key: [a-z0-9_], value: decimal);
// unknown keys are skipped. Another shape, a value over math.MaxInt64, a
// key given twice, v1 and v2 names mixed, neither "anon" nor "rss", or over
// safefs.MaxCgroupFile bytes is an error naming the line, with every
// figure -1.
func ParseMemoryStat(r io.Reader, name string) (MemoryStat, error) {
	b, err := io.ReadAll(io.LimitReader(r, safefs.MaxCgroupFile+1))
	if err != nil {
		return missingMemoryStat(), fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	if len(b) > safefs.MaxCgroupFile {
		return missingMemoryStat(), fmt.Errorf("cgroupfs: %s: over %d bytes, not a memory.stat file", name, safefs.MaxCgroupFile)
	}
	return parseMemoryStat(b, name)
}

func parseMemoryStat(b []byte, name string) (MemoryStat, error) {
	m := missingMemoryStat()
	fail := func(format string, args ...any) (MemoryStat, error) {
		return missingMemoryStat(), fmt.Errorf("cgroupfs: %s: "+format, append([]any{safefs.Quote(name)}, args...)...)
	}
	seen := make(map[string]bool)
	fromTotal := make(map[*int64]bool) // figures set from a v1 total_ line
	sc := lines(bytes.NewReader(b))
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		key, val, ok := strings.Cut(line, " ")
		if !ok || !isStatKey(key) || !isDecimal(val) {
			return fail("line %d: malformed, want \"key bytes\": %s", n, safefs.Quote(line))
		}
		if seen[key] {
			return fail("line %d: %s given twice", n, safefs.Quote(key))
		}
		seen[key] = true
		base, total := strings.CutPrefix(key, "total_")
		f, ok := statFields[base]
		if !ok || (total && f.ver == 2) {
			continue // v2 has no total_ lines: total_anon is not anon
		}
		p, ver := f.p(&m), f.ver
		v, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return fail("line %d: value out of range: %s", n, safefs.Quote(line))
		}
		if total {
			ver = 1
		}
		if ver != 0 {
			if m.Version != 0 && m.Version != ver {
				return fail("line %d: %s mixes cgroup v1 and v2 names", n, safefs.Quote(key))
			}
			m.Version = ver
		}
		switch {
		case total:
			*p, fromTotal[p] = v, true
		case !fromTotal[p]:
			*p = v
		}
	}
	if err := sc.Err(); err != nil {
		return fail("%w", err)
	}
	if m.Anon < 0 {
		return fail("neither \"anon\" (v2) nor \"rss\" (v1): not a memory.stat file")
	}
	return m, nil
}

// isStatKey reports whether s is made of [a-z0-9_], as the kernel writes keys.
func isStatKey(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// readIn reads file name of cgroup directory dir, safely (see the package
// doc); an absent file matches fs.ErrNotExist.
func readIn(dir, name string) ([]byte, error) {
	d, err := safefs.OpenDir(dir, safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	defer d.Close()
	d.FSTypes = FSTypes
	b, err := d.ReadFile(name, safefs.MaxCgroupFile)
	if err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	return b, nil
}

// ReadMemoryStat reads and parses dir's memory.stat. Safe for concurrent use.
func ReadMemoryStat(dir string) (MemoryStat, error) {
	b, err := readIn(dir, "memory.stat")
	if err != nil {
		return missingMemoryStat(), err
	}
	return parseMemoryStat(b, filepath.Join(dir, "memory.stat"))
}

// ReadKmemUsage reads v1 memory.kmem.usage_in_bytes of dir: kernel memory
// of the cgroup and its descendants, in bytes, reclaimable slab included,
// so it errs high (cgroup-v1/memory.rst 2.7). Safe for concurrent use.
func ReadKmemUsage(dir string) (int64, error) {
	b, err := readIn(dir, "memory.kmem.usage_in_bytes")
	if err != nil {
		return 0, err
	}
	return ParseKmemUsage(string(b), filepath.Join(dir, "memory.kmem.usage_in_bytes"))
}

// ReadUsage reads dir's memory.usage_in_bytes (v1) or memory.current (v2),
// in bytes, page cache included, and the file's path. Safe for concurrent use.
func ReadUsage(version int, dir string) (int64, string, error) {
	name := "memory.usage_in_bytes"
	if version == 2 {
		name = "memory.current"
	}
	file := filepath.Join(dir, name)
	b, err := readIn(dir, name)
	if err != nil {
		return 0, file, err
	}
	n, err := ParseKmemUsage(string(b), file)
	return n, file, err
}

// ParseKmemUsage parses a cgroup usage counter (memory.kmem.usage_in_bytes,
// memory.usage_in_bytes, memory.current): decimal bytes and a newline;
// anything else is an error naming name and quoting it.
func ParseKmemUsage(s, name string) (int64, error) {
	v := strings.TrimSuffix(s, "\n")
	if !isDecimal(v) {
		return 0, fmt.Errorf("cgroupfs: %s: malformed usage %s, want bytes", safefs.Quote(name), safefs.Quote(s))
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroupfs: %s: usage out of range: %s", safefs.Quote(name), safefs.Quote(s))
	}
	return n, nil
}
