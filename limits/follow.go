package limits

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Following a changed limit without a GC.
//
// The refresh at GC end (internal/gcend) misses two cases: a process that
// allocates nothing runs no GC, and one that the kernel throttles under
// memory.high runs few. A MemLimiter that found a memory cgroup therefore
// also runs one goroutine, its follower, which re-reads the limit when one
// of its files is written and, only where the kernel gives no notification
// and a cgroup limit exists, at most every Refresh:
//
//   - inotify (Linux): a write(2) to memory.max, memory.high (v2) or
//     memory.limit_in_bytes (v1) generates IN_MODIFY (vfs_write calls
//     fsnotify_modify), from any cgroup namespace or mount of the
//     hierarchy, as all of them share one superblock: measured on Debian's
//     6.1 kernel (a write from the host's mount seen by a watch in a
//     private cgroup namespace's mount, and the reverse) and, for v1, on
//     this repo's 6.18 host. The files of the process's cgroup and of each
//     ancestor up to the top it can see are watched. The inotify file is
//     read through the runtime's network poller: the goroutine is parked
//     without a thread and wakes only on a write.
//   - a timer, when inotify is not available (inotify_init1 failed: the
//     per-user limit of instances, fs.inotify.max_user_instances, is 128
//     by default and shared by every process of that user on the node), a
//     file could not be watched, or the limit came from a file no write
//     reaches (v1's hierarchical_memory_limit in memory.stat, set above
//     the mounted part of the hierarchy). It runs only while GOMEMLIMIT
//     follows a cgroup limit, wakes at most every Refresh (10 s), and
//     skips the re-read when a GC end re-read the limit within Refresh.
//
// A re-read costs what the refresh at GC end costs (see MemLimiter); it
// reads GOMEMLIMIT through runtime/metrics, which takes no lock, so that a
// follower woken while the kernel throttles the process does not queue
// on the heap lock behind a thread asleep in the kernel (only a change of
// GOMEMLIMIT takes it). package memctl also asks for a re-read on kernel
// memory pressure (Poke).

// follower waits for a change of the watched limit files. Only the
// follower's goroutine calls watch and wait; close may be called from any
// goroutine, once, and makes a wait in progress or to come return
// errFollowClosed.
type follower interface {
	// watch replaces the watched files; it reports whether every one of
	// them is watched.
	watch(files []string) bool
	// wait blocks until a watched file is written (true), the deadline
	// passes (false; a zero deadline never passes) or close is called.
	wait(deadline time.Time) (changed bool, err error)
	close()
	// kind names the mechanism for Following.
	kind() string
}

// staler is a follower that can lose a watch (inotify's IN_IGNORED when
// a watched file is removed): stale reports it, and the files are then
// watched again even when their names are the same.
type staler interface{ stale() bool }

func isStale(f follower) bool {
	s, ok := f.(staler)
	return ok && s.stale()
}

var errFollowClosed = errors.New("limits: follower closed")

// timerFollower watches nothing: it waits for its deadline.
type timerFollower struct {
	quit chan struct{}
	once sync.Once
	note string // why there is no inotify
}

func newTimerFollower(note string) *timerFollower {
	return &timerFollower{quit: make(chan struct{}), note: note}
}

func (f *timerFollower) watch([]string) bool { return false }

func (f *timerFollower) wait(deadline time.Time) (bool, error) {
	if deadline.IsZero() {
		<-f.quit
		return false, errFollowClosed
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-f.quit:
		return false, errFollowClosed
	case <-t.C:
		return false, nil
	}
}

func (f *timerFollower) close() { f.once.Do(func() { close(f.quit) }) }

func (f *timerFollower) kind() string { return "timer (" + f.note + ")" }

// maxFollowDepth bounds how many cgroups up the path are watched.
const maxFollowDepth = 64

// limitFiles returns the limit files of the cgroup directory dir and of
// each ancestor up to the top this process can see (the first directory
// without them: the v2 root has no memory.max, the v1 mount point's parent
// is not a cgroup), plus extra (the files the last decision came from).
func limitFiles(version int, dir string, extra []string) []string {
	names := []string{"memory.limit_in_bytes"}
	if version == 2 {
		names = []string{"memory.max", "memory.high"}
	}
	var files []string
	seen := map[string]bool{}
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	for d, i := filepath.Clean(dir), 0; dir != "" && i < maxFollowDepth; d, i = filepath.Dir(d), i+1 {
		found := false
		for _, n := range names {
			if st, err := os.Stat(filepath.Join(d, n)); err == nil && st.Mode().IsRegular() {
				add(filepath.Join(d, n))
				found = true
			}
		}
		if !found || d == "/" || d == "." {
			break
		}
	}
	for _, f := range extra {
		add(f)
	}
	return files
}

// unwatchable reports whether a write to file is not a way its limit
// changes: v1's memory.stat (hierarchical_memory_limit, set above the
// mount) changes with no write to it.
func unwatchable(file string) bool { return filepath.Base(file) == "memory.stat" }

// startFollow starts the follower's goroutine. Called once, by
// NewMemLimiter, when a memory cgroup was found and the refresh is on.
func (m *MemLimiter) startFollow(newFollower func() (follower, error)) {
	f, err := newFollower()
	if err != nil {
		f = newTimerFollower(err.Error())
	}
	m.fol, m.folDone = f, make(chan struct{})
	st := &followState{}
	m.rewatch(f, st) // before Start's report reads Following
	go m.follow(f, st)
}

// followState is what the follower's goroutine knows of its watches.
type followState struct {
	list    []string // the files watched, or read at a timer's wake-up
	snap    []byte   // their content at the last timer wake-up
	buf     []byte   // reused by snapshot
	watched string   // the key of the watched set
	all     bool     // every file that matters is watched
	limited bool     // GOMEMLIMIT follows a cgroup limit
}

// rewatch reads what the last decision found and, when it changed,
// replaces the watches. It reports false when the limiter stopped.
func (m *MemLimiter) rewatch(f follower, st *followState) bool {
	m.mu.Lock()
	stopped, dir, version, files := m.stopped, m.dir, m.version, m.files
	st.limited = m.applied != 0
	m.mu.Unlock()
	if stopped {
		return false
	}
	key := fmt.Sprint(version, dir, files)
	if key == st.watched && !isStale(f) {
		return true
	}
	st.watched = key
	list := limitFiles(version, dir, files)
	st.list, st.snap = list, nil
	st.all = f.watch(list)
	for _, file := range files {
		st.all = st.all && !unwatchable(file)
	}
	desc := f.kind()
	if desc == "inotify" {
		desc = fmt.Sprintf("inotify on %d files", len(list))
		if !st.all {
			desc += fmt.Sprintf(", and a timer every %v while a limit is followed (not every file can be watched)", m.every)
		}
	}
	m.following.Store(&desc)
	return true
}

// follow is the follower's goroutine: it keeps the watches on the files
// of the cgroup that the last decision read, waits for a write (or, where
// needed, the due time), and re-reads the limit. It returns when closed or
// when the program took GOMEMLIMIT over.
func (m *MemLimiter) follow(f follower, st *followState) {
	defer close(m.folDone)
	for {
		if !m.rewatch(f, st) {
			return
		}
		var deadline time.Time
		if st.limited && !st.all {
			deadline = m.epoch.Add(time.Duration(m.next.Load()))
		}
		changed, err := f.wait(deadline)
		if errors.Is(err, errFollowClosed) {
			return
		}
		if err != nil {
			// The inotify file failed: the timer takes over.
			m.mu.Lock()
			m.warn(false, "follow", fmt.Errorf("limits: watching the cgroup limit files: %w; re-read every %v instead", err, m.every))
			m.mu.Unlock()
			f.close()
			f = newTimerFollower(err.Error())
			m.folMu.Lock()
			closing := m.folClosing
			m.fol = f
			m.folMu.Unlock()
			if closing {
				return
			}
			st.watched = ""
			continue
		}
		now := time.Since(m.epoch)
		if !changed && int64(now) < m.next.Load() {
			continue // a GC end re-read the limit meanwhile
		}
		if !changed {
			// The timer: the whole re-read only when a limit file
			// changed since its last wake-up.
			var same bool
			st.buf, same = snapshot(st.list, st.buf[:0], st.snap)
			st.snap = append(st.snap[:0], st.buf...)
			if same {
				m.next.Store(dueAfter(now, m.every))
				continue
			}
		}
		m.mu.Lock()
		if !m.stopped {
			m.next.Store(dueAfter(now, m.every))
			_, _ = m.decide(false)
		}
		m.mu.Unlock()
	}
}

// Following says how a changed limit is noticed between GC ends: "inotify on N
// files", a timer with the reason there is no inotify, or "" when there is no
// follower (no memory cgroup, the refresh off, the operator's GOMEMLIMIT).
func (m *MemLimiter) Following() string {
	if m == nil {
		return ""
	}
	if s := m.following.Load(); s != nil {
		return *s
	}
	return ""
}

// Poke re-reads the limit now, in the caller's goroutine, unless the refresh is
// off or closed, a re-read is running, or Poke re-read it within the last
// second. package memctl calls it on kernel memory pressure, when a lowered
// memory.high may be throttling the process and GC ends become rare.
func (m *MemLimiter) Poke() {
	if m == nil || !m.on || m.every <= 0 || m.closed.Load() {
		return
	}
	now := time.Since(m.epoch)
	if last := m.poked.Load(); last != 0 && now-time.Duration(last) < time.Second {
		return
	}
	if !m.mu.TryLock() {
		return
	}
	defer m.mu.Unlock()
	m.poked.Store(int64(max(now, 1)))
	if m.stopped {
		return
	}
	m.next.Store(dueAfter(now, m.every))
	_, _ = m.decide(false)
}

// closeFollow stops the follower and waits for its goroutine.
func (m *MemLimiter) closeFollow() {
	m.folMu.Lock()
	m.folClosing = true
	f := m.fol
	m.folMu.Unlock()
	if f == nil {
		return
	}
	f.close()
	<-m.folDone
}

// snapshot appends the content of files to buf and reports whether it is
// prev; a file that cannot be read, or is over 64 bytes (v1's memory.stat),
// is never the same. It allocates nothing once buf has grown.
func snapshot(files []string, buf, prev []byte) ([]byte, bool) {
	ok := len(files) > 0
	var small [64]byte
	for _, f := range files {
		n, read := readSmall(f, small[:])
		ok = ok && read
		buf = append(buf, small[:n]...)
		buf = append(buf, 0)
	}
	return buf, ok && prev != nil && string(buf) == string(prev)
}
