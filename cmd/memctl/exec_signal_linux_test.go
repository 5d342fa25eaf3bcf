package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// underTrap changes cmd to run under "trap ” SIGS" in /bin/sh, as a
// service that systemd starts with SIGPIPE ignored or a shell script does.
func underTrap(cmd *exec.Cmd, sigs string) {
	cmd.Args = append([]string{"/bin/sh", "-c", "trap '' " + sigs + `; exec "$0" "$@"`, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
}

var sigIgnRE = regexp.MustCompile(`(?m)^SigIgn:\s+([0-9a-f]+)$`)

// sigIgn returns the SigIgn mask in /proc/PID/status output.
func sigIgn(t *testing.T, status string) uint64 {
	t.Helper()
	m := sigIgnRE.FindStringSubmatch(status)
	require.NotNil(t, m, "no SigIgn in %q", status)
	n, err := strconv.ParseUint(m[1], 16, 64)
	require.NoError(t, err)
	return n
}

func bit(s syscall.Signal) uint64 { return 1 << (s - 1) }

// TestExecKeepsIgnoredSignals is issue 9 item 4: under trap ” PIPE TERM
// HUP, the program run through memctl exec (with MEMCTL=off too) has the
// same ignored signals as run directly, read from its /proc/self/status.
func TestExecKeepsIgnoredSignals(t *testing.T) {
	_, exact := inheritedIgnored()
	direct := exec.Command("/bin/cat", "/proc/self/status")
	underTrap(direct, "PIPE TERM HUP")
	b, err := direct.Output()
	require.NoError(t, err)
	want := sigIgn(t, string(b))
	require.Equal(t, bit(syscall.SIGPIPE)|bit(syscall.SIGTERM)|bit(syscall.SIGHUP), want&(bit(syscall.SIGPIPE)|bit(syscall.SIGTERM)|bit(syscall.SIGHUP)))
	for _, env := range [][]string{nil, {"MEMCTL=off"}} {
		cmd := memctl(t, env, "exec", "-v", "--", "/bin/cat", "/proc/self/status")
		underTrap(cmd, "PIPE TERM HUP")
		out, errOut, code := result(t, cmd)
		require.Equal(t, 0, code)
		got := sigIgn(t, out)
		if !exact {
			t.Logf("built without cgo: only SIGHUP and SIGINT are kept")
			assert.Equal(t, bit(syscall.SIGHUP), got&bit(syscall.SIGHUP))
			continue
		}
		assert.Equal(t, want, got, "SigIgn %x through memctl exec %v, %x directly", got, env, want)
		assert.Contains(t, errOut, "memctl: signals ignored as inherited: SIGHUP SIGPIPE SIGTERM\n")
	}
	// Nothing ignored: nothing added.
	out, _, code := result(t, memctl(t, nil, "exec", "--", "/bin/cat", "/proc/self/status"))
	require.Equal(t, 0, code)
	assert.Zero(t, sigIgn(t, out)&(bit(syscall.SIGPIPE)|bit(syscall.SIGTERM)))
}

// TestExecWriterGetsEPIPE: with SIGPIPE ignored, a program that writes into
// a closed pipe gets EPIPE and goes on (exit 0 here), through memctl exec as
// directly; it is not killed by SIGPIPE (141 in a shell).
func TestExecWriterGetsEPIPE(t *testing.T) {
	if _, exact := inheritedIgnored(); !exact {
		t.Skip("built without cgo: memctl cannot see an inherited SIGPIPE ignore")
	}
	const script = `sleep 0.1; echo x; echo "after the write" >&2`
	run := func(cmd *exec.Cmd) (*os.ProcessState, string) {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		require.NoError(t, r.Close()) // the reader is gone
		defer w.Close()
		var errOut strings.Builder
		cmd.Stdout, cmd.Stderr = w, &errOut
		require.NoError(t, cmd.Start())
		_ = cmd.Wait()
		return cmd.ProcessState, errOut.String()
	}
	direct := exec.Command("/bin/sh", "-c", script)
	underTrap(direct, "PIPE")
	st, errOut := run(direct)
	require.Equal(t, 0, st.ExitCode(), "directly: %s", errOut)

	cmd := memctl(t, nil, "exec", "--", "/bin/sh", "-c", script)
	underTrap(cmd, "PIPE")
	st, errOut = run(cmd)
	ws := st.Sys().(syscall.WaitStatus)
	assert.False(t, ws.Signaled(), "killed by %v", ws.Signal())
	assert.Equal(t, 0, st.ExitCode())
	assert.Contains(t, errOut, "after the write")
}

// TestExecPathLikeEnv is issue 9 item 5: a program found through "." or an
// empty PATH entry runs, as with env(1); so does a file without "#!" (with
// /bin/sh, as execvp(3)).
func TestExecPathLikeEnv(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "memctl-i9-prog"), []byte("#!/bin/sh\necho ran \"$@\"\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "memctl-i9-noshebang"), []byte("echo plain\n"), 0o755))
	for _, path := range []string{".", "/nonexistent::/bin", "/bin:", ":/bin", "/bin:."} {
		for _, prog := range []string{"memctl-i9-prog", "memctl-i9-noshebang"} {
			envCmd := exec.Command("/usr/bin/env", prog, "a")
			envCmd.Dir, envCmd.Env = dir, []string{"PATH=" + path}
			want, err := envCmd.Output()
			require.NoError(t, err, "env(1) runs %s with PATH=%q", prog, path)

			cmd := memctl(t, []string{"PATH=" + path}, "exec", "--", prog, "a")
			cmd.Dir = dir
			out, errOut, code := result(t, cmd)
			assert.Equal(t, 0, code, "PATH=%q %s: %s", path, prog, errOut)
			assert.Equal(t, string(want), out, "PATH=%q %s", path, prog)
		}
	}
	// Not in PATH: 127, as env(1).
	cmd := memctl(t, []string{"PATH=/bin"}, "exec", "--", "memctl-i9-prog")
	cmd.Dir = dir
	_, errOut, code := result(t, cmd)
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, errOut, `memctl: exec: "memctl-i9-prog": executable file not found in $PATH`)
}

var sigBlkRE = regexp.MustCompile(`(?m)^SigBlk:\s+([0-9a-f]+)$`)

// allSignals lists every signal 1..64 that a shell can ignore: not SIGKILL
// and SIGSTOP, and not 32 and 33, which glibc keeps for itself.
func allSignals() string {
	var s []string
	for i := 1; i <= 64; i++ {
		if i != 9 && i != 19 && i != 32 && i != 33 {
			s = append(s, strconv.Itoa(i))
		}
	}
	return strings.Join(s, " ")
}

// TestExecKeepsEveryIgnoredSignal: every signal 1..64 that can be ignored,
// ignored by the parent, stays ignored through memctl exec, as through
// env(1). signal.Ignore alone kept none of SIGILL, SIGTRAP, SIGBUS,
// SIGSTKFLT, SIGPROF and SIGSYS, which the Go runtime keeps for itself.
func TestExecKeepsEveryIgnoredSignal(t *testing.T) {
	if _, exact := inheritedIgnored(); !exact {
		t.Skip("built without cgo: memctl cannot see inherited ignores but SIGHUP and SIGINT")
	}
	direct := exec.Command("/usr/bin/env", "/bin/cat", "/proc/self/status")
	underTrap(direct, allSignals())
	b, err := direct.Output()
	require.NoError(t, err)
	want := sigIgn(t, string(b))
	require.NotZero(t, want&bit(syscall.SIGPROF), "the shell ignored SIGPROF")
	for _, env := range [][]string{nil, {"MEMCTL=off"}} {
		cmd := memctl(t, env, "exec", "--", "/bin/cat", "/proc/self/status")
		underTrap(cmd, allSignals())
		out, errOut, code := result(t, cmd)
		require.Equal(t, 0, code, errOut)
		assert.Equal(t, want, sigIgn(t, out), "SigIgn through memctl exec %v: %x, through env(1): %x", env, sigIgn(t, out), want)
	}
}

// TestExecKeepsBlockedSignals: the signal mask memctl inherits (here
// SIGUSR1, SIGSEGV, SIGTERM, SIGCHLD, SIGURG, SIGPROF blocked by perl) is
// the program's, as through env(1); the Go runtime unblocks SIGSEGV,
// SIGCHLD, SIGURG and SIGPROF on its threads, and memctl exec passed that
// on.
func TestExecKeepsBlockedSignals(t *testing.T) {
	if _, exact := inheritedBlocked(); !exact {
		t.Skip("built without cgo: memctl cannot see the inherited signal mask")
	}
	perl, err := exec.LookPath("perl")
	if err != nil {
		t.Skip("no perl to start memctl with signals blocked (Debian: perl-base)")
	}
	underBlock := func(cmd *exec.Cmd) {
		cmd.Args = append([]string{perl, "-MPOSIX", "-e",
			`sigprocmask(SIG_BLOCK, POSIX::SigSet->new(SIGUSR1, SIGSEGV, SIGTERM, SIGCHLD, SIGURG, SIGPROF)) or die; exec @ARGV or die`,
			cmd.Path}, cmd.Args[1:]...)
		cmd.Path = perl
	}
	sigBlk := func(status string) uint64 {
		m := sigBlkRE.FindStringSubmatch(status)
		require.NotNil(t, m, "no SigBlk in %q", status)
		n, err := strconv.ParseUint(m[1], 16, 64)
		require.NoError(t, err)
		return n
	}
	direct := exec.Command("/usr/bin/env", "/bin/cat", "/proc/self/status")
	underBlock(direct)
	b, err := direct.Output()
	require.NoError(t, err)
	want := sigBlk(string(b))
	require.Equal(t, bit(syscall.SIGUSR1)|bit(syscall.SIGSEGV)|bit(syscall.SIGTERM)|bit(syscall.SIGCHLD)|bit(syscall.SIGURG)|bit(syscall.SIGPROF), want)
	for _, env := range [][]string{nil, {"MEMCTL=off"}} {
		cmd := memctl(t, env, "exec", "-v", "--", "/bin/cat", "/proc/self/status")
		underBlock(cmd)
		out, errOut, code := result(t, cmd)
		require.Equal(t, 0, code, errOut)
		assert.Equal(t, want, sigBlk(out), "SigBlk through memctl exec %v: %x, through env(1): %x", env, sigBlk(out), want)
		assert.Contains(t, errOut, "memctl: signals blocked as inherited: SIGUSR1 SIGSEGV SIGTERM SIGCHLD SIGURG SIGPROF\n")
	}
}

// TestExecPathEdgesLikeEnv: memctl exec finds (or refuses) PROGRAM as
// env(1) does, same exit status and output, for an empty name (127, was
// 126), a name over NAME_MAX (126, was 127), a PATH entry with ".." after
// a symlink (the kernel's directory, not the lexically cleaned one), a
// directory or a non-executable file named like the program.
func TestExecPathEdgesLikeEnv(t *testing.T) {
	dir := t.TempDir()
	script := func(p, out string, mode os.FileMode) {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\necho "+out+"\n"), mode))
	}
	script(filepath.Join(dir, "deep/b/prog"), "physical", 0o755)
	script(filepath.Join(dir, "b/prog"), "lexical", 0o755)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "deep/a"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(dir, "deep/a"), filepath.Join(dir, "l")))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "isdir/prog"), 0o755))
	script(filepath.Join(dir, "noexec/prog"), "noexec", 0o644)
	for _, tc := range []struct{ path, prog string }{
		{"/bin", ""},
		{"/bin", strings.Repeat("x", 256)},
		{dir + "/l/../b", "prog"}, // not filepath.Join, which cleans
		{filepath.Join(dir, "isdir"), "prog"},
		{filepath.Join(dir, "noexec"), "prog"},
		{filepath.Join(dir, "noexec") + ":" + filepath.Join(dir, "isdir"), "prog"},
		{filepath.Join(dir, "noexec") + ":/nonexistent", "prog"},
	} {
		envCmd := exec.Command("/usr/bin/env", tc.prog)
		envCmd.Env = []string{"PATH=" + tc.path}
		want, _ := envCmd.Output()
		wantCode := envCmd.ProcessState.ExitCode()

		out, errOut, code := result(t, memctl(t, []string{"PATH=" + tc.path}, "exec", "--", tc.prog))
		name := tc.prog
		if len(name) > 20 {
			name = name[:20] + "..."
		}
		assert.Equal(t, wantCode, code, "PATH=%q %q: %s", tc.path, name, errOut)
		assert.Equal(t, string(want), out, "PATH=%q %q", tc.path, name)
	}
}
