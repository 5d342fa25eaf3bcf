package limits

import (
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/relief"
)

func TestDefaultLimit(t *testing.T) {
	var logs strings.Builder
	p := &Pool{name: "pool", log: slog.New(slog.NewTextHandler(&logs, nil))}
	for gml, want := range map[int64]int64{1 << 30: 512 << 20, 0: 1, 1: 1} {
		got, from, err := p.defaultLimit(gml)
		require.NoError(t, err)
		assert.Equal(t, want, got)
		assert.Contains(t, from, "half of GOMEMLIMIT")
	}
	assert.Empty(t, logs.String(), "NewPool logs, defaultLimit does not")

	t.Cleanup(func() { fromCgroup, fromSystem = memlimit.FromCgroup, memlimit.FromSystem })
	fromCgroup = func() (uint64, error) { return 256 << 20, nil }
	fromSystem = func() (uint64, error) { return 0, errors.New("not asked") }
	got, from, err := p.defaultLimit(math.MaxInt64)
	require.NoError(t, err)
	assert.Equal(t, int64(120795955), got)
	assert.Contains(t, from, "cgroup memory limit 256.0MiB")

	logs.Reset()
	fromCgroup = func() (uint64, error) { return 0, memlimit.ErrNoLimit }
	fromSystem = func() (uint64, error) { return 24 << 30, nil }
	got, from, err = p.defaultLimit(math.MaxInt64)
	require.NoError(t, err)
	assert.Equal(t, int64(11596411699), got)
	assert.Contains(t, from, "physical memory")

	fromSystem = func() (uint64, error) { return 0, errors.New("no meminfo") }
	_, _, err = p.defaultLimit(math.MaxInt64)
	require.Error(t, err, "never silently unlimited")
	assert.Contains(t, err.Error(), "PoolConfig.Limit")

	// The real thing: outside a limited cgroup, with GOMEMLIMIT unset, the
	// pool's limit comes from MemTotal.
	fromCgroup, fromSystem = memlimit.FromCgroup, memlimit.FromSystem
	old := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	logs.Reset()
	pool, err := NewPool(PoolConfig{HeapPressure: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer pool.Close()
	assert.Less(t, pool.Limit(), Unlimited)
	assert.Positive(t, pool.Limit())
	assert.Equal(t, 1, strings.Count(logs.String(), "\n"), "one INFO line: %s", logs.String())
	assert.Contains(t, logs.String(), `msg="limits: pool made" pool=pool limit=`)
	assert.Contains(t, logs.String(), "GOMEMLIMIT not set")
	t.Logf("fallback limit %d: %s", pool.Limit(), logs.String())
}

// TestPoolLimitAndHeapThresholdFollowGOMEMLIMIT (issue 27, item 6, after
// OpenTelemetry Collector #15580): a pool made with Limit 0 and its
// heap-pressure threshold both follow GOMEMLIMIT; a change made outside
// this package (the program's SetMemoryLimit) is seen at the next GC
// cycle's end. A pool with a Limit of its own keeps it.
func TestPoolLimitAndHeapThresholdFollowGOMEMLIMIT(t *testing.T) {
	prev := debug.SetMemoryLimit(4 * gib)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	var logs strings.Builder
	p := newTestPool(t, PoolConfig{HeapPressure: 0.5, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	fixed := newTestPool(t, PoolConfig{Name: "fixed", Limit: gib, HeapPressure: 0.5})
	assert.Equal(t, 2*gib, p.Limit(), "defaultPoolRatio of GOMEMLIMIT at NewPool")
	assert.Contains(t, logs.String(), `msg="limits: pool made" pool=pool limit=2048.0MiB limit_source="half of GOMEMLIMIT 4096.0MiB, following it"`)
	waitCycles(t, p, 1)
	assert.Equal(t, 2*gib, p.Stats().HeapThreshold)

	debug.SetMemoryLimit(8 * gib) // the program's own change
	waitCycles(t, p, 2)
	assert.Equal(t, 4*gib, p.Stats().HeapThreshold, "the threshold follows GOMEMLIMIT")
	assert.Equal(t, 4*gib, p.Limit(), "so does the pool's limit")
	assert.Equal(t, 4*gib, p.Stats().Limit)
	assert.Contains(t, logs.String(), `msg="limits: pool limit follows GOMEMLIMIT" pool=pool limit=4096.0MiB was=2048.0MiB`)
	assert.Equal(t, gib, fixed.Limit(), "PoolConfig.Limit is the pool's own")
}

// TestPoolFollowsMemLimiterWithoutGC: a change this package makes (the
// MemLimiter's refresh) is seen by the pool's next reservation, with no GC
// cycle between.
func TestPoolFollowsMemLimiterWithoutGC(t *testing.T) {
	prev := debug.SetMemoryLimit(4 * gib)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	p := newTestPool(t, PoolConfig{HeapPressure: -1})
	assert.Equal(t, 2*gib, p.Limit())
	debug.SetMemoryLimit(gib)
	assert.Equal(t, 2*gib, p.Limit(), "no GC end, no generation: not seen yet")
	noteMemLimitSet()
	assert.Equal(t, gib/2, p.Limit(), "the generation changed: read at once")
	a := mustOpen(t, p, "big", Unlimited)
	defer a.Close()
	err := a.Grow(gib/2 + 1)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, gib/2, e.Limit, "the refusal uses the limit followed")
}

// Input (issue 27, item 4): the HTTP and gRPC examples each made a pool
// with the default limit, half of GOMEMLIMIT each, together all of it,
// with no warning. The second such pool is warned about; a pool with a
// Limit of its own is not.
func TestSecondDefaultPoolWarned(t *testing.T) {
	prev := debug.SetMemoryLimit(4 * gib)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	var logs strings.Builder
	l := slog.New(slog.NewTextHandler(&logs, nil))
	newTestPool(t, PoolConfig{Name: "http", Logger: l})
	newTestPool(t, PoolConfig{Name: "sized", Limit: gib, Logger: l})
	assert.NotContains(t, logs.String(), "level=WARN", "one default pool, one sized: nothing to warn about")
	newTestPool(t, PoolConfig{Name: "grpc", Logger: l})
	assert.Contains(t, logs.String(), `level=WARN msg="limits: a second pool with the default limit`)
	assert.Contains(t, logs.String(), "pool=grpc other_pool=http")
}

// TestPoolNameOnce: a second open pool of the same name is said at WARN
// (its errors and metrics could not be told apart); once the first is
// closed, the name is free.
func TestPoolNameOnce(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	a := newTestPool(t, PoolConfig{Name: "i20-unique", Limit: mib, Logger: log})
	assert.NotContains(t, logs.String(), "same name")
	b := newTestPool(t, PoolConfig{Name: "i20-unique", Limit: mib, Logger: log})
	assert.Equal(t, 1, strings.Count(logs.String(), "another open pool has the same name"), logs.String())
	assert.Contains(t, logs.String(), "pool=i20-unique")
	a.Close()
	b.Close()
	newTestPool(t, PoolConfig{Name: "i20-unique", Limit: mib, Logger: log})
	assert.Equal(t, 1, strings.Count(logs.String(), "another open pool has the same name"))
	assert.Equal(t, "i20-unique", b.Stats().Name)
}

// PoolStats.RefusedBy tells what refused: the request's own budget, the
// full pool, shedding (and heap pressure, counted where the pool refuses
// under it).
func TestRefusedByScope(t *testing.T) {
	t.Setenv("MEMCTL_BUDGETS", "")
	p := newTestPool(t, PoolConfig{Limit: 4 * mib, ShedSize: mib, HeapPressure: -1})
	a := mustOpen(t, p, "a", 2*mib)
	require.ErrorIs(t, a.Grow(3*mib), ErrResourceExhausted) // its own budget
	b := mustOpen(t, p, "b", Unlimited)
	require.ErrorIs(t, b.Grow(5*mib), ErrResourceExhausted) // the pool
	relief.Shed(true)
	require.ErrorIs(t, b.Grow(2*mib), ErrResourceExhausted) // shedding
	relief.Shed(false)
	s := p.Stats()
	assert.Equal(t, RefusedBy{Account: 1, Pool: 1, Shedding: 1}, s.RefusedBy)
	assert.Equal(t, int64(3), s.Refused)
}

// TestPoolCloseRacesGrow: Pool.Close while goroutines grow, shrink, open
// and close accounts three levels deep. Once Close returns, every Grow and
// Open at any depth fails with ErrClosed; the accounts, closed after it,
// give everything back; no limit is passed meanwhile. Run it with -race.
func TestPoolCloseRacesGrow(t *testing.T) {
	for seed := range uint64(8) {
		p, err := NewPool(PoolConfig{Name: "p", Limit: mib, ChunkSize: 4 * kib, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		top := mustOpen(t, p, "top", 768*kib)
		mid := mustOpen(t, top, "mid", Unlimited)
		low := mustOpen(t, mid, "low", 256*kib)
		accts := []*Account{top, mid, low}
		var closed atomic.Bool
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				for range 2000 {
					a := accts[rng.IntN(len(accts))]
					wasClosed := closed.Load()
					n := 1 + rng.Int64N(16*kib)
					if err := a.Grow(n); err == nil {
						if wasClosed {
							t.Errorf("%s: Grow(%d) granted after Pool.Close returned", a.scope(), n)
						}
						a.Shrink(n)
					} else if !errors.Is(err, ErrResourceExhausted) && !errors.Is(err, ErrClosed) {
						t.Errorf("%s: %v", a.scope(), err)
					}
					if c, err := a.Open("tmp", 8*kib); err == nil {
						if wasClosed {
							t.Errorf("%s: Open after Pool.Close returned", a.scope())
						}
						if c.Grow(n) == nil {
							c.Shrink(n)
						}
						c.Close()
					}
					if bad := checkLimits(p, accts); len(bad) > 0 {
						t.Errorf("limits passed: %v", bad)
					}
				}
			}()
		}
		time.Sleep(time.Duration(seed) * time.Millisecond)
		p.Close()
		closed.Store(true)
		wg.Wait()
		for _, a := range accts {
			require.ErrorIs(t, a.Grow(1), ErrClosed)
			_, err := a.Open("late", Unlimited)
			require.ErrorIs(t, err, ErrClosed)
		}
		top.Close()
		assert.Zero(t, p.Used(), "seed %d", seed)
		assert.Zero(t, p.Stats().Leaked, "seed %d", seed)
		for _, a := range accts {
			assert.Zero(t, a.Used())
			assert.Zero(t, a.used.Load())
		}
	}
}
