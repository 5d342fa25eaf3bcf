package childtest

import (
	"strconv"
	"testing"
)

// RequireInt returns the report's key as an int64, or fails the test
// saying which key was missing or malformed, with the whole report.
func RequireInt(t testing.TB, rep map[string]string, key string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(require(t, rep, key), 10, 64)
	if err != nil {
		t.Fatalf("childtest: the child reported %s=%q, not an integer; its report: %v", key, rep[key], rep)
	}
	return n
}

// RequireFloat is RequireInt for a float64.
func RequireFloat(t testing.TB, rep map[string]string, key string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(require(t, rep, key), 64)
	if err != nil {
		t.Fatalf("childtest: the child reported %s=%q, not a number; its report: %v", key, rep[key], rep)
	}
	return f
}

// require returns the report's key, or fails the test.
func require(t testing.TB, rep map[string]string, key string) string {
	t.Helper()
	v, ok := rep[key]
	if !ok {
		t.Fatalf("childtest: the child did not report %s; its report: %v", key, rep)
	}
	return v
}
