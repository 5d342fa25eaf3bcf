package limits

import (
	"errors"
	"math"
	"runtime/debug"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	kib = int64(1 << 10)
	mib = int64(1 << 20)
)

// newTestPool returns a strict pool without heap watch, closed at the end of
// the test.
func newTestPool(t testing.TB, cfg PoolConfig) *Pool {
	t.Helper()
	cfg.Strict = true
	if cfg.HeapPressure == 0 {
		cfg.HeapPressure = -1
	}
	p, err := NewPool(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func mustOpen(t testing.TB, parent interface {
	Open(string, int64) (*Account, error)
}, name string, limit int64) *Account {
	t.Helper()
	a, err := parent.Open(name, limit)
	require.NoError(t, err)
	return a
}

func TestGrowShrinkClose(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 64 * kib})
	a := mustOpen(t, p, "a", 0)
	assert.Equal(t, "pool/a", a.Name())

	require.NoError(t, a.Grow(100))
	assert.Equal(t, int64(100), a.Used())
	assert.Equal(t, 64*kib, p.Used(), "the first Grow reserves one chunk from the pool")
	require.NoError(t, a.Grow(1000))
	assert.Equal(t, 64*kib, p.Used(), "a Grow within the chunk does not touch the pool")
	a.Shrink(600)
	assert.Equal(t, int64(500), a.Used())
	assert.Equal(t, int64(1100), a.Peak())
	require.NoError(t, a.Resize(500, 3*mib))
	assert.Equal(t, 3*mib, a.Used())
	assert.Equal(t, 3*mib, p.Used(), "a large Grow reserves whole chunks")
	require.NoError(t, a.Resize(3*mib, 500))
	assert.Equal(t, int64(500), a.Used())
	assert.LessOrEqual(t, p.Used(), 500+2*64*kib, "a large Shrink returns all but about a chunk")
	require.NoError(t, a.Grow(0))
	a.Shrink(0)

	a.Close()
	a.Close()
	assert.Zero(t, a.Used())
	assert.Zero(t, p.Used())
	assert.Equal(t, 3*mib, a.Peak(), "Peak is kept after Close")
	err := a.Grow(1)
	assert.ErrorIs(t, err, ErrClosed)
	assert.True(t, strings.HasPrefix(err.Error(), "limits: "), err.Error())
	_, err = a.Open("child", 0)
	assert.ErrorIs(t, err, ErrClosed)
	a.Shrink(500) // after Close: does nothing, not misuse
	assert.Zero(t, p.Stats().Misuse)

	p.Close()
	_, err = p.Open("b", 0)
	assert.ErrorIs(t, err, ErrClosed)
}

func TestAccountLimitAndTrackOnly(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib})
	limited := mustOpen(t, p, "limited", mib)
	require.NoError(t, limited.Grow(mib))
	err := limited.Grow(1)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, ExhaustedError{Requested: 1, Used: mib, Limit: mib, Scope: "pool/limited"}, *e)
	assert.Equal(t, mib, limited.Used(), "a refused Grow counts nothing")

	track := mustOpen(t, p, "track", 0)
	require.NoError(t, track.Grow(9*mib), "limit 0 never refuses on its own")
	err = track.Grow(1)
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "pool", e.Scope, "the pool still refuses")
	assert.Equal(t, int64(2), p.Stats().Refused)
	limited.Close()
	track.Close()
	assert.Zero(t, p.Used())
}

func TestExhaustedErrorFields(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 4 * mib, ChunkSize: 64 * kib})
	q := mustOpen(t, p, "query-17", 2*mib)
	sort := mustOpen(t, q, "sort", 0)
	require.NoError(t, sort.Grow(mib+1))

	err := sort.Grow(mib) // 2 MiB + 1 byte > query's 2 MiB
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrResourceExhausted))
	assert.False(t, errors.Is(err, ErrInvalidSize))
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, mib, e.Requested, "Requested is exactly what was asked, not rounded to chunks")
	assert.Equal(t, "pool/query-17", e.Scope)
	assert.Equal(t, 2*mib, e.Limit)
	assert.Equal(t, mib+64*kib, e.Used, "the query holds the sort's reservation, whole chunks")
	assert.Equal(t, "resource_exhausted", e.Code())
	assert.Equal(t, 429, e.HTTPStatus())
	assert.Equal(t, 8, GRPCCodeResourceExhausted)
	assert.Equal(t, "limits: resource_exhausted in pool/query-17: requested 1048576 bytes, 1114112 in use, limit 2097152", e.Error())

	// Within the query's budget the exact remainder still fits: the
	// reservation falls back from whole chunks to the bytes needed.
	require.NoError(t, sort.Grow(mib-1))
	assert.Equal(t, 2*mib, sort.Used())

	// The pool refuses with its own name as the scope.
	other := mustOpen(t, p, "query-18", 0)
	require.NoError(t, other.Grow(2*mib))
	err = other.Grow(1)
	require.ErrorAs(t, err, &e)
	assert.Equal(t, ExhaustedError{Requested: 1, Used: 4 * mib, Limit: 4 * mib, Scope: "pool"}, *e)

	sort.Close()
	q.Close()
	other.Close()
	assert.Zero(t, p.Used())
}

func TestInvalidSizes(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: math.MaxInt64})
	assert.Zero(t, p.Limit(), "math.MaxInt64 means no limit")
	a := mustOpen(t, p, "a", 0)
	for _, err := range []error{a.Grow(-1), a.Resize(-1, 5), a.Resize(5, -1)} {
		assert.ErrorIs(t, err, ErrInvalidSize)
		assert.False(t, errors.Is(err, ErrResourceExhausted))
		assert.Contains(t, err.Error(), "pool/a")
	}
	require.NoError(t, a.Grow(math.MaxInt64-10))
	err := a.Grow(11)
	assert.ErrorIs(t, err, ErrInvalidSize, "a total past math.MaxInt64 is invalid, not exhausted")
	assert.Contains(t, err.Error(), "overflows")
	assert.Equal(t, int64(math.MaxInt64-10), a.Used())
	a.Close()
	assert.Zero(t, p.Used())

	_, err = p.Open("neg", -1)
	assert.ErrorIs(t, err, ErrInvalidSize)
	for _, cfg := range []PoolConfig{{Limit: -1}, {ChunkSize: -1}, {ChunkSize: 2 << 30}, {HeapPressure: 1.5}, {HeapPressure: math.NaN()}} {
		_, err := NewPool(cfg)
		assert.Error(t, err, "%+v", cfg)
		assert.True(t, strings.HasPrefix(err.Error(), "limits: "), err.Error())
	}
}

// TestUnlimitedPoolOverflowIsInvalidSize: in a pool without a limit, two
// accounts whose sum passes math.MaxInt64 are a caller bug
// (ErrInvalidSize), not a lack of memory: no *ExhaustedError with a limit
// the pool does not have, and nothing counted in Refused.
func TestUnlimitedPoolOverflowIsInvalidSize(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: math.MaxInt64})
	require.Zero(t, p.Limit())
	a := mustOpen(t, p, "a", 0)
	b := mustOpen(t, p, "b", 0)
	require.NoError(t, a.Grow(math.MaxInt64-mib))
	used := p.Used()

	err := b.Grow(2 * mib)
	require.ErrorIs(t, err, ErrInvalidSize)
	var e *ExhaustedError
	assert.False(t, errors.As(err, &e), "not an *ExhaustedError: %v", err)
	assert.False(t, errors.Is(err, ErrResourceExhausted))
	assert.Contains(t, err.Error(), "pool/b: Grow(2097152) ")
	assert.Contains(t, err.Error(), "overflows int64")
	assert.Zero(t, p.Stats().Refused, "an overflow is not a refusal")
	assert.Zero(t, b.Used())
	assert.Equal(t, used, p.Used(), "nothing reserved")

	// What fits still fits.
	require.NoError(t, b.Grow(mib/2))
	a.Close()
	b.Close()
	assert.Zero(t, p.Used())
}

// TestNestedGrowToExactlyMaxInt64: a nested account reserves from its
// parent in chunks, but the rounding must not refuse a total that fits
// exactly, and an overflow names the size the caller passed, not the
// rounded reservation.
func TestNestedGrowToExactlyMaxInt64(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: math.MaxInt64})
	parent := mustOpen(t, p, "parent", 0)
	child := mustOpen(t, parent, "child", 0)
	grandchild := mustOpen(t, child, "grandchild", 0)
	require.NoError(t, parent.Grow(100000))

	n := int64(math.MaxInt64 - 100000)
	err := grandchild.Grow(n + 1)
	require.ErrorIs(t, err, ErrInvalidSize)
	assert.Contains(t, err.Error(), "pool/parent/child/grandchild: Grow(9223372036854675808) ", "the caller's size")
	assert.Contains(t, err.Error(), "in pool/parent, which has 100000 in use")
	assert.Zero(t, grandchild.Used())

	require.NoError(t, grandchild.Grow(n), "parent total exactly math.MaxInt64")
	assert.Equal(t, n, grandchild.Used())
	assert.Equal(t, n, child.Used())
	assert.Equal(t, int64(math.MaxInt64), parent.Used())

	err = grandchild.Grow(1)
	require.ErrorIs(t, err, ErrInvalidSize)
	assert.Contains(t, err.Error(), "pool/parent/child/grandchild: Grow(1) ")
	err = parent.Grow(1)
	require.ErrorIs(t, err, ErrInvalidSize)
	assert.Contains(t, err.Error(), "pool/parent: Grow(1) with 9223372036854775807 in use overflows int64")
	assert.Zero(t, p.Stats().Refused)

	grandchild.Close()
	child.Close()
	parent.Close()
	assert.Zero(t, p.Used())
}

func TestMisuseIsCountedOrPanics(t *testing.T) {
	p, err := NewPool(PoolConfig{Limit: mib, HeapPressure: -1})
	require.NoError(t, err)
	defer p.Close()
	a := mustOpen(t, p, "a", 0)
	require.NoError(t, a.Grow(50))
	a.Shrink(100)
	assert.Zero(t, a.Used(), "Shrink below zero clamps at zero")
	a.Shrink(-1)
	assert.Equal(t, int64(2), p.Stats().Misuse)
	require.NoError(t, a.Grow(10), "the account still works")
	a.Close()
	assert.Zero(t, p.Used())

	strict := newTestPool(t, PoolConfig{Limit: mib})
	b := mustOpen(t, strict, "b", 0)
	require.NoError(t, b.Grow(50))
	assert.PanicsWithValue(t, "limits: pool/b: Shrink(100) below zero with 50 in use", func() { b.Shrink(100) })
	assert.Panics(t, func() { b.Shrink(-1) })
	b.Close()
	assert.Zero(t, strict.Used())
}

func TestNestedCloseReturnsEverything(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 4 * kib})
	q := mustOpen(t, p, "q", 0)
	op := mustOpen(t, q, "op", 0)
	require.NoError(t, q.Grow(100))
	require.NoError(t, op.Grow(10*kib))
	assert.Equal(t, 100+12*kib, q.Used(), "the parent counts its child's reservation")
	q.Close()
	assert.Zero(t, p.Used(), "closing the parent returns its children's bytes too")
	err := op.Grow(64 * kib)
	assert.ErrorIs(t, err, ErrClosed, "a child of a closed account cannot reserve more")
	op.Shrink(10 * kib)
	op.Close()
	assert.Zero(t, p.Used())
	assert.Zero(t, p.Stats().Misuse)
}

func TestDefaultLimitFromGOMEMLIMIT(t *testing.T) {
	assert.Equal(t, int64(math.MaxInt64), limitFromGOMEMLIMIT(math.MaxInt64))
	assert.Equal(t, int64(512<<20), limitFromGOMEMLIMIT(1<<30))
	assert.Equal(t, int64(1), limitFromGOMEMLIMIT(0))
	p, err := NewPool(PoolConfig{HeapPressure: -1})
	require.NoError(t, err)
	defer p.Close()
	assert.Equal(t, "pool", p.Name())
	if gml := limitFromGOMEMLIMIT(debug.SetMemoryLimit(-1)); gml == math.MaxInt64 {
		assert.Zero(t, p.Limit())
	} else {
		assert.Equal(t, gml, p.Limit())
	}
}

func TestAccountLayout(t *testing.T) {
	// Hot counters first, struct a whole number of cache lines, so accounts
	// of different goroutines do not share a line (see the parallel
	// benchmark).
	assert.Zero(t, unsafe.Sizeof(Account{})%64, "sizeof(Account) = %d", unsafe.Sizeof(Account{}))
	assert.Less(t, unsafe.Offsetof(Account{}.releaseAt), uintptr(64))
}

// TestEightRequestsAgainstPool: eight concurrent 80 MiB Grows, each under a
// 100 MiB per-request budget, against a 400 MiB pool: exactly five fit, and
// the three others are refused by the pool.
func TestEightRequestsAgainstPool(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 400 * mib})
	start := make(chan struct{})
	errs := make(chan error, 8)
	accts := make([]*Account, 8)
	for i := range accts {
		accts[i] = mustOpen(t, p, "req", 100*mib)
		go func() {
			<-start
			errs <- accts[i].Grow(80 * mib)
		}()
	}
	close(start)
	ok, refused := 0, 0
	for range accts {
		err := <-errs
		if err == nil {
			ok++
			continue
		}
		var e *ExhaustedError
		require.ErrorAs(t, err, &e)
		assert.Equal(t, "pool", e.Scope)
		assert.Equal(t, 80*mib, e.Requested)
		assert.Equal(t, 400*mib, e.Limit)
		refused++
	}
	assert.Equal(t, 5, ok)
	assert.Equal(t, 3, refused)
	assert.Equal(t, 400*mib, p.Used())
	for _, a := range accts {
		a.Close()
	}
	assert.Zero(t, p.Used())
}

// TestGrowRacingRelease puts a release, then a Close, exactly between the
// fast path's check against the reservation and its compare-and-swap: the
// Grow must notice the lowered reservation and take the slow path, so an
// account never uses more than it holds from its parent.
func TestGrowRacingRelease(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 4 * kib})
	a := mustOpen(t, p, "a", 0)
	require.NoError(t, a.Grow(mib))
	// A Shrink has lowered used; its release has not run yet.
	a.used.Add(-mib)
	hooked := 0
	testHookGrow = func() {
		if hooked++; hooked == 1 {
			a.release() // lowers reserved to one chunk
		}
	}
	t.Cleanup(func() { testHookGrow = nil })
	require.NoError(t, a.Grow(64*kib))
	assert.Equal(t, 1, hooked, "the release ran between check and swap")
	assert.Equal(t, 64*kib, a.Used())
	assert.GreaterOrEqual(t, a.reserved.Load(), a.used.Load(), "reserved below used")
	assert.Equal(t, a.reserved.Load(), p.Used())

	a.Shrink(kib) // leaves a kibibyte of slack for the fast path
	hooked = 0
	testHookGrow = func() {
		if hooked++; hooked == 1 {
			a.Close()
		}
	}
	assert.ErrorIs(t, a.Grow(1), ErrClosed, "a Grow racing Close fails")
	assert.Equal(t, 1, hooked)
	assert.Zero(t, p.Used())
}

// TestReleaseRacingGrow puts a whole fast-path Grow between a release's read
// of used and its lowering of the reservation: the release must see the
// Grow's bytes and keep the reservation.
func TestReleaseRacingGrow(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 4 * kib})
	a := mustOpen(t, p, "a", 0)
	require.NoError(t, a.Grow(mib))
	a.used.Add(-mib) // a Shrink whose release has not run yet
	hooked := 0
	testHookRelease = func() {
		if hooked++; hooked == 1 {
			require.NoError(t, a.Grow(512*kib)) // fits in what a holds: fast path
		}
	}
	t.Cleanup(func() { testHookRelease = nil })
	a.release()
	assert.Equal(t, 2, hooked, "the release looked again after seeing the Grow")
	assert.Equal(t, 512*kib, a.Used())
	assert.Equal(t, 512*kib+4*kib, a.reserved.Load(), "the release looked again and kept one chunk")
	assert.Equal(t, a.reserved.Load(), p.Used())
	a.Shrink(512 * kib)
	a.Close()
	assert.Zero(t, p.Used())
}
