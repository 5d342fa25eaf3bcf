// Package childtest re-runs a test binary as a child process, so that tests
// can observe process-wide effects (a prctl flag, GOMEMLIMIT, RSS) in a
// process of their own and read them back from the outside.
//
// A test package calls Main from its TestMain with the children it defines;
// a test starts one with Command and reads its "KEY=VALUE" report lines with
// Report.
package childtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// EnvVar names the child to run; it is set only in child processes.
const EnvVar = "MEMCTL_TEST_CHILD"

// Main runs the child named by EnvVar and exits, or, in the parent, runs the
// tests. Call it from TestMain. An unknown child name exits with status 2.
func Main(m *testing.M, children map[string]func()) {
	if name := os.Getenv(EnvVar); name != "" {
		f, ok := children[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "childtest: unknown child %q\n", name)
			os.Exit(2)
		}
		f()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Command returns a command that re-runs the current test binary as the child
// name, with the environment that Env gives.
func Command(t testing.TB, name string, unset []string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("childtest: %v", err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = Env(name, unset, env...)
	return cmd
}

// Env returns the environment for the child name: the parent's less unset,
// plus env ("KEY=VALUE", winning). Unless GORACE is set, a race-enabled
// child is told not to sleep at exit.
func Env(name string, unset []string, env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == EnvVar || slices.Contains(unset, k) {
			continue
		}
		out = append(out, kv)
	}
	out = append(out, EnvVar+"="+name)
	if _, ok := os.LookupEnv("GORACE"); !ok {
		// A race-enabled child otherwise sleeps 1 s at exit.
		out = append(out, "GORACE=atexit_sleep_ms=0")
	}
	return append(out, env...)
}

// Report runs cmd, fails the test if it exits with an error, and returns
// the "KEY=VALUE" lines it printed on standard output (other lines are
// ignored). Standard error is included in the failure message.
func Report(t testing.TB, cmd *exec.Cmd) map[string]string {
	t.Helper()
	return Reports(t, cmd)[0]
}

// Reports runs cmds at the same time, as Report runs one, and waits for
// all before it fails the test for any.
func Reports(t testing.TB, cmds ...*exec.Cmd) []map[string]string {
	t.Helper()
	outs := make([][2]bytes.Buffer, len(cmds))
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		cmd.Stdout, cmd.Stderr = &outs[i][0], &outs[i][1]
		errs[i] = cmd.Start()
	}
	reps := make([]map[string]string, len(cmds))
	failed := false
	for i, cmd := range cmds {
		if errs[i] == nil {
			errs[i] = cmd.Wait()
		}
		reps[i] = ParseReport(outs[i][0].Bytes())
		if errs[i] != nil {
			t.Errorf("child %v: %v\nstdout:\n%s\nstderr:\n%s", cmd.Args, errs[i], outs[i][0].String(), outs[i][1].String())
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
	return reps
}

// ParseReport returns the "KEY=VALUE" lines of out as a map; a later line
// wins over an earlier one with the same key.
func ParseReport(out []byte) map[string]string {
	m := make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && k != "" && !strings.ContainsAny(k, " \t") {
			m[k] = v
		}
	}
	return m
}

// Say prints one "KEY=VALUE" report line on standard output; for children.
func Say(key string, value any) {
	fmt.Printf("%s=%v\n", key, value)
}

// Fail prints msg on standard error and exits with status 1; for children.
func Fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "child: "+format+"\n", args...)
	os.Exit(1)
}

// RequireInt returns the report's key as an int64, or fails the test
// saying which key was missing or malformed, with the whole report.
func RequireInt(t testing.TB, rep map[string]string, key string) int64 {
	t.Helper()
	return require(t, rep, key, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
}

// RequireFloat is RequireInt for a float64.
func RequireFloat(t testing.TB, rep map[string]string, key string) float64 {
	t.Helper()
	return require(t, rep, key, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
}

func require[T any](t testing.TB, rep map[string]string, key string, parse func(string) (T, error)) T {
	t.Helper()
	v, ok := rep[key]
	if !ok {
		t.Fatalf("childtest: the child did not report %s; its report: %v", key, rep)
	}
	n, err := parse(v)
	if err != nil {
		t.Fatalf("childtest: the child reported %s=%q, not a number; its report: %v", key, v, rep)
	}
	return n
}
