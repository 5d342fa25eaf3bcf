package limits

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// follower waits for a write to the watched limit files (inotify), or for a
// timer where no write can be seen (docs/gomemlimit.md). Only the follower's
// goroutine calls watch and wait; close, from any goroutine, makes every wait
// return errFollowClosed.
type follower interface {
	watch(files []string) bool // replaces the watches; true when all are watched
	// wait blocks until a watched file is written (true), the deadline
	// passes (false; a zero deadline never passes) or close is called.
	wait(deadline time.Time) (changed bool, err error)
	close()
	kind() string // for Following
	// stale reports whether a watch was lost since the last watch: the
	// files are then watched again even under the same names.
	stale() bool
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

func (f *timerFollower) stale() bool { return false }

// maxFollowDepth bounds how many cgroups up the path are watched.
const maxFollowDepth = 64

// limitFiles returns the limit files of dir and of each ancestor up to the
// first directory without them, plus extra.
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

// unwatchable reports whether file's limit changes without a write to it
// (v1's memory.stat).
func unwatchable(file string) bool { return filepath.Base(file) == "memory.stat" }

// startFollow starts the follower's goroutine; called once, by NewMemLimiter.
func (m *MemLimiter) startFollow() {
	f, err := m.follower()
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

// rewatch replaces the watches when the last decision's files changed; false
// when the limiter stopped.
func (m *MemLimiter) rewatch(f follower, st *followState) bool {
	m.mu.Lock()
	stopped, dir, version, files := m.stopped, m.dir, m.version, m.files
	st.limited = m.applied != 0
	m.mu.Unlock()
	if stopped {
		return false
	}
	key := fmt.Sprint(version, dir, files)
	if key == st.watched && !f.stale() {
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

// follow is the follower's goroutine; it returns when closed or when the
// program took GOMEMLIMIT over.
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
		if err != nil { // the inotify file failed: the timer takes over
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
		if !changed { // the timer: re-read only when a limit file changed
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
// follower.
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
// second.
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
// prev; a file unread or over 64 bytes is never the same.
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
