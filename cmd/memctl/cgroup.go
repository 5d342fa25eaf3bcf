package main

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/safefs"
	"github.com/memctl/memctl/internal/state"
)

// readCgroup reads the process's memory cgroup, limit, swap and (v2)
// memory.events into st; noMemory makes every error a note, not unknown.
func readCgroup(proc *safefs.Dir, st *statusReport, noMemory bool) {
	l, view, err := cgroupfs.OfProc(proc)
	if err != nil {
		st.CgroupError = err.Error()
		if !errors.Is(err, cgroupfs.ErrNoCgroup) && !noMemory {
			st.Unknown["cgroup"] = err.Error()
		}
		return
	}
	c := &memCgroup{Version: l.Version, Path: l.Cgroup, Dir: l.Dir, View: "process"}
	switch view {
	case cgroupfs.ViewCaller:
		c.View = "memctl"
	case cgroupfs.ViewCallerRoot:
		c.View = "memctl-root"
	}
	if l.Bytes != cgroupfs.NoLimit {
		c.LimitBytes, c.LimitFile = &l.Bytes, &l.File
	} else {
		c.LimitUnknown = l.TopNotRoot
	}
	st.Cgroup = c
	if l.Version == 2 {
		readCgroupEvents(proc, l, view, st)
	}
	if err := readSwap(proc, l, view, c); err != nil {
		st.Unknown["swap"] = err.Error()
	}
}

// cgroupRoot opens the root l's cgroup is read in (memctl's for a view other
// than ViewProcess) and returns it with l.Dir relative to it.
func cgroupRoot(proc *safefs.Dir, l cgroupfs.Limit, view cgroupfs.View) (*safefs.Dir, string, error) {
	root, prefix := proc, proc.Name()+"/root"
	if view != cgroupfs.ViewProcess {
		self, err := safefs.OpenDir("/proc/self", safefs.NoSymlinks)
		if err != nil {
			return nil, "", err
		}
		defer self.Close()
		root = self
	}
	r, err := root.Sub("root", safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return nil, "", err
	}
	r.FSTypes = cgroupfs.FSTypes
	return r, strings.TrimPrefix(l.Dir, prefix), nil
}

// readSwap reads l's swap into c; absent files set c.SwapNote.
func readSwap(proc *safefs.Dir, l cgroupfs.Limit, view cgroupfs.View, c *memCgroup) error {
	r, rel, err := cgroupRoot(proc, l, view)
	if err != nil {
		return err
	}
	defer r.Close()
	sw, err := cgroupfs.ReadSwapAt(r, l.Version, rel, l.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		cur, max := cgroupfs.SwapFiles(l.Version)
		c.SwapNote = fmt.Sprintf("no %s or %s: %s", cur, max, state.NoSwapAccounting)
		return nil
	}
	if err != nil {
		return err
	}
	c.Swap = &memSwap{CurrentBytes: sw.Current, CurrentFile: sw.CurrentFile, MaxFile: sw.MaxFile, MemoryPlusSwap: sw.MemoryPlusSwap}
	if sw.Max != cgroupfs.NoLimit {
		c.Swap.MaxBytes = &sw.Max
	}
	return nil
}

// readCgroupEvents reads the memory.events of the v2 cgroup l into st; a
// cgroup without one gets MemoryEventsNote, not unknown.
func readCgroupEvents(proc *safefs.Dir, l cgroupfs.Limit, view cgroupfs.View, st *statusReport) {
	r, rel, err := cgroupRoot(proc, l, view)
	var b []byte
	if err == nil {
		defer r.Close()
		b, err = r.ReadFile(rel+"/memory.events", safefs.MaxCgroupFile)
	}
	if err == nil {
		st.MemoryEvents, err = parseMemoryEvents(b, l.Dir+"/memory.events")
	}
	file := safefs.Quote(l.Dir + "/memory.events")
	switch {
	case errors.Is(err, fs.ErrNotExist) && l.Cgroup == "/":
		st.MemoryEventsNote = "no " + file + ": the root cgroup has none (or the root of a cgroup namespace whose cgroup lacks the memory controller)"
	case errors.Is(err, fs.ErrNotExist):
		st.MemoryEventsNote = "no " + file + ": the memory controller is not enabled for this cgroup (its parent's cgroup.subtree_control)"
	case err != nil:
		st.Unknown["memory_events"] = err.Error()
	}
}

// parseMemoryEvents parses memory.events, leaving out absent counters.
func parseMemoryEvents(b []byte, file string) (map[string]int64, error) {
	ev, err := cgroupfs.ParseEvents(b, safefs.Quote(file))
	if err != nil {
		return nil, err
	}
	m := make(map[string]int64, 6)
	for k, v := range ev.All() {
		if v >= 0 {
			m[k] = v
		}
	}
	return m, nil
}
