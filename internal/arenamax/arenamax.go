// Package arenamax reads glibc's arena cap from the environment by
// glibc's own rules: whether the operator capped malloc's arenas with
// MALLOC_ARENA_MAX or GLIBC_TUNABLES (package cheap's SetArenaMax leaves
// such a cap alone, and memctl exec does not add one).
package arenamax

import (
	"errors"
	"math"
	"strings"
)

// ErrOperatorSet is matched by the error of cheap.SetArenaMax when the
// operator set the arena cap: memctl leaves it alone.
var ErrOperatorSet = errors.New("cheap: glibc arena cap set by the operator")

// Operator reports whether the environment read through getenv
// caps glibc's arenas, by glibc's own rules (elf/dl-tunables.c), and
// returns the variable that does and its value:
//
//   - GLIBC_TUNABLES (colon-separated name=value pairs, tunables(7)) whose
//     glibc.malloc.arena_max entry has a valid value: the name must match
//     exactly (" glibc.malloc.arena_max=4" is another, unknown tunable) and,
//     when the name appears more than once, the last entry counts. It wins
//     over MALLOC_ARENA_MAX, as in glibc; value is the whole variable.
//   - otherwise MALLOC_ARENA_MAX with a valid value.
//
// A valid value is what glibc's number parser (_dl_strtoul) reads in full
// as at least 1 and at most SIZE_MAX: optional leading spaces or tabs, an
// optional sign, then decimal digits, octal after a leading 0, or hex after
// 0x. An empty value, 0, "abc" or "-0" is no cap: glibc rejects them (the
// tunable's minimum is 1) and runs with its default of 8 arenas per core.
// A negative value is a cap of SIZE_MAX+1-n, as glibc reads it.
//
// Where glibc versions disagree, the answer is "no cap", so that a caller
// applies its own cap rather than leave the process with none: glibc 2.39
// and later ignore a value with trailing characters ("4x", "4 ") or past
// 2^64, and ignore the whole of a GLIBC_TUNABLES that has a value
// containing '=' or that ends without a value (a trailing ':' or a bare
// name), while 2.26 to 2.38 apply what they read before. Measured with
// ld.so --list-tunables of glibc 2.36 (this package's tests compare with it
// where it is installed). It runs on every OS and is pure.
func Operator(getenv func(string) string) (name, value string, ok bool) {
	if tun := getenv("GLIBC_TUNABLES"); tunablesArenaMax(tun) {
		return "GLIBC_TUNABLES", tun, true
	}
	if v := getenv("MALLOC_ARENA_MAX"); validArenaMax(v) {
		return "MALLOC_ARENA_MAX", v, true
	}
	return "", "", false
}

// arenaTunable is the name of glibc's arena cap in GLIBC_TUNABLES.
const arenaTunable = "glibc.malloc.arena_max"

// tunablesArenaMax reports whether every glibc since 2.26 sets its arena
// cap from the GLIBC_TUNABLES value tun. It parses tun as glibc 2.39's
// parse_tunables_string does, the strictest: an entry up to '=' is a name
// (an entry that reaches ':' first is skipped), and its value runs to the
// next ':'; a value holding '=', or the end of the string reached inside a
// name, makes glibc 2.39 ignore the whole variable. The last arena_max
// entry is the one glibc 2.39 applies (and 2.36 applies it last).
func tunablesArenaMax(tun string) bool {
	last, found := "", false
	for rest := tun; rest != ""; {
		i := strings.IndexAny(rest, "=:")
		if i < 0 {
			return false // a name without a value at the end
		}
		if rest[i] == ':' {
			rest = rest[i+1:]
			continue
		}
		name := rest[:i]
		rest = rest[i+1:]
		v := rest
		j := strings.IndexAny(rest, "=:")
		switch {
		case j >= 0 && rest[j] == '=':
			return false // a value holding '='
		case j >= 0:
			v, rest = rest[:j], rest[j+1:]
			if rest == "" {
				return false // a trailing ':' leaves an empty name at the end
			}
		default:
			rest = ""
		}
		if name == arenaTunable {
			last, found = v, true
		}
	}
	return found && validArenaMax(last)
}

// validArenaMax reports whether glibc's _dl_strtoul (elf/dl-misc.c) reads
// all of v as a number in [1, SIZE_MAX], the range of
// glibc.malloc.arena_max.
func validArenaMax(v string) bool {
	s := strings.TrimLeft(v, " \t")
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	base := uint64(10)
	if s[0] == '0' {
		base = 8
		if len(s) > 1 && (s[1] == 'x' || s[1] == 'X') {
			base = 16
			s = s[2:]
		}
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		d := digitValue(s[i])
		if d >= base {
			return false // glibc 2.39 rejects what follows the number
		}
		if n >= (math.MaxUint64-d)/base {
			return false // glibc's overflow check: 2.39 rejects it
		}
		n = n*base + d
	}
	if neg {
		n = -n
	}
	return n >= 1 && n <= math.MaxUint // math.MaxUint: SIZE_MAX
}

// digitValue returns the value of the digit c in bases up to 16, or 16 for
// a byte that is no digit.
func digitValue(c byte) uint64 {
	switch {
	case '0' <= c && c <= '9':
		return uint64(c - '0')
	case 'a' <= c && c <= 'f':
		return uint64(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return uint64(c-'A') + 10
	}
	return 16
}
