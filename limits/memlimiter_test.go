package limits

import (
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gcendtest"
)

func TestOperatorEnvironmentWins(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(123 << 20)
	for _, env := range [][2]string{{"GOMEMLIMIT", "123MiB"}, {"GOMEMLIMIT", "off"}, {"AUTOMEMLIMIT", "off"},
		{"AUTOMEMLIMIT", "OFF"}, {"AUTOMEMLIMIT", " Off "}, {"AUTOMEMLIMIT", "off\n"}, {"AUTOMEMLIMIT", "0"}, {"AUTOMEMLIMIT", "false"}} {
		t.Run(env[0]+"="+env[1], func(t *testing.T) {
			t.Setenv(env[0], env[1])
			cfg := cfgFor(fixedLimit(2, gib))
			cfg.Refresh = time.Millisecond
			m, d, err := start(t, cfg)
			require.NoError(t, err)
			assert.Equal(t, SourceEnv, d.Source)
			assert.Equal(t, int64(123<<20), d.GoMemLimit)
			assert.Equal(t, int64(123<<20), debug.SetMemoryLimit(-1), "GOMEMLIMIT untouched")
			assert.Contains(t, d.Reason, env[0])
			assert.Equal(t, time.Millisecond, m.Interval(), "the limit is still followed under the operator's value")
			d, err = m.Refresh()
			require.NoError(t, err)
			assert.Equal(t, SourceEnv, d.Source)
			assert.Equal(t, int64(123<<20), debug.SetMemoryLimit(-1), "Refresh does not override the operator")
		})
	}
}

// TestEmptyEnvironmentIsUnset: GOMEMLIMIT= and AUTOMEMLIMIT= (or only
// space) are unset: memctl sets GOMEMLIMIT from the cgroup limit as if
// they were absent.
func TestEmptyEnvironmentIsUnset(t *testing.T) {
	for _, env := range [][2]string{{"GOMEMLIMIT", ""}, {"AUTOMEMLIMIT", ""}, {"AUTOMEMLIMIT", "  "}} {
		t.Run(env[0]+"="+env[1], func(t *testing.T) {
			keepMemoryLimit(t)
			debug.SetMemoryLimit(math.MaxInt64)
			t.Setenv(env[0], env[1])
			_, d, err := start(t, cfgFor(fixedLimit(2, gib)))
			require.NoError(t, err)
			want := ninetyPct(gib)
			assert.Equal(t, SourceCgroupV2, d.Source, d.Reason)
			assert.Equal(t, want, d.GoMemLimit)
			assert.Equal(t, want, debug.SetMemoryLimit(-1), "GOMEMLIMIT read back from the runtime")
			v, ok := os.LookupEnv(env[0])
			assert.True(t, ok && v == env[1], "%s is left in the environment as it was", env[0])
		})
	}
}

func TestBadConfigChangesNothing(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(77 << 20)
	for _, r := range []float64{-0.1, 1.5, math.NaN(), math.Inf(1)} {
		cfg := cfgFor(fixedLimit(2, gib))
		cfg.Ratio = r
		m, _, err := start(t, cfg)
		require.Error(t, err, "ratio %v", r)
		assert.Contains(t, err.Error(), "(0.0, 1.0]")
		_, err = m.Refresh()
		require.NoError(t, err, "Refresh of a limiter that never started does nothing")
	}
	cfg := cfgFor(fixedLimit(2, gib))
	cfg.Floor = -1
	_, _, err := start(t, cfg)
	require.ErrorContains(t, err, "floor -1")
	for _, v := range []string{"lots", "2", "-0.5", "NaN", "of f", "0.5x", "0x1p-1"} {
		t.Setenv("AUTOMEMLIMIT", v)
		_, _, err := start(t, cfgFor(fixedLimit(2, gib)))
		require.Error(t, err, "AUTOMEMLIMIT=%s", v)
		assert.Contains(t, err.Error(), "AUTOMEMLIMIT")
	}
	assert.Equal(t, int64(77<<20), debug.SetMemoryLimit(-1))
}

// TestRefreshAtGCEnd: the re-read runs at GC end once the interval has
// passed, not before; each change is logged once at INFO, each distinct
// failure once at WARN.
func TestRefreshAtGCEnd(t *testing.T) {
	keepMemoryLimit(t)
	var mu sync.Mutex
	limit, fail := gib, error(nil)
	cfg := cfgFor(func() (cgroupfs.Limit, error) {
		mu.Lock()
		defer mu.Unlock()
		l, _ := fixedLimit(2, limit)()
		return l, fail
	})
	set := func(l int64, err error) {
		mu.Lock()
		limit, fail = l, err
		mu.Unlock()
	}
	rec := &recorder{}
	cfg.Ratio, cfg.Refresh, cfg.Logger = 1, time.Minute, slog.New(rec)
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, gib, d.GoMemLimit)
	assert.Equal(t, time.Minute, m.Interval())
	assert.Empty(t, rec.levels(), "the first decision is returned, not logged")

	set(512<<20, nil) // the pod was resized in place
	assert.True(t, m.tick(59*time.Second))
	assert.Equal(t, gib, debug.SetMemoryLimit(-1), "not before the interval")
	assert.True(t, m.tick(61*time.Second))
	assert.Equal(t, int64(512<<20), debug.SetMemoryLimit(-1), "after it")
	assert.Equal(t, 1, rec.count(slog.LevelInfo))
	assert.True(t, m.tick(62*time.Second))
	assert.True(t, m.tick(200*time.Second))
	assert.Equal(t, 1, rec.count(slog.LevelInfo), "no change, no log")

	set(0, errors.New("cgroupfs: /sys/fs/cgroup/x/memory.max: malformed limit \"lots\""))
	for i := range 5 {
		assert.True(t, m.tick(time.Duration(300+60*i)*time.Second))
	}
	assert.Equal(t, int64(512<<20), debug.SetMemoryLimit(-1), "a failed re-read leaves GOMEMLIMIT")
	assert.Equal(t, 1, rec.count(slog.LevelWarn), "one WARN for one failure seen five times")
	set(0, errors.New("cgroupfs: /sys/fs/cgroup/x/memory.max: permission denied"))
	assert.True(t, m.tick(700*time.Second))
	assert.True(t, m.tick(800*time.Second))
	assert.Equal(t, 2, rec.count(slog.LevelWarn), "a distinct failure is logged once too")
	set(0, nil) // memory.max 0: implausible, once
	assert.True(t, m.tick(900*time.Second))
	assert.True(t, m.tick(1000*time.Second))
	assert.Equal(t, 3, rec.count(slog.LevelWarn))
	assert.Equal(t, int64(512<<20), debug.SetMemoryLimit(-1))

	// The program sets GOMEMLIMIT itself: memctl stops refreshing it.
	set(2*gib, nil)
	debug.SetMemoryLimit(300 << 20)
	assert.False(t, m.tick(1100*time.Second), "the subscription ends")
	assert.Equal(t, int64(300<<20), debug.SetMemoryLimit(-1))
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(300<<20), d.GoMemLimit, "Refresh leaves the program's limit too")
}

// A refresh with no cgroup limit must leave a limit the program set itself,
// and set one once the cgroup gets a limit.
func TestRefreshWithoutLimitKeepsProgramLimit(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(512 << 20)
	var mu sync.Mutex
	var limit int64 = cgroupfs.NoLimit
	cfg := cfgFor(func() (cgroupfs.Limit, error) {
		mu.Lock()
		defer mu.Unlock()
		return fixedLimit(2, limit)()
	})
	cfg.Ratio, cfg.Refresh = 1, time.Minute
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, SourceNone, d.Source)
	for i := 1; i <= 3; i++ {
		m.tick(time.Duration(i) * 61 * time.Second)
	}
	assert.Equal(t, int64(512<<20), debug.SetMemoryLimit(-1), "no limit found: the program's own limit stays")
	mu.Lock()
	limit = gib
	mu.Unlock()
	m.tick(5 * time.Minute)
	assert.Equal(t, gib, debug.SetMemoryLimit(-1), "a limit that appears is applied")
}

// TestRefreshRunsFromGCEnd: the real hook, no goroutine: GC cycles re-read
// the limit, and Close removes the subscription.
func TestRefreshRunsFromGCEnd(t *testing.T) {
	keepMemoryLimit(t)
	before := gcend.Active()
	var mu sync.Mutex
	limit := gib
	cfg := cfgFor(func() (cgroupfs.Limit, error) {
		mu.Lock()
		defer mu.Unlock()
		return fixedLimit(2, limit)()
	})
	cfg.Ratio, cfg.Refresh = 1, time.Nanosecond
	m, _, err := NewMemLimiter(cfg)
	require.NoError(t, err)
	assert.Equal(t, before+1, gcend.Active())
	mu.Lock()
	limit = 768 << 20
	mu.Unlock()
	for i := 0; i < 10000 && debug.SetMemoryLimit(-1) != 768<<20; i++ { // until it is seen; the bound only stops a hang
		runtime.GC()
		time.Sleep(time.Millisecond) // the cleanup goroutine runs the hook
	}
	assert.Equal(t, int64(768<<20), debug.SetMemoryLimit(-1), "re-read at a GC end")
	m.Close()
	m.Close()
	assert.Equal(t, before, gcend.Active(), "Close stops the subscription")
	mu.Lock()
	limit = 640 << 20
	mu.Unlock()
	gcendtest.Seen(t)
	assert.Equal(t, int64(768<<20), debug.SetMemoryLimit(-1), "no re-read after Close")
}

// TestRefreshHugeInterval: an interval near the largest time.Duration
// (MEMCTL_REFRESH=2562047h47m16s) means "practically never", before and
// after a Refresh call; now + interval wrapped to a negative time and the
// limit was then re-read at every GC end.
func TestRefreshHugeInterval(t *testing.T) {
	keepMemoryLimit(t)
	var reads atomic.Int64
	read := fixedLimit(2, gib)
	cfg := cfgFor(func() (cgroupfs.Limit, error) {
		reads.Add(1)
		return read()
	})
	cfg.Refresh = math.MaxInt64 - time.Millisecond
	m, _, err := start(t, cfg)
	require.NoError(t, err)
	require.Equal(t, int64(1), reads.Load())
	assert.True(t, m.tick(time.Hour))
	assert.Equal(t, int64(1), reads.Load(), "not due after an hour")
	time.Sleep(2 * time.Millisecond) // time.Since(epoch) + interval overflows now
	_, err = m.Refresh()
	require.NoError(t, err)
	require.Equal(t, int64(2), reads.Load())
	for i := range 5 {
		assert.True(t, m.tick(time.Duration(i+2)*time.Hour))
	}
	assert.Equal(t, int64(2), reads.Load(), "a Refresh call does not make every GC end a re-read")
}

// BenchmarkRefresh is what the GC-end hook costs on the runtime's cleanup
// goroutine: "not-due", every GC end but one per interval (one atomic
// load); "reread", the one per interval, and its parts. The reads are the
// limiter's own (selfReads: the cgroup resolved once, its files re-read),
// of this machine's real cgroup files and /proc/self/status. go test
// ./limits -run XXX -bench BenchmarkRefresh -benchmem -count 8
func BenchmarkRefresh(b *testing.B) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	// This machine's own cgroup may have no limit: read its real files, and
	// take 1 GiB when they set none, so that the whole decision runs.
	var own selfReads
	file := ""
	read := func() (cgroupfs.Limit, error) {
		l, err := own.limit.Read()
		if err == nil && l.Bytes == cgroupfs.NoLimit {
			if file == "" {
				file = filepath.Join(l.Dir, "memory.limit_in_bytes")
			}
			l.Bytes, l.File = gib, file
		}
		return l, err
	}
	m, _, err := NewMemLimiter(MemLimitConfig{Refresh: time.Hour, deps: limDeps{read: read}})
	if err != nil {
		b.Skip(err)
	}
	defer m.Close()
	b.Run("not-due", func(b *testing.B) {
		for b.Loop() {
			m.tick(time.Minute)
		}
	})
	b.Run("reread", func(b *testing.B) {
		defer threadCPU(b)()
		for b.Loop() {
			m.mu.Lock()
			_, _ = m.decide(false)
			m.mu.Unlock()
		}
	})
	// The same decision without the cgroup's account (issue 18 added the
	// memory.stat read): the ratio of reread to this is its cost.
	n, _, err := NewMemLimiter(MemLimitConfig{Refresh: time.Hour, deps: limDeps{read: read, charge: noCharge}})
	if err != nil {
		b.Skip(err)
	}
	defer n.Close()
	b.Run("reread-no-charge", func(b *testing.B) {
		for b.Loop() {
			n.mu.Lock()
			_, _ = n.decide(false)
			n.mu.Unlock()
		}
	})
	b.Run("charge", func(b *testing.B) {
		l, err := cgroupfs.Of(0)
		if err != nil {
			b.Skip(err)
		}
		for b.Loop() {
			if _, err := m.self.charge(l.Version, l.Dir); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cgroup", func(b *testing.B) {
		for b.Loop() {
			_, _ = m.read()
		}
	})
	b.Run("usage", func(b *testing.B) {
		for b.Loop() {
			_, _, _ = m.usage()
		}
	})
}
