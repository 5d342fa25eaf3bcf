package limits

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

const gib = int64(1 << 30)

func init() {
	children["memlimit"] = func() {
		d, err := SetGoMemLimit(context.Background(), MemLimitConfig{})
		if err != nil {
			childtest.Fail("%v", err)
		}
		childtest.Say("BYTES", d.Bytes)
		childtest.Say("READBACK", debug.SetMemoryLimit(-1))
		childtest.Say("LIMIT", d.Limit)
		childtest.Say("SOURCE", d.Source)
	}
}

// keepMemoryLimit restores GOMEMLIMIT and clears the environment switches
// for one test; GOMEMLIMIT is process-wide.
func keepMemoryLimit(t *testing.T) int64 {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	for _, k := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Setenv(k, v) // restores it afterwards
			os.Unsetenv(k)
		}
	}
	return prev
}

func fixed(limit uint64) memlimit.Provider { return memlimit.Limit(limit) }

func TestSetGoMemLimitFromCgroupProvider(t *testing.T) {
	keepMemoryLimit(t)
	d, err := SetGoMemLimit(context.Background(), MemLimitConfig{provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_v2"})
	require.NoError(t, err)
	ratio := 0.9
	want := int64(float64(gib) * ratio)
	assert.Equal(t, want, d.Bytes)
	assert.Equal(t, want, debug.SetMemoryLimit(-1), "GOMEMLIMIT read back from the runtime")
	assert.Equal(t, gib, d.Limit)
	assert.Equal(t, 0.9, d.Ratio)
	assert.Equal(t, SourceCgroupV2, d.Source)
	assert.Contains(t, d.Reason, "cgroup v2")
}

func TestSetGoMemLimitRatio(t *testing.T) {
	keepMemoryLimit(t)
	d, err := SetGoMemLimit(context.Background(), MemLimitConfig{Ratio: 0.5, provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_v1_hybrid"})
	require.NoError(t, err)
	assert.Equal(t, gib/2, debug.SetMemoryLimit(-1))
	assert.Equal(t, SourceCgroupV1, d.Source)

	t.Setenv("AUTOMEMLIMIT", "0.25")
	d, err = SetGoMemLimit(context.Background(), MemLimitConfig{Ratio: 0.5, provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_v1_hybrid"})
	require.NoError(t, err)
	assert.Equal(t, gib/4, debug.SetMemoryLimit(-1), "AUTOMEMLIMIT wins over the configured ratio")
	assert.Equal(t, 0.25, d.Ratio)
	assert.Contains(t, d.Reason, "AUTOMEMLIMIT")
}

func TestOperatorEnvironmentWins(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(123 << 20)
	for _, env := range [][2]string{{"GOMEMLIMIT", "123MiB"}, {"AUTOMEMLIMIT", "off"}} {
		t.Run(env[0], func(t *testing.T) {
			t.Setenv(env[0], env[1])
			d, err := SetGoMemLimit(context.Background(), MemLimitConfig{provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_v2"})
			require.NoError(t, err)
			assert.Equal(t, SourceEnv, d.Source)
			assert.Equal(t, int64(123<<20), d.Bytes)
			assert.Equal(t, int64(123<<20), debug.SetMemoryLimit(-1), "GOMEMLIMIT untouched")
			assert.Contains(t, d.Reason, env[0])
		})
	}
}

func TestBadRatioChangesNothing(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(77 << 20)
	for _, r := range []float64{-0.1, 1.5, math.NaN(), math.Inf(1)} {
		_, err := SetGoMemLimit(context.Background(), MemLimitConfig{Ratio: r, provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_v2"})
		require.Error(t, err, "ratio %v", r)
		assert.Contains(t, err.Error(), "(0.0, 1.0]")
	}
	for _, v := range []string{"lots", "0", "2", "NaN"} {
		t.Setenv("AUTOMEMLIMIT", v)
		_, err := SetGoMemLimit(context.Background(), MemLimitConfig{provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_v2"})
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

func TestNoCgroupIsNormal(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(55 << 20)
	for _, perr := range []error{memlimit.ErrNoCgroup, memlimit.ErrCgroupsNotSupported, memlimit.ErrNoLimit} {
		rec := &recorder{}
		none := func() (uint64, error) { return 0, perr }
		d, err := SetGoMemLimit(context.Background(), MemLimitConfig{provider: none, cgroupFile: "testdata/cgroup_v2", Logger: slog.New(rec)})
		require.NoError(t, err)
		assert.Equal(t, SourceNone, d.Source)
		assert.Equal(t, int64(55<<20), debug.SetMemoryLimit(-1), "left as it was")
		for _, l := range rec.levels() {
			assert.Less(t, l, slog.LevelError, "nothing at error level")
		}

		d, err = SetGoMemLimit(context.Background(), MemLimitConfig{provider: none, SystemFallback: true})
		require.NoError(t, err)
		assert.Equal(t, SourceSystem, d.Source)
		assert.Positive(t, d.Limit)
		assert.Equal(t, int64(float64(d.Limit)*0.9), debug.SetMemoryLimit(-1))
		debug.SetMemoryLimit(55 << 20)
	}
}

func TestProviderErrorChangesNothing(t *testing.T) {
	keepMemoryLimit(t)
	debug.SetMemoryLimit(66 << 20)
	broken := func() (uint64, error) { return 0, errors.New("failed to parse memory.max value: bogus") }
	_, err := SetGoMemLimit(context.Background(), MemLimitConfig{provider: broken, cgroupFile: "testdata/cgroup_v2"})
	require.ErrorContains(t, err, "memory.max")
	_, err = SetGoMemLimit(context.Background(), MemLimitConfig{provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_malformed"})
	require.ErrorContains(t, err, "testdata/cgroup_malformed")
	_, err = SetGoMemLimit(context.Background(), MemLimitConfig{provider: fixed(uint64(gib)), cgroupFile: "testdata/missing"})
	require.ErrorContains(t, err, "testdata/missing")
	assert.Equal(t, int64(66<<20), debug.SetMemoryLimit(-1))
}

func TestCgroupVersionFixtures(t *testing.T) {
	for file, want := range map[string]Source{
		"testdata/cgroup_v1_hybrid":           SourceCgroupV1,
		"testdata/cgroup_v2":                  SourceCgroupV2,
		"testdata/cgroup_v2_hybrid_no_memory": SourceCgroupV2,
	} {
		got, err := cgroupVersionFile(file)
		require.NoError(t, err, file)
		assert.Equal(t, want, got, file)
	}
}

func TestRefreshFollowsResizeAndStops(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		limit := uint64(gib)
		provider := func() (uint64, error) {
			mu.Lock()
			defer mu.Unlock()
			return limit, nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		rec := &recorder{}
		d, err := SetGoMemLimit(ctx, MemLimitConfig{Ratio: 1, Refresh: time.Minute, provider: provider, cgroupFile: "testdata/cgroup_v2", Logger: slog.New(rec)})
		require.NoError(t, err)
		assert.Equal(t, gib, d.Bytes)
		assert.Empty(t, rec.levels(), "the first update is reported by the caller, not logged")

		mu.Lock()
		limit = uint64(2 * gib) // the pod was resized in place
		mu.Unlock()
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		assert.Equal(t, 2*gib, debug.SetMemoryLimit(-1))
		assert.NotEmpty(t, rec.levels(), "refresh updates reach the logger")

		cancel()
		<-d.RefreshDone // the refresh goroutine has exited
	})
}

// A refresh with no cgroup limit must leave a limit the program set itself,
// and set one once the cgroup gets a limit (automemlimit's own refresh sets
// math.MaxInt64 whenever it finds none).
func TestRefreshWithoutLimitKeepsProgramLimit(t *testing.T) {
	keepMemoryLimit(t)
	synctest.Test(t, func(t *testing.T) {
		debug.SetMemoryLimit(512 << 20)
		var mu sync.Mutex
		var limit uint64 // 0: no limit yet
		provider := func() (uint64, error) {
			mu.Lock()
			defer mu.Unlock()
			if limit == 0 {
				return 0, memlimit.ErrNoLimit
			}
			return limit, nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		d, err := SetGoMemLimit(ctx, MemLimitConfig{Ratio: 1, Refresh: time.Minute, provider: provider, cgroupFile: "testdata/cgroup_v2"})
		require.NoError(t, err)
		assert.Equal(t, SourceNone, d.Source)
		time.Sleep(3*time.Minute + time.Second)
		synctest.Wait()
		assert.Equal(t, int64(512<<20), debug.SetMemoryLimit(-1), "no limit found: the program's own limit stays")

		mu.Lock()
		limit = uint64(gib)
		mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.Equal(t, gib, debug.SetMemoryLimit(-1), "a limit that appears is applied")
		cancel()
		<-d.RefreshDone
	})
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
	want := strconv.FormatInt(int64(float64(limit)*ratio), 10)
	assert.Equal(t, want, r["BYTES"])
	assert.Equal(t, want, r["READBACK"], "debug.SetMemoryLimit(-1) in the child")
	assert.Equal(t, strconv.Itoa(256<<20), r["LIMIT"])
	assert.Equal(t, source.String(), r["SOURCE"])

	cmd = childtest.Command(t, "memlimit", []string{"AUTOMEMLIMIT"}, "GOMEMLIMIT=100MiB")
	g.Wrap(cmd)
	r = childtest.Report(t, cmd)
	assert.Equal(t, strconv.Itoa(100<<20), r["READBACK"], "the operator's GOMEMLIMIT is kept")
	assert.Equal(t, "env", r["SOURCE"])

	// Empty is unset, for the Go runtime as for memctl.
	cmd = childtest.Command(t, "memlimit", []string{"GOMEMLIMIT", "AUTOMEMLIMIT"}, "GOMEMLIMIT=", "AUTOMEMLIMIT=")
	g.Wrap(cmd)
	r = childtest.Report(t, cmd)
	assert.Equal(t, want, r["READBACK"], "GOMEMLIMIT= and AUTOMEMLIMIT= are unset")
	assert.Equal(t, source.String(), r["SOURCE"])
}

func TestSourceText(t *testing.T) {
	b, err := json.Marshal(MemLimit{Bytes: 1, Limit: 2, Ratio: 0.5, Source: SourceCgroupV1, Reason: "r"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"Bytes":1,"Limit":2,"Ratio":0.5,"Source":"cgroup v1","Reason":"r"}`, string(b))
	for _, s := range []Source{SourceNone, SourceCgroupV1, SourceCgroupV2, SourceSystem, SourceEnv} {
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

// TestEmptyEnvironmentIsUnset: GOMEMLIMIT= and AUTOMEMLIMIT= are unset to
// the Go runtime (and to automemlimit's parser they are no ratio): memctl
// sets GOMEMLIMIT from the cgroup limit as if they were absent.
func TestEmptyEnvironmentIsUnset(t *testing.T) {
	for _, env := range [][]string{{"GOMEMLIMIT"}, {"AUTOMEMLIMIT"}, {"GOMEMLIMIT", "AUTOMEMLIMIT"}} {
		t.Run(strings.Join(env, "+"), func(t *testing.T) {
			keepMemoryLimit(t)
			debug.SetMemoryLimit(math.MaxInt64)
			for _, k := range env {
				t.Setenv(k, "")
			}
			d, err := SetGoMemLimit(context.Background(), MemLimitConfig{provider: fixed(uint64(gib)), cgroupFile: "testdata/cgroup_v2"})
			require.NoError(t, err)
			ratio := DefaultRatio
			want := int64(float64(gib) * ratio)
			assert.Equal(t, SourceCgroupV2, d.Source, d.Reason)
			assert.Equal(t, want, d.Bytes)
			assert.Equal(t, want, debug.SetMemoryLimit(-1), "GOMEMLIMIT read back from the runtime")
			for _, k := range env {
				v, ok := os.LookupEnv(k)
				assert.True(t, ok && v == "", "%s= is left in the environment as it was", k)
			}
		})
	}
}
