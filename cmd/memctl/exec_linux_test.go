package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/thp"
)

// requireTHPFlag skips unless /proc/self/status shows THP_enabled (Linux
// 5.0) and this process's flag is clear, as TestMain leaves it.
func requireTHPFlag(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	if !strings.Contains(string(b), "THP_enabled:") {
		t.Skip("no THP_enabled in /proc/self/status (Linux before 5.0)")
	}
	s, err := thp.Process()
	require.NoError(t, err)
	require.Equal(t, thp.StateEnabled, s, "TestMain clears the inherited flag")
}

func TestExecTHP(t *testing.T) {
	requireTHPFlag(t)
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, "THP_enabled:\t0"},
		{[]string{"-thp=disable"}, "THP_enabled:\t0"},
		{[]string{"-thp=keep"}, "THP_enabled:\t1"},
	} {
		t.Run(strings.Join(append([]string{"default"}, tc.flags...), " "), func(t *testing.T) {
			args := append(append([]string{"exec"}, tc.flags...), "--", "/bin/cat", "/proc/self/status")
			out, errOut, code := result(t, memctl(t, nil, args...))
			require.Equal(t, 0, code)
			assert.Contains(t, out, tc.want+"\n")
			assert.Empty(t, errOut, "without -v exec prints nothing")
		})
	}
}

func TestExecTHPExceptAdvised(t *testing.T) {
	requireTHPFlag(t)
	out, errOut, code := result(t, memctl(t, []string{envThen + "=report"}, "exec", "-thp=except-advised", "--", exe(t)))
	if code == 1 && strings.Contains(errOut, "use -thp=disable on this kernel") {
		t.Skipf("kernel without PR_THP_DISABLE_EXCEPT_ADVISED: %s", errOut)
	}
	require.Equal(t, 0, code)
	r := childtest.ParseReport([]byte(out))
	assert.Equal(t, strconv.Itoa(int(thp.StateDisabledExceptAdvised)), r["STATE"], "PR_GET_THP_DISABLE in the program")
}

func TestExecVerbose(t *testing.T) {
	requireTHPFlag(t)
	_, errOut, code := result(t, memctl(t, []string{"GLIBC_TUNABLES=glibc.malloc.check=0"}, "exec", "-v", "-arena-max=2", "--", "true"))
	require.Equal(t, 0, code)
	assert.Contains(t, errOut, "memctl: THP disabled (-thp=disable)\n")
	assert.Contains(t, errOut, "memctl: GOMEMLIMIT")
	assert.Contains(t, errOut, "memctl: GLIBC_TUNABLES=glibc.malloc.check=0:glibc.malloc.arena_max=2\n")
	assert.Regexp(t, `memctl: exec /\S+/true\n$`, errOut)
}

func TestExecMemctlOff(t *testing.T) {
	requireTHPFlag(t)
	out, _, code := result(t, memctl(t, []string{"MEMCTL=off", "GLIBC_TUNABLES=x=1"}, "exec", "-arena-max=2", "--", "/bin/sh", "-c", `grep THP_enabled /proc/self/status; echo "GT=$GLIBC_TUNABLES"`))
	require.Equal(t, 0, code)
	assert.Contains(t, out, "THP_enabled:\t1\n", "MEMCTL=off: the flag is left as inherited")
	assert.Contains(t, out, "GT=x=1\n")
}

func TestExecExitStatusSignalsPID(t *testing.T) {
	_, _, code := result(t, memctl(t, nil, "exec", "--", "sh", "-c", "exit 7"))
	assert.Equal(t, 7, code, "the program's exit status")

	cmd := memctl(t, nil, "exec", "--", "sh", "-c", "kill -TERM $$")
	_, _, code = result(t, cmd)
	assert.Equal(t, -1, code)
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	assert.True(t, ws.Signaled(), "killed by its own signal, not an exit status from memctl")
	assert.Equal(t, syscall.SIGTERM, ws.Signal())

	cmd = memctl(t, nil, "exec", "--", "sh", "-c", "echo $$")
	out, _, code := result(t, cmd)
	require.Equal(t, 0, code)
	assert.Equal(t, strconv.Itoa(cmd.Process.Pid), strings.TrimSpace(out), "the program has memctl's PID")

	// The program's own arguments, flags included, reach it unchanged.
	out, _, code = result(t, memctl(t, nil, "exec", "printf", "%s|", "-v", "--", "a b"))
	require.Equal(t, 0, code)
	assert.Equal(t, "-v|--|a b|", out)
}

func TestExecProgramNotRunnable(t *testing.T) {
	_, errOut, code := result(t, memctl(t, nil, "exec", "--", "memctl-no-such-program"))
	assert.Equal(t, 127, code)
	assert.Contains(t, errOut, `memctl: exec: "memctl-no-such-program": executable file not found`)

	_, errOut, code = result(t, memctl(t, nil, "exec", "--", "/nonexistent/prog"))
	assert.Equal(t, 127, code)
	assert.Contains(t, errOut, "/nonexistent/prog")

	f := t.TempDir() + "/notexec"
	require.NoError(t, os.WriteFile(f, []byte("data"), 0o644))
	_, errOut, code = result(t, memctl(t, nil, "exec", "--", f))
	assert.Equal(t, 126, code)
	assert.Contains(t, errOut, f)

	// Found, but execve fails with ENOENT: the interpreter is missing.
	s := t.TempDir() + "/script"
	require.NoError(t, os.WriteFile(s, []byte("#!/nonexistent/interpreter\n"), 0o755))
	_, errOut, code = result(t, memctl(t, nil, "exec", "--", s))
	assert.Equal(t, 127, code)
	assert.Contains(t, errOut, "memctl: exec "+s+": no such file or directory")
}

// envLines returns the KEY=VALUE lines of env(1) output for key.
func envLines(out, key string) []string {
	var vs []string
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && k == key {
			vs = append(vs, v)
		}
	}
	return vs
}

// TestExecGOMEMLIMITInCgroup runs memctl in a real child cgroup with a
// 256 MiB limit.
func TestExecGOMEMLIMITInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	inGroup := func(env []string, args ...string) (string, string, int) {
		cmd := memctl(t, env, args...)
		g.Wrap(cmd)
		return result(t, cmd)
	}
	t.Run("derived", func(t *testing.T) {
		out, errOut, code := inGroup([]string{"GLIBC_TUNABLES=glibc.malloc.check=0"}, "exec", "-v", "-arena-max=2", "--", "/usr/bin/env")
		require.Equal(t, 0, code)
		assert.Contains(t, errOut, "memctl: GOMEMLIMIT=241591910 (default ratio 0.9 of the cgroup v"+strconv.Itoa(g.Version)+" limit from "+g.Dir+"/memory.")
		assert.Equal(t, []string{"241591910"}, envLines(out, "GOMEMLIMIT"), "0.9 of 256 MiB, in bytes")
		assert.Equal(t, []string{"glibc.malloc.check=0:glibc.malloc.arena_max=2"}, envLines(out, "GLIBC_TUNABLES"))
	})
	t.Run("ratio", func(t *testing.T) {
		out, _, code := inGroup(nil, "exec", "-ratio=0.5", "--", "/usr/bin/env")
		require.Equal(t, 0, code)
		assert.Equal(t, []string{"134217728"}, envLines(out, "GOMEMLIMIT"))
		assert.Empty(t, envLines(out, "GLIBC_TUNABLES"), "no -arena-max: no tunable")
	})
	t.Run("operator GOMEMLIMIT", func(t *testing.T) {
		out, _, code := inGroup([]string{"GOMEMLIMIT=100MiB"}, "exec", "--", "/usr/bin/env")
		require.Equal(t, 0, code)
		assert.Equal(t, []string{"100MiB"}, envLines(out, "GOMEMLIMIT"), "left untouched")
	})
	t.Run("AUTOMEMLIMIT=off", func(t *testing.T) {
		out, _, code := inGroup([]string{"AUTOMEMLIMIT=off"}, "exec", "--", "/usr/bin/env")
		require.Equal(t, 0, code)
		assert.Empty(t, envLines(out, "GOMEMLIMIT"))
	})
	t.Run("AUTOMEMLIMIT ratio wins", func(t *testing.T) {
		out, _, code := inGroup([]string{"AUTOMEMLIMIT=0.25"}, "exec", "-ratio=0.5", "--", "/usr/bin/env")
		require.Equal(t, 0, code)
		assert.Equal(t, []string{"67108864"}, envLines(out, "GOMEMLIMIT"))
	})
	t.Run("bad AUTOMEMLIMIT", func(t *testing.T) {
		out, errOut, code := inGroup([]string{"AUTOMEMLIMIT=lots"}, "exec", "--", "/usr/bin/env")
		require.Equal(t, 0, code, "a typo does not stop the program")
		assert.Contains(t, errOut, `memctl: warning: GOMEMLIMIT not set: limits: AUTOMEMLIMIT="lots"`)
		assert.Empty(t, envLines(out, "GOMEMLIMIT"))
	})
	t.Run("empty GOMEMLIMIT and AUTOMEMLIMIT", func(t *testing.T) {
		out, errOut, code := inGroup([]string{"GOMEMLIMIT=", "AUTOMEMLIMIT="}, "exec", "--", "/usr/bin/env")
		require.Equal(t, 0, code)
		assert.Empty(t, errOut)
		assert.Equal(t, []string{"241591910"}, envLines(out, "GOMEMLIMIT"), "empty is unset, as for the Go runtime")
	})
	t.Run("MALLOC_ARENA_MAX", func(t *testing.T) {
		out, _, code := inGroup([]string{"MALLOC_ARENA_MAX=4"}, "exec", "-arena-max=2", "--", "/usr/bin/env")
		require.Equal(t, 0, code)
		assert.Empty(t, envLines(out, "GLIBC_TUNABLES"), "the operator capped arenas already")
		assert.Equal(t, []string{"4"}, envLines(out, "MALLOC_ARENA_MAX"))
	})
	t.Run("Go program", func(t *testing.T) {
		// The Go runtime of the program takes the value as its memory limit.
		out, _, code := inGroup([]string{envThen + "=report"}, "exec", "--", exe(t))
		require.Equal(t, 0, code)
		r := childtest.ParseReport([]byte(out))
		assert.Equal(t, "241591910", r["MEMORY_LIMIT"], "debug.SetMemoryLimit(-1) in the program")
		assert.Equal(t, strconv.Itoa(int(thp.StateDisabled)), r["STATE"])
	})
}

// TestExecNoCgroupLimit runs memctl where this test runs: without a cgroup
// memory limit GOMEMLIMIT stays unset.
func TestExecNoCgroupLimit(t *testing.T) {
	l, err := cgroupfs.Of(0)
	if err != nil || l.Bytes != cgroupfs.NoLimit {
		t.Skipf("this process has a memory limit or none can be read (%+v, %v)", l, err)
	}
	out, _, code := result(t, memctl(t, nil, "exec", "--", "/usr/bin/env"))
	require.Equal(t, 0, code)
	assert.Empty(t, envLines(out, "GOMEMLIMIT"))
}

func exe(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	require.NoError(t, err)
	return p
}

// TestExecEnvironmentDefaults: MEMCTL_THP and MEMCTL_ARENA_MAX are the
// defaults of -thp and -arena-max, read back in the program.
func TestExecEnvironmentDefaults(t *testing.T) {
	requireTHPFlag(t)
	show := []string{"--", "/bin/sh", "-c", `grep THP_enabled /proc/self/status; echo "GT=$GLIBC_TUNABLES"`}
	for _, tc := range []struct {
		env   []string
		flags []string
		thp   string
		gt    string
		warn  string // on stderr; "" for none
	}{
		{nil, nil, "0", "", ""},
		{[]string{"MEMCTL_THP=keep"}, nil, "1", "", ""},
		{[]string{"MEMCTL_THP=KEEP", "MEMCTL_ARENA_MAX=3"}, nil, "1", "glibc.malloc.arena_max=3", ""},
		{[]string{"MEMCTL_THP=keep", "MEMCTL_ARENA_MAX=3"}, []string{"-thp=disable", "-arena-max=2"}, "0", "glibc.malloc.arena_max=2", ""},
		{[]string{"MEMCTL_THP=", "MEMCTL_ARENA_MAX="}, nil, "0", "", ""},
		{[]string{"MEMCTL_ARENA_MAX=off"}, nil, "0", "", ""},
		// A typo does not stop the program: that part is left off.
		{[]string{"MEMCTL_THP=disabled"}, nil, "1", "", `memctl: warning: MEMCTL_THP="disabled"`},
		{[]string{"MEMCTL_ARENA_MAX=two"}, nil, "0", "", `memctl: warning: MEMCTL_ARENA_MAX="two"`},
		// MEMCTL=off in any case; another value is a warning.
		{[]string{"MEMCTL=OFF", "MEMCTL_ARENA_MAX=3"}, nil, "1", "", ""},
		{[]string{"MEMCTL=Off"}, []string{"-arena-max=2"}, "1", "", ""},
		{[]string{"MEMCTL=on", "MEMCTL_ARENA_MAX=3"}, nil, "0", "glibc.malloc.arena_max=3", `memctl: warning: MEMCTL="on" is not "off"`},
		// An empty MALLOC_ARENA_MAX is unset.
		{[]string{"MALLOC_ARENA_MAX="}, []string{"-arena-max=2"}, "0", "glibc.malloc.arena_max=2", ""},
	} {
		t.Run(strings.Join(append(tc.env, tc.flags...), " "), func(t *testing.T) {
			args := append(append([]string{"exec"}, tc.flags...), show...)
			out, errOut, code := result(t, memctl(t, tc.env, args...))
			require.Equal(t, 0, code)
			assert.Contains(t, out, "THP_enabled:\t"+tc.thp+"\n")
			assert.Contains(t, out, "GT="+tc.gt+"\n")
			if tc.warn == "" {
				assert.Empty(t, errOut)
			} else {
				assert.Contains(t, errOut, tc.warn)
			}
		})
	}
}

// TestExecBadAUTOMEMLIMITRuns: a bad AUTOMEMLIMIT is a warning; the program
// still runs, without GOMEMLIMIT from memctl.
func TestExecBadAUTOMEMLIMITRuns(t *testing.T) {
	out, errOut, code := result(t, memctl(t, []string{"AUTOMEMLIMIT=bogus"}, "exec", "--", "/usr/bin/env"))
	require.Equal(t, 0, code)
	assert.Contains(t, errOut, `memctl: warning: GOMEMLIMIT not set: limits: AUTOMEMLIMIT="bogus"`)
	assert.Empty(t, envLines(out, "GOMEMLIMIT"))
	assert.Equal(t, []string{"bogus"}, envLines(out, "AUTOMEMLIMIT"), "the program's environment is left as it is")
}

// TestStatusTHPExceptAdvised: THP_enabled is 1 both for a clear flag and
// for "disabled except advised"; status says so for another process, and
// tells them apart for itself with PR_GET_THP_DISABLE.
func TestStatusTHPExceptAdvised(t *testing.T) {
	requireTHPFlag(t)
	out, errOut, code := result(t, memctl(t, []string{envThen + "=memctl"}, "exec", "-thp=except-advised", "--", exe(t), "status"))
	if code == 1 && strings.Contains(errOut, "use -thp=disable on this kernel") {
		t.Skipf("kernel without PR_THP_DISABLE_EXCEPT_ADVISED: %s", errOut)
	}
	require.Equal(t, 0, code)
	assert.Regexp(t, `(?m)^THP_enabled +1 \(disabled except advised: prctl PR_THP_DISABLE_EXCEPT_ADVISED\)$`, out)

	out, _, code = result(t, memctl(t, nil, "status"))
	require.Equal(t, 0, code)
	assert.Regexp(t, `(?m)^THP_enabled +1 \(enabled: follows the system mode\)$`, out)

	pid := startHold(t, nil, "MEMCTL_THP=except-advised")
	out, _, code = result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(pid)))
	require.Equal(t, 0, code)
	assert.Regexp(t, `(?m)^THP_enabled +1 \(enabled, or disabled except advised: /proc cannot tell them apart\)$`, out)
}
