// Package gcendtest lets a test wait, instead of sleeping, until a GC end
// has reached every subscriber of internal/gcend.
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
// Subscribers run in order, so the second call of Seen's own subscriber
// means every earlier one has run for a cycle begun after the call.
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
