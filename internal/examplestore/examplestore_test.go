package examplestore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOutsideABudget(t *testing.T) {
	ctx := context.Background() // no account: Grow counts nothing
	n, err := Alloc(ctx, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), n)
	n, err = AllocWrapped(ctx, 4096)
	require.NoError(t, err)
	assert.Equal(t, int64(4096), n)
	n, err = AllocUndercharged(ctx, 9<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(16<<20), n, "two 8 MiB steps")
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = Hold(canceled, 1)
	assert.ErrorIs(t, err, context.Canceled)
}
