// Package gcendtest lets a test wait for the end of a GC cycle to have
// reached every subscriber of internal/gcend, instead of sleeping: a check
// that something happened, or did not, at a GC end waits for the event.
package gcendtest

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/gcend"
)

// Seen runs GC cycles until every gcend subscriber registered before the
// call has run for a cycle that ended after it, or fails t after 10 s.
// Subscribers run in the order they subscribed, one GC end after another,
// so the second call of the one Seen subscribes is for a cycle that began
// after the first, and every earlier subscriber has run for it by then.
func Seen(t testing.TB) {
	t.Helper()
	var calls atomic.Int64
	s := gcend.Subscribe(func(*gcend.Sample) bool { calls.Add(1); return true })
	defer s.Stop()
	for deadline := time.Now().Add(10 * time.Second); calls.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("gcendtest: no GC end seen in 10 s (%d calls)", calls.Load())
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}
