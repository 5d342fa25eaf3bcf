package cgrouptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGroupRunsCommandInside(t *testing.T) {
	g := New(t, 64<<20)
	cmd := exec.Command("/bin/cat", "/proc/self/cgroup")
	g.Wrap(cmd)
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), filepath.Base(g.Dir), "the program runs inside the new cgroup")

	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(g.Dir, file))
	require.NoError(t, err)
	got, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	require.NoError(t, err)
	assert.Equal(t, int64(64<<20), got)
	n, err := g.OOMKills()
	require.NoError(t, err)
	assert.Zero(t, n)
}

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
