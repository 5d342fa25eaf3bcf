package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/thpflag"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
)

// envThen names the child the test binary runs as after "memctl exec"
// replaced itself with it: the memctl child moves it to childtest.EnvVar.
const envThen = "MEMCTL_TEST_THEN"

// The test binary is memctl itself when childtest.EnvVar is "memctl", so
// the tests run the real command without building it.
func TestMain(m *testing.M) {
	if os.Getenv(childtest.EnvVar) == "" {
		// The THP flag is inherited across fork and execve: start the
		// children with a clear flag whatever this process inherited.
		// Tests that need a clear flag check it (requireTHPFlag).
		if err := thpflag.Set(thpflag.Enabled); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			fmt.Fprintln(os.Stderr, "TestMain:", err)
		}
	}
	childtest.Main(m, map[string]func(){
		"memctl":  memctlChild,
		"hold":    holdChild,
		"report":  reportChild,
		"service": serviceChild,
		"forge":   forgeChild,
		"chroot":  chrootChild,
		// Issue 22's hostile targets (status_attack_linux_test.go).
		"republish": republishChild,
		"rewrite":   rewriteChild,
		"fds":       fdsChild,
		"pidreuse":  pidReuseChild,
		// Issue 27 item 9's target (status_smaps_test.go).
		"stall": stallChild,
	})
}

// memctlChild runs memctl with the test binary's arguments.
func memctlChild() {
	os.Unsetenv(childtest.EnvVar)
	if then, ok := os.LookupEnv(envThen); ok {
		os.Unsetenv(envThen)
		os.Setenv(childtest.EnvVar, then)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// holdMiB is how much the hold child allocates and touches.
const holdMiB = 64

// holdChild allocates and touches holdMiB MiB, says PID and READY, and waits
// until its standard input is closed.
func holdChild() {
	b := make([]byte, holdMiB<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	childtest.Say("PID", os.Getpid())
	childtest.Say("READY", 1)
	_, _ = io.ReadAll(os.Stdin)
	runtime.KeepAlive(b)
}

// reportChild says its THP state and the GOMEMLIMIT the Go runtime uses.
func reportChild() {
	s, err := thp.Process()
	if err != nil {
		childtest.Say("THP_ERROR", err)
	}
	childtest.Say("STATE", int(s))
	childtest.Say("MEMORY_LIMIT", debug.SetMemoryLimit(-1))
}

// operatorVars are left out of the children's environment unless a test
// sets them, so that an operator's settings on the test machine do not
// change what the tests see.
var operatorVars = []string{"GOMEMLIMIT", "AUTOMEMLIMIT", "GLIBC_TUNABLES", "MALLOC_ARENA_MAX", "GOGC", "MEMCTL", "MEMCTL_THP", "MEMCTL_ARENA_MAX", envThen}

// memctl returns a command that runs memctl with args, with env
// ("KEY=VALUE") added to the cleaned environment. It is killed when the
// test ends.
func memctl(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = childtest.Env("memctl", operatorVars, env...)
	return cmd
}

// result runs cmd and returns its output and exit status (-1 when killed
// by a signal).
func result(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	t.Logf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", cmd.Args, code, o.String(), e.String())
	return o.String(), e.String(), code
}

// runIn runs memctl in this process (only for paths that do not exec).
func runIn(args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return o.String(), e.String(), code
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		out, err   string // substrings of stdout and stderr
		noOut      bool
		stderrNone bool
	}{
		{args: nil, code: 2, err: "usage:", noOut: true},
		{args: []string{"bogus"}, code: 2, err: `memctl: unknown command "bogus"`, noOut: true},
		{args: []string{"-h"}, code: 0, out: "memctl exec", stderrNone: true},
		{args: []string{"help"}, code: 0, out: "memctl status", stderrNone: true},
		{args: []string{"status", "-h"}, code: 0, out: "-json", stderrNone: true},
		{args: []string{"exec", "-h"}, code: 0, out: "-arena-max", stderrNone: true},
		{args: []string{"exec", "--help"}, code: 0, out: "-thp", stderrNone: true},
		{args: []string{"exec"}, code: 2, err: "no PROGRAM", noOut: true},
		{args: []string{"exec", "--"}, code: 2, err: "no PROGRAM", noOut: true},
		{args: []string{"exec", "-thp=off", "true"}, code: 2, err: `thp: unknown policy "off"`, noOut: true},
		{args: []string{"exec", "-ratio=1.5", "true"}, code: 2, err: "-ratio 1.5: want a ratio in (0, 1]", noOut: true},
		{args: []string{"exec", "-ratio=0", "true"}, code: 2, err: "-ratio 0", noOut: true},
		{args: []string{"exec", "-ratio=NaN", "true"}, code: 2, err: "-ratio NaN", noOut: true},
		{args: []string{"exec", "-arena-max=-1", "true"}, code: 2, err: "-arena-max -1", noOut: true},
		{args: []string{"exec", "-nosuchflag", "true"}, code: 2, err: "flag provided but not defined: -nosuchflag", noOut: true},
		{args: []string{"status", "-pid=-3"}, code: 2, err: "-pid -3: want a process ID", noOut: true},
		{args: []string{"status", "-pid=abc"}, code: 2, err: `invalid value "abc" for flag -pid`, noOut: true},
		{args: []string{"status", "extra"}, code: 2, err: `unexpected argument "extra"`, noOut: true},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := runIn(tc.args...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, out, tc.out)
			assert.Contains(t, errOut, tc.err)
			if tc.noOut {
				assert.Empty(t, out)
			}
			if tc.stderrNone {
				assert.Empty(t, errOut)
			}
			if tc.code == 2 {
				assert.Regexp(t, `usage:\s+memctl`, errOut, "a usage error prints the usage")
			}
		})
	}
}

// TestUsageExitStatus checks the exit statuses of the real process.
func TestUsageExitStatus(t *testing.T) {
	_, errOut, code := result(t, memctl(t, nil))
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "usage:")
	_, _, code = result(t, memctl(t, nil, "frobnicate"))
	assert.Equal(t, 2, code)
	out, _, code := result(t, memctl(t, nil, "-h"))
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "usage:")
}

func TestArenaMaxEnv(t *testing.T) {
	env, note := arenaMaxEnv([]string{"A=1"}, 2)
	assert.Equal(t, []string{"A=1", "GLIBC_TUNABLES=glibc.malloc.arena_max=2"}, env)
	assert.Equal(t, "GLIBC_TUNABLES=glibc.malloc.arena_max=2", note)

	env, _ = arenaMaxEnv([]string{"GLIBC_TUNABLES=glibc.malloc.check=0:glibc.malloc.tcache_count=0", "B=2"}, 4)
	assert.Equal(t, []string{"GLIBC_TUNABLES=glibc.malloc.check=0:glibc.malloc.tcache_count=0:glibc.malloc.arena_max=4", "B=2"}, env,
		"appended after what is there")

	env, _ = arenaMaxEnv([]string{"GLIBC_TUNABLES="}, 4)
	assert.Equal(t, []string{"GLIBC_TUNABLES=glibc.malloc.arena_max=4"}, env)

	in := []string{"GLIBC_TUNABLES=glibc.malloc.arena_max=8:glibc.malloc.check=0"}
	env, note = arenaMaxEnv(in, 2)
	assert.Equal(t, in, env, "the operator's arena_max is kept")
	assert.Contains(t, note, "left as it is")

	// Empty is unset, for glibc and for arenamax.Operator.
	env, _ = arenaMaxEnv([]string{"MALLOC_ARENA_MAX="}, 2)
	assert.Equal(t, []string{"MALLOC_ARENA_MAX=", "GLIBC_TUNABLES=glibc.malloc.arena_max=2"}, env)
	env, _ = arenaMaxEnv([]string{"GLIBC_TUNABLES=glibc.malloc.arena_max="}, 2)
	assert.Equal(t, []string{"GLIBC_TUNABLES=glibc.malloc.arena_max=:glibc.malloc.arena_max=2"}, env, "an empty arena_max is no cap")
	// glibc matches tunable names exactly: " glibc.malloc.arena_max" is
	// another name, and glibc runs with no cap (arenamax.Operator).
	env, _ = arenaMaxEnv([]string{"GLIBC_TUNABLES= glibc.malloc.arena_max=3"}, 2)
	assert.Equal(t, []string{"GLIBC_TUNABLES= glibc.malloc.arena_max=3:glibc.malloc.arena_max=2"}, env, "the same rule as arenamax.Operator")

	in = []string{"MALLOC_ARENA_MAX=1", "GLIBC_TUNABLES=glibc.malloc.check=0"}
	env, note = arenaMaxEnv(in, 2)
	assert.Equal(t, in, env, "MALLOC_ARENA_MAX is kept and nothing is added")
	assert.Contains(t, note, "MALLOC_ARENA_MAX=1")

	// A similar name is not arena_max.
	env, _ = arenaMaxEnv([]string{"GLIBC_TUNABLES=glibc.malloc.arena_max_x=1"}, 2)
	assert.Equal(t, []string{"GLIBC_TUNABLES=glibc.malloc.arena_max_x=1:glibc.malloc.arena_max=2"}, env)
}

func TestSetEnv(t *testing.T) {
	in := []string{"A=1", "K=old", "B=2", "K=dup", "KK=3"}
	out := setEnv(in, "K", "new")
	assert.Equal(t, []string{"A=1", "K=new", "B=2", "KK=3"}, out, "the first replaced, duplicates dropped")
	assert.Equal(t, "K=old", in[1], "the input is not modified")
	assert.Equal(t, []string{"A=1", "Z=9"}, setEnv([]string{"A=1"}, "Z", "9"))
	v, ok := lookupEnv(in, "K")
	assert.True(t, ok)
	assert.Equal(t, "old", v, "the first wins, as getenv")
	_, ok = lookupEnv(in, "k")
	assert.False(t, ok)
}

func TestGoMemLimitEnv(t *testing.T) {
	cg := limits.MemLimit{GoMemLimit: 241591910, MemoryLimit: 256 << 20, Ratio: 0.9, Source: limits.SourceCgroupV2, Reason: "default ratio 0.9 of the cgroup v2 limit"}
	env, note := goMemLimitEnv([]string{"A=1"}, cg)
	assert.Equal(t, []string{"A=1", "GOMEMLIMIT=241591910"}, env)
	assert.Equal(t, "GOMEMLIMIT=241591910 (default ratio 0.9 of the cgroup v2 limit of 268435456 bytes)", note)

	env, _ = goMemLimitEnv([]string{"GOMEMLIMIT=", "A=1"}, cg)
	assert.Equal(t, []string{"GOMEMLIMIT=241591910", "A=1"}, env, "an empty GOMEMLIMIT is unset")

	in := []string{"GOMEMLIMIT=100MiB"}
	env, note = goMemLimitEnv(in, cg)
	assert.Equal(t, in, env, "the operator's GOMEMLIMIT is kept")
	assert.Contains(t, note, "left as set")

	for _, ml := range []limits.MemLimit{
		{GoMemLimit: math.MaxInt64, Source: limits.SourceNone, Reason: "no cgroup memory limit"},
		{GoMemLimit: math.MaxInt64, Source: limits.SourceEnv, Reason: "AUTOMEMLIMIT=off is set in the environment"},
	} {
		env, note = goMemLimitEnv([]string{"A=1"}, ml)
		assert.Equal(t, []string{"A=1"}, env)
		assert.Contains(t, note, "not set ("+ml.Reason)
	}
}

func TestSize(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	assert.Equal(t, "unknown", logattr.Size(nil))
	assert.Equal(t, "0 bytes", logattr.Size(n(0)))
	assert.Equal(t, "1023 bytes", logattr.Size(n(1023)))
	assert.Equal(t, "1024 bytes (1.0 KiB)", logattr.Size(n(1024)))
	assert.Equal(t, "268435456 bytes (256.0 MiB)", logattr.Size(n(256<<20)))
	assert.Equal(t, "9223372036854775807 bytes (8.0 EiB)", logattr.Size(n(math.MaxInt64)))
}

func TestMemoryVar(t *testing.T) {
	for _, k := range []string{"GOMEMLIMIT", "GOGC", "GODEBUG", "AUTOMEMLIMIT", "MEMCTL", "MEMCTL_THP", "MALLOC_ARENA_MAX", "MALLOC_CONF", "MIMALLOC_PURGE_DELAY", "GLIBC_TUNABLES"} {
		assert.True(t, memoryVar(k), k)
	}
	for _, k := range []string{"PATH", "HOME", "GOMAXPROCS", "GOROOT", "gogc", "XMALLOC"} {
		assert.False(t, memoryVar(k), k)
	}
}

func TestExecEnvDefaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		flags    []string // flags given on the command line
		thp      thp.Policy
		thpFrom  string
		thpEnv   bool
		arenaMax int
		off      bool
		warn     []string // substrings, one per warning, in order
	}{
		{name: "none", thp: thp.PolicyDisable, thpFrom: "-thp=disable"},
		{name: "MEMCTL_THP", env: map[string]string{"MEMCTL_THP": "keep"}, thp: thp.PolicyKeep, thpFrom: "MEMCTL_THP=keep", thpEnv: true},
		{name: "MEMCTL_THP any case", env: map[string]string{"MEMCTL_THP": "Except-Advised"}, thp: thp.PolicyExceptAdvised, thpFrom: "MEMCTL_THP=Except-Advised", thpEnv: true},
		{name: "flag wins", env: map[string]string{"MEMCTL_THP": "keep", "MEMCTL_ARENA_MAX": "4"}, flags: []string{"thp", "arena-max"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable"},
		{name: "flag wins over a bad value", env: map[string]string{"MEMCTL_THP": "bogus", "MEMCTL_ARENA_MAX": "many"}, flags: []string{"thp", "arena-max"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable"},
		{name: "empty is unset", env: map[string]string{"MEMCTL_THP": "", "MEMCTL_ARENA_MAX": "", "MEMCTL": ""}, thp: thp.PolicyDisable, thpFrom: "-thp=disable"},
		{name: "bad MEMCTL_THP", env: map[string]string{"MEMCTL_THP": "sometimes"}, thp: thp.PolicyKeep, thpFrom: "MEMCTL_THP invalid: left as inherited",
			warn: []string{`memctl: warning: MEMCTL_THP="sometimes": thp: unknown policy "sometimes"`}},
		{name: "MEMCTL_ARENA_MAX", env: map[string]string{"MEMCTL_ARENA_MAX": "3"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable", arenaMax: 3},
		{name: "MEMCTL_ARENA_MAX off", env: map[string]string{"MEMCTL_ARENA_MAX": "OFF"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable"},
		{name: "MEMCTL_ARENA_MAX 0", env: map[string]string{"MEMCTL_ARENA_MAX": "0"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable"},
		{name: "bad MEMCTL_ARENA_MAX", env: map[string]string{"MEMCTL_ARENA_MAX": "-2"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable",
			warn: []string{`memctl: warning: MEMCTL_ARENA_MAX="-2": want "off" or a count of arenas`}},
		{name: "MEMCTL=off", env: map[string]string{"MEMCTL": "off", "MEMCTL_THP": "bogus"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable", off: true},
		{name: "MEMCTL=OFF", env: map[string]string{"MEMCTL": "OFF"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable", off: true},
		{name: "MEMCTL=Off", env: map[string]string{"MEMCTL": "Off"}, thp: thp.PolicyDisable, thpFrom: "-thp=disable", off: true},
		{name: "unknown MEMCTL", env: map[string]string{"MEMCTL": "of", "MEMCTL_THP": "keep"}, thp: thp.PolicyKeep, thpFrom: "MEMCTL_THP=keep", thpEnv: true,
			warn: []string{`memctl: warning: MEMCTL="of" is not "off": memctl applies its settings`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := execConfig{thp: thp.PolicyDisable}
			warns := cfg.applyEnv(func(k string) string { return tc.env[k] }, func(name string) bool { return slices.Contains(tc.flags, name) })
			assert.Equal(t, tc.thp, cfg.thp)
			assert.Equal(t, tc.thpFrom, cfg.thpFrom)
			assert.Equal(t, tc.thpEnv, cfg.thpEnv)
			assert.Equal(t, tc.arenaMax, cfg.arenaMax)
			assert.Equal(t, tc.off, cfg.off)
			require.Len(t, warns, len(tc.warn), "%q", warns)
			for i, w := range tc.warn {
				assert.Contains(t, warns[i], w)
			}
		})
	}
}
