package procfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadAnonHugePages(t *testing.T) {
	n, err := ReadBytes("testdata/thp/smaps_rollup", "AnonHugePages")
	require.NoError(t, err)
	assert.Equal(t, int64(64<<20), n)
	for _, f := range []string{"smaps_rollup_badunit", "smaps_rollup_nokey", "smaps_rollup_garbage", "does_not_exist"} {
		_, err := ReadBytes(filepath.Join("testdata/thp", f), "AnonHugePages")
		require.Error(t, err, f)
		assert.Contains(t, err.Error(), filepath.Join("testdata/thp", f), "the error names the file")
	}
}

func TestAnonHugePages(t *testing.T) {
	self, err := AnonHugePages(0)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, self, int64(0))
	_, err = AnonHugePages(os.Getpid())
	require.NoError(t, err)
	_, err = AnonHugePages(-5)
	assert.ErrorContains(t, err, "/proc/-5/smaps_rollup")
}
