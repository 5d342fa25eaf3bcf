package limits

import (
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

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

// TestOperatorAtLimit (issue 27 item 7, unit): an operator's GOMEMLIMIT
// that leaves less headroom than memctl's rule (ratio and outside charges)
// is left as set and said at WARN, naming GOMEMLIMIT, the limit's file and
// the headroom; one that leaves as much is not.
func TestOperatorAtLimit(t *testing.T) {
	for _, tc := range []struct {
		env  string
		cur  int64
		warn bool
	}{
		{"512MiB", 512 << 20, true},
		{"500MiB", 500 << 20, true},
		{"460MiB", 460 << 20, false},
	} {
		t.Run(tc.env, func(t *testing.T) {
			keepMemoryLimit(t)
			t.Setenv("GOMEMLIMIT", tc.env)
			debug.SetMemoryLimit(tc.cur) // as the runtime read it at start
			rec := &recorder{}
			cfg := cfgFor(fixedLimit(1, 512<<20))
			cfg.Logger = slog.New(rec)
			_, d, err := start(t, cfg)
			require.NoError(t, err)
			assert.Equal(t, SourceEnv, d.Source)
			assert.Equal(t, tc.cur, debug.SetMemoryLimit(-1), "the operator wins")
			assert.Equal(t, tc.cur, d.Operator)
			assert.False(t, d.Overridden)
			w := rec.texts(slog.LevelWarn)
			if !tc.warn {
				assert.Empty(t, w)
				return
			}
			require.Len(t, w, 1)
			for _, s := range []string{"GOMEMLIMIT=" + tc.env, "/sys/fs/cgroup/memory/x/memory.limit_in_bytes", "512.0 MiB", "ratio 0.9", "headroom=" + strconv.FormatInt((512<<20)-tc.cur, 10)} {
				assert.Contains(t, w[0], s)
			}
			assert.Contains(t, d.Reason, "left as set")
			assert.Equal(t, int64(512<<20), d.MemoryLimit)
		})
	}
}

// TestOperatorAboveLimit (issue 32 item 2): an operator's GOMEMLIMIT above
// the hard limit cannot take effect before the OOM killer: memctl sets its
// own value, says so naming both values and the file, follows the limit,
// and gives the operator's value back once the limit is above it again.
// MEMCTL_KEEP_GOMEMLIMIT (KeepOperator) keeps the operator's value, with
// the WARN. The limit lowered while memctl follows it counts the same.
func TestOperatorAboveLimit(t *testing.T) {
	const file = "/sys/fs/cgroup/memory/x/memory.limit_in_bytes"
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			keepMemoryLimit(t)
			t.Setenv("GOMEMLIMIT", "900MiB")
			debug.SetMemoryLimit(900 << 20) // as the runtime read it at start
			var limit atomic.Int64
			limit.Store(gib)
			rec := &recorder{}
			cfg := cfgFor(func() (cgroupfs.Limit, error) {
				return cgroupfs.Limit{Version: 1, Cgroup: "/x", Bytes: limit.Load(), File: file}, nil
			})
			cfg.Logger, cfg.KeepOperator = slog.New(rec), keep
			cfg.Refresh = time.Hour // Refresh by hand below
			m, d, err := start(t, cfg)
			require.NoError(t, err)
			assert.Equal(t, SourceEnv, d.Source, d.Reason)
			assert.Equal(t, int64(900<<20), debug.SetMemoryLimit(-1), "under the 1 GiB limit the operator's value stands")
			assert.Empty(t, rec.texts(slog.LevelWarn))

			limit.Store(512 << 20)
			d, err = m.Refresh()
			require.NoError(t, err)
			w := rec.texts(slog.LevelWarn)
			require.Len(t, w, 1, "one WARN")
			for _, s := range []string{"GOMEMLIMIT=900MiB", "900.0 MiB", "512.0 MiB", file} {
				assert.Contains(t, w[0], s)
			}
			if keep {
				assert.Equal(t, int64(900<<20), debug.SetMemoryLimit(-1), "kept")
				assert.False(t, d.Overridden)
				assert.Contains(t, w[0], "is kept")
			} else {
				assert.Equal(t, ratioOf(512<<20), debug.SetMemoryLimit(-1), "memctl's own value")
				assert.Equal(t, ratioOf(512<<20), d.GoMemLimit)
				assert.True(t, d.Overridden)
				assert.Equal(t, int64(900<<20), d.Operator)
				assert.Contains(t, w[0], "memctl sets 460.8 MiB")
			}
			_, err = m.Refresh() // no second WARN for the same limit
			require.NoError(t, err)
			assert.Len(t, rec.texts(slog.LevelWarn), 1)

			limit.Store(gib)
			d, err = m.Refresh()
			require.NoError(t, err)
			assert.Equal(t, int64(900<<20), debug.SetMemoryLimit(-1), "the operator's value back")
			assert.Equal(t, SourceEnv, d.Source)
			assert.False(t, d.Overridden)
			if !keep {
				assert.Contains(t, rec.text(), "back to the operator's GOMEMLIMIT=900MiB")
			}
		})
	}
}

// TestOperatorAtLimitRealCgroup (issue 27 item 7): GOMEMLIMIT=512MiB in a
// real 512 MiB cgroup (v1 here): GOMEMLIMIT left as set, a WARN naming
// GOMEMLIMIT, the cgroup limit's file and the headroom memctl's rule would
// leave (ratio 0.9, what the child holds outside the Go runtime).
func TestOperatorAtLimitRealCgroup(t *testing.T) {
	g := cgrouptest.New(t, 512<<20)
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	cmd := childtest.Command(t, "memlimitlog", []string{"AUTOMEMLIMIT", declaredLimitEnv, lambdaMemoryEnv}, "GOMEMLIMIT=512MiB")
	g.Wrap(cmd)
	r, warns := reportAndWarns(t, cmd)
	assert.Equal(t, strconv.Itoa(512<<20), r["READBACK"], "GOMEMLIMIT left as set")
	assert.Equal(t, "env", r["SOURCE"])
	require.Len(t, warns, 1, "one WARN")
	w := warns[0]
	assert.Contains(t, w["error"], "GOMEMLIMIT=512MiB")
	assert.Equal(t, g.Dir+"/"+file, w["limit_file"])
	assert.EqualValues(t, 512<<20, w["limit"])
	assert.EqualValues(t, 0, w["headroom"], "GOMEMLIMIT at the limit leaves none")
	assert.EqualValues(t, 0.9, w["ratio"])
	assert.Contains(t, w["error"], "memctl's rule leaves")
	t.Logf("WARN: %v", w["error"])

	// The control: GOMEMLIMIT under memctl's own value says nothing.
	cmd = childtest.Command(t, "memlimitlog", []string{"AUTOMEMLIMIT", declaredLimitEnv, lambdaMemoryEnv}, "GOMEMLIMIT=400MiB")
	g.Wrap(cmd)
	r, warns = reportAndWarns(t, cmd)
	assert.Equal(t, strconv.Itoa(400<<20), r["READBACK"])
	assert.Empty(t, warns)
}

// GOMEMLIMIT=off under a cgroup limit (issue 32 item 4): no figure is a
// sentinel: no WARN quoting an overflowed headroom, GOMEMLIMIT none.
func TestOperatorOffNoSentinel(t *testing.T) {
	keepMemoryLimit(t)
	t.Setenv("GOMEMLIMIT", "off")
	debug.SetMemoryLimit(math.MaxInt64)
	rec := &recorder{}
	cfg := cfgFor(fixedLimit(1, 256<<20))
	cfg.Logger = slog.New(rec)
	m, d, err := start(t, cfg)
	require.NoError(t, err)
	_, err = m.Refresh()
	require.NoError(t, err)
	assert.Empty(t, rec.texts(slog.LevelWarn), "GOMEMLIMIT=off is the operator's choice: nothing to warn about")
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1))
	assert.Equal(t, SourceEnv, d.Source)
	assert.NotContains(t, d.Reason, "-")
	assert.False(t, d.Overridden)
}
