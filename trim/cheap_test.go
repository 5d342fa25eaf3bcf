package trim

import (
	"errors"
	"testing"

	"github.com/memctl/memctl/trim/cheap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultCHeap(t *testing.T) {
	c := DefaultCHeap()
	require.NotNil(t, c)
	st, ok := c.(CHeapStater)
	require.True(t, ok, "the default step reports statistics")
	assert.Equal(t, cheap.Detect().Allocator(), c.Allocator())

	if err := cheap.Detect().Err(); err != nil {
		// cgo off, not Linux, or no known allocator.
		assert.Equal(t, "none", c.Allocator())
		assert.Zero(t, c.Retained(), "nothing to release")
		_, err := c.Release()
		assert.ErrorIs(t, err, ErrCHeapUnavailable)
		_, err = st.Stats()
		assert.ErrorIs(t, err, ErrCHeapUnavailable)
		return
	}
	assert.Contains(t, []string{"glibc", "jemalloc", "mimalloc", "tcmalloc"}, c.Allocator())
	_, err := c.Release()
	require.NoError(t, err)
	s, err := st.Stats()
	require.NoError(t, err)
	assert.Equal(t, c.Allocator(), s.Allocator)
}

func TestErrCHeapUnavailableIsCheaps(t *testing.T) {
	err := (&cheap.Step{}).Err()
	assert.True(t, errors.Is(err, ErrCHeapUnavailable))
	assert.True(t, errors.Is(err, cheap.ErrUnavailable))
}
