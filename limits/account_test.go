package limits

import (
	"errors"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/KimMachineGun/automemlimit/memlimit"

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

// TestHugeSizeIsExhaustedWhateverIsInUse (issue 11, input 5): on an account
// limited to 64 MiB, a client-supplied size past the limit is
// resource_exhausted whether 0 or 1 byte (or anything) is in use, in every
// kind of scope, up to math.MaxInt64.
func TestHugeSizeIsExhaustedWhateverIsInUse(t *testing.T) {
	for _, poolLimit := range []int64{Unlimited, 1 << 40} {
		p := newTestPool(t, PoolConfig{Limit: poolLimit})
		a := mustOpen(t, p, "a", 64*mib)
		q := mustOpen(t, p, "q", Unlimited)
		child := mustOpen(t, q, "child", Unlimited)
		accts := []*Account{a, child, q}
		if poolLimit == Unlimited {
			accts = accts[:1] // the others may hold up to math.MaxInt64
		}
		for _, acct := range accts {
			for _, inUse := range []int64{0, 1, 64 * kib, mib} {
				require.NoError(t, acct.Grow(inUse))
				for _, n := range []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - inUse, math.MaxInt64 - inUse + 1, 1 << 62, 65 * mib} {
					if n <= 0 || (acct != a && n == 65*mib) {
						continue
					}
					err := acct.Grow(n)
					require.ErrorIs(t, err, ErrResourceExhausted, "%s: Grow(%d) with %d in use", acct.Name(), n, inUse)
					assert.False(t, errors.Is(err, ErrInvalidSize))
					var e *ExhaustedError
					require.ErrorAs(t, err, &e)
					assert.Equal(t, n, e.Requested)
					assert.Equal(t, inUse, acct.used.Load(), "nothing counted")
				}
				acct.Shrink(inUse)
			}
		}
		child.Close()
		q.Close()
		a.Close()
		assert.Zero(t, p.Used())
		assert.Zero(t, p.Stats().Misuse)
	}
}

// TestNestedGrowToExactlyMaxInt64: a nested account reserves from its
// parent in chunks, but the rounding must not refuse a total that fits
// exactly, and a total past math.MaxInt64 is refused as exhausted, naming
// the size the caller passed, not the rounded reservation.
func TestNestedGrowToExactlyMaxInt64(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: Unlimited})
	parent := mustOpen(t, p, "parent", Unlimited)
	child := mustOpen(t, parent, "child", Unlimited)
	grandchild := mustOpen(t, child, "grandchild", Unlimited)
	require.NoError(t, parent.Grow(100000))

	n := int64(math.MaxInt64 - 100000)
	err := grandchild.Grow(n + 1)
	require.ErrorIs(t, err, ErrResourceExhausted)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, n+1, e.Requested, "the caller's size")
	assert.Zero(t, grandchild.Used())

	require.NoError(t, grandchild.Grow(n), "parent total exactly math.MaxInt64")
	assert.Equal(t, n, grandchild.Used())
	assert.Equal(t, n, child.Used())
	assert.Equal(t, int64(math.MaxInt64), parent.Used())

	require.ErrorIs(t, grandchild.Grow(1), ErrResourceExhausted)
	require.ErrorIs(t, parent.Grow(1), ErrResourceExhausted)

	grandchild.Shrink(n)
	parent.Shrink(100000)
	grandchild.Close()
	child.Close()
	parent.Close()
	assert.Zero(t, p.Used())
}

func TestMisuseIsCountedOrPanics(t *testing.T) {
	var logs strings.Builder
	p, err := NewPool(PoolConfig{Limit: mib, HeapPressure: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer p.Close()
	a := mustOpen(t, p, "a", Unlimited)
	require.NoError(t, a.Grow(50))
	a.Shrink(100)
	assert.Equal(t, int64(50), a.Used(), "a Shrink below what the account grew is not applied")
	a.Shrink(-1)
	assert.Equal(t, int64(2), p.Stats().Misuse)
	assert.Equal(t, 1, strings.Count(logs.String(), "misuse"), "logged once: %s", logs.String())
	assert.Contains(t, logs.String(), "pool/a: Shrink(100) below what it grew itself, 50")
	require.NoError(t, a.Grow(10), "the account still works")
	a.Shrink(60)
	a.Close()
	assert.Zero(t, p.Used())
	assert.Zero(t, p.Stats().Leaked)

	strict := newTestPool(t, PoolConfig{Limit: mib})
	b := mustOpen(t, strict, "b", Unlimited)
	require.NoError(t, b.Grow(50))
	assert.PanicsWithValue(t, "limits: pool/b: Shrink(100) below what it grew itself, 50", func() { b.Shrink(100) })
	assert.Panics(t, func() { b.Shrink(-1) })
	b.Shrink(50)
	b.Close()
	assert.Zero(t, strict.Used())
}

// TestParentOverShrinkIsMisuse (issue 11, input 1): pool limit 1 MiB,
// account P opens child C, C grows 900 KiB, P.Shrink(900 KiB) with nothing
// grown by P itself is misuse: not applied, so a second account cannot grow
// 900 KiB on top; never more granted than the pool's limit. The same for
// every depth and for a parent that grew a little itself.
func TestParentOverShrinkIsMisuse(t *testing.T) {
	for _, own := range []int64{0, 1, 100 * kib} {
		for _, depth := range []int{1, 2} {
			p, err := NewPool(PoolConfig{Limit: mib, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			parent := mustOpen(t, p, "P", Unlimited)
			require.NoError(t, parent.Grow(own))
			c := parent
			for range depth {
				c = mustOpen(t, c, "C", Unlimited)
			}
			require.NoError(t, c.Grow(900*kib-own))
			parent.Shrink(900 * kib)
			assert.Equal(t, int64(1), p.Stats().Misuse, "own %d depth %d", own, depth)
			assert.Equal(t, own, parent.used.Load(), "not applied")
			assert.GreaterOrEqual(t, parent.Used(), 900*kib)
			second := mustOpen(t, p, "second", Unlimited)
			err = second.Grow(900 * kib)
			require.ErrorIs(t, err, ErrResourceExhausted, "own %d depth %d: the pool still counts C's bytes", own, depth)
			assert.LessOrEqual(t, p.Used(), mib)
			second.Close()
			parent.Shrink(own)
			c.Shrink(900*kib - own)
			parent.Close()
			assert.Zero(t, p.Used())
			p.Close()
		}
	}
}

// TestStrictPanicsWithNoLockHeld (issue 11, input 2): in strict mode, the
// panic of a misuse or a leak comes after every lock is released: after
// net/http-style recovery, the accounts involved keep working and close.
func TestStrictPanicsWithNoLockHeld(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: mib})
	parent := mustOpen(t, p, "P", Unlimited)
	child := mustOpen(t, parent, "C", Unlimited)
	require.NoError(t, child.Grow(900*kib))
	recovered := func(f func()) (v any) {
		defer func() { v = recover() }()
		f()
		return nil
	}
	assert.NotNil(t, recovered(func() { parent.Shrink(900 * kib) }))
	// The innocent child is unaffected: it grows, shrinks and closes.
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, child.Grow(kib))
		child.Shrink(901 * kib)
		child.Close()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("child blocked after the strict panic")
	}
	// A leak panics after the whole tree is closed and every lock released.
	grand := mustOpen(t, mustOpen(t, parent, "C2", Unlimited), "G", Unlimited)
	require.NoError(t, grand.Grow(10))
	assert.Equal(t, "limits: pool/P/C2/G: closed with 10 bytes grown and not shrunk", recovered(parent.Close))
	assert.Zero(t, p.Used())
	assert.ErrorIs(t, grand.Grow(1), ErrClosed)
	grand.Close() // no deadlock, no second panic
	parent.Close()
	assert.Equal(t, int64(1), p.Stats().Leaked)
	assert.Equal(t, int64(10), p.Stats().LeakedBytes)
}

// TestClosedIsClosed (issue 11, input 4): a child or grandchild of a closed
// account, and any account of a closed pool, refuses Grow (even within its
// reserved chunk) and Open with ErrClosed, and the pool counts nothing
// after.
func TestClosedIsClosed(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 64 * kib})
	parent := mustOpen(t, p, "P", Unlimited)
	child := mustOpen(t, parent, "C", Unlimited)
	grand := mustOpen(t, child, "G", Unlimited)
	for _, a := range []*Account{child, grand} {
		require.NoError(t, a.Grow(1))
		a.Shrink(1)
	}
	parent.Close()
	assert.Zero(t, p.Used())
	for _, a := range []*Account{parent, child, grand} {
		assert.ErrorIs(t, a.Grow(1), ErrClosed, a.Name())
		_, err := a.Open("x", Unlimited)
		assert.ErrorIs(t, err, ErrClosed, a.Name())
		assert.Zero(t, a.Used())
	}
	assert.Zero(t, p.Used())

	top := mustOpen(t, p, "top", Unlimited)
	kid := mustOpen(t, top, "kid", Unlimited)
	require.NoError(t, top.Grow(1))
	require.NoError(t, kid.Grow(1))
	top.Shrink(1)
	kid.Shrink(1)
	used := p.Used()
	p.Close()
	for _, a := range []*Account{top, kid} {
		assert.ErrorIs(t, a.Grow(1), ErrClosed, "within the reserved chunk too: %s", a.Name())
		_, err := a.Open("x", Unlimited)
		assert.ErrorIs(t, err, ErrClosed)
	}
	assert.Equal(t, used, p.Used())
	kid.Close()
	top.Close()
	assert.Zero(t, p.Used())
}

func TestNestedCloseReturnsEverything(t *testing.T) {
	var logs strings.Builder
	p, err := NewPool(PoolConfig{Limit: 10 * mib, ChunkSize: 4 * kib, HeapPressure: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer p.Close()
	q := mustOpen(t, p, "q", Unlimited)
	op := mustOpen(t, q, "op", Unlimited)
	require.NoError(t, q.Grow(100))
	require.NoError(t, op.Grow(10*kib))
	assert.Equal(t, 100+12*kib, q.Used(), "the parent counts its child's reservation")
	q.Shrink(100)
	q.Close()
	assert.Zero(t, p.Used(), "closing the parent returns its children's bytes too")
	err = op.Grow(1)
	assert.ErrorIs(t, err, ErrClosed, "a child of a closed account is closed")
	// Leaks show (issue 11, item 6): the child closed by its parent with
	// 10 KiB grown is counted, and logged once.
	st := p.Stats()
	assert.Equal(t, int64(1), st.Leaked)
	assert.Equal(t, 10*kib, st.LeakedBytes)
	assert.Equal(t, 1, strings.Count(logs.String(), "leak"), logs.String())
	assert.Contains(t, logs.String(), "pool/q/op: closed with 10240 bytes")
	op.Shrink(10 * kib)
	op.Close()
	assert.Zero(t, p.Used())
	assert.Zero(t, p.Stats().Misuse)

	// A second leak is counted, not logged again.
	a := mustOpen(t, p, "a", Unlimited)
	require.NoError(t, a.Grow(7))
	a.Close()
	st = p.Stats()
	assert.Equal(t, int64(2), st.Leaked)
	assert.Equal(t, 10*kib+7, st.LeakedBytes)
	assert.Equal(t, 1, strings.Count(logs.String(), "leak"), logs.String())
}

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
	shrinkClose(accts...)
	assert.Zero(t, p.Used())
}

// TestGrowRacingRelease puts a release, then a Close, exactly between the
// fast path's add and its check against the reservation: the Grow must
// notice the lowered reservation and take the slow path, so an account
// never uses more than it holds from its parent.
func TestGrowRacingRelease(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 4 * kib})
	a := mustOpen(t, p, "a", Unlimited)
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
			a.close(nil) // a Close by another goroutine, not strict about the leak
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
	a := mustOpen(t, p, "a", Unlimited)
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

// TestMisuseCountingOnPassingBytes puts a Shrink past what the account grew
// between a fast-path Grow's add and its check: the Shrink sees the Grow's
// passing bytes and succeeds, the Grow does not fit and takes its bytes
// back, finds the account below zero, puts it back at zero and counts the
// misuse. The Grow then succeeds under the lock.
func TestMisuseCountingOnPassingBytes(t *testing.T) {
	p, err := NewPool(PoolConfig{Limit: 10 * mib, ChunkSize: 64 * kib, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Close()
	a := mustOpen(t, p, "a", Unlimited)
	require.NoError(t, a.Grow(10))
	hooked := 0
	testHookGrow = func() {
		if hooked++; hooked == 1 {
			a.Shrink(1000) // a grew 10: misuse, but the Grow's bytes are there
		}
	}
	t.Cleanup(func() { testHookGrow = nil })
	// 64 KiB: no more than a holds (one chunk), so it takes the fast path,
	// and with the 10 bytes it does not fit. A Grow larger than all the
	// account holds goes straight to the lock, with no passing bytes.
	require.NoError(t, a.Grow(64*kib))
	assert.Equal(t, 1, hooked)
	assert.Equal(t, int64(1), p.Stats().Misuse)
	assert.Equal(t, 64*kib, a.Used(), "the misuse took the 10 bytes a grew, no more")
	testHookGrow = nil
	hooked = 0
	testHookGrow = func() { hooked++ }
	require.NoError(t, a.Grow(mib))
	assert.Zero(t, hooked, "a Grow past all the account holds never adds passing bytes")
	testHookGrow = nil
	a.Shrink(mib + 64*kib)
	a.Close()
	assert.Zero(t, p.Used())
	assert.Equal(t, int64(1), p.Stats().Misuse)
	assert.Zero(t, p.Stats().Leaked)
}
