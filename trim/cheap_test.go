package trim

import (
	"errors"
	"testing"

	"github.com/memctl/memctl/trim/cheap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultCHeap(t *testing.T) {
	c := realDeps.cheap()
	require.NotNil(t, c)
	assert.Equal(t, cheap.Detect().Allocator(), c.Allocator())
	if err := cheap.Detect().Err(); err != nil {
		// cgo off, not Linux, or no known allocator.
		assert.Equal(t, "none", c.Allocator())
		assert.Zero(t, c.Retained(), "nothing to release")
		_, err := c.ReleaseOver(-1)
		assert.ErrorIs(t, err, ErrCHeapUnavailable)
		return
	}
	assert.Contains(t, []string{"glibc", "jemalloc", "mimalloc", "tcmalloc"}, c.Allocator())
	_, err := c.ReleaseOver(-1)
	require.NoError(t, err)
}

func TestErrCHeapUnavailableIsCheaps(t *testing.T) {
	err := (&cheap.Step{}).Err()
	assert.True(t, errors.Is(err, ErrCHeapUnavailable))
	assert.True(t, errors.Is(err, cheap.ErrUnavailable))
}
