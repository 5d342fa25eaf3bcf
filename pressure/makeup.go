package pressure

import (
	"fmt"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/satmath"
)

// makeup is what the memory under pressure is made of, where the kernel
// says it, in bytes, -1 when unknown.
type makeup struct {
	Anon  int64  // memory.stat "anon" ("total_rss" in v1), or meminfo AnonPages
	Cache int64  // the file LRUs: "active_file" + "inactive_file", or meminfo's
	Own   int64  // this process's RssAnon, for the host's makeup only
	From  string // the file read
}

// known reports whether both Anon and Cache could be read.
func (m makeup) known() bool { return m.Anon >= 0 && m.Cache >= 0 }

// anonymous reports whether anonymous memory is known and more than the page
// cache, which the kernel reclaims first.
func (m makeup) anonymous() bool { return m.known() && m.Anon > m.Cache }

// ownsHostAnon reports whether this process holds at least half of the
// host's anonymous memory.
func (m makeup) ownsHostAnon() bool { return m.Own >= 0 && m.Anon >= 0 && m.Own >= m.Anon-m.Own }

// unknownMakeup is the makeup when the file from could not be read.
func unknownMakeup(from string) makeup { return makeup{Anon: -1, Cache: -1, Own: -1, From: from} }

// makeupOfStat returns the makeup of a parsed memory.stat; the cache is
// unknown unless both file LRU lines are there.
func makeupOfStat(s cgroupfs.MemoryStat, from string) makeup {
	mk := makeup{Anon: s.Anon, Cache: -1, Own: -1, From: from}
	if s.ActiveFile >= 0 && s.InactiveFile >= 0 {
		mk.Cache = satmath.Add(s.ActiveFile, s.InactiveFile)
	}
	return mk
}

// cgroupMakeup reads the makeup of the cgroup directory dir.
func cgroupMakeup(dir string) (makeup, error) {
	file := dir + "/memory.stat"
	s, err := cgroupfs.ReadMemoryStat(dir)
	if err != nil {
		return unknownMakeup(file), err
	}
	return makeupOfStat(s, file), nil
}

// hostMakeup reads the host's makeup from meminfo (/proc/meminfo) and this
// process's RssAnon from status (/proc/self/status; Own -1 when unread).
func hostMakeup(meminfo, status string) (makeup, error) {
	f, err := procfs.ReadFile(meminfo)
	if err != nil {
		return unknownMakeup(meminfo), err
	}
	var v [3]int64
	for i, k := range []string{"AnonPages", "Active(file)", "Inactive(file)"} {
		if v[i], err = f.Bytes(k); err != nil {
			return unknownMakeup(f.File), fmt.Errorf("pressure: %w", err)
		}
	}
	mk := makeup{Anon: v[0], Cache: satmath.Add(v[1], v[2]), Own: -1, From: f.File}
	if n, err := procfs.ReadBytes(status, "RssAnon"); err == nil {
		mk.Own = n
	}
	return mk, nil
}

// response is what to do on a signal: act (a trim through its gate and the
// event) and cancel the largest request.
type response struct{ act, cancel bool }

// respond decides the response to a signal whose memory is mk
// (docs/pressure.md). A cgroup's memory known to be mostly page cache is left
// to the kernel; an unknown makeup asks for the trim, whose gate decides. A
// request is cancelled only for memory known mostly anonymous and, host-wide,
// mostly this process's.
func respond(mk makeup, hostWide bool) response {
	anon := mk.anonymous()
	if mk.known() && !anon && !hostWide {
		return response{}
	}
	return response{act: true, cancel: anon && (!hostWide || mk.ownsHostAnon())}
}

// act answers signals of w whose memory is mk (respond), and reports
// whether it acted.
func (m *Monitor) act(w *watcher, signals int64, mk makeup) bool {
	r := respond(mk, w.hostWide)
	if !r.act {
		m.leftToKernel.Add(1)
		return false
	}
	m.acted.Add(1)
	m.deps.trim()
	if r.cancel {
		m.deps.cancel()
	} else {
		m.held.Add(1)
	}
	e := Event{Kind: KindKernel, Time: time.Now(), Source: w.name, Signals: signals}
	e.Makeup = mk
	m.publish(e)
	return true
}
