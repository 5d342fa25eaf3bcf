package gomemlimit

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIsSet(t *testing.T) {
	for v, want := range map[int64]bool{
		math.MinInt64:     false,
		-1:                false,
		0:                 false,
		1:                 true,
		512 << 20:         true,
		math.MaxInt64 - 1: true,
		math.MaxInt64:     false, // the runtime's "no limit"
	} {
		assert.Equal(t, want, IsSet(v), "%d", v)
	}
}

// TestReadFollowsSet checks Read against the runtime's own value after a
// write through Set, and that Set returns the value it replaced.
func TestReadFollowsSet(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	Do(func() {
		assert.Equal(t, prev, Set(1<<40))
		assert.Equal(t, int64(1<<40), Read())
		assert.Equal(t, int64(1<<40), debug.SetMemoryLimit(-1))
		assert.Equal(t, int64(1<<40), Set(math.MaxInt64))
	})
	assert.False(t, IsSet(Read()))
}
