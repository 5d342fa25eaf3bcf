package memctl

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/procfs"
)

// TestStatsSwap reads the process's real swap: VmSwap as /proc/self/status
// says, and its cgroup's swap files where the kernel accounts swap (on a v1
// host the memsw files, which may be absent: then CgroupErr says so), in
// Stats and in the state record.
func TestStatsSwap(t *testing.T) {
	recordTest(t)
	t.Setenv("MEMCTL_PRESSURE", "off")
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer ctl.Close()
	s := ctl.Stats().Swap
	f, err := procfs.ReadFile("/proc/self/status")
	require.NoError(t, err)
	vm, err := f.Bytes("VmSwap")
	require.NoError(t, err)
	assert.InDelta(t, float64(vm), float64(s.VmSwap), 1<<20, "VmSwap")

	r := ownRecord(t)
	require.NotNil(t, r.Swap, "the record shows swap")
	require.NotNil(t, r.Swap.VmSwapBytes)
	l, err := cgroupfs.Of(0)
	if errors.Is(err, cgroupfs.ErrNoCgroup) {
		assert.Error(t, s.CgroupErr)
		t.Skipf("no memory cgroup: %v", err)
	}
	require.NoError(t, err)
	if s.CgroupVersion == 0 {
		require.Error(t, s.CgroupErr)
		assert.Contains(t, s.CgroupErr.Error(), "does not account swap")
		assert.Equal(t, 0, r.Swap.CgroupVersion)
		assert.Contains(t, r.Swap.Note, "does not account swap")
		t.Skipf("cgroup v%d without swap accounting: %v", l.Version, s.CgroupErr)
	}
	require.NoError(t, s.CgroupErr)
	cur, max := cgroupfs.SwapFiles(l.Version)
	assert.Equal(t, l.Version, s.CgroupVersion)
	assert.True(t, strings.HasSuffix(s.CurrentFile, "/"+cur), s.CurrentFile)
	assert.True(t, strings.HasSuffix(s.MaxFile, "/"+max), s.MaxFile)
	assert.GreaterOrEqual(t, s.Current, int64(0))
	assert.Equal(t, l.Version, r.Swap.CgroupVersion)
	assert.Equal(t, l.Version == 1, r.Swap.MemoryPlusSwap)
	require.NotNil(t, r.Swap.CurrentBytes)
	assert.Equal(t, s.CurrentFile, r.Swap.File)
	if l.Version == 1 {
		assert.Positive(t, s.Current, "memsw counts this process's memory")
	}
	// GOMEMLIMIT's limit never comes from a swap file.
	assert.NotContains(t, ctl.Report().MemLimit.File, "swap")
	assert.NotContains(t, ctl.Report().MemLimit.File, "memsw")
}

func TestSwapRecord(t *testing.T) {
	r := swapRecord(SwapStats{VmSwap: -1, Current: -1, Max: -1, CgroupErr: errors.New("no cgroup")})
	assert.Nil(t, r.VmSwapBytes)
	assert.Nil(t, r.CurrentBytes)
	assert.Equal(t, "no cgroup", r.Note)
	r = swapRecord(SwapStats{VmSwap: 4096, CgroupVersion: 2, Current: 8192, Max: -1, CurrentFile: "/c/memory.swap.current"})
	assert.Equal(t, int64(4096), *r.VmSwapBytes)
	assert.Equal(t, int64(8192), *r.CurrentBytes)
	assert.Nil(t, r.MaxBytes, "no limit")
	assert.False(t, r.MemoryPlusSwap)
	r = swapRecord(SwapStats{VmSwap: 0, CgroupVersion: 1, Current: 1 << 20, Max: 1 << 30})
	assert.Equal(t, int64(1<<30), *r.MaxBytes)
	assert.True(t, r.MemoryPlusSwap)
}
