package memctl

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// eventKind says what a historyEntry records.
type eventKind uint8

const (
	kindGCEnd    eventKind = iota // a GC cycle ended
	kindTrim                      // a trim ran or was skipped
	kindLimit                     // GOMEMLIMIT or the memory limit changed
	kindPressure                  // kernel memory pressure, or a death spiral
)

func (k eventKind) String() string {
	if names := [...]string{"gc", "trim", "limit", "pressure"}; int(k) < len(names) {
		return names[k]
	}
	return "gc"
}

// historyEntry is one moment of the /debug/memctl page's history: RSS
// (bytes, -1 unknown), the live heap at the last GC end and GOMEMLIMIT.
type historyEntry struct {
	At         time.Time
	Kind       eventKind
	RSS        int64
	Live       int64
	GoMemLimit int64
}

// historySize is how many entries a ring keeps: at most one GC end every
// historyGap, so three minutes of a busy process, more of a quiet one.
const (
	historySize = 720
	historyGap  = 250 * time.Millisecond
)

// historyRing is a controller's history, recorded when memctl already wakes
// (GC ends, trims, limit changes, pressure): no timer, no goroutine, and
// recording allocates nothing. The zero value is ready; safe for concurrent
// use.
type historyRing struct {
	live   atomic.Int64 // the live heap of the last GC end
	lastGC atomic.Int64 // when the last GC-end entry was made, Unix ns; 0 none

	mu    sync.Mutex
	e     [historySize]historyEntry
	n     int      // entries added, ever
	statm *os.File // /proc/self/statm, opened at the first read; nil if it cannot be
	tried bool
	buf   [128]byte
}

// GCEnd records a GC end; within historyGap of the last only the live heap
// is kept.
func (r *historyRing) GCEnd(t time.Time, live, gomemlimit int64) {
	r.live.Store(live)
	ns := t.UnixNano()
	if last := r.lastGC.Load(); last != 0 && ns-last < int64(historyGap) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastGC.Store(ns)
	r.add(historyEntry{At: t, Kind: kindGCEnd, RSS: r.rss(), Live: live, GoMemLimit: gomemlimit})
}

// Mark records an event of kind k at t, with RSS read now.
func (r *historyRing) Mark(t time.Time, k eventKind, gomemlimit int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add(historyEntry{At: t, Kind: k, RSS: r.rss(), Live: r.live.Load(), GoMemLimit: gomemlimit})
}

// Entries returns the entries recorded, oldest first.
func (r *historyRing) Entries() []historyEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []historyEntry
	for i := max(0, r.n-historySize); i < r.n; i++ {
		out = append(out, r.e[i%historySize])
	}
	return out
}

// Close closes the file the ring reads RSS from.
func (r *historyRing) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.statm != nil {
		r.statm.Close()
		r.statm = nil
	}
}

func (r *historyRing) add(e historyEntry) {
	r.e[r.n%historySize] = e
	r.n++
}

// rss returns RSS in bytes from /proc/self/statm (proc(5)), -1 when
// unreadable, from a file kept open and a fixed buffer. r.mu held.
func (r *historyRing) rss() int64 {
	if !r.tried {
		r.tried = true
		r.statm, _ = os.Open("/proc/self/statm")
	}
	if r.statm == nil {
		return -1
	}
	n, err := r.statm.ReadAt(r.buf[:], 0)
	if n == 0 && err != nil {
		return -1
	}
	return parseStatm(r.buf[:n])
}

// parseStatm returns a statm line's resident size (its second field) in
// bytes, -1 if malformed.
func parseStatm(b []byte) int64 {
	_, rest, ok := bytes.Cut(bytes.TrimSuffix(b, []byte("\n")), []byte(" "))
	field, _, _ := bytes.Cut(rest, []byte(" "))
	pages, err := strconv.ParseUint(string(field), 10, 63)
	if !ok || err != nil {
		return -1
	}
	return int64(pages) * int64(os.Getpagesize())
}
