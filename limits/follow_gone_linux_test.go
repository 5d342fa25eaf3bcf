package limits

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/cgrouptest"
)

// TestFollowFileReplaced: a watched limit file replaced at the same path
// (a cgroup removed and made again) drops its inotify watch (IN_IGNORED);
// the follower watches the new file, and a later write to it is followed
// at once. The watch was lost for good: the set of file names was the
// same, so it was not watched again, and with every file "watched" no
// timer ran either: the write was never followed.
func TestFollowFileReplaced(t *testing.T) {
	keepMemoryLimit(t)
	file := filepath.Join(t.TempDir(), "memory.max")
	write := func(n int64) {
		require.NoError(t, os.WriteFile(file, []byte(strconv.FormatInt(n, 10)+"\n"), 0o644))
	}
	write(gib)
	l := &movingLimit{file: file}
	l.bytes.Store(gib)
	m, d, err := NewMemLimiter(followCfg(l, newFollower))
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, ninetyPct(gib), d.GoMemLimit)
	require.Equal(t, "inotify on 1 files", m.Following())

	// Replaced: the new file is in place when the old one goes (rename),
	// so the follower finds it when it watches again.
	reads, watched := l.reads.Load(), m.following.Load()
	tmp := file + ".new"
	require.NoError(t, os.WriteFile(tmp, []byte(strconv.FormatInt(gib, 10)+"\n"), 0o644))
	require.NoError(t, os.Rename(tmp, file))
	// The IN_IGNORED re-read, and the new file watched (rewatch stores a
	// new Following after the watch is in place), before the write that
	// matters.
	require.Eventually(t, func() bool { return l.reads.Load() > reads }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return m.following.Load() != watched }, 5*time.Second, time.Millisecond, "the new file watched")

	l.bytes.Store(512 << 20)
	write(512 << 20)
	assert.Eventually(t, func() bool { return debug.SetMemoryLimit(-1) == ninetyPct(512<<20) }, 5*time.Second, 10*time.Millisecond,
		"a write to the file made again is followed")
}

// TestFollowCloseInFlight: Close while inotify events arrive, twice, from
// two goroutines: it returns, and no goroutine is left behind.
func TestFollowCloseInFlight(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	keepMemoryLimit(t)
	file := filepath.Join(t.TempDir(), "memory.max")
	require.NoError(t, os.WriteFile(file, []byte("1073741824\n"), 0o644))
	for range 20 {
		l := &movingLimit{file: file}
		l.bytes.Store(gib)
		m, _, err := NewMemLimiter(followCfg(l, newFollower))
		require.NoError(t, err)
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					_ = os.WriteFile(file, []byte("1073741824\n"), 0o644)
				}
			}
		}()
		time.Sleep(5 * time.Millisecond)
		done := make(chan struct{}, 2)
		go func() { m.Close(); done <- struct{}{} }()
		go func() { m.Close(); done <- struct{}{} }()
		for range 2 {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not return")
			}
		}
		close(stop)
		select {
		case <-m.folDone:
		default:
			t.Fatal("the follower still runs after Close")
		}
		m.Close()
	}
}

// TestFollowCgroupRemoved: an idle process moved to another cgroup (v1's
// cgrulesengd, cgclassify), whose old cgroup is then removed, should
// follow the new cgroup's limit within Refresh. It does not: cgroupfs
// sends no event on the watched files when the cgroup is removed (the
// watch pins the inode: no IN_IGNORED), nothing notifies a migration, and
// with every file watched no timer runs; the new limit waits for a GC-end
// refresh (an idle process: the forced GC, every 2 minutes). A known gap,
// not fixed here: following it needs the timer while every file is
// watched, a change to the idle contract. MEMCTL_TEST_MIGRATION=1 runs it.
func TestFollowCgroupRemoved(t *testing.T) {
	if os.Getenv("MEMCTL_TEST_MIGRATION") == "" {
		t.Skip("known gap: a migration to another cgroup is not followed until a GC-end refresh (MEMCTL_TEST_MIGRATION=1 runs it)")
	}
	a := cgrouptest.New(t, 512<<20)
	b := cgrouptest.New(t, 256<<20)
	c := startFollow(t, a, "FOLLOW_MODE=idle", "FOLLOW_LIVE=16")
	before := c.readyLimit(t)
	t.Logf("start: %s", c.ready)
	require.NoError(t, os.WriteFile(filepath.Join(b.Dir, "cgroup.procs"), []byte(strconv.Itoa(c.cmd.Process.Pid)), 0))
	time.Sleep(200 * time.Millisecond)
	since := time.Now()
	require.NoError(t, a.Remove())
	n, line, after, ok := c.waitChange(since, followWithin+5*time.Second)
	require.True(t, ok, "no GOMEMLIMIT change after the move and the old cgroup's removal")
	t.Logf("%s, %v after the removal", line, after)
	assert.Less(t, n, before)
	assert.LessOrEqual(t, n, int64(256<<20))
}

// TestFollowerClosedBeforeWait: a close that comes before the follower's
// wait is the close, not a failed watch. SetReadDeadline on the closed
// inotify file says "use of closed file", which is not os.ErrClosed: the
// follower took it for a failure and, at Close, logged a WARN and made a
// timer (a second Start closed at once: TestSecondStartWarnsAndOlderServesAfterNewerCloses).
func TestFollowerClosedBeforeWait(t *testing.T) {
	f, err := newFollower()
	if err != nil {
		t.Skipf("no inotify here: %v", err)
	}
	f.close()
	_, err = f.wait(time.Time{})
	assert.ErrorIs(t, err, errFollowClosed, "no deadline")
	_, err = f.wait(time.Now().Add(time.Second))
	assert.ErrorIs(t, err, errFollowClosed, "with a deadline")
}
