package pressure

import (
	"fmt"
	"math"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
)

// Makeup is what the memory under pressure is made of, where the kernel
// says it: the watched cgroup's memory.stat, or /proc/meminfo for
// host-wide PSI. Bytes; -1 when unknown.
type Makeup struct {
	// Anon is anonymous memory: memory.stat "anon" (v2) or "total_rss"
	// (v1, hierarchical; "rss" without hierarchy), /proc/meminfo
	// AnonPages. Shmem and tmpfs are not in it.
	Anon int64
	// Cache is the page cache the kernel reclaims under pressure:
	// "active_file" + "inactive_file" (v1 "total_" lines), /proc/meminfo
	// Active(file) + Inactive(file). Shmem is on the anon LRU lists and is
	// not in it.
	Cache int64
	// Own is this process's own anonymous memory (/proc/self/status
	// RssAnon), read for host-wide PSI only: whether the host's anonymous
	// memory is this process's (see Monitor's CancelLargest rule); -1 when
	// not read.
	Own int64
	// From names the file read ("" when none could be).
	From string
}

// Known reports whether both figures could be read: a memory.stat or
// /proc/meminfo that could not be read or parsed, or that lacks one of the
// lines (active_file or inactive_file), gives an unknown makeup.
func (m Makeup) Known() bool { return m.Anon >= 0 && m.Cache >= 0 }

// Anonymous reports whether anonymous memory is the problem: known, and
// more than the reclaimable page cache. While the cache is at least as
// large, the kernel reclaims cache first (it is what it does at a cgroup's
// limit, cgroup-v1/memory.rst and cgroup-v2.rst "memory.high"), and a trim
// or a cancel would cost the service for pressure its Go heap did not
// cause. An unknown makeup is not anonymous: on a signal with an unknown
// makeup the watcher asks for the trim, whose gate decides whether it is
// worth its cost, and holds CancelLargest (a request is never cancelled on
// data that could not be read; see Stats.CancelsHeld).
func (m Makeup) Anonymous() bool {
	return m.Known() && m.Anon > m.Cache
}

// unknownMakeup is the makeup when the file from could not be read.
func unknownMakeup(from string) Makeup { return Makeup{Anon: -1, Cache: -1, Own: -1, From: from} }

// makeupOfStat returns the makeup of a parsed memory.stat. The cache is
// unknown (-1) unless the file has both active_file and inactive_file: one
// list alone would understate the cache and make the memory look
// anonymous. The sum saturates at math.MaxInt64.
func makeupOfStat(s cgroupfs.MemoryStat, from string) Makeup {
	mk := Makeup{Anon: s.Anon, Cache: -1, Own: -1, From: from}
	if s.ActiveFile >= 0 && s.InactiveFile >= 0 {
		mk.Cache = addSat(s.ActiveFile, s.InactiveFile)
	}
	return mk
}

// addSat returns a+b for a, b >= 0, saturating at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// cgroupMakeup reads the makeup of the cgroup directory dir.
func cgroupMakeup(dir string) (Makeup, error) {
	file := dir + "/memory.stat"
	s, err := cgroupfs.ReadMemoryStat(dir)
	if err != nil {
		return unknownMakeup(file), err
	}
	return makeupOfStat(s, file), nil
}

// hostMakeup reads the host's makeup from /proc/meminfo and this
// process's own anonymous memory from status (/proc/self/status RssAnon;
// Own stays -1 when it cannot be read).
func hostMakeup(meminfo, status string) (Makeup, error) {
	mk, err := meminfoMakeup(meminfo)
	if err == nil {
		if n, err := procfs.ReadBytes(status, "RssAnon"); err == nil {
			mk.Own = n
		}
	}
	return mk, err
}

// ownsHostAnon reports whether this process holds at least half of the
// host's anonymous memory: then a host-wide signal whose memory is mostly
// anonymous is the process's own doing, and cancelling its largest request
// relieves it. Otherwise the host is short of a neighbour's anonymous
// memory, which a cancel here would not give back: the service would pay
// for it (the kind of issue 17's case 1, with anonymous memory).
func (m Makeup) ownsHostAnon() bool {
	return m.Own >= 0 && m.Anon >= 0 && m.Own >= m.Anon-m.Own
}

// meminfoMakeup reads the host's makeup from /proc/meminfo.
func meminfoMakeup(path string) (Makeup, error) {
	f, err := procfs.ReadFile(path)
	if err != nil {
		return unknownMakeup(path), err
	}
	return meminfoFields(f)
}

func meminfoFields(f procfs.Fields) (Makeup, error) {
	var v [3]int64
	for i, k := range []string{"AnonPages", "Active(file)", "Inactive(file)"} {
		n, err := f.Bytes(k)
		if err != nil {
			return unknownMakeup(f.File), fmt.Errorf("pressure: %w", err)
		}
		v[i] = n
	}
	return Makeup{Anon: v[0], Cache: addSat(v[1], v[2]), Own: -1, From: f.File}, nil
}

// eventsGrowth returns how much the memory.events counters that mean
// pressure the cgroup's processes feel (high: throttled over memory.high;
// max: at the limit; oom, oom_kill) grew from a to b; "low" (protection
// breached by others' pressure) does not count. A counter absent in
// either is left out; one that went down (a new cgroup) counts 0. The sum
// saturates at math.MaxInt64 (a negative count would read as the source
// gone and stop the watcher).
func eventsGrowth(a, b cgroupfs.Events) int64 {
	var d int64
	for _, p := range [...][2]int64{{a.High, b.High}, {a.Max, b.Max}, {a.OOM, b.OOM}, {a.OOMKill, b.OOMKill}} {
		if p[0] >= 0 && p[1] > p[0] {
			d = addSat(d, p[1]-p[0])
		}
	}
	return d
}
