package main

import (
	"encoding/json"
	"io"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/state"
)

// chrootChild chroots into MEMCTL_TEST_CHROOT (an empty directory), publishes
// a state record there when MEMCTL_TEST_CHROOT_RECORD is set, says PID and
// READY, and waits until its standard input is closed.
func chrootChild() {
	dir := os.Getenv("MEMCTL_TEST_CHROOT")
	if err := unix.Chroot(dir); err != nil {
		childtest.Fail("chroot %s: %v", dir, err)
	}
	if err := unix.Chdir("/"); err != nil {
		childtest.Fail("chdir: %v", err)
	}
	if os.Getenv("MEMCTL_TEST_CHROOT_RECORD") != "" {
		// Published from inside the chroot, as a library there would.
		if err := state.Publish(&state.Record{CHeap: "chrooted"}); err != nil {
			childtest.Fail("Publish: %v", err)
		}
	}
	childtest.Say("PID", os.Getpid())
	childtest.Say("READY", 1)
	_, _ = io.ReadAll(os.Stdin)
}

// TestStatusChrooted is issue 22's chrooted case: a process chrooted in
// memctl's mount namespace has an empty mountinfo; its cgroup, from
// /proc/PID/cgroup, is read from memctl's own root: its limit, exit 0. The
// same holds for a chroot with a mount in it but no cgroup mount.
func TestStatusChrooted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chroot")
	}
	t.Run("empty mountinfo", func(t *testing.T) { testChrooted(t, false) })
	t.Run("a tmpfs, no cgroup mount", func(t *testing.T) { testChrooted(t, true) })
}

func testChrooted(t *testing.T, tmpfs bool) {
	g := cgrouptest.New(t, 256<<20)
	dir := t.TempDir()
	if tmpfs {
		m := dir + "/tmp"
		require.NoError(t, os.Mkdir(m, 0o755))
		require.NoError(t, unix.Mount("none", m, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"))
		t.Cleanup(func() { _ = unix.Unmount(m, unix.MNT_DETACH) })
	}
	cmd := childtest.Command(t, "chroot", operatorVars, "MEMCTL_TEST_CHROOT="+dir)
	g.Wrap(cmd)
	pid := startReady(t, cmd)["PID"]
	mi, err := os.ReadFile("/proc/" + pid + "/mountinfo")
	require.NoError(t, err)
	if tmpfs {
		require.Contains(t, string(mi), " /tmp ", "the tmpfs, as the chrooted process sees it")
		require.NotContains(t, string(mi), "cgroup")
	} else {
		require.Empty(t, mi, "a chroot with no mount under it shows no mount")
	}
	root, err := os.Readlink("/proc/" + pid + "/root")
	require.NoError(t, err)
	require.NotEqual(t, "/", root, "chrooted")

	out, _, code := result(t, memctl(t, nil, "status", "-json", "-pid", pid))
	require.Equal(t, exitOK, code)
	var doc statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Empty(t, doc.Unknown)
	require.NotNil(t, doc.Cgroup, "cgroup_error: %s", doc.CgroupError)
	assert.Equal(t, g.Dir, doc.Cgroup.Dir)
	assert.Equal(t, "memctl-root", doc.Cgroup.View)
	require.NotNil(t, doc.Cgroup.LimitBytes)
	assert.Equal(t, int64(256<<20), *doc.Cgroup.LimitBytes)

	out, _, code = result(t, memctl(t, nil, "status", "-pid", pid))
	require.Equal(t, exitOK, code)
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	assert.Contains(t, out, "268435456 bytes (256.0 MiB) from "+strconv.Quote(g.Dir+"/"+file)+"\n")
	assert.Contains(t, out, "(read from memctl's root: the process is chrooted")
}
