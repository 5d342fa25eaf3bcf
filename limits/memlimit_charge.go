package limits

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"runtime/metrics"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/procfs"
)

// goMappedMetrics are the runtime/metrics samples whose difference is the
// memory the Go runtime has mapped and not returned to the OS.
var goMappedMetrics = [2]string{"/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}

// readUsage returns the memory this process holds that the kernel cannot
// reclaim (procfs.Held: RssAnon + RssShmem; file-backed pages such as mapped
// files and the binary's text are page cache) and what the Go runtime has
// mapped and not released (runtime/metrics); err is the /proc read's (not
// Linux, no /proc).
func readUsage() (held, goMapped int64, err error) {
	s := [2]metrics.Sample{{Name: goMappedMetrics[0]}, {Name: goMappedMetrics[1]}}
	metrics.Read(s[:])
	goMapped = int64(s[0].Value.Uint64() - s[1].Value.Uint64())
	held, err = procfs.Held(0)
	return held, goMapped, err
}

// liveHeapFactor is how far above the live heap a memory.high target may
// bring GOMEMLIMIT down, at the least: 1.5 × the live heap
// (/gc/heap/live:bytes at the last GC). GOMEMLIMIT bounds the whole Go
// runtime, so a limit at 1.5 × live leaves the GC half the live heap of new
// allocation between cycles, twice as many cycles as GOGC=100's default
// goal of 2 × live, and well clear of the death-spiral detector's
// threshold (package pressure reports a spiral once the live heap passes
// 0.85 × GOMEMLIMIT). A memory.high under that is left to the kernel's
// throttling and reclaim: GOMEMLIMIT is never the cause of a spiral.
const liveHeapFactor = 1.5

// charge is the part of a cgroup's account that neither the Go runtime
// holds nor the kernel can reclaim, in bytes, with the file it came from.
type charge struct {
	anon   int64 // anonymous memory; with fromUsage, the whole usage
	kept   int64 // file-backed memory off the file LRU lists (shmem, tmpfs, ramfs), and HugeTLB pages
	kernel int64 // 0 when the file has none
	// reclaimable is the page cache on the file LRU lists, mapped files
	// included: never subtracted, shown apart; -1 when unknown.
	reclaimable int64
	file        string
	// statErr, when not nil, is why memory.stat could not be used: the
	// charge is then the cgroup's usage counter (file), page cache
	// included.
	statErr error
}

func (c charge) total() int64 { return c.anon + c.kept + c.kernel }

func (c charge) String() string {
	if c.statErr != nil {
		return fmt.Sprintf("%s: %s, page cache included, as memory.stat could not be read", c.file, logattr.MiB(c.anon))
	}
	return fmt.Sprintf("%s: anon %s, shmem, tmpfs, ramfs and hugetlb %s, kernel %s; page cache not counted", c.file, logattr.MiB(c.anon), logattr.MiB(c.kept), logattr.MiB(c.kernel))
}

// chargeOf returns the account of the cgroup directory dir, read now; on a
// read error other than "not there" the last account read from dir is used
// and w is the warning to give once at WARN (naming the file), as it is
// for an account read from the usage counter; w is nil otherwise. The
// caller gives w through m.warn. ok is false when there is no account (no
// memory.stat: the v2 root, a made-up Limit).
func (m *MemLimiter) chargeOf(version int, dir string) (c charge, ok bool, w *planWarning) {
	c, err := m.charge(version, dir)
	if err == nil {
		if c.statErr != nil {
			w = &planWarning{key: "charge " + dir, err: fmt.Errorf("limits: the cgroup's account for the GOMEMLIMIT headroom: %w; its usage %s is subtracted instead, page cache included (GOMEMLIMIT errs low)", c.statErr, c.file)}
		}
		m.charges[dir] = c
		return c, true, w
	}
	if !errors.Is(err, fs.ErrNotExist) {
		w = &planWarning{key: "charge " + dir, err: fmt.Errorf("limits: the cgroup's account for the GOMEMLIMIT headroom: %w", err)}
	}
	c, ok = m.charges[dir]
	return c, ok, w
}

// chargeFiles are the reads behind readCharge (the fixture table's read
// plain files).
type chargeFiles struct {
	stat  func(dir string) (cgroupfs.MemoryStat, error)
	kmem  func(dir string) (int64, error)
	usage func(version int, dir string) (int64, string, error)
}

var cgroupCharge = chargeFiles{cgroupfs.ReadMemoryStat, cgroupfs.ReadKmemUsage, cgroupfs.ReadUsage}

// readCharge reads the account of the cgroup directory dir from its
// memory.stat (cgroupfs.ReadMemoryStat): anonymous memory (v2 "anon", v1
// "total_rss"); file-backed memory the kernel cannot reclaim as page cache
// (MemoryStat.FileUnreclaimable: "file" less the file LRU lists, that is
// shmem and tmpfs, ramfs, mlocked files), both charged to the cgroup and
// never reclaimed without swap; HugeTLB pages, when the v2 hierarchy charges
// them (v2 "hugetlb", the memory_hugetlb_accounting mount option); and the
// kernel memory it cannot reclaim:
// in v2 "kernel" less slab_reclaimable, plus sock (on kernels before 5.18
// slab_unreclaimable, kernel_stack, pagetables, sec_pagetables, percpu,
// vmalloc and sock; MemoryStat.KernelUnreclaimable;
// Documentation/admin-guide/cgroup-v2.rst, "memory.stat"); in v1, whose
// memory.stat has none, all of memory.kmem.usage_in_bytes
// (cgroup-v1/memory.rst, 2.7), reclaimable slab included (an estimate that
// errs high). The page cache (active_file, inactive_file) is reclaimed by
// the kernel before it kills: it is not counted.
//
// When memory.stat (or v1's memory.kmem.usage_in_bytes) is there but cannot
// be read or parsed (EACCES from an LSM, a malformed line), the cgroup's
// usage counter (cgroupfs.ReadUsage: memory.current, memory.usage_in_bytes)
// is the charge, with charge.statErr set: it counts the page cache too, so
// GOMEMLIMIT errs low, never high. The error is memory.stat's when neither
// can be read.
func readCharge(version int, dir string) (charge, error) { return cgroupCharge.read(version, dir) }

func (r chargeFiles) read(version int, dir string) (charge, error) {
	c, err := r.fromStat(version, dir)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return c, err
	}
	u, file, uerr := r.usage(version, dir)
	if uerr != nil {
		return charge{}, fmt.Errorf("%w (and %w)", err, uerr)
	}
	return charge{anon: u, reclaimable: -1, file: file, statErr: err}, nil
}

func (r chargeFiles) fromStat(version int, dir string) (charge, error) {
	st, err := r.stat(dir)
	if err != nil {
		return charge{}, err
	}
	c := charge{anon: st.Anon, kept: max(st.FileUnreclaimable(), 0) + max(st.Hugetlb, 0), kernel: max(st.KernelUnreclaimable(), 0),
		reclaimable: st.Reclaimable(), file: filepath.Join(dir, "memory.stat")}
	if st.Version == 1 || version == 1 {
		k, err := r.kmem(dir)
		switch {
		case err == nil:
			c.kernel = k
		case !errors.Is(err, fs.ErrNotExist):
			return charge{}, err
		}
	}
	return c, nil
}

// readLive returns the live heap at the last GC (runtime/metrics
// /gc/heap/live:bytes), in bytes.
func readLive() int64 {
	s := [1]metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s[:])
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}
