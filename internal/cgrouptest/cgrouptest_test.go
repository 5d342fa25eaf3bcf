package cgrouptest

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Making, entering and reading the cgroup is cgroupfs's, tested there
// (TestChild); this package adds only the removal at the end of a test.
func TestGroupIsRemoved(t *testing.T) {
	var dir string
	t.Run("inner", func(t *testing.T) {
		dir = New(t, 32<<20).Dir
		_, err := os.Stat(dir)
		require.NoError(t, err)
	})
	if dir == "" {
		t.Skip("inner test skipped")
	}
	_, err := os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "cgroup %s still exists after the test", dir)
}
