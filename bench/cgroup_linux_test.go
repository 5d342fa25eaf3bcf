package main

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
)

// TestCgroup makes a real child memory cgroup, runs a process in it, reads
// the limit back from the files and the process's /proc/PID/cgroup, and
// removes it.
func TestCgroup(t *testing.T) {
	parent, err := findCgroupParent()
	if err != nil {
		t.Skipf("no child memory cgroup can be made here: %v", err)
	}
	const limit = 256 << 20
	name := fmt.Sprintf("memctl-bench-test-%d", os.Getpid())
	g, err := parent.newChild(name, limit)
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.remove() })

	file := "memory.limit_in_bytes"
	if g.version == 2 {
		file = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(g.dir, file))
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(limit), strings.TrimSpace(string(b)))

	cmd := exec.Command("/bin/cat", "/proc/self/cgroup")
	g.wrap(cmd)
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), "/"+name+"\n", "the process ran inside the cgroup")
	n, err := g.oomKills()
	require.NoError(t, err)
	assert.Zero(t, n)

	require.NoError(t, g.remove())
	_, err = os.Stat(g.dir)
	assert.True(t, os.IsNotExist(err), "removed")
	require.NoError(t, g.remove(), "removing twice is fine")
}
