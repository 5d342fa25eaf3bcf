package limits

import (
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// TestConcurrentMisuseIsExact: Shrinks past what the account grew, racing
// correct Grow/Shrink pairs of other goroutines on the same account and its
// child, are each counted once and change nothing; no correct call is
// counted as misuse, and every counter ends at exactly zero.
func TestConcurrentMisuseIsExact(t *testing.T) {
	p, err := NewPool(PoolConfig{Limit: 64 * mib, ChunkSize: kib, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Close()
	a := mustOpen(t, p, "a", 32*mib)
	child := mustOpen(t, a, "child", Unlimited)
	const (
		workers = 6
		rounds  = 5000
		misuses = 3000
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			acct := []*Account{a, child}[w%2]
			for range rounds {
				n := 1 + rng.Int64N(4*kib)
				if acct.Grow(n) == nil {
					acct.Shrink(n)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range misuses {
			a.Shrink(64*mib + int64(i)) // more than a can ever have grown
		}
	}()
	wg.Wait()
	assert.Equal(t, int64(misuses), p.Stats().Misuse)
	assert.Zero(t, a.used.Load())
	assert.Zero(t, child.used.Load())
	child.Close()
	a.Close()
	assert.Zero(t, p.Used())
	assert.Zero(t, p.Stats().Leaked)
}
