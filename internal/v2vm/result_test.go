package v2vm

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Result is what the guest's console said: each test's outcome, each
// package binary's exit code and the guest script's own.
type Result struct {
	// Tests maps "import/path.TestXxx" (subtests with their "/" path) to
	// "PASS", "FAIL" or "SKIP".
	Tests map[string]string
	// Top counts the top-level tests by outcome; Sub the subtests.
	Top, Sub map[string]int
	// PkgRC is each package test binary's exit code, by import path.
	PkgRC map[string]int
	// Started is true once the guest reached the suite (V2VM_START).
	Started bool
	// Exit is the guest script's exit code; -1 until it printed one.
	Exit int

	pkg string
}

// NewResult returns an empty Result ready for Line.
func NewResult() *Result {
	return &Result{Tests: map[string]string{}, Top: map[string]int{}, Sub: map[string]int{}, PkgRC: map[string]int{}, Exit: -1}
}

var testLine = regexp.MustCompile(`^(\s*)--- (PASS|FAIL|SKIP): (\S+) \(`)

// Line takes one console line. Not safe for concurrent use.
func (r *Result) Line(s string) {
	switch {
	case strings.HasPrefix(s, "V2VM_START"):
		r.Started = true
	case strings.HasPrefix(s, "V2SUITE_PKG "):
		r.pkg = strings.TrimSpace(strings.TrimPrefix(s, "V2SUITE_PKG "))
	case strings.HasPrefix(s, "V2SUITE_RC "):
		f := strings.Fields(s)
		if len(f) == 3 {
			if n, err := strconv.Atoi(f[2]); err == nil {
				r.PkgRC[f[1]] = n
			}
		}
		r.pkg = ""
	case strings.HasPrefix(s, "V2VM_EXIT="):
		f := strings.Fields(strings.TrimPrefix(s, "V2VM_EXIT="))
		if len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				r.Exit = n
			}
		}
	default:
		m := testLine.FindStringSubmatch(s)
		if m == nil {
			return
		}
		r.Tests[r.pkg+"."+m[3]] = m[2]
		if m[1] == "" {
			r.Top[m[2]]++
		} else {
			r.Sub[m[2]]++
		}
	}
}

// Failed lists what failed: tests, package binaries that exited non-zero,
// packages that never reported an exit code, and a guest that never
// finished. pkgs are the import paths that should have run.
func (r *Result) Failed(pkgs []string) []string {
	var out []string
	for name, v := range r.Tests {
		if v == "FAIL" {
			out = append(out, "test "+name)
		}
	}
	for _, p := range pkgs {
		rc, ok := r.PkgRC[p]
		switch {
		case !ok:
			out = append(out, "package "+p+": no exit code (crashed, hung or never ran)")
		case rc != 0:
			out = append(out, fmt.Sprintf("package %s: exit code %d", p, rc))
		}
	}
	if r.Exit < 0 {
		out = append(out, "guest: did not finish (no V2VM_EXIT line)")
	}
	return out
}

// Summary is one line: tests run in the guest, by outcome.
func (r *Result) Summary() string {
	run := r.Top["PASS"] + r.Top["FAIL"] + r.Top["SKIP"]
	return fmt.Sprintf("%d tests run in the guest (%d passed, %d failed, %d skipped; subtests: %d passed, %d failed, %d skipped), %d packages",
		run, r.Top["PASS"], r.Top["FAIL"], r.Top["SKIP"], r.Sub["PASS"], r.Sub["FAIL"], r.Sub["SKIP"], len(r.PkgRC))
}
