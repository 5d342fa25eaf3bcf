package limits

import (
	"errors"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// movingLimit is a v2 memory.max that a test changes, and counts its
// reads.
type movingLimit struct {
	bytes atomic.Int64
	reads atomic.Int64
	file  string
}

func (l *movingLimit) read() (cgroupfs.Limit, error) {
	l.reads.Add(1)
	b := l.bytes.Load()
	if b == cgroupfs.NoLimit {
		return cgroupfs.Limit{Version: 2, Cgroup: "/x", Dir: "/nonexistent/x", Bytes: b, Max: b, High: b}, nil
	}
	return cgroupfs.Limit{Version: 2, Cgroup: "/x", Dir: "/nonexistent/x", Bytes: b, File: l.file, Max: b, MaxFile: l.file, High: cgroupfs.NoLimit}, nil
}

func followCfg(l *movingLimit, f func() (follower, error)) MemLimitConfig {
	cfg := cfgFor(l.read)
	cfg.deps.follower, cfg.deps.noGCEnd, cfg.Refresh = f, true, 0
	return cfg
}

func noInotify() (follower, error) { return nil, errors.New("no inotify in this test") }

// Without inotify, the timer re-reads an idle process's limit every
// Refresh, not sooner, only while a limit is followed, and stops at Close
// (synctest fails on a goroutine left behind).
func TestFollowTimer(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		l := &movingLimit{file: "/nonexistent/x/memory.max"}
		l.bytes.Store(gib)
		m, d, err := NewMemLimiter(followCfg(l, noInotify))
		require.NoError(t, err)
		defer m.Close()
		assert.Equal(t, ninetyPct(gib), d.GoMemLimit)
		assert.Contains(t, m.Following(), "timer (no inotify in this test)")

		l.bytes.Store(512 << 20) // an in-place resize while idle
		time.Sleep(DefaultRefresh - time.Millisecond)
		synctest.Wait()
		assert.Equal(t, ninetyPct(gib), debug.SetMemoryLimit(-1), "not re-read before Refresh")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, ninetyPct(512<<20), debug.SetMemoryLimit(-1), "re-read at Refresh")

		// One re-read per Refresh, no more.
		reads := l.reads.Load()
		time.Sleep(10 * DefaultRefresh)
		synctest.Wait()
		assert.Equal(t, reads+10, l.reads.Load())

		// The limit goes away: no timer while none is followed.
		l.bytes.Store(cgroupfs.NoLimit)
		time.Sleep(DefaultRefresh)
		synctest.Wait()
		reads = l.reads.Load()
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Equal(t, reads, l.reads.Load(), "no wake-up with no limit")
	})
}

// A Poke re-reads at once, at most once a second; a GC-end or Poke
// re-read puts the timer's next wake-up off.
func TestFollowPoke(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		l := &movingLimit{file: "/nonexistent/x/memory.max"}
		l.bytes.Store(gib)
		m, _, err := NewMemLimiter(followCfg(l, noInotify))
		require.NoError(t, err)
		defer m.Close()
		time.Sleep(5 * time.Second)
		l.bytes.Store(512 << 20)
		m.Poke()
		assert.Equal(t, ninetyPct(512<<20), debug.SetMemoryLimit(-1), "a Poke re-reads at once")
		l.bytes.Store(256 << 20)
		m.Poke()
		assert.Equal(t, ninetyPct(512<<20), debug.SetMemoryLimit(-1), "a second Poke within a second does nothing")
		reads := l.reads.Load()
		time.Sleep(DefaultRefresh - time.Millisecond) // the timer was due 5 s after the Poke
		synctest.Wait()
		assert.Equal(t, reads, l.reads.Load(), "the timer waits Refresh after the Poke's re-read")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, ninetyPct(256<<20), debug.SetMemoryLimit(-1))
	})
}

// fakeNotify stands for inotify: every file is watched, wait returns on
// a write (a send on writes).
type fakeNotify struct {
	writes    chan struct{}
	quit      chan struct{}
	once      sync.Once
	mu        sync.Mutex
	deadlines []time.Time
	files     []string
	watchAll  bool
}

func (f *fakeNotify) watch(files []string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files = files
	return f.watchAll
}

func (f *fakeNotify) wait(deadline time.Time) (bool, error) {
	f.mu.Lock()
	f.deadlines = append(f.deadlines, deadline)
	f.mu.Unlock()
	var timer <-chan time.Time
	if !deadline.IsZero() {
		timer = time.After(time.Until(deadline))
	}
	select {
	case <-f.writes:
		return true, nil
	case <-timer:
		return false, nil
	case <-f.quit:
		return false, errFollowClosed
	}
}

func (f *fakeNotify) close()       { f.once.Do(func() { close(f.quit) }) }
func (f *fakeNotify) kind() string { return "inotify" }
func (f *fakeNotify) stale() bool  { return false }

// With every file watched, a write is followed at once and nothing wakes
// the process otherwise; a limit from a file no write reaches (v1's
// memory.stat) brings the timer back.
func TestFollowNotify(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		l := &movingLimit{file: "/nonexistent/x/memory.max"}
		l.bytes.Store(gib)
		fn := &fakeNotify{writes: make(chan struct{}), quit: make(chan struct{}), watchAll: true}
		m, _, err := NewMemLimiter(followCfg(l, func() (follower, error) { return fn, nil }))
		require.NoError(t, err)
		defer m.Close()
		assert.Contains(t, m.Following(), "inotify on 1 files")
		reads := l.reads.Load()
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Equal(t, reads, l.reads.Load(), "no wake-up while every file is watched")
		fn.mu.Lock()
		assert.Equal(t, []time.Time{{}}, fn.deadlines, "no deadline: no timer")
		assert.Equal(t, []string{"/nonexistent/x/memory.max"}, fn.files)
		fn.mu.Unlock()

		l.bytes.Store(256 << 20)
		fn.writes <- struct{}{}
		synctest.Wait()
		assert.Equal(t, ninetyPct(256<<20), debug.SetMemoryLimit(-1), "a write is followed at once")

		l.file = "/nonexistent/x/memory.stat" // v1's hierarchical_memory_limit
		fn.writes <- struct{}{}
		synctest.Wait()
		fn.mu.Lock()
		last := fn.deadlines[len(fn.deadlines)-1]
		fn.mu.Unlock()
		assert.False(t, last.IsZero(), "a limit no write reaches needs the timer")
	})
}

// A program that sets GOMEMLIMIT itself stops the follower.
func TestFollowStopsWhenTakenOver(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		l := &movingLimit{file: "/nonexistent/x/memory.max"}
		l.bytes.Store(gib)
		m, _, err := NewMemLimiter(followCfg(l, noInotify))
		require.NoError(t, err)
		debug.SetMemoryLimit(300 << 20)
		time.Sleep(DefaultRefresh)
		synctest.Wait()
		assert.Equal(t, int64(300<<20), debug.SetMemoryLimit(-1))
		select {
		case <-m.folDone:
		default:
			t.Error("the follower still runs after the program took GOMEMLIMIT over")
		}
		m.Close()
	})
}

// TestPokeAfterClose: Close stops the refresh, GOMEMLIMIT staying as it
// is: a Poke after Close (a pressure watcher the program closes after the
// limiter) re-reads nothing and changes nothing. It re-read the limit and
// set GOMEMLIMIT from it.
func TestPokeAfterClose(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		l := &movingLimit{file: "/nonexistent/x/memory.max"}
		l.bytes.Store(gib)
		m, d, err := NewMemLimiter(followCfg(l, noInotify))
		require.NoError(t, err)
		require.Equal(t, ninetyPct(gib), d.GoMemLimit)
		m.Close()
		reads := l.reads.Load()
		l.bytes.Store(256 << 20)
		time.Sleep(2 * time.Second) // past Poke's once a second
		m.Poke()
		assert.Equal(t, reads, l.reads.Load(), "no re-read after Close")
		assert.Equal(t, ninetyPct(gib), debug.SetMemoryLimit(-1), "GOMEMLIMIT stays as it is")
		m.Close()
	})
}
