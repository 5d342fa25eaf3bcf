package memsignal

import (
	"fmt"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/satmath"
)

// Makeup is what the memory under pressure is made of, where the kernel
// says it, in bytes, -1 when unknown.
type Makeup struct {
	Anon  int64  // memory.stat "anon" ("total_rss" in v1), or meminfo AnonPages
	Cache int64  // the file LRUs: "active_file" + "inactive_file", or meminfo's
	Own   int64  // this process's RssAnon, for the host's makeup only
	From  string // the file read
}

// Known reports whether both Anon and Cache could be read.
func (m Makeup) Known() bool { return m.Anon >= 0 && m.Cache >= 0 }

// Anonymous reports whether anonymous memory is known and more than the page
// cache, which the kernel reclaims first.
func (m Makeup) Anonymous() bool { return m.Known() && m.Anon > m.Cache }

// OwnsHostAnon reports whether this process holds at least half of the
// host's anonymous memory.
func (m Makeup) OwnsHostAnon() bool { return m.Own >= 0 && m.Anon >= 0 && m.Own >= m.Anon-m.Own }

// UnknownMakeup is the makeup when the file from could not be read.
func UnknownMakeup(from string) Makeup { return Makeup{Anon: -1, Cache: -1, Own: -1, From: from} }

// MakeupOfStat returns the makeup of a parsed memory.stat; the cache is
// unknown unless both file LRU lines are there.
func MakeupOfStat(s cgroupfs.MemoryStat, from string) Makeup {
	mk := Makeup{Anon: s.Anon, Cache: -1, Own: -1, From: from}
	if s.ActiveFile >= 0 && s.InactiveFile >= 0 {
		mk.Cache = satmath.Add(s.ActiveFile, s.InactiveFile)
	}
	return mk
}

// CgroupMakeup reads the makeup of the cgroup directory dir.
func CgroupMakeup(dir string) (Makeup, error) {
	file := dir + "/memory.stat"
	s, err := cgroupfs.ReadMemoryStat(dir)
	if err != nil {
		return UnknownMakeup(file), err
	}
	return MakeupOfStat(s, file), nil
}

// HostMakeup reads the host's makeup from meminfo (/proc/meminfo) and this
// process's RssAnon from status (/proc/self/status; Own -1 when unread).
func HostMakeup(meminfo, status string) (Makeup, error) {
	f, err := procfs.ReadFile(meminfo)
	if err != nil {
		return UnknownMakeup(meminfo), err
	}
	var v [3]int64
	for i, k := range []string{"AnonPages", "Active(file)", "Inactive(file)"} {
		if v[i], err = f.Bytes(k); err != nil {
			return UnknownMakeup(f.File), fmt.Errorf("pressure: %w", err)
		}
	}
	mk := Makeup{Anon: v[0], Cache: satmath.Add(v[1], v[2]), Own: -1, From: f.File}
	if n, err := procfs.ReadBytes(status, "RssAnon"); err == nil {
		mk.Own = n
	}
	return mk, nil
}
