package limits

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"runtime/metrics"
	"strconv"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/procfs"
)

// goMappedMetrics are the runtime/metrics samples whose difference is the
// memory the Go runtime has mapped and not returned to the OS.
var goMappedMetrics = [2]string{"/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}

// liveHeapFactor × the live heap is the lowest a memory.high target brings
// GOMEMLIMIT, clear of package pressure's spiral threshold.
const liveHeapFactor = 1.5

// charge is the part of a cgroup's account that neither the Go runtime
// holds nor the kernel can reclaim, in bytes, with the file it came from.
type charge struct {
	anon        int64 // anonymous memory; with fromUsage, the whole usage
	kept        int64 // file-backed memory off the file LRU lists (shmem, tmpfs, ramfs), and HugeTLB pages
	kernel      int64 // 0 when the file has none
	reclaimable int64 // page cache, never subtracted; -1 when unknown
	file        string
	statErr     error // memory.stat failed: anon is the usage counter (file)
}

func (c charge) total() int64 { return c.anon + c.kept + c.kernel }

// write says what c holds.
func (c charge) write(s *sentence) {
	if c.statErr != nil {
		s.add(c.file, ": ").mib(c.anon).add(", page cache included, as memory.stat could not be read")
		return
	}
	s.add(c.file, ": anon ").mib(c.anon).add(", shmem, tmpfs, ramfs and hugetlb ").mib(c.kept).add(", kernel ").mib(c.kernel).add("; page cache not counted")
}

// sentence is a Reason being written into a buffer that compute's caller
// keeps, so that writing it allocates nothing once the buffer is large
// enough.
type sentence struct{ b []byte }

func (s *sentence) add(parts ...string) *sentence {
	for _, p := range parts {
		s.b = append(s.b, p...)
	}
	return s
}

// mib writes logattr.MiB(n).
func (s *sentence) mib(n int64) *sentence { s.b = logattr.AppendMiB(s.b, n); return s }

// num writes f as fmt's %v does.
func (s *sentence) num(f float64) *sentence { s.b = strconv.AppendFloat(s.b, f, 'g', -1, 64); return s }

// chargeFiles are readCharge's reads.
type chargeFiles struct {
	stat  func(dir string) (cgroupfs.MemoryStat, error)
	kmem  func(dir string) (int64, error)
	usage func(version int, dir string) (int64, string, error)
}

var cgroupCharge = chargeFiles{cgroupfs.ReadMemoryStat, cgroupfs.ReadKmemUsage, cgroupfs.ReadUsage}

// readCharge reads dir's account from its memory.stat: anonymous memory,
// file memory off the LRU lists, HugeTLB pages and unreclaimable kernel
// memory (v1: memory.kmem.usage_in_bytes), not the page cache. When
// memory.stat cannot be read or parsed, the usage counter is the charge, with
// statErr set: GOMEMLIMIT errs low, never high.
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
	c := statCharge(st, filepath.Join(dir, "memory.stat"))
	if st.Version == 1 || version == 1 {
		k, err := r.kmem(dir)
		return withKmem(c, k, err)
	}
	return c, nil
}

// statCharge is the charge memory.stat st, read from file, gives.
func statCharge(st cgroupfs.MemoryStat, file string) charge {
	return charge{anon: st.Anon, kept: max(st.FileUnreclaimable(), 0) + max(st.Hugetlb, 0), kernel: max(st.KernelUnreclaimable(), 0),
		reclaimable: st.Reclaimable(), file: file}
}

// withKmem returns c with v1's kernel memory k, read with err; a missing
// file leaves c as it is.
func withKmem(c charge, k int64, err error) (charge, error) {
	switch {
	case err == nil:
		c.kernel = k
	case !errors.Is(err, fs.ErrNotExist):
		return charge{}, err
	}
	return c, nil
}

// readLive returns the live heap at the last GC, in bytes.
func readLive() int64 {
	s := [1]metrics.Sample{{Name: liveHeapMetric}}
	metrics.Read(s[:])
	return sampleBytes(s[0])
}

// selfReads are the limiter's reads of its own process (cgroup limit, held
// memory, cgroup accounts) through files kept open, allocating nothing once
// warm; on anything unexpected each falls back to the full read. Not safe
// for concurrent use: the limiter calls them with m.mu held.
type selfReads struct {
	limit  cgroupfs.Self
	held   procfs.SelfHeld
	mapped [2]metrics.Sample // goMappedMetrics; kept, as metrics.Read's slice escapes
}

// close closes the files kept open; a later read opens them again.
func (r *selfReads) close() {
	r.limit.Reset()
	r.held.Close()
}

// usage returns what this process holds that the kernel cannot reclaim
// (RssAnon + RssShmem) and what the Go runtime has mapped and not released,
// in bytes; err is the /proc read's.
func (r *selfReads) usage() (held, goMapped int64, err error) {
	if r.mapped[0].Name == "" {
		r.mapped[0].Name, r.mapped[1].Name = goMappedMetrics[0], goMappedMetrics[1]
	}
	metrics.Read(r.mapped[:])
	goMapped = int64(r.mapped[0].Value.Uint64() - r.mapped[1].Value.Uint64())
	held, err = r.held.Held()
	return held, goMapped, err
}

// charge is readCharge through r.limit's kept-open files; anything
// unexpected is read again by readCharge.
func (r *selfReads) charge(version int, dir string) (charge, error) {
	st, file, err := r.limit.MemoryStat(dir)
	if err != nil {
		return readCharge(version, dir)
	}
	c := statCharge(st, file)
	if st.Version == 1 || version == 1 {
		k, err := r.limit.KmemUsage(dir)
		if c, err = withKmem(c, k, err); err != nil {
			return readCharge(version, dir)
		}
	}
	return c, nil
}
