package chold

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/procfs"
)

// TestHoldIsResident: Hold raises RSS by what it holds and Release gives it
// back to the OS.
func TestHoldIsResident(t *testing.T) {
	before, err := procfs.RSS(0)
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	err = Hold(128 << 20)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip(err)
	}
	require.NoError(t, err)
	held, err := procfs.RSS(0)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, held-before, int64(120<<20), "128 MiB of C heap is resident")
	require.NoError(t, Release())
	after, err := procfs.RSS(0)
	require.NoError(t, err)
	assert.Less(t, after-before, int64(16<<20), "Release returned it to the OS")
	t.Logf("RSS %d MiB, holding %d MiB, released %d MiB", before>>20, held>>20, after>>20)
}
