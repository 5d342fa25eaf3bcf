package limits

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gcendtest"
)

const gib = int64(1 << 30)

func init() {
	children["memlimit"] = func() {
		d, err := SetGoMemLimit(context.Background(), MemLimitConfig{})
		if err != nil {
			childtest.Fail("%v", err)
		}
		childtest.Say("BYTES", d.GoMemLimit)
		childtest.Say("READBACK", debug.SetMemoryLimit(-1))
		childtest.Say("LIMIT", d.MemoryLimit)
		childtest.Say("SOURCE", d.Source)
		childtest.Say("OUTSIDE", d.Outside)
		childtest.Say("FILE", d.File)
	}
}

// keepMemoryLimit restores GOMEMLIMIT and clears the environment switches
// for one test; GOMEMLIMIT is process-wide.
func keepMemoryLimit(t *testing.T) int64 {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	for _, k := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT", declaredLimitEnv, lambdaMemoryEnv} {
		if v, ok := os.LookupEnv(k); ok {
			t.Setenv(k, v) // restores it afterwards
			os.Unsetenv(k)
		}
	}
	return prev
}

// fixedLimit reads a fixed v1 or v2 limit from a made-up file.
func fixedLimit(version int, bytes int64) func() (cgroupfs.Limit, error) {
	file := "/sys/fs/cgroup/memory/x/memory.limit_in_bytes"
	if version == 2 {
		file = "/sys/fs/cgroup/x/memory.max"
	}
	return func() (cgroupfs.Limit, error) {
		return cgroupfs.Limit{Version: version, Cgroup: "/x", Bytes: bytes, File: file}, nil
	}
}

// pureGo is a process of 32 MiB RSS, all of it mapped by the Go runtime.
func pureGo() (int64, int64, error) { return 32 << 20, 32 << 20, nil }

// cfgFor is the configuration of a test: limit from read, usage pureGo, no
// refresh unless the test sets one.
func cfgFor(read func() (cgroupfs.Limit, error)) MemLimitConfig {
	return MemLimitConfig{read: read, usage: pureGo, Refresh: -1, cgroupFile: "testdata/none/cgroup", charge: noCharge, live: func() int64 { return 16 << 20 }}
}

// noCharge is a cgroup without memory.stat (a made-up Limit's directory).
func noCharge(int, string) (charge, error) { return charge{}, fs.ErrNotExist }

// fixtureCharge reads a fixture's memory.stat (and v1
// memory.kmem.usage_in_bytes, memory.usage_in_bytes or v2 memory.current)
// as readCharge reads a cgroup's, without readCharge's check that the files
// are on a cgroup file system.
func fixtureCharge(version int, dir string) (charge, error) {
	return chargeFiles{
		stat: func(dir string) (cgroupfs.MemoryStat, error) {
			f, err := os.Open(filepath.Join(dir, "memory.stat"))
			if err != nil {
				return cgroupfs.MemoryStat{}, err
			}
			defer f.Close()
			return cgroupfs.ParseMemoryStat(f, f.Name())
		},
		kmem: func(dir string) (int64, error) {
			b, err := os.ReadFile(filepath.Join(dir, "memory.kmem.usage_in_bytes"))
			if err != nil {
				return 0, err
			}
			return cgroupfs.ParseKmemUsage(string(b), "kmem")
		},
		usage: func(version int, dir string) (int64, string, error) {
			file := filepath.Join(dir, "memory.usage_in_bytes")
			if version == 2 {
				file = filepath.Join(dir, "memory.current")
			}
			b, err := os.ReadFile(file)
			if err != nil {
				return 0, file, err
			}
			n, err := cgroupfs.ParseKmemUsage(string(b), file)
			return n, file, err
		},
	}.read(version, dir)
}

func start(t *testing.T, cfg MemLimitConfig) (*MemLimiter, MemLimit, error) {
	t.Helper()
	m, d, err := NewMemLimiter(cfg)
	t.Cleanup(m.Close)
	return m, d, err
}

func TestSetGoMemLimitFromCgroup(t *testing.T) {
	keepMemoryLimit(t)
	d, err := SetGoMemLimit(t.Context(), cfgFor(fixedLimit(2, gib)))
	require.NoError(t, err)
	want := ninetyPct(gib)
	assert.Equal(t, want, d.GoMemLimit)
	assert.Equal(t, want, debug.SetMemoryLimit(-1), "GOMEMLIMIT read back from the runtime")
	assert.Equal(t, gib, d.MemoryLimit)
	assert.Equal(t, 0.9, d.Ratio)
	assert.Equal(t, SourceCgroupV2, d.Source)
	assert.Equal(t, "/sys/fs/cgroup/x/memory.max", d.File)
	assert.Contains(t, d.Reason, "cgroup v2")
}

func TestSetGoMemLimitRatio(t *testing.T) {
	keepMemoryLimit(t)
	cfg := cfgFor(fixedLimit(1, gib))
	cfg.Ratio = 0.5
	d, err := SetGoMemLimit(t.Context(), cfg)
	require.NoError(t, err)
	assert.Equal(t, gib/2, debug.SetMemoryLimit(-1))
	assert.Equal(t, SourceCgroupV1, d.Source)

	// AUTOMEMLIMIT is read as MEMCTL_* variables are: space around it is
	// ignored.
	for _, v := range []string{"0.25", " 0.25", "0.25\n", "\t0.25 "} {
		t.Setenv("AUTOMEMLIMIT", v)
		d, err = SetGoMemLimit(t.Context(), cfg)
		require.NoError(t, err, "AUTOMEMLIMIT=%q", v)
		assert.Equal(t, gib/4, debug.SetMemoryLimit(-1), "AUTOMEMLIMIT=%q wins over the configured ratio", v)
		assert.Equal(t, 0.25, d.Ratio)
		assert.Contains(t, d.Reason, "AUTOMEMLIMIT")
	}
}

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

// recorder is a slog handler that keeps the records it is given.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }
func (r *recorder) levels() []slog.Level {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ls []slog.Level
	for _, rec := range r.recs {
		ls = append(ls, rec.Level)
	}
	return ls
}

// count returns how many records were logged at level.
func (r *recorder) count(level slog.Level) int {
	n := 0
	for _, l := range r.levels() {
		if l == level {
			n++
		}
	}
	return n
}

// TestFixtureTable checks testdata/memlimit/cases.txt: the GOMEMLIMIT and
// log level each fixture gives.
func TestFixtureTable(t *testing.T) {
	f, err := os.Open("testdata/memlimit/cases.txt")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	seen := map[string]bool{}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		require.GreaterOrEqual(t, len(fields), 4, line)
		name, want, level := fields[0], fields[1], fields[2]
		reason := strings.Join(fields[3:], " ")
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			keepMemoryLimit(t)
			const before = 999 << 20 // the program's own GOMEMLIMIT
			debug.SetMemoryLimit(before)
			dir := filepath.Join("testdata", "memlimit", name)
			cfg := cfgFor(func() (cgroupfs.Limit, error) {
				return cgroupfs.Read(filepath.Join(dir, "cgroup"), filepath.Join(dir, "mountinfo"), filepath.Join(dir, "root"))
			})
			cfg.cgroupFile = filepath.Join(dir, "cgroup")
			cfg.charge = fixtureCharge
			rec := &recorder{}
			cfg.Logger = slog.New(rec)
			_, d, err := start(t, cfg)
			got := strconv.FormatInt(debug.SetMemoryLimit(-1), 10)
			if got == strconv.Itoa(before) {
				got = "unchanged"
			}
			assert.Equal(t, want, got, "GOMEMLIMIT; reason: %s; error: %v", d.Reason, err)
			assert.Equal(t, d.GoMemLimit, debug.SetMemoryLimit(-1), "MemLimit.GoMemLimit is GOMEMLIMIT")
			gotLevel := "INFO"
			if err != nil || rec.count(slog.LevelWarn) > 0 {
				gotLevel = "WARN"
			}
			assert.Equal(t, level, gotLevel, "reason: %s; error: %v", d.Reason, err)
			assert.Zero(t, rec.count(slog.LevelError))
			assert.Contains(t, d.Reason, reason)
			if err != nil {
				assert.Contains(t, err.Error(), reason, "the error names the file and the value")
				assert.Regexp(t, "^limits: ", err.Error())
			}
			if want == "unchanged" && level == "INFO" {
				assert.Equal(t, SourceNone, d.Source)
				if d.LimitUnknown {
					// A cgroup no mount shows, or a namespace's top
					// that is not the root: unknown, with the remedy.
					assert.Contains(t, d.Reason, "unknown", d.Reason)
					assert.Contains(t, d.Reason, declaredLimitEnv, "the remedy")
				} else {
					assert.True(t, strings.HasPrefix(d.Reason, "no cgroup memory limit"), d.Reason)
				}
			}
		})
	}
	require.NoError(t, sc.Err())
	dirs, err := os.ReadDir("testdata/memlimit")
	require.NoError(t, err)
	for _, e := range dirs {
		if e.IsDir() {
			assert.True(t, seen[e.Name()], "fixture %s has no row in cases.txt", e.Name())
		}
	}
}

func TestNoCgroupIsNormal(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(55 << 20)
	for _, perr := range []error{
		fmt.Errorf("%w: v2: hierarchy not mounted", cgroupfs.ErrNoCgroup),
		fmt.Errorf("%w: %w", cgroupfs.ErrNoCgroup, &os.PathError{Op: "open", Path: "testdata/none/cgroup", Err: os.ErrNotExist}),
		fmt.Errorf("cgroupfs: cgroups are Linux only, not plan9: %w", errors.ErrUnsupported),
	} {
		rec := &recorder{}
		none := func() (cgroupfs.Limit, error) { return cgroupfs.Limit{}, perr }
		cfg := cfgFor(none)
		cfg.Logger = slog.New(rec)
		_, d, err := start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, SourceNone, d.Source)
		assert.Equal(t, int64(55<<20), debug.SetMemoryLimit(-1), "left as it was")
		assert.Contains(t, d.Reason, "no cgroup memory limit: ")
		assert.Contains(t, d.Reason, perr.Error(), "the reason says why")
		assert.Empty(t, rec.levels(), "nothing logged")

		cfg.SystemFallback = true
		_, d, err = start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, SourceSystem, d.Source)
		assert.Positive(t, d.MemoryLimit)
		assert.Equal(t, int64(float64(d.MemoryLimit)*0.9), debug.SetMemoryLimit(-1))
		debug.SetMemoryLimit(55 << 20)
	}
	// A missing file other than /proc/self/cgroup is an error.
	missing := func() (cgroupfs.Limit, error) {
		return cgroupfs.Limit{}, fmt.Errorf("cgroupfs: %w", &os.PathError{Op: "stat", Path: "/sys/fs/cgroup/x", Err: os.ErrNotExist})
	}
	_, _, err := start(t, cfgFor(missing))
	require.ErrorContains(t, err, "/sys/fs/cgroup/x")
}

// TestHeadroom: memory outside the Go runtime (a C heap) comes off the
// limit, never below the floor.
func TestHeadroom(t *testing.T) {
	keepMemoryLimit(t)
	var mu sync.Mutex
	rss, goMapped := int64(400<<20), int64(100<<20)
	cfg := cfgFor(fixedLimit(1, gib))
	cfg.usage = func() (int64, int64, error) {
		mu.Lock()
		defer mu.Unlock()
		return rss, goMapped, nil
	}
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	want := ninetyPct(gib) - 300<<20
	assert.Equal(t, want, d.GoMemLimit)
	assert.Equal(t, want, debug.SetMemoryLimit(-1))
	assert.Equal(t, int64(300<<20), d.Outside)
	assert.Contains(t, d.Reason, "minus 300.0 MiB outside the Go runtime")

	mu.Lock()
	rss = 110 << 20 // the C heap was freed and trimmed
	mu.Unlock()
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib)-10<<20, debug.SetMemoryLimit(-1), "GOMEMLIMIT follows the C heap down")

	mu.Lock()
	rss = 105 << 20 // moved by less than 1%: left alone, no log churn
	mu.Unlock()
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib)-10<<20, d.GoMemLimit)

	mu.Lock()
	rss = 1000 << 20 // almost all of the limit is C heap: the floor holds
	mu.Unlock()
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(defaultFloor), debug.SetMemoryLimit(-1))
	assert.True(t, d.AtFloor)

	// NoHeadroom: the ratio alone.
	cfg.NoHeadroom = true
	_, d, err = start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib), d.GoMemLimit)
	assert.Zero(t, d.Outside)

	// No RSS (not Linux): no headroom, and the Go runtime's share is what
	// the sanity check compares with.
	cfg.NoHeadroom = false
	cfg.usage = func() (int64, int64, error) { return 0, 100 << 20, errors.New("no /proc") }
	_, d, err = start(t, cfg)
	require.NoError(t, err)
	assert.Equal(t, ninetyPct(gib), d.GoMemLimit)
	cfg.read = fixedLimit(1, 90<<20)
	_, _, err = start(t, cfg)
	require.ErrorIs(t, err, ErrImplausibleLimit)
}

func TestFloor(t *testing.T) {
	keepMemoryLimit(t)
	for _, tc := range []struct {
		limit, floor int64
		ratio        float64
		want         int64
		atFloor      bool
	}{
		{limit: gib, ratio: 0.01, want: defaultFloor, atFloor: true}, // a ratio under the floor
		{limit: gib, floor: 512 << 20, want: ninetyPct(gib)},
		{limit: gib, floor: 1000 << 20, want: 1000 << 20, atFloor: true},
		{limit: 100 << 20, floor: 2 * gib, want: 100 << 20, atFloor: true}, // never over the limit
		{limit: 40 << 20, want: 40 << 20, atFloor: true},
	} {
		rec := &recorder{}
		cfg := cfgFor(fixedLimit(2, tc.limit))
		cfg.Ratio, cfg.Floor, cfg.Logger = tc.ratio, tc.floor, slog.New(rec)
		_, d, err := start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, tc.want, debug.SetMemoryLimit(-1), "%+v", tc)
		assert.Equal(t, tc.atFloor, d.AtFloor, "%+v", tc)
		if tc.atFloor {
			assert.Equal(t, 1, rec.count(slog.LevelWarn), "one WARN that the GC will run often")
			assert.Contains(t, d.Reason, "the GC will run often")
		} else {
			assert.Empty(t, rec.levels())
		}
	}
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

func TestSetGoMemLimitStopsWithContext(t *testing.T) {
	keepMemoryLimit(t)
	before := gcend.Active()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := cfgFor(fixedLimit(2, gib))
	cfg.Refresh = time.Hour
	_, err := SetGoMemLimit(ctx, cfg)
	require.NoError(t, err)
	assert.Equal(t, before+1, gcend.Active())
	cancel()
	require.Eventually(t, func() bool { return gcend.Active() == before }, 5*time.Second, time.Millisecond)
}

func TestRealCgroupLimit(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	source := SourceCgroupV1
	if g.Version == 2 {
		source = SourceCgroupV2
	}

	cmd := childtest.Command(t, "memlimit", []string{"GOMEMLIMIT", "AUTOMEMLIMIT"})
	g.Wrap(cmd)
	r := childtest.Report(t, cmd)
	ratio, limit := 0.9, int64(256<<20)
	outside := childtest.RequireInt(t, r, "OUTSIDE")
	assert.Less(t, outside, int64(32<<20), "a pure Go child holds little outside the Go runtime")
	want := strconv.FormatInt(int64(float64(limit)*ratio)-outside, 10)
	assert.Equal(t, want, r["BYTES"])
	assert.Equal(t, want, r["READBACK"], "debug.SetMemoryLimit(-1) in the child")
	assert.Equal(t, strconv.Itoa(256<<20), r["LIMIT"])
	assert.Equal(t, source.String(), r["SOURCE"])
	assert.Equal(t, g.Dir, filepath.Dir(r["FILE"]))
	t.Logf("pure Go child: %d bytes outside the Go runtime", outside)

	cmd = childtest.Command(t, "memlimit", []string{"AUTOMEMLIMIT"}, "GOMEMLIMIT=100MiB")
	g.Wrap(cmd)
	r = childtest.Report(t, cmd)
	assert.Equal(t, strconv.Itoa(100<<20), r["READBACK"], "the operator's GOMEMLIMIT is kept")
	assert.Equal(t, "env", r["SOURCE"])

	// Empty is unset, for the Go runtime as for memctl.
	cmd = childtest.Command(t, "memlimit", []string{"GOMEMLIMIT", "AUTOMEMLIMIT"}, "GOMEMLIMIT=", "AUTOMEMLIMIT=")
	g.Wrap(cmd)
	r = childtest.Report(t, cmd)
	assert.Equal(t, source.String(), r["SOURCE"], "GOMEMLIMIT= and AUTOMEMLIMIT= are unset")
	assert.NotEqual(t, strconv.FormatInt(math.MaxInt64, 10), r["READBACK"])
}

func TestSourceText(t *testing.T) {
	b, err := json.Marshal(MemLimit{GoMemLimit: 1, MemoryLimit: 2, Ratio: 0.5, Source: SourceCgroupV1, Reason: "r"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"GoMemLimit":1,"MemoryLimit":2,"Ratio":0.5,"Source":"cgroup v1","Reason":"r"}`, string(b))
	b, err = json.Marshal(MemLimit{GoMemLimit: 1, Source: SourceCgroupV2, File: "/f/memory.high", Outside: 3, AtFloor: true})
	require.NoError(t, err)
	assert.JSONEq(t, `{"GoMemLimit":1,"MemoryLimit":0,"Ratio":0,"Source":"cgroup v2","File":"/f/memory.high","Outside":3,"AtFloor":true,"Reason":""}`, string(b))
	for _, s := range []Source{SourceNone, SourceCgroupV1, SourceCgroupV2, SourceSystem, SourceEnv, SourceDeclared, SourceLambda} {
		b, err := s.MarshalText()
		require.NoError(t, err)
		assert.Equal(t, s.String(), string(b))
		var back Source
		require.NoError(t, back.UnmarshalText(b), "%s", b)
		assert.Equal(t, s, back)
	}
	var m MemLimit
	require.NoError(t, json.Unmarshal([]byte(`{"Source":"cgroup v2"}`), &m))
	assert.Equal(t, SourceCgroupV2, m.Source)
	b, err = Source(9).MarshalText()
	require.NoError(t, err)
	assert.Equal(t, "Source(9)", string(b))
	s := SourceEnv
	err = s.UnmarshalText([]byte("cgroup v3"))
	assert.ErrorContains(t, err, `limits: unknown Source "cgroup v3"`)
	assert.Equal(t, SourceEnv, s, "a failed UnmarshalText leaves the value alone")
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

// ninetyPct is 0.9 of n as memctl computes it (a float product, truncated).
func ninetyPct(n int64) int64 { r := 0.9; return int64(float64(n) * r) }

// BenchmarkRefresh is what the GC-end hook costs on the runtime's cleanup
// goroutine: "not-due", every GC end but one per interval (one atomic
// load); "reread", the one per interval (this machine's real cgroup files
// and RSS), and its two parts. go test ./limits -run XXX -bench
// BenchmarkRefresh -benchmem -count 8
func BenchmarkRefresh(b *testing.B) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	// This machine's own cgroup may have no limit: read its real files, and
	// take 1 GiB when they set none, so that the whole decision runs.
	read := func() (cgroupfs.Limit, error) {
		l, err := cgroupfs.Of(0)
		if err == nil && l.Bytes == cgroupfs.NoLimit {
			l.Bytes, l.File = gib, filepath.Join(l.Dir, "memory.limit_in_bytes")
		}
		return l, err
	}
	m, _, err := NewMemLimiter(MemLimitConfig{Refresh: time.Hour, read: read})
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
		for b.Loop() {
			m.mu.Lock()
			_, _ = m.decide(false)
			m.mu.Unlock()
		}
	})
	// The same decision without the cgroup's account (issue 18 added the
	// memory.stat read): the ratio of reread to this is its cost.
	n, _, err := NewMemLimiter(MemLimitConfig{Refresh: time.Hour, read: read, charge: noCharge})
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
			if _, err := readCharge(l.Version, l.Dir); err != nil {
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

// BenchmarkGCUnderSmallLimit is the measurement behind defaultFloor: a
// heap of 16 MiB live (64 KiB objects) allocating 1 MiB of garbage per op
// under GOMEMLIMIT of 24 to 128 MiB; gc-cpu-% is the GC's share of the
// CPU the process used (runtime/metrics /cpu/classes/gc/total over
// /cpu/classes/total less /cpu/classes/idle) and gcs/op the GC cycles per
// op. go test ./limits
// -run XXX -bench BenchmarkGCUnderSmallLimit -count 3
func BenchmarkGCUnderSmallLimit(b *testing.B) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	live := make([][]byte, 256) // 16 MiB
	for i := range live {
		live[i] = make([]byte, 64<<10)
	}
	read := func() (gc, total float64, cycles uint64) {
		s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"},
			{Name: "/cpu/classes/idle:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"}}
		metrics.Read(s)
		return s[0].Value.Float64(), s[1].Value.Float64() - s[2].Value.Float64(), s[3].Value.Uint64()
	}
	for _, limit := range []int64{24 << 20, 32 << 20, 48 << 20, 64 << 20, 128 << 20} {
		b.Run(fmt.Sprintf("limit=%dMiB", limit>>20), func(b *testing.B) {
			debug.SetMemoryLimit(limit)
			runtime.GC()
			gc0, total0, n0 := read()
			var sink []byte
			for b.Loop() {
				for range 16 {
					sink = make([]byte, 64<<10)
				}
			}
			_ = sink
			gc1, total1, n1 := read()
			b.ReportMetric(100*(gc1-gc0)/(total1-total0), "gc-cpu-%")
			b.ReportMetric(float64(n1-n0)/float64(b.N), "gcs/op")
		})
	}
	runtime.KeepAlive(live)
}

// A lift (pressure's death-spiral action) is kept by the refresh, capped at
// the cgroup limit, undone by Lift(0), and never applied over a GOMEMLIMIT
// that the program took over.
func TestLiftKeptByRefresh(t *testing.T) {
	keepMemoryLimit(t)
	m, d, err := start(t, cfgFor(fixedLimit(1, gib)))
	require.NoError(t, err)
	base := ninetyPct(gib)
	require.Equal(t, base, d.GoMemLimit)

	from, to, ok := m.Lift(50 << 20)
	require.True(t, ok)
	assert.Equal(t, base, from)
	assert.Equal(t, base+50<<20, to)
	assert.Equal(t, base+50<<20, debug.SetMemoryLimit(-1), "GOMEMLIMIT lifted")
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, base+50<<20, d.GoMemLimit, "a refresh keeps the lift")
	assert.Contains(t, d.Reason, "lifted by 50.0 MiB")

	_, to, ok = m.Lift(1 << 40)
	require.True(t, ok)
	assert.Equal(t, gib, to, "never above the cgroup limit")

	_, to, ok = m.Lift(0)
	require.True(t, ok)
	assert.Equal(t, base, to)
	assert.Equal(t, base, debug.SetMemoryLimit(-1), "restored")

	_, _, ok = m.Lift(-1)
	assert.False(t, ok, "a negative lift is refused")

	debug.SetMemoryLimit(300 << 20) // the program takes GOMEMLIMIT over
	_, _, ok = m.Lift(10 << 20)
	assert.False(t, ok)
	assert.Equal(t, int64(300<<20), debug.SetMemoryLimit(-1), "the program's GOMEMLIMIT is kept")
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

// TestLiftHuge: a lift of math.MaxInt64 ("all the way") gives the cgroup
// limit, as a lift of 1 TiB does; want + lift wrapped negative, and
// GOMEMLIMIT was left at a value that was not the decision.
func TestLiftHuge(t *testing.T) {
	keepMemoryLimit(t)
	m, d, err := start(t, cfgFor(fixedLimit(1, gib)))
	require.NoError(t, err)
	base := d.GoMemLimit
	for _, extra := range []int64{math.MaxInt64, math.MaxInt64 - base + 1, 1 << 62} {
		_, to, ok := m.Lift(extra)
		require.True(t, ok, "%d", extra)
		assert.Equal(t, gib, to, "lift %d", extra)
		assert.Equal(t, gib, debug.SetMemoryLimit(-1), "lift %d", extra)
		assert.Equal(t, gib, m.Last().GoMemLimit, "lift %d", extra)
		_, to, ok = m.Lift(0)
		require.True(t, ok)
		assert.Equal(t, base, to)
	}
}

// While a burst has the runtime map more than the kernel has backed yet
// (RSS below the runtime's mapped memory), the headroom for memory outside
// the Go runtime keeps its last estimate instead of dropping to 0, which
// raised GOMEMLIMIT in the middle of a burst (found by the new-user trial:
// 234835822 -> 241591910 in a 256 MiB cgroup).
func TestHeadroomKeptWhileRSSBelowMapped(t *testing.T) {
	keepMemoryLimit(t)
	rss, mapped := int64(40<<20), int64(32<<20) // 8 MiB outside
	cfg := cfgFor(fixedLimit(1, 256<<20))
	cfg.usage = func() (int64, int64, error) { return rss, mapped, nil }
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	base := ninetyPct(256 << 20)
	require.Equal(t, base-8<<20, d.GoMemLimit)

	rss, mapped = 120<<20, 150<<20 // a burst: mapped, not yet resident
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(8<<20), d.Outside, "the last estimate is kept")
	assert.Equal(t, base-8<<20, d.GoMemLimit)

	rss, mapped = 36<<20, 32<<20 // the C heap shrank to 4 MiB
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, int64(4<<20), d.Outside, "a real reading replaces it")
}

// TestLimitUnknownFlag: a cgroup namespace whose visible top sets no limit
// (cgroupfs.Limit.TopNotRoot) is reported as LimitUnknown, with or without
// SystemFallback, so that the state record can say so (issue 22); a real
// root that sets none is not.
func TestLimitUnknownFlag(t *testing.T) {
	keepMemoryLimit(t)
	for _, tc := range []struct {
		top, fallback bool
		source        Source
	}{{true, false, SourceNone}, {true, true, SourceSystem}, {false, false, SourceNone}} {
		cfg := cfgFor(func() (cgroupfs.Limit, error) {
			return cgroupfs.Limit{Version: 2, Cgroup: "/", Bytes: cgroupfs.NoLimit, TopNotRoot: tc.top}, nil
		})
		cfg.SystemFallback = tc.fallback
		_, ml, err := start(t, cfg)
		require.NoError(t, err)
		assert.Equal(t, tc.source, ml.Source, "%+v", tc)
		assert.Equal(t, tc.top, ml.LimitUnknown, "%+v: %s", tc, ml.Reason)
	}
}

// Hold is how the trim lowers GOMEMLIMIT for a moment through the
// limiter: a Lift that comes meanwhile waits, and is applied from the
// restored value, not from the transient one; a Refresh waits too and
// does not take the transient value for the program's.
func TestHoldSerializesTransientLimit(t *testing.T) {
	keepMemoryLimit(t)
	m, d, err := start(t, cfgFor(fixedLimit(1, gib)))
	require.NoError(t, err)
	base := d.GoMemLimit
	lifted := make(chan int64)
	m.Hold(func() {
		prev := debug.SetMemoryLimit(base / 2) // the trim's transient limit
		go func() { _, to, _ := m.Lift(50 << 20); lifted <- to }()
		select {
		case <-lifted:
			t.Error("a Lift ran during the hold")
		case <-time.After(50 * time.Millisecond):
		}
		debug.SetMemoryLimit(prev) // restored exactly
	})
	assert.Equal(t, base+50<<20, <-lifted, "the lift applies from the restored limit")
	d, err = m.Refresh()
	require.NoError(t, err)
	assert.Equal(t, base+50<<20, d.GoMemLimit, "the refresh keeps the lift: the transient limit was not taken for the program's")
	var nilM *MemLimiter
	ran := false
	nilM.Hold(func() { ran = true })
	assert.True(t, ran)
}
