package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/safefs"
)

// rootCgroup2 returns a mount point of a cgroup2 hierarchy's root (its
// mountinfo root is "/") from this process's mountinfo, "" when none.
func rootCgroup2(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, postf := strings.Fields(pre), strings.Fields(post)
		if ok && len(fields) >= 5 && len(postf) >= 1 && postf[0] == "cgroup2" && fields[3] == "/" {
			return fields[4]
		}
	}
	return ""
}

// Issue 32: `memctl status -pid` exited 3 for a process in the cgroup v2
// root cgroup: it read a memory.events that the kernel makes for no root
// cgroup, and called the field unknown. The fixture is a real cgroup2
// root directory (this host's, wherever one is mounted): memory.events is
// absent there, which is a note, not an unknown field.
func TestStatusV2RootCgroupEventsAbsent(t *testing.T) {
	mnt := rootCgroup2(t)
	if mnt == "" {
		t.Skip("no cgroup2 hierarchy's root is mounted here")
	}
	if _, err := os.Stat(mnt + "/memory.events"); err == nil {
		t.Skipf("%s/memory.events exists: not a root cgroup as the kernel makes it", mnt)
	}
	pid := os.Getpid()
	proc, err := safefs.OpenDir(fmt.Sprintf("/proc/%d", pid), safefs.NoSymlinks)
	require.NoError(t, err)
	defer proc.Close()
	l := cgroupfs.Limit{Version: 2, Cgroup: "/", Dir: proc.Name() + "/root" + mnt, Bytes: cgroupfs.NoLimit}
	st := &statusReport{PID: pid, Unknown: map[string]string{}, Cgroup: &memCgroup{Version: 2, Path: "/", Dir: l.Dir, View: "process"}}
	readCgroupEvents(proc, l, cgroupfs.ViewProcess, st)
	assert.Empty(t, st.Unknown, "absent is not unknown (exit status 0)")
	assert.Nil(t, st.MemoryEvents)
	assert.Contains(t, st.MemoryEventsNote, "the root cgroup has none")
	assert.Contains(t, st.MemoryEventsNote, `"`+l.Dir+`/memory.events"`)

	var out strings.Builder
	writeTable(&out, st)
	assert.Regexp(t, `(?m)^memory\.events +absent: no ".*/memory\.events": the root cgroup has none`, out.String())
	b, err := json.Marshal(st)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"memory_events_note":"no `)
	assert.NotContains(t, string(b), `"memory_events":`)

	// An absent file elsewhere is a note too, naming the controller.
	st = &statusReport{PID: pid, Unknown: map[string]string{}}
	l.Dir = proc.Name() + "/root" + mnt + "/memctl-no-such-cgroup-" + strconv.Itoa(pid)
	l.Cgroup = "/memctl-no-such-cgroup"
	readCgroupEvents(proc, l, cgroupfs.ViewProcess, st)
	assert.Empty(t, st.Unknown)
	assert.Contains(t, st.MemoryEventsNote, "the memory controller is not enabled")

	// Any other error stays unknown: a memory.events outside a cgroup
	// file system.
	tmp := t.TempDir()
	require.NoError(t, os.WriteFile(tmp+"/memory.events", []byte("oom_kill 0\n"), 0o600))
	st = &statusReport{PID: pid, Unknown: map[string]string{}}
	l.Dir, l.Cgroup = proc.Name()+"/root"+tmp, "/x"
	readCgroupEvents(proc, l, cgroupfs.ViewProcess, st)
	assert.Contains(t, st.Unknown["memory_events"], "file system refused")
	assert.Empty(t, st.MemoryEventsNote)
}

// TestV2StatusRootCgroup: memctl status -pid on a process in the root
// cgroup of a real cgroup v2 hierarchy exits 0 and shows what the root
// does not have as absent: no memory limit, no memory.events, no swap
// files.
func TestV2StatusRootCgroup(t *testing.T) {
	dir := cgrouptest.RequireV2(t)
	mnt := rootCgroup2(t)
	if mnt == "" || !strings.HasPrefix(dir, mnt) {
		t.Skipf("no cgroup2 root mount holds %s", dir)
	}
	root, err := os.Open(mnt)
	require.NoError(t, err)
	defer root.Close()
	sl := exec.Command("sleep", "120")
	sl.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(root.Fd())}
	require.NoError(t, sl.Start())
	t.Cleanup(func() { _ = sl.Process.Kill(); _ = sl.Wait() })
	pid := strconv.Itoa(sl.Process.Pid)
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile("/proc/" + pid + "/cgroup")
		return strings.Contains(string(b), "0::/\n")
	}, 10*time.Second, 20*time.Millisecond, "the process is in the root cgroup")

	out, errOut, code := result(t, memctl(t, nil, "status", "-json", "-pid", pid))
	require.Equal(t, exitOK, code, "stderr: %s\nstdout: %s", errOut, out)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.NotNil(t, st.Cgroup, st.CgroupError)
	assert.Equal(t, 2, st.Cgroup.Version)
	assert.Equal(t, "/", st.Cgroup.Path)
	assert.Nil(t, st.Cgroup.LimitBytes, "the root cgroup has no memory.max")
	assert.Empty(t, st.Unknown)
	assert.Nil(t, st.MemoryEvents)
	assert.Contains(t, st.MemoryEventsNote, "the root cgroup has none")

	table, errOut, code := result(t, memctl(t, nil, "status", "-pid", pid))
	require.Equal(t, exitOK, code, "stderr: %s\nstdout: %s", errOut, table)
	assert.Regexp(t, `(?m)^memory limit +none$`, table)
	assert.Regexp(t, `(?m)^memory\.events +absent: no ".*/memory\.events": the root cgroup has none`, table)
	assert.NotContains(t, table, "unknown:")
	t.Logf("status of a process in the root cgroup:\n%s", table)
}
