package pressure

import (
	"bytes"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEpisodeActions(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOMEMLIMIT", "")
	var shed []bool
	m := newTestMonitor(t, Config{LiftFor: time.Hour}, &fakeOwner{ceiling: 256 * mib})
	m.deps.shed = func(on bool) { shed = append(shed, on) }
	debug.SetMemoryLimit(230 * mib)
	ch, _ := m.Subscribe(4)

	m.inSpiral.Store(true)
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiral})
	assert.Equal(t, []bool{true}, shed)
	// +10% of 230 MiB is 253 MiB, under the 256 MiB ceiling.
	assert.Equal(t, int64(230*mib+23*mib), debug.SetMemoryLimit(-1))
	assert.Equal(t, int64(23*mib), m.Stats().Lifted)
	// A second start while lifted does not lift again.
	m.applied = false
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiral})
	assert.Equal(t, int64(253*mib), debug.SetMemoryLimit(-1))
	assert.Equal(t, int64(1), m.Stats().Lifts)

	m.inSpiral.Store(false)
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiralEnd})
	assert.Equal(t, []bool{true, true, false}, shed, "each change applied sheds or stops")

	require.NoError(t, m.Close())
	assert.Equal(t, int64(230*mib), debug.SetMemoryLimit(-1), "Close ends the lift")
	assert.Zero(t, m.Stats().Lifted)
	assert.Empty(t, ch, "episode() publishes nothing; gcEnd does")
}

// liftOnce runs one lift of m as an episode would, under its action lock.
func liftOnce(m *Monitor) (to int64, why string) {
	m.actMu.Lock()
	defer m.actMu.Unlock()
	return m.liftLocked()
}

func TestLiftBounds(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Run("ceiling", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{}, &fakeOwner{ceiling: 240 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, _ := liftOnce(m)
		assert.Equal(t, int64(240*mib), to, "never above the cgroup limit")
	})
	t.Run("no room", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{}, &fakeOwner{ceiling: 200 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, why := liftOnce(m)
		assert.Zero(t, to)
		assert.Contains(t, why, "no room")
		assert.Equal(t, int64(230*mib), debug.SetMemoryLimit(-1))
	})
	t.Run("operator", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "230MiB")
		m := newTestMonitor(t, Config{}, &fakeOwner{ceiling: 256 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, why := liftOnce(m)
		assert.Zero(t, to)
		assert.Contains(t, why, "operator")
	})
	t.Run("off", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftOff: true}, &fakeOwner{ceiling: 256 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, _ := liftOnce(m)
		assert.Zero(t, to)
	})
	t.Run("changed meanwhile", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftFor: time.Second}, &fakeOwner{ceiling: 256 * mib})
		debug.SetMemoryLimit(230 * mib)
		m.actMu.Lock()
		to, _ := m.liftLocked()
		require.Positive(t, to)
		debug.SetMemoryLimit(100 * mib) // a refresh after a cgroup resize
		m.endLiftLocked("test")
		// Cool-down: no new lift within LiftFor of the last.
		again, why := m.liftLocked()
		m.actMu.Unlock()
		assert.Equal(t, int64(100*mib), debug.SetMemoryLimit(-1), "the refresh wins over the restore")
		assert.Zero(t, again)
		assert.Contains(t, why, "not yet")
	})
	t.Run("restored after LiftFor", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{LiftFor: time.Second}, &fakeOwner{ceiling: 256 * mib})
		debug.SetMemoryLimit(230 * mib)
		to, _ := liftOnce(m)
		require.Equal(t, int64(253*mib), to)
		require.Eventually(t, func() bool { return debug.SetMemoryLimit(-1) == 230*mib }, 10*time.Second, 20*time.Millisecond)
		assert.Zero(t, m.Stats().Lifted)
	})
	t.Run("through the owner", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		o := &fakeOwner{ceiling: 256 * mib}
		m := newTestMonitor(t, Config{LiftFor: time.Second}, o)
		debug.SetMemoryLimit(230 * mib)
		m.actMu.Lock()
		to, _ := m.liftLocked()
		m.endLiftLocked("test")
		m.actMu.Unlock()
		assert.Equal(t, int64(253*mib), to)
		assert.Equal(t, []int64{23 * mib, 0}, o.asked, "the lift and its end go through the owner")
		assert.Equal(t, int64(230*mib), debug.SetMemoryLimit(-1))
	})
	t.Run("owner refuses", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{}, &fakeOwner{ceiling: 256 * mib})
		m.deps.lift = func(int64) (int64, int64, bool) { return 0, 0, false } // an operator's GOMEMLIMIT
		debug.SetMemoryLimit(230 * mib)
		to, why := liftOnce(m)
		assert.Zero(t, to)
		assert.Contains(t, why, "refused")
	})
	t.Run("no owner", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		m := newTestMonitor(t, Config{}, nil)
		debug.SetMemoryLimit(230 * mib)
		to, why := liftOnce(m)
		assert.Zero(t, to)
		assert.Equal(t, "off", why)
	})
}

// Issue 32: no log line shows a sentinel as a number. A death spiral that
// ends because GOMEMLIMIT was removed (math.MaxInt64, the runtime's "no
// limit") logged gomemlimit=9223372036854775807; so did the end of a lift
// after the limit was removed. Both say "off" now.
func TestSpiralLinesNoSentinel(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOMEMLIMIT", "")
	var b bytes.Buffer
	m := newTestMonitor(t, Config{LiftFor: time.Hour}, &fakeOwner{ceiling: 256 * mib})
	m.log = slog.New(slog.NewTextHandler(&b, nil))
	debug.SetMemoryLimit(230 * mib)

	m.inSpiral.Store(true)
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiral, GoMemLimit: 230 * mib, LiveHeap: 220 * mib})
	assert.Contains(t, b.String(), "gomemlimit=241172480", "the start: a number")
	require.Equal(t, int64(1), m.Stats().Lifts)

	b.Reset()
	debug.SetMemoryLimit(math.MaxInt64) // the program removed its limit
	m.inSpiral.Store(false)
	m.episodes.Add(1)
	m.episode(Event{Kind: KindSpiralEnd, GoMemLimit: math.MaxInt64, LiveHeap: 20 * mib})
	assert.Contains(t, b.String(), `msg="memctl: GC death spiral ended"`)
	assert.Contains(t, b.String(), "gomemlimit=off")

	b.Reset()
	m.actMu.Lock()
	m.endLiftLocked("test")
	m.actMu.Unlock()
	assert.Contains(t, b.String(), `msg="memctl: GOMEMLIMIT lift ended"`)
	assert.Contains(t, b.String(), "gomemlimit=off")
	assert.NotContains(t, b.String(), "9223372036854775807")
}
