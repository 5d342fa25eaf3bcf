//go:build !cgo && linux

package trim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/trim/cheap"
)

func TestDefaultCHeapCgoOff(t *testing.T) {
	c := realDeps.cheap()
	assert.Equal(t, "none", c.Allocator())
	_, err := c.ReleaseOver(-1)
	require.ErrorIs(t, err, cheap.ErrUnavailable)
	assert.Contains(t, err.Error(), "cgo is off")
}
