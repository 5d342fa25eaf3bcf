package cgroupfs_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
)

// selfOrSkip returns Of(0), skipping where there is no memory cgroup.
func selfOrSkip(t *testing.T) cgroupfs.Limit {
	t.Helper()
	l, err := cgroupfs.Of(0)
	if errors.Is(err, errors.ErrUnsupported) || errors.Is(err, cgroupfs.ErrNoCgroup) {
		t.Skipf("no memory cgroup here: %v", err)
	}
	require.NoError(t, err)
	return l
}

// TestSelfReadsAsOf: Self reads what Of(0) reads, the first time and again
// from its kept plan, and allocates nothing once resolved.
func TestSelfReadsAsOf(t *testing.T) {
	want := selfOrSkip(t)
	var s cgroupfs.Self
	for i := range 3 {
		got, err := s.Read()
		require.NoError(t, err)
		assert.Equal(t, want, got, "read %d", i)
	}
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := s.Read(); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "allocations a Read once resolved")
}

// TestSelfFollowsMove: a write to a limit file is read from the kept plan,
// a move of this process to another cgroup is noticed (/proc/self/cgroup
// changed), and so is the move back, after which the other cgroup is gone.
func TestSelfFollowsMove(t *testing.T) {
	home := selfOrSkip(t)
	g := cgrouptest.New(t, 1<<30)
	if g.Version != home.Version {
		t.Skipf("the test cgroup is v%d, this process's v%d", g.Version, home.Version)
	}
	limitFile := filepath.Join(g.Dir, "memory.limit_in_bytes")
	if g.Version == 2 {
		limitFile = filepath.Join(g.Dir, "memory.max")
	}
	move := func(dir string) {
		t.Helper()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644))
	}
	var s cgroupfs.Self
	got, err := s.Read()
	require.NoError(t, err)
	require.Equal(t, home, got)

	move(g.Dir)
	t.Cleanup(func() { move(home.Dir) })
	got, err = s.Read()
	require.NoError(t, err)
	assert.Equal(t, g.Dir, got.Dir, "the move is followed")
	assert.Equal(t, int64(1<<30), got.Max)
	assert.Equal(t, limitFile, got.MaxFile)

	require.NoError(t, os.WriteFile(limitFile, []byte(strconv.Itoa(512<<20)), 0o644))
	got, err = s.Read()
	require.NoError(t, err)
	assert.Equal(t, int64(512<<20), got.Max, "a new limit is read")
	of, err := cgroupfs.Of(0)
	require.NoError(t, err)
	assert.Equal(t, of, got)

	move(home.Dir)
	got, err = s.Read()
	require.NoError(t, err)
	assert.Equal(t, home, got, "the move back is followed")
}

// TestSelfMemoryStat: Self reads memory.stat and memory.kmem.usage_in_bytes
// as ParseMemoryStat and ParseKmemUsage do, again through the kept files
// without allocating, and reports an absent file as fs.ErrNotExist.
func TestSelfMemoryStat(t *testing.T) {
	dir := t.TempDir()
	stat := filepath.Join(dir, "memory.stat")
	require.NoError(t, os.WriteFile(stat, []byte("rss 4096\ncache 8192\n"), 0o644))
	var s cgroupfs.Self
	defer s.Reset()
	_, err := s.KmemUsage(dir)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "memory.kmem.usage_in_bytes"), []byte("12\n"), 0o644))
	st, file, err := s.MemoryStat(dir)
	require.NoError(t, err)
	assert.Equal(t, stat, file)
	assert.Equal(t, int64(4096), st.Anon)
	k, err := s.KmemUsage(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(12), k)
	allocs := testing.AllocsPerRun(20, func() {
		_, _, _ = s.MemoryStat(dir)
		_, _ = s.KmemUsage(dir)
	})
	assert.Zero(t, allocs)
	_, _, err = s.MemoryStat(filepath.Join(dir, "gone"))
	assert.ErrorIs(t, err, fs.ErrNotExist)
}
