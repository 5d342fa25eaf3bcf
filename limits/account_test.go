package limits

import (
	"errors"
	"log/slog"
	"math"
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
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

// shrinkClose shrinks what each account grew itself and closes it, as
// correct code does (Close with bytes grown is a leak).
func shrinkClose(accts ...*Account) {
	for _, a := range accts {
		a.Shrink(a.used.Load())
		a.Close()
	}
}

func TestGrowShrinkClose(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 64 * kib})
	a := mustOpen(t, p, "a", Unlimited)
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

	a.Shrink(500)
	a.Close()
	a.Close()
	assert.Zero(t, a.Used())
	assert.Zero(t, p.Used())
	assert.Equal(t, 3*mib, a.Peak(), "Peak is kept after Close")
	err := a.Grow(1)
	assert.ErrorIs(t, err, ErrClosed)
	assert.True(t, strings.HasPrefix(err.Error(), "limits: "), err.Error())
	_, err = a.Open("child", Unlimited)
	assert.ErrorIs(t, err, ErrClosed)
	a.Shrink(500) // after Close: does nothing, not misuse
	assert.Zero(t, p.Stats().Misuse)
	assert.Zero(t, p.Stats().Leaked)

	p.Close()
	_, err = p.Open("b", Unlimited)
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

	track := mustOpen(t, p, "track", Unlimited)
	require.NoError(t, track.Grow(9*mib), "limit 0 never refuses on its own")
	err = track.Grow(1)
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "pool", e.Scope, "the pool still refuses")
	assert.Equal(t, int64(2), p.Stats().Refused)
	limited.Shrink(mib)
	track.Shrink(9 * mib)
	limited.Close()
	track.Close()
	assert.Zero(t, p.Used())
}

func TestExhaustedErrorFields(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 4 * mib, ChunkSize: 64 * kib})
	q := mustOpen(t, p, "query-17", 2*mib)
	sort := mustOpen(t, q, "sort", Unlimited)
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
	assert.Equal(t, "limits: resource_exhausted in pool/query-17: requested 1048576 bytes, 1114112 in use, limit 2097152", e.Error())

	// Within the query's budget the exact remainder still fits: the
	// reservation falls back from whole chunks to the bytes needed.
	require.NoError(t, sort.Grow(mib-1))
	assert.Equal(t, 2*mib, sort.Used())

	// The pool refuses with its own name as the scope.
	other := mustOpen(t, p, "query-18", Unlimited)
	require.NoError(t, other.Grow(2*mib))
	err = other.Grow(1)
	require.ErrorAs(t, err, &e)
	assert.Equal(t, ExhaustedError{Requested: 1, Used: 4 * mib, Limit: 4 * mib, Scope: "pool", RetryAfter: defaultRetryAfter}, *e)

	sort.Shrink(2 * mib)
	other.Shrink(2 * mib)
	sort.Close()
	q.Close()
	other.Close()
	assert.Zero(t, p.Used())
}

func TestInvalidSizes(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: Unlimited})
	assert.Equal(t, Unlimited, p.Limit())
	a := mustOpen(t, p, "a", Unlimited)
	for _, err := range []error{a.Grow(-1), a.Resize(-1, 5), a.Resize(5, -1)} {
		assert.ErrorIs(t, err, ErrInvalidSize)
		assert.False(t, errors.Is(err, ErrResourceExhausted))
		assert.Contains(t, err.Error(), "pool/a")
	}
	require.NoError(t, a.Grow(math.MaxInt64-10))
	err := a.Grow(11)
	assert.ErrorIs(t, err, ErrResourceExhausted, "a total past math.MaxInt64 is past every limit")
	assert.False(t, errors.Is(err, ErrInvalidSize))
	assert.Equal(t, int64(math.MaxInt64-10), a.Used())
	a.Shrink(math.MaxInt64 - 10)
	a.Close()
	assert.Zero(t, p.Used())

	for _, lim := range []int64{-1, 0} {
		_, err = p.Open("bad", lim)
		assert.ErrorIs(t, err, ErrInvalidSize, "limit %d", lim)
		_, err = mustOpen(t, p, "parent", Unlimited).Open("bad", lim)
		assert.ErrorIs(t, err, ErrInvalidSize, "limit %d", lim)
		_, err = p.Middleware(HTTPConfig{Limit: lim})
		assert.ErrorIs(t, err, ErrInvalidSize, "limit %d", lim)
	}
	_, err = p.Open("zero", 0)
	assert.Contains(t, err.Error(), "limits.Unlimited", "the error says how to ask for no limit")
	for _, cfg := range []PoolConfig{{Limit: -1}, {ChunkSize: -1}, {ChunkSize: 2 << 30}, {HeapPressure: 1.5}, {HeapPressure: math.NaN()}, {CancelShare: 2}, {CancelShare: -0.5}, {CancelShare: math.NaN()}} {
		_, err := NewPool(cfg)
		assert.Error(t, err, "%+v", cfg)
		assert.True(t, strings.HasPrefix(err.Error(), "limits: "), err.Error())
	}
}

func TestAccountLayout(t *testing.T) {
	// Hot counters first, struct a whole number of cache lines, so accounts
	// of different goroutines do not share a line (see the parallel
	// benchmark).
	assert.Zero(t, unsafe.Sizeof(Account{})%64, "sizeof(Account) = %d", unsafe.Sizeof(Account{}))
	assert.Less(t, unsafe.Offsetof(Account{}.releaseAt), uintptr(64))
}
