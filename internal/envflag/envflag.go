// Package envflag is the one grammar of memctl's switches: every MEMCTL_*
// environment variable (and AUTOMEMLIMIT's "off") is read through it.
//
//   - Surrounding space is ignored; an empty value means unset (as the Go
//     runtime reads an empty GOMEMLIMIT).
//   - Switch words, any case. Off: "off", "no", "0", "f", "false". On:
//     "on", "yes", "1", "t", "true".
//   - "off" means the variable's part does nothing; "on" means it runs with
//     its default.
//   - Duration, Count and Ratio take the switch words too (off gives 0, on
//     the default). For a count, "0" and "1" are counts; for a ratio, "1"
//     is the ratio 1.
//   - An invalid value gives an *Error (matching ErrInvalid); the caller
//     switches its part off, logs the error at WARN and returns it.
package envflag

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid is matched (errors.Is) by every *Error.
var ErrInvalid = errors.New("invalid value")

// Error is an invalid value of a variable: NAME="value": want WANT.
type Error struct {
	Name  string // the variable, e.g. "MEMCTL_TRIM_DELAY"
	Value string // the value as read
	Want  string // what the variable accepts, in words
}

func (e *Error) Error() string { return fmt.Sprintf("%s=%q: want %s", e.Name, e.Value, e.Want) }

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Lookup returns the named environment variable with surrounding space
// removed; ok is false when it is unset or empty after trimming.
func Lookup(name string) (v string, ok bool) {
	v = strings.TrimSpace(os.Getenv(name))
	return v, v != ""
}

// Switch reports whether v is a switch word (ok) and its meaning (on).
func Switch(v string) (on, ok bool) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on", "yes", "1", "t", "true":
		return true, true
	case "off", "no", "0", "f", "false":
		return false, true
	}
	return false, false
}

// IsOff reports whether v is one of the off words.
func IsOff(v string) bool {
	on, ok := Switch(v)
	return ok && !on
}

// IsOn reports whether v is one of the on words.
func IsOn(v string) bool {
	on, ok := Switch(v)
	return ok && on
}

// Bool parses a plain switch (for example MEMCTL). Anything but a switch
// word is an *Error.
func Bool(name, v string) (bool, error) {
	on, ok := Switch(v)
	if !ok {
		return false, &Error{Name: name, Value: v, Want: `"on" or "off" (or yes/no, true/false, 1/0)`}
	}
	return on, nil
}

// onOff returns def for an on word and the zero value for an off word; ok
// is false for anything else.
func onOff[T any](v string, def T) (x T, ok bool) {
	on, ok := Switch(v)
	if on {
		x = def
	}
	return x, ok
}

// Duration parses a duration switch: off (or "0s") gives 0, on gives def,
// else a time.ParseDuration string of at least min. Anything else is an
// *Error and d is 0.
func Duration(name, v string, def, min time.Duration) (d time.Duration, err error) {
	if d, ok := onOff(v, def); ok {
		return d, nil
	}
	d, perr := time.ParseDuration(strings.TrimSpace(v))
	if perr == nil && d == 0 {
		return 0, nil
	}
	if perr != nil || d < min {
		return 0, &Error{Name: name, Value: v, Want: fmt.Sprintf(`"off" or a duration of at least %v such as %q`, min, def.String())}
	}
	return d, nil
}

// Count parses a count switch: a decimal count >= 0 (0 is off), off gives
// 0, on gives def. Anything else is an *Error and n is 0.
func Count(name, v string, def int) (n int, err error) {
	t := strings.TrimSpace(v)
	if n, perr := strconv.Atoi(t); perr == nil { // "0" and "1" are counts
		if n >= 0 {
			return n, nil
		}
	} else if n, ok := onOff(t, def); ok {
		return n, nil
	}
	return 0, &Error{Name: name, Value: v, Want: fmt.Sprintf(`"off" or a count >= 0 such as "%d"`, def)}
}

// Ratio parses a ratio switch (for example AUTOMEMLIMIT): a decimal in
// (0, 1], off (or "0") gives 0, on gives def. Anything else, NaN included,
// is an *Error and r is 0.
func Ratio(name, v string, def float64) (r float64, err error) {
	t := strings.TrimSpace(v)
	// Decimal only: ParseFloat would also take "NaN", "Inf", "0x1p-1" and "1_0".
	decimal := t != "" && strings.Trim(t, "0123456789.eE+-") == ""
	if f, perr := strconv.ParseFloat(t, 64); perr == nil && decimal {
		// "1e-400" rounds to 0 but is not "off".
		mantissa, _, _ := strings.Cut(strings.ToLower(t), "e")
		switch {
		case f == 0 && !strings.ContainsAny(mantissa, "123456789"):
			return 0, nil
		case f > 0 && f <= 1:
			return f, nil
		}
	} else if r, ok := onOff(t, def); ok {
		return r, nil
	}
	return 0, &Error{Name: name, Value: v, Want: fmt.Sprintf(`"off" or a ratio in (0, 1] such as "%g"`, def)}
}

// Known is every MEMCTL_* variable memctl reads; a new one must be added
// here, or Unknown reports it.
var Known = []string{
	"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_AUTOBURST", "MEMCTL_ARENA_MAX",
	"MEMCTL_REFRESH", "MEMCTL_GOMEMLIMIT_FLOOR", "MEMCTL_KEEP_GOMEMLIMIT", "MEMCTL_MEMORY_LIMIT", "MEMCTL_PRESSURE", "MEMCTL_BUDGETS",
}

// Unrecognized is a MEMCTL_* variable that memctl does not read, and the
// known variable whose name is closest to it.
type Unrecognized struct {
	Name    string // as set, e.g. "MEMCTL_BUDGET"
	Closest string // e.g. "MEMCTL_BUDGETS"
}

// Unknown returns the variables of environ (os.Environ's form) whose name
// starts with "MEMCTL" and that are neither Known nor test or benchmark
// variables (MEMCTL_TEST_*, MEMCTL_BENCH_*), each once, in environ's order,
// with the Known name closest to it (edit distance ignoring case; the first
// on a tie).
func Unknown(environ []string) []Unrecognized {
	var out []Unrecognized
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(strings.ToUpper(name), "MEMCTL") || slices.Contains(Known, name) ||
			strings.HasPrefix(name, "MEMCTL_TEST_") || strings.HasPrefix(name, "MEMCTL_BENCH_") ||
			slices.ContainsFunc(out, func(u Unrecognized) bool { return u.Name == name }) {
			continue
		}
		best, bestD := "", 1<<30
		for _, k := range Known {
			if d := distance(strings.ToUpper(name), k); d < bestD {
				best, bestD = k, d
			}
		}
		out = append(out, Unrecognized{Name: name, Closest: best})
	}
	return out
}

// distance is the optimal-string-alignment edit distance, in bytes.
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
