package examplestore

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "123": 123, "64KiB": 64 << 10, "64MiB": 64 << 20, "1GiB": 1 << 30,
		"8589934591GiB": math.MaxInt64 >> 30 << 30,
	} {
		got, err := ParseBytes(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "-1", "1GB", "x", "GiB", "1KiBMiB", "9999999999GiB", " 1"} {
		_, err := ParseBytes(in)
		assert.ErrorContains(t, err, fmt.Sprintf("%q", in), in)
	}
}

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
