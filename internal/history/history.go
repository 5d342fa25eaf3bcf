// Package history keeps the last minutes of RSS, the live heap and
// GOMEMLIMIT for the /debug/memctl page, recorded when memctl already wakes
// (GC ends, trims, limit changes, pressure) in a fixed ring. No timer, no
// goroutine, and recording allocates nothing.
package history

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Kind says what an Entry records.
type Kind uint8

const (
	KindGCEnd    Kind = iota // a GC cycle ended
	KindTrim                 // a trim ran or was skipped
	KindLimit                // GOMEMLIMIT or the memory limit changed
	KindPressure             // kernel memory pressure, or a death spiral
)

// String returns "gc", "trim", "limit" or "pressure".
func (k Kind) String() string {
	if names := [...]string{"gc", "trim", "limit", "pressure"}; int(k) < len(names) {
		return names[k]
	}
	return "gc"
}

// Entry is one moment: its time, what it was, RSS (bytes, -1 unknown),
// the live heap at the last GC end and GOMEMLIMIT (bytes).
type Entry struct {
	At         time.Time
	Kind       Kind
	RSS        int64
	Live       int64
	GoMemLimit int64
}

// Size is how many entries a Ring keeps: at most one GC end every
// minGap, so three minutes of a busy process, more of a quiet one.
const Size = 720

// minGap is the least time between two GC-end entries (and RSS reads).
const minGap = 250 * time.Millisecond

// Ring is the history of one controller. Its zero value is empty and
// ready; it is safe for concurrent use.
type Ring struct {
	live   atomic.Int64 // the live heap of the last GC end
	lastGC atomic.Int64 // when the last GC-end entry was made, Unix ns; 0 none

	mu      sync.Mutex
	e       [Size]Entry
	n, next int
	statm   *os.File // /proc/self/statm, opened at the first read; nil if it cannot be
	tried   bool
	buf     [128]byte
}

// GCEnd records a GC end at t with its live heap and GOMEMLIMIT; within
// minGap of the last only the live heap is kept. It allocates nothing.
func (r *Ring) GCEnd(t time.Time, live, gomemlimit int64) {
	r.live.Store(live)
	ns := t.UnixNano()
	if last := r.lastGC.Load(); last != 0 && ns-last < int64(minGap) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastGC.Store(ns)
	r.add(Entry{At: t, Kind: KindGCEnd, RSS: r.rss(), Live: live, GoMemLimit: gomemlimit})
}

// Mark records an event of kind k at t, with RSS read now.
func (r *Ring) Mark(t time.Time, k Kind, gomemlimit int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add(Entry{At: t, Kind: k, RSS: r.rss(), Live: r.live.Load(), GoMemLimit: gomemlimit})
}

// Entries returns the entries recorded, oldest first.
func (r *Ring) Entries() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Entry, 0, r.n)
	for i := range r.n {
		out = append(out, r.e[(r.next-r.n+i+Size)%Size])
	}
	return out
}

// Close closes the file the ring reads RSS from.
func (r *Ring) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.statm != nil {
		r.statm.Close()
		r.statm = nil
	}
}

func (r *Ring) add(e Entry) {
	r.e[r.next] = e
	r.next = (r.next + 1) % Size
	r.n = min(r.n+1, Size)
}

// rss returns RSS in bytes from /proc/self/statm (proc(5)), -1 when
// unreadable, from a file kept open and a fixed buffer. r.mu held.
func (r *Ring) rss() int64 {
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
