package limits

import (
	"path/filepath"
	"runtime/metrics"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/fastread"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/safefs"
)

// selfReads are the limiter's reads of its own process (cgroup limit, held
// memory, cgroup accounts) through files kept open, allocating nothing once
// warm; on anything unexpected each falls back to the full read. Not safe
// for concurrent use: the limiter calls them with m.mu held.
type selfReads struct {
	limit  cgroupfs.Self
	held   procfs.SelfHeld
	dirs   []chargePaths // the accounts read, by directory
	buf    []byte
	kmem   []byte
	mapped [2]metrics.Sample // goMappedMetrics; kept, as metrics.Read's slice escapes
}

// chargePaths is one cgroup directory's account files, prepared.
type chargePaths struct {
	dir, statName string
	stat, kmem    fastread.File
}

// maxChargeDirs bounds the directories selfReads keeps prepared.
const maxChargeDirs = 16

func (r *selfReads) read() (cgroupfs.Limit, error) { return r.limit.Read() }

// close closes the files kept open; a later read opens them again.
func (r *selfReads) close() {
	r.limit.Reset()
	r.held.Close()
	for i := range r.dirs {
		r.dirs[i].stat.Close()
		r.dirs[i].kmem.Close()
	}
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

// charge is readCharge through r's files and buffers; anything unexpected
// is read again by readCharge.
func (r *selfReads) charge(version int, dir string) (charge, error) {
	f := r.files(dir)
	if f == nil {
		return readCharge(version, dir)
	}
	var err error
	if r.buf, err = f.stat.Read(r.buf, safefs.MaxCgroupFile); err != nil {
		return readCharge(version, dir)
	}
	st, err := cgroupfs.ParseMemoryStat(r.buf, f.statName)
	if err != nil {
		return readCharge(version, dir)
	}
	c := statCharge(st, f.statName)
	if st.Version == 1 || version == 1 {
		var k int64
		if r.kmem, err = f.kmem.Read(r.kmem, safefs.MaxCgroupFile); err == nil {
			k, err = cgroupfs.ParseKmemUsage(r.kmem, f.kmem.String())
		}
		if c, err = withKmem(c, k, err); err != nil {
			return readCharge(version, dir)
		}
	}
	return c, nil
}

// files returns dir's prepared files, nil past maxChargeDirs or for a name
// fastread cannot take.
func (r *selfReads) files(dir string) *chargePaths {
	for i := range r.dirs {
		if r.dirs[i].dir == dir {
			return &r.dirs[i]
		}
	}
	if len(r.dirs) >= maxChargeDirs {
		return nil
	}
	f := chargePaths{dir: dir, statName: filepath.Join(dir, "memory.stat")}
	var err error
	if f.stat, err = fastread.New(f.statName); err != nil {
		return nil
	}
	if f.kmem, err = fastread.New(filepath.Join(dir, "memory.kmem.usage_in_bytes")); err != nil {
		return nil
	}
	r.dirs = append(r.dirs, f)
	return &r.dirs[len(r.dirs)-1]
}
