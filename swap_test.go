package memctl

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
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

func init() { moreChildren["swap"] = childSwap }

// childSwap runs Start and reports GOMEMLIMIT, its source and file, and
// Stats().Swap.
func childSwap() {
	ctl, err := Start(WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		childtest.Fail("Start: %v", err)
	}
	defer ctl.Close()
	r := ctl.Report().MemLimit
	childtest.Say("GOMEMLIMIT", debug.SetMemoryLimit(-1))
	childtest.Say("SOURCE", r.Source)
	childtest.Say("FILE", r.File)
	childtest.Say("MEMORY_LIMIT", r.MemoryLimit)
	s := ctl.Stats().Swap
	childtest.Say("VMSWAP", s.VmSwap)
	childtest.Say("SWAP_VERSION", s.CgroupVersion)
	childtest.Say("SWAP_CURRENT", s.Current)
	childtest.Say("SWAP_MAX", s.Max)
	childtest.Say("SWAP_FILE", s.CurrentFile)
	childtest.Say("SWAP_ERR", strings.ReplaceAll(fmt.Sprint(s.CgroupErr), "\n", "; "))
}

// TestV2Swap: on a real cgroup v2 memory controller, a cgroup that may use
// swap (memory.swap.max 512 MiB, or "max") under a 256 MiB memory.max:
// GOMEMLIMIT is 0.9 of memory.max, never of memory plus swap, and Stats
// shows the cgroup's memory.swap.current and memory.swap.max and VmSwap
// (the VM has no swap device: 0 in swap). In the host layout and in a
// container's own cgroup namespace and mount.
func TestV2Swap(t *testing.T) {
	cgrouptest.RequireV2(t)
	const limit = 256 << 20
	for _, l := range []cgrouptest.Layout{cgrouptest.LayoutHost, cgrouptest.LayoutContainer} {
		for _, swapMax := range []int64{512 << 20, -1} {
			t.Run(fmt.Sprintf("%s/swap.max=%d", l.Name, swapMax), func(t *testing.T) {
				g := cgrouptest.NewV2(t, l, limit)
				v := "max"
				if swapMax >= 0 {
					v = strconv.FormatInt(swapMax, 10)
				}
				require.NoError(t, os.WriteFile(filepath.Join(g.Dir, "memory.swap.max"), []byte(v), 0o644))
				cmd := childtest.Command(t, "swap", []string{"MEMCTL", "GOMEMLIMIT", "AUTOMEMLIMIT", "MEMCTL_PRESSURE"})
				g.Wrap(t, cmd)
				rep := childtest.Report(t, cmd)
				assert.Equal(t, "cgroup v2", rep["SOURCE"])
				assert.Equal(t, "memory.max", filepath.Base(rep["FILE"]))
				assert.Equal(t, strconv.Itoa(limit), rep["MEMORY_LIMIT"], "the limit is memory.max: swap is not memory")
				gml := childtest.RequireInt(t, rep, "GOMEMLIMIT")
				assert.LessOrEqual(t, gml, int64(limit*9/10))
				assert.Greater(t, gml, int64(limit*7/10))
				assert.Equal(t, "<nil>", rep["SWAP_ERR"])
				assert.Equal(t, "2", rep["SWAP_VERSION"])
				assert.Equal(t, "0", rep["SWAP_CURRENT"], "no swap device in the VM")
				assert.Equal(t, strconv.FormatInt(swapMax, 10), rep["SWAP_MAX"])
				assert.Equal(t, "memory.swap.current", filepath.Base(rep["SWAP_FILE"]))
				assert.Equal(t, "0", rep["VMSWAP"])
			})
		}
	}
}

// BenchmarkSwapRead is what Stats (and each publication of the state
// record) pays for the swap figures: /proc/self/status and the cgroup's
// two swap files, the cgroup found once.
func BenchmarkSwapRead(b *testing.B) {
	readSwap()
	b.ReportAllocs()
	for b.Loop() {
		readSwap()
	}
}
