package main

import (
	"bytes"
	"fmt"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/cpuquota"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAbortRemovesCgroups aborts a child that sits in its memory cgroup
// and in a CPU-quota cgroup beside the busy loop, as load-contended's
// child does during its window: abort removes both cgroups, and a second
// abort finds nothing left to do.
func TestAbortRemovesCgroups(t *testing.T) {
	cpuquota.SkipUnlessAvailable(t)
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no writable memory cgroup: %v", err)
	}
	removeLeftCgroups(t)
	exe := filepath.Join(t.TempDir(), "child")
	require.NoError(t, os.WriteFile(exe, []byte("#!/bin/sh\nexec sleep 300\n"), 0o755))
	cg, err := parent.NewChild(fmt.Sprintf("memctl-bench%s-%d-abort-test-0", tagSuffix(), os.Getpid()), 64<<20)
	require.NoError(t, err)
	pr, err := startProc(exe, "abort/test", params{}, cg)
	require.NoError(t, err)
	require.NoError(t, pr.enterQuota(fmt.Sprintf("memctl-bench-cpu%s-%d-abort-test", tagSuffix(), os.Getpid()), 10000, 100000))
	g := pr.quota
	busy := g.BusyPid()
	b, err := os.ReadFile(filepath.Join(g.Dir, "cgroup.procs"))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{strconv.Itoa(pr.pid), strconv.Itoa(busy)}, strings.Fields(string(b)), "the child and the busy loop share the quota")

	require.NoError(t, pr.abort())
	for _, dir := range []string{cg.Dir, g.Dir} {
		_, err := os.Stat(dir)
		assert.ErrorIs(t, err, os.ErrNotExist, "%s is removed", dir)
	}
	_, err = os.Stat("/proc/" + strconv.Itoa(busy))
	assert.ErrorIs(t, err, os.ErrNotExist, "the busy loop is gone")
	assert.Nil(t, pr.cg)
	assert.Nil(t, pr.quota)
	assert.NoError(t, pr.abort(), "a second abort has nothing left to do")
	require.Error(t, pr.enterQuota(fmt.Sprintf("memctl-bench-cpu%s-%d-abort-test-2", tagSuffix(), os.Getpid()), 10000, 100000), "no quota cgroup after abort")
	assert.Nil(t, pr.quota)
}

// TestInterruptRemovesCgroups runs the harness (this test binary as `go
// run ./bench -quick -scenarios http -svg off`) and sends it SIGTERM while its first
// arm runs in its cgroup: it exits with status 130, the arm is gone and no
// cgroup of the harness is left.
func TestInterruptRemovesCgroups(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the harness")
	}
	parent, err := cgrouptest.WritableParent()
	if err != nil {
		t.Skipf("no writable memory cgroup: %v", err)
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), cliEnv+"=-quick -scenarios http -svg off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	harness := cmd.Process.Pid
	mem := filepath.Join(parent.Dir, fmt.Sprintf("memctl-bench%s-%d-*", tagSuffix(), harness))
	cpu := filepath.Join(cpuquota.Root, fmt.Sprintf("memctl-bench-cpu%s-%d-*", tagSuffix(), harness))
	left := func() []string {
		a, _ := filepath.Glob(mem)
		b, _ := filepath.Glob(cpu)
		return append(a, b...)
	}
	t.Cleanup(func() { // failing or not
		_ = cmd.Process.Kill()
		for _, dir := range left() {
			assert.NoError(t, removeCgroup(dir))
		}
	})
	var arm []string
	require.Eventually(t, func() bool { // a bound on a hang
		for _, dir := range left() {
			if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
				arm = strings.Fields(string(b))
			}
		}
		return len(arm) > 0
	}, 2*time.Minute, 10*time.Millisecond, "an arm running in its cgroup; the harness said:\n%s", &out)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err = <-waited:
	case <-time.After(2 * time.Minute): // a bound on a hang
		t.Fatalf("the harness did not exit within 2 minutes of SIGTERM:\n%s", &out)
	}
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", &out)
	assert.Equal(t, 130, exit.ExitCode(), "%s", &out)
	t.Logf("the harness said:\n%s", &out)
	assert.Empty(t, left(), "the harness removed its cgroups:\n%s", &out)
	for _, pid := range arm {
		_, err := os.Stat("/proc/" + pid)
		assert.ErrorIs(t, err, os.ErrNotExist, "the arm %s is gone", pid)
	}
}
