package cgrouptest_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
)

// TestChild makes a real child memory cgroup, runs a process in it, reads
// the limit back from the files and the process's /proc/PID/cgroup, and
// removes it.
func TestChild(t *testing.T) {
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no child memory cgroup can be made here: %v", err)
	}
	const limit = 256 << 20
	name := fmt.Sprintf("memctl-cgroupfs-test-%d", os.Getpid())
	g, err := parent.NewChild(name, limit)
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Remove() })

	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(g.Dir, file))
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(limit), strings.TrimSpace(string(b)))

	cmd := exec.Command("/bin/cat", "/proc/self/cgroup")
	g.Wrap(cmd)
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), "/"+name+"\n", "the process ran inside the cgroup")
	n, err := g.OOMKills()
	require.NoError(t, err)
	assert.Zero(t, n)

	require.NoError(t, g.Remove())
	_, err = os.Stat(g.Dir)
	assert.True(t, os.IsNotExist(err), "removed")
	require.NoError(t, g.Remove(), "removing twice is fine")
}
