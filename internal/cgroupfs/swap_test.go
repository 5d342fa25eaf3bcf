package cgroupfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/safefs"
)

func swapFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "swap", name))
	require.NoError(t, err)
	return b
}

func TestParseSwapFixtures(t *testing.T) {
	for _, tc := range []struct {
		version  int
		cur, max string
		want     Swap
	}{
		{2, "v2-current", "v2-max-max", Swap{Version: 2, Current: 1 << 30, Max: NoLimit}},
		{2, "v2-current-zero", "v2-max-bytes", Swap{Version: 2, Current: 0, Max: 512 << 20}},
		{1, "v1-usage", "v1-limit", Swap{Version: 1, Current: 768 << 20, Max: 1536 << 20, MemoryPlusSwap: true}},
		{1, "v1-usage", "v1-limit-unset", Swap{Version: 1, Current: 768 << 20, Max: NoLimit, MemoryPlusSwap: true}},
	} {
		t.Run(tc.cur+"+"+tc.max, func(t *testing.T) {
			got, err := ParseSwap(tc.version, swapFixture(t, tc.cur), swapFixture(t, tc.max), tc.cur, tc.max)
			require.NoError(t, err)
			tc.want.CurrentFile, tc.want.MaxFile = tc.cur, tc.max
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestParseSwapMalformed: every bad- fixture, as the usage and as the
// limit, is an error that names the file and quotes the value; never a
// value.
func TestParseSwapMalformed(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join("testdata", "swap"))
	require.NoError(t, err)
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "bad-") {
			continue
		}
		n++
		bad := swapFixture(t, e.Name())
		for _, version := range []int{1, 2} {
			if e.Name() == "bad-v1-limit-max" && version == 2 {
				continue // "max" is v2's unset limit
			}
			_, err := ParseSwap(version, swapFixture(t, "v2-current"), bad, "ok", e.Name())
			require.Error(t, err, "%s as v%d limit", e.Name(), version)
			assert.Contains(t, err.Error(), safefs.Quote(e.Name()))
			assert.NotContains(t, err.Error(), "\x1b", "the value is quoted")
			if e.Name() == "bad-v1-limit-max" {
				continue // a valid usage file's shape is not at issue
			}
			okMax := map[int]string{1: "v1-limit", 2: "v2-max-max"}[version]
			_, err = ParseSwap(version, bad, swapFixture(t, okMax), e.Name(), "ok")
			if e.Name() == "bad-no-newline" {
				// A usage without its newline is still one decimal
				// value, as ParseKmemUsage reads every usage file.
				assert.NoError(t, err)
				continue
			}
			require.Error(t, err, "%s as v%d usage", e.Name(), version)
			assert.Contains(t, err.Error(), safefs.Quote(e.Name()))
		}
	}
	assert.GreaterOrEqual(t, n, 8)
	_, err = ParseSwap(3, []byte("0\n"), []byte("max\n"), "a", "b")
	assert.ErrorContains(t, err, "version 3")
}

// TestSwapNotInLimit: a container with 1 GiB of swap allowed and 300 MiB in
// swap under a pod's 512 MiB memory.max: the limit is memory.max's (v2's
// memory.max does not count swap), and the swap files read beside it.
func TestSwapNotInLimit(t *testing.T) {
	l, err := readFixture(t, "v2-swap")
	require.NoError(t, err)
	assert.Equal(t, int64(512<<20), l.Bytes)
	assert.Equal(t, "memory.max", filepath.Base(l.File))
	d, err := safefs.OpenDir(l.Dir, safefs.InRoot|safefs.NoSymlinks) // fixture: no FSTypes
	require.NoError(t, err)
	defer d.Close()
	cur, max := SwapFiles(2)
	s, err := ReadSwapAt(d, 2, ".", l.Dir)
	require.NoError(t, err)
	assert.Equal(t, Swap{Version: 2, Current: 300 << 20, Max: 1 << 30,
		CurrentFile: filepath.Join(l.Dir, cur), MaxFile: filepath.Join(l.Dir, max)}, s)
	// ReadSwap reads cgroup file systems only: the fixture, on another
	// file system, is refused.
	_, err = ReadSwap(2, l.Dir)
	assert.Error(t, err)
}

// TestReadSwapReal reads the calling process's real cgroup swap files (v1:
// memsw, v2: memory.swap.*), skipping where the kernel does not account
// swap per cgroup.
func TestReadSwapReal(t *testing.T) {
	l, err := Of(0)
	if errors.Is(err, ErrNoCgroup) {
		t.Skipf("no memory cgroup: %v", err)
	}
	require.NoError(t, err)
	s, err := ReadSwap(l.Version, l.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no swap accounting for this cgroup (v%d: %v)", l.Version, err)
	}
	require.NoError(t, err)
	cur, max := SwapFiles(l.Version)
	assert.Equal(t, filepath.Join(l.Dir, cur), s.CurrentFile)
	assert.Equal(t, filepath.Join(l.Dir, max), s.MaxFile)
	assert.GreaterOrEqual(t, s.Current, int64(0))
	assert.True(t, s.Max == NoLimit || s.Max >= 0)
	if l.Version == 1 {
		// memsw counts memory and swap: at least the memory in use.
		u, _, err := ReadUsage(1, l.Dir)
		require.NoError(t, err)
		assert.True(t, s.MemoryPlusSwap)
		assert.Greater(t, s.Current, int64(0))
		assert.InDelta(t, float64(u), float64(s.Current), float64(u)) // same order: memory plus swap
	}
	t.Logf("v%d swap: current %d max %d (%s)", s.Version, s.Current, s.Max, s.MaxFile)
	_, err = ReadSwap(l.Version, filepath.Join(l.Dir, "no-such-child-swap"))
	assert.ErrorIs(t, err, fs.ErrNotExist)
}
