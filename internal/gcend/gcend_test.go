package gcend

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitFor runs GC cycles until cond holds or a few seconds pass.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met after GC cycles")
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestSubscribeRunsAtGCEnd(t *testing.T) {
	var a, b atomic.Int64
	sa := Subscribe(func() bool { a.Add(1); return true })
	sb := Subscribe(func() bool { b.Add(1); return b.Load() < 3 })
	waitFor(t, func() bool { return a.Load() >= 5 })
	require.Equal(t, int64(3), b.Load(), "a subscriber that returns false is not called again")
	sa.Stop()
	sa.Stop() // idempotent
	sb.Stop()
	require.Equal(t, 0, Active())
	n := a.Load()
	for range 3 {
		runtime.GC()
	}
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, n, a.Load(), "no call after Stop")
}

func TestNoSubscriberNoHook(t *testing.T) {
	require.Equal(t, 0, Active())
	c := Cycles()
	for range 3 {
		runtime.GC()
	}
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, c, Cycles(), "the hook is disarmed with no subscriber")
}
