package limits

import (
	"bufio"
	"context"
	"encoding/json"
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
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/gcend"
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
	return MemLimitConfig{Refresh: -1, deps: limDeps{read: read, usage: pureGo, charge: noCharge, live: func() int64 { return 16 << 20 }}}
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
			file := filepath.Join(dir, "memory.stat")
			b, err := os.ReadFile(file)
			if err != nil {
				return cgroupfs.MemoryStat{}, err
			}
			return cgroupfs.ParseMemoryStat(b, file)
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
			cfg.deps.charge = fixtureCharge
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

// ninetyPct is 0.9 of n as memctl computes it (a float product, truncated).
func ninetyPct(n int64) int64 { r := 0.9; return int64(float64(n) * r) }

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
