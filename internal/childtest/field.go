package childtest

import (
	"strconv"
	"testing"
)

// RequireInt returns the report's key as an int64, or fails the test
// saying which key was missing or malformed, with the whole report.
func RequireInt(t testing.TB, rep map[string]string, key string) int64 {
	t.Helper()
	v, ok := rep[key]
	if !ok {
		t.Fatalf("childtest: the child did not report %s; its report: %v", key, rep)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("childtest: the child reported %s=%q, not an integer; its report: %v", key, v, rep)
	}
	return n
}

// RequireFloat is RequireInt for a float64.
func RequireFloat(t testing.TB, rep map[string]string, key string) float64 {
	t.Helper()
	v, ok := rep[key]
	if !ok {
		t.Fatalf("childtest: the child did not report %s; its report: %v", key, rep)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("childtest: the child reported %s=%q, not a number; its report: %v", key, v, rep)
	}
	return f
}
