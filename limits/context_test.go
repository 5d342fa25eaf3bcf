package limits

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWithAccountClosesWhenContextEnds(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, CancelLargest: true, HeapPressure: 0.9})
	a := mustOpen(t, p, "a", Unlimited)
	parent, cancel := context.WithCancel(context.Background())
	ctx, done := WithAccount(parent, a)
	defer done()
	assert.Same(t, a, FromContext(ctx))
	require.NoError(t, Grow(ctx, mib))
	assert.Equal(t, mib, p.Used())
	cancel()
	require.Eventually(t, func() bool { return p.Used() == 0 }, 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, Grow(ctx, 1), ErrClosed)
	p.mu.Lock()
	assert.Empty(t, p.listed, "a closed account leaves the pool's list")
	p.mu.Unlock()

	b := mustOpen(t, p, "b", Unlimited)
	ctx, done = WithAccount(context.Background(), b)
	require.NoError(t, Grow(ctx, mib))
	Shrink(ctx, mib)
	done()
	assert.Zero(t, p.Used(), "the returned cancel closes the account before it returns")
	assert.ErrorIs(t, context.Cause(ctx), context.Canceled)
}

func TestContextWithoutAccount(t *testing.T) {
	ctx := context.Background()
	assert.Nil(t, FromContext(ctx))
	assert.NoError(t, Grow(ctx, 1<<40), "no account: nothing is counted")
	assert.ErrorIs(t, Grow(ctx, -1), ErrInvalidSize)
	Shrink(ctx, 5)
}

// TestGrowAfterContextEndWrapsCause: an account closed because its context
// ended fails Grow and Open with ErrClosed and the context's cause.
func TestGrowAfterContextEndWrapsCause(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 100 * mib, HeapPressure: 0.9, CancelLargest: true})
	closed := func(a *Account) func() bool { return func() bool { return a.reserved.Load() < 0 } }

	// Canceled by the heap watch.
	a := mustOpen(t, p, "req-1", Unlimited)
	ctx, done := WithAccount(context.Background(), a)
	defer done()
	child, err := a.Open("sort", Unlimited)
	require.NoError(t, err)
	require.NoError(t, Grow(ctx, mib))
	p.observeHeap(15*mib, 16*mib)
	<-ctx.Done()
	require.Eventually(t, closed(a), 5*time.Second, time.Millisecond)
	err = Grow(ctx, mib)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, err, ErrResourceExhausted)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "pool/req-1 (heap pressure)", e.Scope)
	_, err = a.Open("x", Unlimited)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, err, ErrResourceExhausted)
	err = child.Grow(mib)
	assert.ErrorIs(t, err, ErrClosed, "a child of the closed account cannot reserve")
	assert.ErrorIs(t, err, ErrResourceExhausted, "and says why")
	child.Close()
	assert.Zero(t, p.Stats().Refused, "Grow calls on a closed account are not refusals")

	// The client went away: the parent context was canceled.
	b := mustOpen(t, p, "req-2", Unlimited)
	parent, cancel := context.WithCancel(context.Background())
	ctx, doneB := WithAccount(parent, b)
	defer doneB()
	cancel()
	require.Eventually(t, closed(b), 5*time.Second, time.Millisecond)
	err = Grow(ctx, 1)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrResourceExhausted)
	assert.False(t, WriteError(httptest.NewRecorder(), err))

	// A deadline.
	c := mustOpen(t, p, "req-3", Unlimited)
	parent, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	ctx, doneC := WithAccount(parent, c)
	defer doneC()
	<-ctx.Done()
	require.Eventually(t, closed(c), 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, Grow(ctx, 1), context.DeadlineExceeded)

	// Closed by the returned cancel (the work ended) or by Close: ErrClosed
	// alone.
	d := mustOpen(t, p, "req-4", Unlimited)
	ctx, doneD := WithAccount(context.Background(), d)
	doneD()
	err = Grow(ctx, 1)
	assert.ErrorIs(t, err, ErrClosed)
	assert.NotErrorIs(t, err, context.Canceled)
	assert.Equal(t, "limits: closed: pool/req-4: Grow(1)", err.Error())
}
