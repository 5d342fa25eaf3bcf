package limits

import (
	"runtime/metrics"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
)

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
