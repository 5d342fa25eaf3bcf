package main

import (
	"os"
	"strings"
	"testing"
)

// TestMain runs a child arm when the harness re-executes the test binary as
// its scenario binary (the smoke test does), the harness itself with
// cliEnv, and the tests otherwise.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec))
	}
	if args, ok := os.LookupEnv(cliEnv); ok {
		os.Exit(cli(strings.Fields(args), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// cliEnv, set to the arguments, makes the test binary the harness's
// command (as `go run ./bench ARGS`). The harness does not pass it to the
// arms (it passes no MEMCTL_ variable).
const cliEnv = "MEMCTL_BENCH_TEST_CLI"
