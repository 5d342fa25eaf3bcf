package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
)

// startHold starts "memctl exec -- <test binary>" as the hold child (wrapped
// by wrap when not nil) with env added, waits until it has allocated, and
// returns its PID. The child exits when the test ends.
func startHold(t *testing.T, wrap func(*exec.Cmd), env ...string) int {
	t.Helper()
	cmd := memctl(t, append(env, envThen+"=hold"), "exec", "--", exe(t))
	if wrap != nil {
		wrap(cmd)
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("hold child: %v", err)
		}
	})
	lines := make(chan map[string]string, 1)
	go func() {
		r := map[string]string{}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			for k, v := range childtest.ParseReport([]byte(sc.Text())) {
				r[k] = v
			}
			if r["READY"] != "" {
				break
			}
		}
		lines <- r
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case r := <-lines:
		require.NotEmpty(t, r["READY"], "hold child report: %v", r)
		pid := int(childtest.RequireInt(t, r, "PID"))
		require.Equal(t, cmd.Process.Pid, pid, "memctl exec kept the PID")
		return pid
	case <-time.After(30 * time.Second):
		t.Fatal("hold child did not get ready in 30 s")
	}
	return 0
}

// statusJSON runs "memctl status -json -pid pid" and decodes its output.
func statusJSON(t *testing.T, pid int) (statusReport, map[string]any) {
	t.Helper()
	out, _, code := result(t, memctl(t, nil, "status", "-json", "-pid", strconv.Itoa(pid)))
	require.Equal(t, 0, code)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	return st, raw
}

// checkAgainstProc checks what status reported for pid against the /proc
// files of pid read here, around the status run.
func checkAgainstProc(t *testing.T, pid int, st statusReport, before procfs.Fields) {
	t.Helper()
	after, err := procfs.ReadFile(procfs.StatusPath(pid))
	require.NoError(t, err)
	assert.Equal(t, pid, st.PID)

	rss0, err := before.Bytes("VmRSS")
	require.NoError(t, err)
	rss1, err := after.Bytes("VmRSS")
	require.NoError(t, err)
	require.NotNil(t, st.VmRSSBytes)
	t.Logf("VmRSS before %d, status %d, after %d", rss0, *st.VmRSSBytes, rss1)
	// The child is idle, so its RSS moves only by what the runtime does in
	// the background: allow 2 MiB around the two readings.
	const slack = 2 << 20
	assert.GreaterOrEqual(t, *st.VmRSSBytes, min(rss0, rss1)-slack)
	assert.LessOrEqual(t, *st.VmRSSBytes, max(rss0, rss1)+slack)
	assert.Greater(t, *st.VmRSSBytes, int64(holdMiB<<20), "the child touched %d MiB", holdMiB)
	hwm, err := after.Bytes("VmHWM")
	require.NoError(t, err)
	require.NotNil(t, st.VmHWMBytes)
	assert.InDelta(t, hwm, *st.VmHWMBytes, slack)
	assert.GreaterOrEqual(t, *st.VmHWMBytes, *st.VmRSSBytes)

	thpEnabled, err := after.Int("THP_enabled")
	require.NoError(t, err)
	require.NotNil(t, st.THPEnabled)
	assert.Equal(t, thpEnabled, *st.THPEnabled)
	assert.Equal(t, int64(0), *st.THPEnabled, "memctl exec disabled THP for the child")

	ahp, err := procfs.AnonHugePages(pid)
	require.NoError(t, err)
	require.NotNil(t, st.AnonHugePagesBytes)
	assert.Equal(t, ahp, *st.AnonHugePagesBytes)

	sys, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage" + "/enabled")
	if err == nil {
		require.NotNil(t, st.THPSystem)
		assert.Contains(t, string(sys), "["+st.THPSystem.Enabled+"]")
	}

	// The environment the child started with, read here from the same file.
	b, err := os.ReadFile(procfs.Path(pid, "environ"))
	require.NoError(t, err)
	want, seen := map[string]string{}, map[string]bool{}
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok && memoryVar(k) && !seen[k] {
			seen[k] = true // the first wins
			if utf8.ValidString(kv) {
				want[k] = v
			}
		}
	}
	assert.Equal(t, want, st.Env)
}

func TestStatusOfChild(t *testing.T) {
	requireTHPFlag(t)
	pid := startHold(t, nil, "GOGC=50", "GODEBUG=madvdontneed=1", "MALLOC_ARENA_MAX=3")
	before, err := procfs.ReadFile(procfs.StatusPath(pid))
	require.NoError(t, err)
	st, raw := statusJSON(t, pid)
	checkAgainstProc(t, pid, st, before)
	assert.Equal(t, "50", st.Env["GOGC"])
	assert.Equal(t, "madvdontneed=1", st.Env["GODEBUG"])
	assert.Equal(t, "3", st.Env["MALLOC_ARENA_MAX"])
	assert.Equal(t, "hold", st.Env["MEMCTL_TEST_CHILD"], "MEMCTL* variables are shown")

	// The cgroup path is the one in the child's /proc/PID/cgroup.
	cg, err := os.ReadFile(procfs.Path(pid, "cgroup"))
	require.NoError(t, err)
	require.NotNil(t, st.Cgroup)
	assert.Contains(t, string(cg), ":"+st.Cgroup.Path+"\n")

	// The documented keys, sizes as JSON numbers.
	for _, k := range []string{"pid", "thp_system", "thp_enabled", "anon_huge_pages_bytes", "vm_rss_bytes", "vm_hwm_bytes", "cgroup", "env"} {
		assert.Contains(t, raw, k)
	}
	assert.IsType(t, float64(0), raw["vm_rss_bytes"])
	if sys, ok := raw["thp_system"].(map[string]any); ok {
		for _, k := range []string{"enabled", "pmd_enabled", "defrag", "pmd_size_bytes", "max_ptes_none"} {
			assert.Contains(t, sys, k)
		}
	}
	c := raw["cgroup"].(map[string]any)
	for _, k := range []string{"version", "path", "dir", "limit_bytes", "limit_file"} {
		assert.Contains(t, c, k)
	}

	// The table shows the same process.
	out, _, code := result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(pid)))
	require.Equal(t, 0, code)
	assert.Regexp(t, `(?m)^pid +`+strconv.Itoa(pid)+`$`, out)
	assert.Regexp(t, `(?m)^THP_enabled +0 \(`, out)
	assert.Regexp(t, `(?m)^VmRSS +\d+ bytes \(\d+\.\d MiB\)$`, out)
	assert.Regexp(t, `(?m)^env +"GODEBUG=madvdontneed=1"$`, out)
	assert.Regexp(t, `(?m)^ +"GOGC=50"$`, out)
}

func TestStatusOfChildInCgroup(t *testing.T) {
	requireTHPFlag(t)
	g := cgrouptest.New(t, 256<<20)
	pid := startHold(t, g.Wrap, "GOGC=50")
	before, err := procfs.ReadFile(procfs.StatusPath(pid))
	require.NoError(t, err)
	st, _ := statusJSON(t, pid)
	checkAgainstProc(t, pid, st, before)
	assert.Equal(t, "241591910", st.Env["GOMEMLIMIT"], "set by memctl exec from the cgroup limit")
	require.NotNil(t, st.Cgroup)
	assert.Equal(t, g.Version, st.Cgroup.Version)
	assert.Equal(t, g.Dir, st.Cgroup.Dir)
	require.NotNil(t, st.Cgroup.LimitBytes)
	assert.Equal(t, int64(256<<20), *st.Cgroup.LimitBytes)
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	require.NotNil(t, st.Cgroup.LimitFile)
	assert.Equal(t, filepath.Join(g.Dir, file), *st.Cgroup.LimitFile)

	out, _, code := result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(pid)))
	require.Equal(t, 0, code)
	assert.Contains(t, out, "268435456 bytes (256.0 MiB) from "+strconv.Quote(filepath.Join(g.Dir, file))+"\n")
}

func TestStatusNoSuchProcess(t *testing.T) {
	// No PID is above pid_max.
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	require.NoError(t, err)
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	pid := strconv.Itoa(max + 1)
	for _, args := range [][]string{{"status", "-pid", pid}, {"status", "-json", "-pid", pid}} {
		out, errOut, code := result(t, memctl(t, nil, args...))
		assert.Equal(t, 1, code)
		assert.Empty(t, out)
		assert.Equal(t, "memctl: process "+pid+" does not exist (no /proc/"+pid+")\n", errOut)
	}
}

func TestStatusSelf(t *testing.T) {
	cmd := memctl(t, []string{"GOGC=77"}, "status", "-json")
	out, _, code := result(t, cmd)
	require.Equal(t, 0, code)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	assert.Equal(t, cmd.Process.Pid, st.PID, "without -pid: memctl itself")
	assert.Equal(t, "77", st.Env["GOGC"])
	require.NotNil(t, st.VmRSSBytes)
	assert.Positive(t, *st.VmRSSBytes)
}

// TestStatusZombie shows a process that has exited but was not waited for:
// it has no memory, no environment and no mountinfo, and status says so
// instead of failing.
func TestStatusZombie(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "exit 0")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Wait() })
	pid := cmd.Process.Pid
	require.Eventually(t, func() bool {
		f, err := procfs.ReadFile(procfs.StatusPath(pid))
		if err != nil {
			return false
		}
		s, _ := f.String("State")
		return strings.HasPrefix(s, "Z")
	}, 10*time.Second, 10*time.Millisecond, "pid %d becomes a zombie", pid)
	st, _ := statusJSON(t, pid)
	assert.Equal(t, pid, st.PID)
	assert.Nil(t, st.VmRSSBytes)
	assert.Nil(t, st.AnonHugePagesBytes)
	assert.Empty(t, st.Env)
	out, _, code := result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(pid)))
	require.Equal(t, 0, code)
	assert.Contains(t, out, "none (a kernel thread or a zombie)")
}

// TestStatusUnprintableEnv: a process's environment is the process's to
// choose, and a C1 control character (U+009B is CSI, the start of an
// escape sequence, like ESC [) or an invalid UTF-8 byte must not reach the
// terminal as it is. The table quotes such values; JSON keeps valid UTF-8
// as it is and carries the rest, unchanged, in base64.
func TestStatusUnprintableEnv(t *testing.T) {
	env := []string{
		"MALLOC_Y=\u009b31m",      // valid UTF-8, C1 control
		"MALLOC_W=\x9b31m",        // the byte 0x9b: CSI to an 8-bit terminal, not UTF-8
		"GOGC=\x1b[31m50",         // C0 control
		"MALLOC_Z=\xff",           // not UTF-8
		"MIMALLOC_\xfe=1",         // the name not UTF-8
		"MEMCTL_NOTE=héllo wörld", // printable: as it is
	}
	out, _, code := result(t, memctl(t, env, "status"))
	require.Equal(t, 0, code)
	assert.NotContains(t, out, "\x1b", "no ESC reaches the terminal")
	assert.NotContains(t, out, "\u009b", "no CSI reaches the terminal")
	assert.NotContains(t, out, "\xff")
	assert.NotContains(t, out, "\x9b")
	assert.NotContains(t, out, "\xfe")
	assert.True(t, utf8.ValidString(out), "the table is valid UTF-8")
	assert.Contains(t, out, `"MALLOC_Y=\u009b31m"`+"\n")
	assert.Contains(t, out, `"GOGC=\x1b[31m50"`+"\n")
	assert.Contains(t, out, `"MALLOC_Z=\xff"`+"\n")
	assert.Contains(t, out, `"MALLOC_W=\x9b31m"`+"\n")
	assert.Contains(t, out, `"MIMALLOC_\xfe=1"`+"\n")
	assert.Contains(t, out, `"MEMCTL_NOTE=héllo wörld"`+"\n")

	cmd := memctl(t, env, "status", "-json")
	js, _, code := result(t, cmd)
	require.Equal(t, 0, code)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(js), &st))
	assert.NotContains(t, js, "\u009b", "no raw CSI in the JSON text")
	assert.Contains(t, js, `"MALLOC_Y": "\u009b31m"`, "escaped as JSON")
	assert.Equal(t, "\u009b31m", st.Env["MALLOC_Y"], "valid UTF-8 as it is")
	assert.Equal(t, "\x1b[31m50", st.Env["GOGC"])
	assert.Equal(t, "héllo wörld", st.Env["MEMCTL_NOTE"])
	assert.NotContains(t, st.Env, "MALLOC_Z")
	for k, v := range st.Env {
		assert.NotContains(t, k+v, "\ufffd", "nothing replaced by U+FFFD")
	}
	var got []string
	for _, b := range st.EnvBase64 {
		kv, err := base64.StdEncoding.DecodeString(b)
		require.NoError(t, err)
		got = append(got, string(kv))
	}
	assert.Equal(t, []string{"MALLOC_W=\x9b31m", "MALLOC_Z=\xff", "MIMALLOC_\xfe=1"}, got, "the entries, byte for byte, sorted by their base64")
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(js), &raw))
	assert.Equal(t, []any{"TUFMTE9DX1c9mzMxbQ==", "TUFMTE9DX1o9/w==", "TUlNQUxMT0Nf/j0x"}, raw["env_base64"])

	// Without such variables the key is left out.
	js, _, code = result(t, memctl(t, []string{"GOGC=50"}, "status", "-json"))
	require.Equal(t, 0, code)
	raw = nil
	require.NoError(t, json.Unmarshal([]byte(js), &raw))
	assert.NotContains(t, raw, "env_base64")
}

// TestStatusHugeEnv: a process whose environment is as large as execve(2)
// lets it be (about 5.8 MB under ulimit -s unlimited: argv and envp get up
// to 6 MiB) shows its memory variables; with a 4 MiB cap its env was
// "unknown" and the exit status 3, so a process could hide its GOMEMLIMIT
// from the operator by padding its environment.
func TestStatusHugeEnv(t *testing.T) {
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_STACK, &old))
	if old.Max != unix.RLIM_INFINITY {
		t.Skipf("cannot raise RLIMIT_STACK to unlimited (max %d)", old.Max)
	}
	big := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: old.Max}
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_STACK, &big))
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_STACK, &old) })
	pad := strings.Repeat("a", 125000) // under MAX_ARG_STRLEN, 128 KiB
	env := []string{"MEMCTL_NOTE=after the padding"}
	for i := range 46 {
		env = append(env, fmt.Sprintf("PAD%02d=%s", i, pad))
	}
	out, errOut, code := result(t, memctl(t, env, "status"))
	require.Equal(t, 0, code, "%s", errOut)
	assert.Contains(t, out, `"MEMCTL_NOTE=after the padding"`)
	b, err := os.ReadFile("/proc/self/environ")
	require.NoError(t, err)
	assert.Less(t, len(b), 1<<20, "the padding is the child's only")
}
