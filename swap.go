package memctl

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/state"
)

// SwapStats is the swap of the process and of its cgroup (Stats.Swap), in
// bytes, -1 when unknown. GOMEMLIMIT does not count swap.
type SwapStats struct {
	VmSwap int64 // VmSwap of /proc/self/status
	// CgroupVersion is 2 (memory.swap.*), 1 (memory.memsw.*: memory plus
	// swap), or 0 when none were read (CgroupErr says why).
	CgroupVersion int
	// Current is memory.swap.current or memory.memsw.usage_in_bytes; Max the
	// cgroup's own memory.swap.max or memory.memsw.limit_in_bytes (-1: none).
	Current, Max         int64
	CurrentFile, MaxFile string // the files read
	CgroupErr            error
}

// ownCgroup is the cgroup swap is read from, found at the first read.
var ownCgroup = sync.OnceValues(func() (cgroupfs.Limit, error) { return cgroupfs.Of(0) })

// readSwap returns the process's SwapStats. Safe for concurrent use.
func readSwap() SwapStats {
	st := SwapStats{VmSwap: -1, Current: -1, Max: -1}
	if v, err := procfs.ReadBytes("/proc/self/status", "VmSwap"); err == nil {
		st.VmSwap = v
	}
	cg, err := ownCgroup()
	if err != nil {
		st.CgroupErr = err
		return st
	}
	sw, err := cgroupfs.ReadSwap(cg.Version, cg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		cur, max := cgroupfs.SwapFiles(cg.Version)
		err = fmt.Errorf("memctl: no %s or %s in %s: %s: %w", cur, max, cg.Dir, state.NoSwapAccounting, err)
	}
	if err != nil {
		st.CgroupErr = err
		return st
	}
	st.CgroupVersion, st.Current, st.Max, st.CurrentFile, st.MaxFile = sw.Version, sw.Current, sw.Max, sw.CurrentFile, sw.MaxFile
	return st
}

// swapRecord returns s as the state record's swap.
func swapRecord(s SwapStats) *state.Swap {
	r := &state.Swap{}
	if s.VmSwap >= 0 {
		r.VmSwapBytes = &s.VmSwap
	}
	if s.CgroupVersion == 0 {
		if s.CgroupErr != nil {
			r.Note = state.Cut(s.CgroupErr.Error())
		}
		return r
	}
	r.CgroupVersion, r.CurrentBytes, r.File = s.CgroupVersion, &s.Current, state.Cut(s.CurrentFile)
	r.MemoryPlusSwap = s.CgroupVersion == 1
	if s.Max >= 0 {
		r.MaxBytes = &s.Max
	}
	return r
}
