package gcendtest

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/memctl/memctl/internal/gcend"
)

// A subscriber registered before Seen has run for a GC cycle that began
// after Seen was called by the time it returns.
func TestSeen(t *testing.T) {
	var calls atomic.Int64
	s := gcend.Subscribe(func(*gcend.Sample) bool { calls.Add(1); return true })
	defer s.Stop()
	before := gcend.Active()
	Seen(t)
	assert.Positive(t, calls.Load())
	n := calls.Load()
	Seen(t)
	assert.Greater(t, calls.Load(), n, "a GC end after the second call")
	assert.Equal(t, before, gcend.Active(), "Seen's own subscription is stopped")
}
