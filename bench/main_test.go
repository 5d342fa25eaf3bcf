package main

import (
	"os"
	"testing"
)

// TestMain runs a child arm when the harness re-executes the test binary as
// its scenario binary (the smoke test does), and the tests otherwise.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec))
	}
	os.Exit(m.Run())
}
