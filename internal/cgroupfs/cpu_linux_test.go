package cgroupfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// In a real cgroup v1 cpu child with a 10% quota and a busy loop inside,
// CPUStatFile names the child's cpu.stat for the busy loop, and its
// throttled time grows by most of the wall time.
func TestReadThrottledReal(t *testing.T) {
	cpuquota.SkipUnlessAvailable(t)
	self, err := CPUStatFile("/proc/self/cgroup", "/proc/self/mountinfo", "")
	require.NoError(t, err)
	self0, err := ReadThrottled(self)
	require.NoError(t, err)

	g, err := cpuquota.New(fmt.Sprintf("memctl-test-cgroupfs-%d", os.Getpid()), 10000, 100000)
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Remove()) }()
	require.NoError(t, g.StartBusy())
	pid := g.BusyPid()
	proc := "/proc/" + strconv.Itoa(pid)
	file, err := CPUStatFile(proc+"/cgroup", proc+"/mountinfo", "")
	require.NoError(t, err)
	// The same file, whatever the name: on many v1 hosts /sys/fs/cgroup/cpu
	// is a symlink to the cpu,cpuacct mount that mountinfo names.
	want, err := os.Stat(filepath.Join(g.Dir, "cpu.stat"))
	require.NoError(t, err)
	got, err := os.Stat(file)
	require.NoError(t, err, file)
	assert.True(t, os.SameFile(want, got), "%s is %s", file, filepath.Join(g.Dir, "cpu.stat"))

	d0, err := ReadThrottled(file)
	require.NoError(t, err)
	const wall = 500 * time.Millisecond
	time.Sleep(wall)
	d1, err := ReadThrottled(file)
	require.NoError(t, err)
	self1, err := ReadThrottled(self)
	require.NoError(t, err)
	t.Logf("throttled over %v: quota cgroup %v, own cgroup %v (%s)", wall, d1-d0, self1-self0, self)
	// 90% of each 100 ms period throttled (360 ms of 500 seen); a quarter
	// of the wall time leaves room for a busy machine.
	assert.Greater(t, d1-d0, wall/4)
	// The test's own cgroup is read for comparison only: CI may run it
	// under a quota of its own.
}
