package relief

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestShed(t *testing.T) {
	defer Shed(false)
	assert.False(t, Shedding())
	Shed(true)
	assert.True(t, Shedding())
	Shed(false)
	assert.False(t, Shedding())
}

func TestCancelLargest(t *testing.T) {
	defer canceler.Store(nil)
	assert.Zero(t, CancelLargest(), "none registered")
	SetCanceler(func() int { return 2 })
	assert.Equal(t, 2, CancelLargest())
}

func TestTrim(t *testing.T) {
	assert.False(t, Trim(), "none registered")
	var a, b int
	removeA := SetTrim(func() { a++ })
	assert.True(t, Trim())
	removeB := SetTrim(func() { b++ })
	removeA() // no longer the one registered: keeps b
	assert.True(t, Trim())
	assert.Equal(t, []int{1, 1}, []int{a, b})
	removeB()
	assert.False(t, Trim())
}
