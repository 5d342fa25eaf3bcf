//go:build !cgo || !linux

package cheap

import (
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDetectUnavailable(t *testing.T) {
	s := Detect()
	assert.Equal(t, none, s.Allocator())
	assert.Zero(t, s.Retained(), "nothing to release")
	_, err := s.Release()
	require.ErrorIs(t, err, ErrUnavailable)
	if runtime.GOOS == "linux" {
		assert.Contains(t, err.Error(), "cgo is off")
	} else {
		assert.ErrorIs(t, err, errors.ErrUnsupported)
	}
	require.ErrorIs(t, SetArenaMax(2), ErrUnavailable)
}
