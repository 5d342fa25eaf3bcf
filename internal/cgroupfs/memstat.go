package cgroupfs

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"

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
	var m MemoryStat
	for _, p := range m.figures() {
		*p = -1
	}
	return m
}

// statFields maps each memory.stat key MemoryStat holds, without any
// "total_" prefix, to the version whose name it is (0: both) and its
// figure (an index in MemoryStat.figures).
var statFields = map[string]struct {
	ver int
	fig uint8
}{
	"anon":               {2, 0},
	"rss":                {1, 0},
	"file":               {2, 1},
	"cache":              {1, 1},
	"shmem":              {0, 2},
	"active_file":        {0, 3},
	"inactive_file":      {0, 4},
	"active_anon":        {0, 5},
	"inactive_anon":      {0, 6},
	"unevictable":        {0, 7},
	"kernel":             {2, 8},
	"slab_reclaimable":   {2, 9},
	"slab_unreclaimable": {2, 10},
	"kernel_stack":       {2, 11},
	"pagetables":         {2, 12},
	"sec_pagetables":     {2, 13},
	"percpu":             {2, 14},
	"sock":               {2, 15},
	"vmalloc":            {2, 16},
	"hugetlb":            {2, 17},
}

// figures returns m's figures, in statFields' numbering.
func (m *MemoryStat) figures() [18]*int64 {
	return [...]*int64{&m.Anon, &m.File, &m.Shmem, &m.ActiveFile, &m.InactiveFile,
		&m.ActiveAnon, &m.InactiveAnon, &m.Unevictable, &m.Kernel, &m.SlabReclaimable,
		&m.SlabUnreclaimable, &m.KernelStack, &m.PageTables, &m.SecPageTables, &m.Percpu,
		&m.Sock, &m.Vmalloc, &m.Hugetlb}
}

// ParseMemoryStat parses the memory.stat file b, which it does not keep;
// name is used in errors. Each line is "key value" (key: [a-z0-9_], value:
// decimal); unknown keys are skipped. Another shape, a value over
// math.MaxInt64, a key given twice, v1 and v2 names mixed, neither "anon"
// nor "rss", or over safefs.MaxCgroupFile bytes is an error naming the
// line, with every figure -1. It allocates nothing for a well-formed file
// of a few hundred keys (only its error does).
func ParseMemoryStat(b []byte, name string) (MemoryStat, error) {
	if len(b) > safefs.MaxCgroupFile {
		return missingMemoryStat(), fmt.Errorf("cgroupfs: %s: over %d bytes, not a memory.stat file", name, safefs.MaxCgroupFile)
	}
	m := missingMemoryStat()
	fail := func(format string, args ...any) (MemoryStat, error) {
		return missingMemoryStat(), fmt.Errorf("cgroupfs: %s: "+format, append([]any{safefs.Quote(name)}, args...)...)
	}
	var seen keySet
	var fromTotal uint32 // bit fig: the figure was set from a v1 total_ line
	n := 0
	for rest := b; len(rest) > 0; {
		var line []byte
		line, rest = nextLine(rest)
		n++
		if len(line) == 0 {
			continue
		}
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 || !isStatKey(line[:sp]) || !isDecimal(line[sp+1:]) {
			return fail("line %d: malformed, want \"key bytes\": %s", n, safefs.Quote(string(line)))
		}
		key, val := line[:sp], line[sp+1:]
		if !seen.add(b, key) {
			return fail("line %d: %s given twice", n, safefs.Quote(string(key)))
		}
		base, total := bytes.CutPrefix(key, []byte("total_"))
		f, ok := statFields[string(base)]
		if !ok || (total && f.ver == 2) {
			continue // v2 has no total_ lines: total_anon is not anon
		}
		p, ver := m.figures()[f.fig], f.ver
		v, ok := parseDecimal(val)
		if !ok {
			return fail("line %d: value out of range: %s", n, safefs.Quote(string(line)))
		}
		if total {
			ver = 1
		}
		if ver != 0 {
			if m.Version != 0 && m.Version != ver {
				return fail("line %d: %s mixes cgroup v1 and v2 names", n, safefs.Quote(string(key)))
			}
			m.Version = ver
		}
		switch {
		case total:
			*p, fromTotal = v, fromTotal|1<<f.fig
		case fromTotal&(1<<f.fig) == 0:
			*p = v
		}
	}
	if m.Anon < 0 {
		return fail("neither \"anon\" (v2) nor \"rss\" (v1): not a memory.stat file")
	}
	return m, nil
}

// nextLine returns b's first line, without its '\n', and the rest. Only
// '\n' ends a line (see lines).
func nextLine(b []byte) (line, rest []byte) {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i], b[i+1:]
	}
	return b, nil
}

// parseDecimal parses b, decimal digits only, as an int64; ok is false
// for anything else or a value over math.MaxInt64.
func parseDecimal(b []byte) (n int64, ok bool) {
	u, ok := parseUint(b)
	if !ok || u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// parseUint parses b, decimal digits only, as a uint64; ok is false for
// anything else or a value over math.MaxUint64.
func parseUint(b []byte) (n uint64, ok bool) {
	if len(b) == 0 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// isStatKey reports whether s is made of [a-z0-9_], as the kernel writes keys.
func isStatKey(s []byte) bool {
	if len(s) == 0 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// openCgroupDir opens the cgroup directory dir to read its files safely
// (see the package doc).
func openCgroupDir(dir string) (*safefs.Dir, error) {
	d, err := safefs.OpenDir(dir, safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	d.FSTypes = FSTypes
	return d, nil
}

// readIn reads file name of cgroup directory dir, safely; an absent file
// matches fs.ErrNotExist.
func readIn(dir, name string) ([]byte, error) {
	d, err := openCgroupDir(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
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
	return ParseMemoryStat(b, filepath.Join(dir, "memory.stat"))
}

// ReadKmemUsage reads v1 memory.kmem.usage_in_bytes of dir: kernel memory
// of the cgroup and its descendants, in bytes, reclaimable slab included,
// so it errs high (cgroup-v1/memory.rst 2.7). Safe for concurrent use.
func ReadKmemUsage(dir string) (int64, error) {
	n, _, err := readUsage(dir, "memory.kmem.usage_in_bytes")
	return n, err
}

// ReadUsage reads dir's memory.usage_in_bytes (v1) or memory.current (v2),
// in bytes, page cache included, and the file's path. Safe for concurrent use.
func ReadUsage(version int, dir string) (int64, string, error) {
	if version == 2 {
		return readUsage(dir, "memory.current")
	}
	return readUsage(dir, "memory.usage_in_bytes")
}

// readUsage reads and parses the usage counter name of dir (ParseKmemUsage).
func readUsage(dir, name string) (int64, string, error) {
	file := filepath.Join(dir, name)
	b, err := readIn(dir, name)
	if err != nil {
		return 0, file, err
	}
	n, err := ParseKmemUsage(b, file)
	return n, file, err
}

// ParseKmemUsage parses a cgroup usage counter (memory.kmem.usage_in_bytes,
// memory.usage_in_bytes, memory.current): decimal bytes and a newline;
// anything else is an error naming name and quoting it. Only the error
// allocates.
func ParseKmemUsage[T string | []byte](s T, name string) (int64, error) {
	v := s
	if len(v) > 0 && v[len(v)-1] == '\n' {
		v = v[:len(v)-1]
	}
	if !isDecimal(v) {
		return 0, fmt.Errorf("cgroupfs: %s: malformed usage %s, want bytes", safefs.Quote(name), safefs.Quote(string(s)))
	}
	n, ok := parseDecimal([]byte(v))
	if !ok {
		return 0, fmt.Errorf("cgroupfs: %s: usage out of range: %s", safefs.Quote(name), safefs.Quote(string(s)))
	}
	return n, nil
}

// keySlots is the room of a keySet's table; past keySlots*3/4 keys a
// keySet moves to a map.
const keySlots = 256

// keySet is the set of the keys of one file, each a subslice of the file,
// held as offsets in an open-addressing table on the stack: the keys of a
// memory.stat file are told apart without allocating. A file of more keys
// than the table holds goes on in a map. The zero value is empty.
type keySet struct {
	slots [keySlots]struct{ start, end uint32 } // end 0: empty
	n     int
	more  map[string]bool
}

// add adds key, a subslice of file, and reports false when it was there.
func (s *keySet) add(file, key []byte) bool {
	if s.more != nil {
		if s.more[string(key)] {
			return false
		}
		s.more[string(key)] = true
		return true
	}
	start := uint32(cap(file) - cap(key)) // key's offset in file
	h := uint32(2166136261)
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	for i := h % keySlots; ; i = (i + 1) % keySlots {
		sl := &s.slots[i]
		if sl.end == 0 {
			sl.start, sl.end = start, start+uint32(len(key))
			break
		}
		if bytes.Equal(file[sl.start:sl.end], key) {
			return false
		}
	}
	if s.n++; s.n >= keySlots*3/4 {
		s.more = make(map[string]bool, 2*s.n)
		for _, sl := range s.slots {
			if sl.end != 0 {
				s.more[string(file[sl.start:sl.end])] = true
			}
		}
	}
	return true
}
