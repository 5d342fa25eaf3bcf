// Package envflag is the one grammar of memctl's switches: every MEMCTL_*
// environment variable (and AUTOMEMLIMIT's "off") is read through it, so
// that the same word means the same thing everywhere.
//
// The grammar:
//
//   - Surrounding space is ignored and an empty value means unset (as the
//     Go runtime reads an empty GOMEMLIMIT or GOGC): Lookup reports it as
//     not set, and the caller's default applies.
//   - A switch word is matched in any case. Off: "off", "no", and the
//     strconv.ParseBool false spellings "0", "f", "false". On: "on", "yes",
//     and "1", "t", "true".
//   - "off" always means that memctl's part named by the variable does
//     nothing (no trim, no arena cap, THP left as it is); "on" means the
//     part runs with its default.
//   - A variable that takes a value takes a switch word too: Duration,
//     Count and Ratio accept the off words (0 for off), the on words (the
//     default), or a time.ParseDuration string / a decimal count / a ratio
//     in (0, 1]. For a count, "0" and "1" are counts, not switch words ("0"
//     means none either way); for a ratio, "1" is the ratio 1.
//   - The one rule for an invalid value: the parse returns an *Error (which
//     matches ErrInvalid), and the caller switches its part off, logs the
//     error at WARN and returns it; it never guesses what was meant.
//
// Typical use, in a package that owns a variable:
//
//	if v, ok := envflag.Lookup("MEMCTL_TRIM_DELAY"); ok {
//		d, err := envflag.Duration("MEMCTL_TRIM_DELAY", v, trim.DefaultDelay, trim.MinDelay)
//		if err != nil { // part off, say so once
//			...
//		}
//	}
package envflag

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid is matched (errors.Is) by every *Error.
var ErrInvalid = errors.New("invalid value")

// Error is an invalid value of a variable. Its message reads
// NAME="value": want WANT, and quotes the value as given (before trimming).
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

// Switch reports whether v is a switch word: on is its meaning and ok is
// true for the on and off words listed in the package doc (any case,
// surrounding space ignored); for anything else ok is false.
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

// SwitchWords is how an *Error lists the switch words in its Want.
const SwitchWords = `"on" or "off" (or yes/no, true/false, 1/0)`

// Bool parses a plain switch (for example MEMCTL). Anything but a switch
// word is an *Error.
func Bool(name, v string) (bool, error) {
	on, ok := Switch(v)
	if !ok {
		return false, &Error{Name: name, Value: v, Want: SwitchWords}
	}
	return on, nil
}

// Duration parses a duration switch: an off word gives 0 (the part is
// off), an on word gives def, and otherwise a time.ParseDuration string of
// at least min ("2s", "500ms"; "0s" is off too). A negative duration, one
// below min, or anything else is an *Error and d is 0.
func Duration(name, v string, def, min time.Duration) (d time.Duration, err error) {
	if on, ok := Switch(v); ok {
		if on {
			return def, nil
		}
		return 0, nil
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

// Count parses a count switch: a decimal count >= 0 (0 is off), an off
// word gives 0, an on word gives def. A negative or non-numeric value is
// an *Error and n is 0.
func Count(name, v string, def int) (n int, err error) {
	t := strings.TrimSpace(v)
	if n, perr := strconv.Atoi(t); perr == nil {
		if n < 0 {
			return 0, &Error{Name: name, Value: v, Want: fmt.Sprintf(`"off" or a count >= 0 such as "%d"`, def)}
		}
		return n, nil
	}
	if on, ok := Switch(t); ok {
		if on {
			return def, nil
		}
		return 0, nil
	}
	return 0, &Error{Name: name, Value: v, Want: fmt.Sprintf(`"off" or a count >= 0 such as "%d"`, def)}
}

// Ratio parses a ratio switch (for example AUTOMEMLIMIT): a number in
// (0, 1] ("0.9", "1"), an off word gives 0 (the part is off; "0" is off
// too), an on word gives def. Anything else, including NaN, a negative
// ratio or one above 1, is an *Error and r is 0.
func Ratio(name, v string, def float64) (r float64, err error) {
	t := strings.TrimSpace(v)
	// Decimal only: ParseFloat would also take "NaN", "Inf", "0x1p-1" and "1_0".
	decimal := t != "" && strings.Trim(t, "0123456789.eE+-") == ""
	if f, perr := strconv.ParseFloat(t, 64); perr == nil && decimal {
		// A zero is off only when written as one: "1e-400" is a
		// positive ratio that ParseFloat rounds to 0, not "off".
		mantissa, _, _ := strings.Cut(strings.ToLower(t), "e")
		switch {
		case f == 0 && !strings.ContainsAny(mantissa, "123456789"):
			return 0, nil
		case f > 0 && f <= 1:
			return f, nil
		}
	} else if on, ok := Switch(t); ok {
		if on {
			return def, nil
		}
		return 0, nil
	}
	return 0, &Error{Name: name, Value: v, Want: fmt.Sprintf(`"off" or a ratio in (0, 1] such as "%g"`, def)}
}
