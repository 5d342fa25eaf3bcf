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

// MemoryStat holds the figures of a cgroup's memory.stat file that tell
// what the cgroup is charged for: anonymous memory, page cache, shmem and
// tmpfs, and kernel memory. Every figure is in bytes, never negative; a
// figure the file does not have (a v1 file has no kernel-memory lines, an
// older kernel lacks some v2 lines) is -1, so that absent is never read as
// zero.
//
// The field names are the kernel's:
//
//   - cgroup v2: Documentation/admin-guide/cgroup-v2.rst, "memory.stat".
//     The figures are hierarchical (the cgroup and its descendants).
//   - cgroup v1: Documentation/admin-guide/cgroup-v1/memory.rst, section
//     5.2 "stat file". A plain line ("rss") counts the cgroup's own pages,
//     its "total_" twin ("total_rss") the cgroup and its descendants
//     (hierarchical); the total_ line is taken when the file has it.
//
// The zero value is not a parsed file (every figure 0); see ParseMemoryStat.
type MemoryStat struct {
	// Version is the cgroup version whose names the file uses: 1 (v1
	// "rss"/"cache") or 2 (v2 "anon"/"file").
	Version int
	// Anon is anonymous memory, not shmem: v2 "anon" ("anonymous mappings
	// such as brk(), sbrk(), and mmap(MAP_ANONYMOUS)"), v1 "rss" ("anonymous
	// and swap cache memory (includes transparent hugepages)").
	Anon int64
	// File is all file-backed memory, shmem and tmpfs included: v2 "file"
	// ("filesystem data, including tmpfs and shared memory"), v1 "cache"
	// ("page cache, including tmpfs (shmem)").
	File int64
	// Shmem is shmem, tmpfs and shared anonymous mappings (v2 and v1
	// "shmem"). It is part of File but lives on the anon LRU lists: it is
	// not reclaimed unless swapped out.
	Shmem int64
	// ActiveFile and InactiveFile are the file-backed pages on the file
	// LRU lists ("active_file", "inactive_file"): the page cache the
	// kernel reclaims under pressure. Shmem is not on these lists.
	ActiveFile, InactiveFile int64
	// ActiveAnon and InactiveAnon are the anon LRU lists ("active_anon",
	// "inactive_anon"), shmem included.
	ActiveAnon, InactiveAnon int64
	// Unevictable is memory that cannot be reclaimed at all
	// ("unevictable": mlocked pages, ramfs, SHM_LOCK).
	Unevictable int64
	// Kernel is v2 "kernel", all kernel memory (Linux 5.18 and later).
	Kernel int64
	// SlabReclaimable and SlabUnreclaimable are v2 "slab_reclaimable"
	// (dentries, inodes) and "slab_unreclaimable".
	SlabReclaimable, SlabUnreclaimable int64
	// KernelStack, PageTables, SecPageTables, Percpu, Sock and Vmalloc are
	// the v2 lines of the same names ("kernel_stack", "pagetables",
	// "sec_pagetables", "percpu", "sock", "vmalloc"): kernel memory the
	// kernel cannot reclaim.
	KernelStack, PageTables, SecPageTables, Percpu, Sock, Vmalloc int64
	// Hugetlb is v2 "hugetlb", HugeTLB pages charged to the cgroup: the
	// line is there only when the cgroup2 hierarchy is mounted with
	// memory_hugetlb_accounting (Linux 6.6 and later), which charges them
	// to memory.current. They are in neither Anon nor File, and are never
	// reclaimed.
	Hugetlb int64
}

// Reclaimable returns the page cache the kernel can reclaim, ActiveFile +
// InactiveFile in bytes (shmem is not on the file lists), or -1 when the
// file has neither.
func (m MemoryStat) Reclaimable() int64 {
	return sumKnown(m.ActiveFile, m.InactiveFile)
}

// KernelUnreclaimable returns the kernel memory the cgroup is charged for
// that the kernel cannot reclaim, in bytes. With a "kernel" line (Linux
// 5.18 and later) it is Kernel − SlabReclaimable + Sock: "kernel" is all the
// kernel memory charged to the cgroup (every __GFP_ACCOUNT allocation and
// object: slab, stacks, page tables, per-cpu, vmalloc, zswap's compressed
// pages, pipe buffers and the rest that has no line of its own), and socket
// buffers are charged beside it, not in it (mm/memcontrol.c: MEMCG_KMEM is
// counted by memcg_account_kmem, MEMCG_SOCK by mem_cgroup_charge_skmem).
// Without it (older kernels), the sum of the lines there are:
// SlabUnreclaimable + KernelStack + PageTables + SecPageTables + Percpu +
// Vmalloc + Sock, the absent ones left out; -1 when all are absent (a v1
// file, whose kernel memory is in memory.kmem.usage_in_bytes, not
// memory.stat).
func (m MemoryStat) KernelUnreclaimable() int64 {
	if m.Kernel >= 0 {
		return max(m.Kernel-max(m.SlabReclaimable, 0), 0) + max(m.Sock, 0)
	}
	return sumKnown(m.SlabUnreclaimable, m.KernelStack, m.PageTables, m.SecPageTables, m.Percpu, m.Vmalloc, m.Sock)
}

// FileUnreclaimable returns the file-backed memory the cgroup is charged
// for that is on neither file LRU list, so the kernel cannot reclaim it as
// page cache, in bytes: File − ActiveFile − InactiveFile, and never less
// than Shmem. That is shmem and tmpfs (on the anon lists), ramfs and other
// unevictable file pages (mlocked files, SHM_LOCK; ramfs writes its pages
// as "cache"/"file" and "unevictable", not "shmem"), and the few pages off
// the lists for a moment (isolated for reclaim or migration). Without the
// LRU lines it is Shmem; -1 when the file has none of these lines.
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

// field returns the figure of m for a memory.stat key without any
// "total_" prefix, and the version whose name it is (0 for both).
func (m *MemoryStat) field(key string) (*int64, int) {
	switch key {
	case "anon":
		return &m.Anon, 2
	case "rss":
		return &m.Anon, 1
	case "file":
		return &m.File, 2
	case "cache":
		return &m.File, 1
	case "shmem":
		return &m.Shmem, 0
	case "active_file":
		return &m.ActiveFile, 0
	case "inactive_file":
		return &m.InactiveFile, 0
	case "active_anon":
		return &m.ActiveAnon, 0
	case "inactive_anon":
		return &m.InactiveAnon, 0
	case "unevictable":
		return &m.Unevictable, 0
	case "kernel":
		return &m.Kernel, 2
	case "slab_reclaimable":
		return &m.SlabReclaimable, 2
	case "slab_unreclaimable":
		return &m.SlabUnreclaimable, 2
	case "kernel_stack":
		return &m.KernelStack, 2
	case "pagetables":
		return &m.PageTables, 2
	case "sec_pagetables":
		return &m.SecPageTables, 2
	case "percpu":
		return &m.Percpu, 2
	case "sock":
		return &m.Sock, 2
	case "vmalloc":
		return &m.Vmalloc, 2
	case "hugetlb":
		return &m.Hugetlb, 2
	}
	return nil, 0
}

// ParseMemoryStat parses a cgroup memory.stat file (v1 or v2, see
// MemoryStat) from r; name is used in errors. Every line must be "key
// value": a key of lower-case letters, digits and '_', one space, a value
// in decimal digits (the kernel writes no other kind); keys MemoryStat does not hold are skipped. In a v1 file a
// "total_" line wins over its plain twin, whatever their order. A line of
// another shape, a value of a held key over math.MaxInt64, a held key
// given twice, v1 and v2 names mixed, a file with neither "anon" nor "rss",
// or one over safefs.MaxCgroupFile bytes is an error that names name and
// the line; every figure is then -1.
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
		p, ver := m.field(base)
		if p == nil || (total && ver == 2) {
			continue // v2 has no total_ lines: total_anon is not anon
		}
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

// isStatKey reports whether s is a memory.stat key as the kernel writes
// them: lower-case letters, digits and '_'.
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

// ReadMemoryStat reads and parses the memory.stat file of the cgroup
// directory dir (for example "/sys/fs/cgroup/memory/app", v1, or
// "/sys/fs/cgroup/app.slice", v2); see ParseMemoryStat. The file is read
// through package safefs (no symlink, regular files of a cgroup file system
// only, at most safefs.MaxCgroupFile bytes). The error names the file and
// matches fs.ErrNotExist when it is absent (the memory controller not
// enabled for dir, or the v2 root on an old kernel). It only reads, so it
// is safe for concurrent use.
func ReadMemoryStat(dir string) (MemoryStat, error) {
	file := filepath.Join(dir, "memory.stat")
	d, err := safefs.OpenDir(dir, safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return missingMemoryStat(), fmt.Errorf("cgroupfs: %w", err)
	}
	defer d.Close()
	d.FSTypes = FSTypes
	b, err := d.ReadFile("memory.stat", safefs.MaxCgroupFile)
	if err != nil {
		return missingMemoryStat(), fmt.Errorf("cgroupfs: %w", err)
	}
	return parseMemoryStat(b, file)
}

// ReadKmemUsage reads the cgroup v1 memory.kmem.usage_in_bytes of the
// cgroup directory dir: the kernel memory charged to the cgroup and its
// descendants (slab, kernel stacks, page tables), in bytes, which v1's
// memory.stat does not break down (Documentation/admin-guide/cgroup-v1/
// memory.rst, 2.7 "Kernel Memory Extension"). It includes reclaimable slab
// (dentries, inodes), so as an estimate of what the kernel cannot reclaim it
// errs high. The file is read as ReadMemoryStat reads memory.stat; the error
// names it and matches fs.ErrNotExist when it is absent (a kernel built
// without kmem accounting, or v2). Safe for concurrent use.
func ReadKmemUsage(dir string) (int64, error) {
	file := filepath.Join(dir, "memory.kmem.usage_in_bytes")
	d, err := safefs.OpenDir(dir, safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return 0, fmt.Errorf("cgroupfs: %w", err)
	}
	defer d.Close()
	d.FSTypes = FSTypes
	b, err := d.ReadFile("memory.kmem.usage_in_bytes", safefs.MaxCgroupFile)
	if err != nil {
		return 0, fmt.Errorf("cgroupfs: %w", err)
	}
	return ParseKmemUsage(string(b), file)
}

// ReadUsage reads the memory charged to the cgroup directory dir and its
// descendants, in bytes: v1's memory.usage_in_bytes (kernel memory
// included) or v2's memory.current (version 2), the counter the kernel
// compares with the limit (cgroup-v1/memory.rst 5.5, cgroup-v2.rst
// "memory.current"). It counts the page cache too, so as an estimate of
// what the kernel cannot reclaim it errs high: it stands in for
// memory.stat when that cannot be read. The file is read as ReadMemoryStat
// reads memory.stat; the error names it and matches fs.ErrNotExist when it
// is absent. Safe for concurrent use.
func ReadUsage(version int, dir string) (int64, string, error) {
	name := "memory.usage_in_bytes"
	if version == 2 {
		name = "memory.current"
	}
	file := filepath.Join(dir, name)
	d, err := safefs.OpenDir(dir, safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return 0, file, fmt.Errorf("cgroupfs: %w", err)
	}
	defer d.Close()
	d.FSTypes = FSTypes
	b, err := d.ReadFile(name, safefs.MaxCgroupFile)
	if err != nil {
		return 0, file, fmt.Errorf("cgroupfs: %w", err)
	}
	n, err := ParseKmemUsage(string(b), file)
	return n, file, err
}

// ParseKmemUsage parses the value of a memory.kmem.usage_in_bytes file, or
// of any cgroup usage counter (memory.usage_in_bytes, memory.current):
// decimal bytes and a newline; name is used in errors. Anything else, or a
// value over math.MaxInt64, is an error that quotes it.
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
