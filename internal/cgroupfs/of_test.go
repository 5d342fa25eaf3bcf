package cgroupfs_test

// These tests read real cgroups through Of. They are in the external test
// package because cgrouptest imports cgroupfs.

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
)

// TestOfSelf reads this process's real cgroup and checks the result against
// the files it names.
func TestOfSelf(t *testing.T) {
	l, err := cgroupfs.Of(0)
	if errors.Is(err, errors.ErrUnsupported) || errors.Is(err, cgroupfs.ErrNoCgroup) {
		t.Skipf("no memory cgroup here: %v", err)
	}
	require.NoError(t, err)
	t.Logf("%+v", l)
	assert.Contains(t, []int{1, 2}, l.Version)
	assert.DirExists(t, l.Dir)
	other, err := cgroupfs.Of(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, l, other, "cgroupfs.Of(own pid) reads the same as cgroupfs.Of(0)")
	if l.Bytes == cgroupfs.NoLimit {
		assert.Empty(t, l.File)
		return
	}
	assertFileHolds(t, l)
}

// TestOfChildInCgroup starts a process in a real child cgroup with a limit
// and reads that limit back through its PID.
func TestOfChildInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 64<<20)
	cmd := exec.Command("/bin/sleep", "30")
	g.Wrap(cmd)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The wrapper shell moves itself into the group, then execs sleep.
	waitInCgroup(t, g.Dir, cmd.Process.Pid)

	l, err := cgroupfs.Of(cmd.Process.Pid)
	require.NoError(t, err)
	t.Logf("%+v", l)
	assert.Equal(t, g.Version, l.Version)
	assert.Equal(t, g.Dir, l.Dir)
	assert.Equal(t, int64(64<<20), l.Bytes)
	want := "memory.limit_in_bytes"
	if g.Version == 2 {
		want = "memory.max"
	}
	assert.Equal(t, filepath.Join(g.Dir, want), l.File)
	assertFileHolds(t, l)

	_, err = cgroupfs.Of(1 << 30)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "/proc/1073741824")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestOfChildInNestedCgroup puts a process in a real cgroup whose own limit
// (128 MiB) is looser than its parent's (64 MiB): the parent's is the one
// that holds, and its file is named.
func TestOfChildInNestedCgroup(t *testing.T) {
	g := cgrouptest.New(t, 64<<20)
	inner := filepath.Join(g.Dir, "inner")
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
		require.NoError(t, os.WriteFile(filepath.Join(g.Dir, "cgroup.subtree_control"), []byte("+memory"), 0))
	}
	require.NoError(t, os.Mkdir(inner, 0o755))
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$0" && exec /bin/sleep 30`, filepath.Join(inner, "cgroup.procs"))
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		// Runs before g's cleanup removes the parent; kills what is left
		// in inner and retries while the cgroup is busy.
		assert.NoError(t, (&cgrouptest.Child{Dir: inner, Version: g.Version}).Remove())
	})
	require.NoError(t, os.WriteFile(filepath.Join(inner, file), []byte("134217728"), 0))
	require.NoError(t, cmd.Start())
	waitInCgroup(t, inner, cmd.Process.Pid)

	l, err := cgroupfs.Of(cmd.Process.Pid)
	require.NoError(t, err)
	t.Logf("%+v", l)
	assert.Equal(t, inner, l.Dir)
	assert.Equal(t, int64(64<<20), l.Bytes)
	assert.Equal(t, filepath.Join(g.Dir, file), l.File, "the parent's limit is the tighter one")
	assertFileHolds(t, l)
}

// waitInCgroup waits until pid is listed in dir/cgroup.procs.
func waitInCgroup(t *testing.T, dir string, pid int) {
	t.Helper()
	procs := filepath.Join(dir, "cgroup.procs")
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(procs)
		return err == nil && slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid))
	}, 5*time.Second, 10*time.Millisecond, "pid %d in %s", pid, procs)
}

// assertFileHolds checks that l.File holds l.Bytes.
func assertFileHolds(t *testing.T, l cgroupfs.Limit) {
	t.Helper()
	b, err := os.ReadFile(l.File)
	require.NoError(t, err)
	want := strconv.FormatInt(l.Bytes, 10)
	if filepath.Base(l.File) == "memory.stat" {
		assert.Contains(t, string(b), "hierarchical_memory_limit "+want+"\n")
		return
	}
	assert.Equal(t, want, strings.TrimSpace(string(b)))
}
