// Package arenamax reads glibc's arena cap from the environment by
// glibc's own rules: whether the operator capped malloc's arenas with
// MALLOC_ARENA_MAX or GLIBC_TUNABLES (package cheap's SetArenaMax leaves
// such a cap alone, and memctl exec does not add one).
package arenamax

import (
	"errors"
	"math"
	"strconv"
	"strings"
)

// ErrOperatorSet is matched by the error of cheap.SetArenaMax when the
// operator set the arena cap: memctl leaves it alone.
var ErrOperatorSet = errors.New("cheap: glibc arena cap set by the operator")

// Operator reports whether the environment read through getenv caps
// glibc's arenas, by glibc's rules (elf/dl-tunables.c), and returns the
// variable that does and its value: GLIBC_TUNABLES (tunables(7)) whose last
// glibc.malloc.arena_max entry has a valid value (value is the whole
// variable), else MALLOC_ARENA_MAX with a valid value. A valid value is
// what _dl_strtoul reads in full as a number in [1, SIZE_MAX]; anything
// else leaves glibc's default of 8 arenas per core. Where glibc versions
// disagree (2.39 rejects trailing characters, values past 2^64, and
// GLIBC_TUNABLES with a value holding '=' or a name without a value, which
// 2.26-2.38 apply) the answer is "no cap". Pure; runs on every OS.
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
// cap from tun, parsed as glibc 2.39's parse_tunables_string (the
// strictest) parses it.
func tunablesArenaMax(tun string) bool {
	last, found := "", false
	entries := strings.Split(tun, ":")
	for i, e := range entries {
		name, v, ok := strings.Cut(e, "=")
		switch {
		case !ok && i == len(entries)-1:
			return false // a name without a value (or nothing, after a ':') at the end
		case !ok:
			continue // a name without a value before others: skipped
		case strings.Contains(v, "="):
			return false // a value holding '='
		case name == arenaTunable:
			last, found = v, true
		}
	}
	return found && validArenaMax(last)
}

// validArenaMax reports whether _dl_strtoul (elf/dl-misc.c) reads all of v
// as a number in [1, SIZE_MAX].
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
		d, err := strconv.ParseUint(s[i:i+1], 16, 8)
		if err != nil || d >= base {
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
