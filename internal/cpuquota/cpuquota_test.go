package cpuquota

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Group has the quota written, holds the busy loop, and Remove kills the
// loop and leaves no directory behind.
func TestGroupLifecycle(t *testing.T) {
	SkipUnlessAvailable(t)
	g, err := New(fmt.Sprintf("memctl-test-cpuquota-%d", os.Getpid()), 10000, 100000)
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Remove() }) // a failure below leaves no cgroup or busy loop (Remove is idempotent)
	for file, want := range map[string]string{"cpu.cfs_quota_us": "10000", "cpu.cfs_period_us": "100000"} {
		b, err := os.ReadFile(filepath.Join(g.Dir, file))
		require.NoError(t, err)
		assert.Equal(t, want, strings.TrimSpace(string(b)), file)
	}
	assert.Zero(t, g.BusyPid())
	require.NoError(t, g.StartBusy())
	pid := g.BusyPid()
	b, err := os.ReadFile(filepath.Join(g.Dir, "cgroup.procs"))
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(string(b)), strconv.Itoa(pid), "the busy loop is in the cgroup")
	require.NoError(t, g.Remove())
	_, err = os.Stat(g.Dir)
	assert.True(t, os.IsNotExist(err), "the cgroup is removed: %v", err)
	_, err = os.Stat("/proc/" + strconv.Itoa(pid))
	assert.True(t, os.IsNotExist(err), "the busy loop is gone: %v", err)
}

func TestNewRefusesAnExistingName(t *testing.T) {
	SkipUnlessAvailable(t)
	name := fmt.Sprintf("memctl-test-cpuquota-dup-%d", os.Getpid())
	g, err := New(name, 10000, 100000)
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Remove()) }()
	_, err = New(name, 10000, 100000)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cpuquota:")
}
