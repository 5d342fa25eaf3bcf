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

// SwapStats is the swap of the process and of its cgroup (Stats.Swap), so
// that a heap the kernel pushed to swap shows. GOMEMLIMIT does not count
// swap: in cgroup v2 memory.max is memory alone, and memctl takes
// GOMEMLIMIT from it whatever memory.swap.max allows (Kubernetes NodeSwap).
// Sizes are bytes.
type SwapStats struct {
	// VmSwap is the process's anonymous memory in swap, VmSwap of
	// /proc/self/status; -1 when unknown (off Linux, a read error).
	VmSwap int64
	// CgroupVersion is the version of the cgroup files read: 2
	// (memory.swap.current and memory.swap.max), 1 (memory.memsw.*:
	// memory plus swap, not swap alone), or 0 when none were read, and
	// then CgroupErr says why (no cgroup, no swap accounting, a read or
	// parse error naming the file).
	CgroupVersion int
	// Current is memory.swap.current (v2, the swap of the cgroup and its
	// descendants) or memory.memsw.usage_in_bytes (v1); -1 when not read.
	Current int64
	// Max is the cgroup's own memory.swap.max (v2) or
	// memory.memsw.limit_in_bytes (v1); -1 when it sets no limit or was
	// not read. An ancestor's may be tighter.
	Max int64
	// CurrentFile and MaxFile are the files read ("" when none were).
	CurrentFile, MaxFile string
	// CgroupErr is why the cgroup's swap was not read; nil when it was.
	CgroupErr error
}

// swapSource is where a controller reads its cgroup's swap: the cgroup
// directory found once, at the first read (a process is not expected to
// move between cgroups), or the error that says why there is none.
type swapSource struct {
	once    sync.Once
	version int
	dir     string
	err     error
}

// read returns the SwapStats of the calling process: three small reads
// (/proc/self/status and the cgroup's two swap files; the first call also
// finds the cgroup from /proc/self/cgroup and mountinfo; measured figures:
// docs/benchmarks.md). Safe for concurrent use. The state
// record calls it at each publication (at most once a second for
// counters, and at decisions), never on a hot path or while idle.
func (s *swapSource) read() SwapStats {
	st := SwapStats{VmSwap: -1, Current: -1, Max: -1}
	if f, err := procfs.ReadFile("/proc/self/status"); err == nil {
		if v, err := f.Bytes("VmSwap"); err == nil {
			st.VmSwap = v
		}
	}
	s.once.Do(func() {
		l, err := cgroupfs.Of(0)
		if err != nil {
			s.err = err
			return
		}
		s.version, s.dir = l.Version, l.Dir
	})
	if s.err != nil {
		st.CgroupErr = s.err
		return st
	}
	sw, err := cgroupfs.ReadSwap(s.version, s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		cur, max := cgroupfs.SwapFiles(s.version)
		err = fmt.Errorf("memctl: no %s or %s in %s: the kernel does not account swap for this cgroup (the root cgroup has none; "+
			"nor has a kernel built without CONFIG_MEMCG_SWAP or booted with swapaccount=0): %w", cur, max, s.dir, err)
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

// looseSwap is the swap source of Stats with no controller.
var looseSwap swapSource
