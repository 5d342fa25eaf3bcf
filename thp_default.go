package memctl

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/thp"
)

// thpInherited is the part of Report.THPNote that is always true.
const thpInherited = "the flag is inherited by child processes (fork and exec)"

// applyTHP decides and applies the THP policy: MEMCTL_THP when set,
// otherwise the WithTHP policy when given (set), otherwise the default
// (except-advised where the kernel has it, else disable). An operator's
// GLIBC_TUNABLES glibc.malloc.hugetlb=1 asks glibc to advise its heap with
// MADV_HUGEPAGE: under except-advised it gets its huge pages; a disable
// that MEMCTL_THP did not ask for would take them away, so it becomes
// except-advised, or keep on an older kernel. It returns the policy
// applied, the state read back, and the note for the report.
func applyTHP(p thp.Policy, set bool, fail func(error)) (thp.Policy, thp.State, string) {
	return decideTHP(p, set, os.Getenv("GLIBC_TUNABLES"), thp.Policy.Apply, fail)
}

// decideTHP is applyTHP with the tunables and the prctl injected, for
// tests.
func decideTHP(p thp.Policy, set bool, tunables string, apply func(thp.Policy) (thp.State, error), fail func(error)) (thp.Policy, thp.State, string) {
	fromEnv := false
	if v, ok := envflag.Lookup("MEMCTL_THP"); ok {
		ep, def, err := parseTHP(v)
		if err != nil {
			fail(fmt.Errorf("memctl: %w; THP flag left as it is", err))
			st, _ := thp.Process() // as inherited
			return thp.PolicyKeep, st, thpInherited
		}
		p, set, fromEnv = ep, !def, !def
	}
	notes := []string{thpInherited}
	hugetlb := glibcHugeTLB(tunables)
	chosen := !set // memctl chose except-advised: it may fall back
	switch {
	case !set:
		p = thp.PolicyExceptAdvised
	case p == thp.PolicyDisable && hugetlb == "1" && fromEnv:
		notes = append(notes, "GLIBC_TUNABLES glibc.malloc.hugetlb=1 gets no huge pages under MEMCTL_THP=disable")
	case p == thp.PolicyDisable && hugetlb == "1":
		p, chosen = thp.PolicyExceptAdvised, true
		notes = append(notes, "except-advised rather than WithTHP's disable: the operator's GLIBC_TUNABLES asks for glibc.malloc.hugetlb=1")
	}
	if chosen && hugetlb == "1" && len(notes) == 1 {
		notes = append(notes, "GLIBC_TUNABLES glibc.malloc.hugetlb=1 kept: glibc's advised heap gets huge pages under except-advised")
	}
	st, err := apply(p)
	if err != nil && errors.Is(err, errors.ErrUnsupported) && chosen {
		// An older kernel: no except-advised.
		if hugetlb == "1" {
			p = thp.PolicyKeep
			notes = append(notes[:1], "left as it is: GLIBC_TUNABLES asks for glibc.malloc.hugetlb=1 and this kernel has no PR_THP_DISABLE_EXCEPT_ADVISED (Linux 6.18)")
		} else {
			p = thp.PolicyDisable
			notes = append(notes, "disable: this kernel has no PR_THP_DISABLE_EXCEPT_ADVISED (Linux 6.18)")
		}
		st, err = apply(p)
	}
	if err != nil {
		fail(err)
	}
	if hugetlb != "" && hugetlb != "0" && hugetlb != "1" {
		notes = append(notes, "GLIBC_TUNABLES glibc.malloc.hugetlb="+hugetlb+" (hugetlbfs pages) is not affected by the flag")
	}
	return p, st, strings.Join(notes, "; ")
}

// glibcHugeTLB returns the value glibc reads for glibc.malloc.hugetlb from
// a GLIBC_TUNABLES string ("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=2"),
// as a decimal number ("0", "1", "2", or a huge page size), or "" when the
// string does not set it. It reads the string as glibc does (elf/
// dl-tunables.c, checked against ld.so --list-tunables of glibc 2.36,
// TestGlibcHugeTLBAsGlibcReads): ':' separates the pairs, a name is
// compared whole (" glibc.malloc.hugetlb" is another name), a pair
// without '=' is skipped, the last pair wins; the value is read as
// _dl_strtoul reads it (blanks skipped, a sign, 0x for hexadecimal, a
// leading 0 for octal, digits up to the first other byte, nothing: 0), so
// "0x1", "01" and "1abc" are 1 and "-1" is 2^64-1. A malformed string (a
// last pair without '=', a value with '=') is read as glibc 2.36 reads it,
// the pairs before kept; glibc 2.39 and later ignore it whole, and there
// memctl honours a request glibc does not make, which costs no more than
// except-advised in place of disable.
func glibcHugeTLB(tunables string) string {
	v, set := "", false
	for _, kv := range strings.Split(tunables, ":") {
		if k, val, ok := strings.Cut(kv, "="); ok && k == "glibc.malloc.hugetlb" {
			v, set = val, true
		}
	}
	if !set {
		return ""
	}
	return strconv.FormatUint(dlStrtoul(v), 10)
}

// dlStrtoul is glibc's _dl_strtoul (elf/dl-misc.c): blanks and tabs
// skipped, an optional sign (a minus negates modulo 2^64), base 16 after
// "0x", 8 after a leading "0", 10 otherwise, digits up to the first byte
// that is not one; 0 when there is none, 2^64-1 on overflow.
func dlStrtoul(s string) uint64 {
	s = strings.TrimLeft(s, " \t")
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0
	}
	base := uint64(10)
	if s[0] == '0' {
		if len(s) > 1 && (s[1] == 'x' || s[1] == 'X') {
			base, s = 16, s[2:]
		} else {
			base = 8
		}
	}
	var r uint64
digits:
	for i := 0; i < len(s); i++ {
		c := s[i]
		var d uint64
		switch {
		case c >= '0' && c <= '9' && uint64(c-'0') < base:
			d = uint64(c - '0')
		case base == 16 && c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		case base == 16 && c >= 'A' && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			break digits
		}
		if r >= (math.MaxUint64-d)/base {
			return math.MaxUint64
		}
		r = r*base + d
	}
	if neg {
		return -r
	}
	return r
}

// parseTHP parses MEMCTL_THP: a thp.Policy word, or a switch word: off
// means memctl leaves the flag alone (thp.PolicyKeep; it does not mean
// "THP off"), on means the default (def is true: Start's default policy).
func parseTHP(v string) (p thp.Policy, def bool, err error) {
	if on, ok := envflag.Switch(v); ok {
		if on {
			return thp.PolicyExceptAdvised, true, nil
		}
		return thp.PolicyKeep, false, nil
	}
	p, err = thp.ParsePolicy(v)
	if err != nil {
		return thp.PolicyKeep, false, &envflag.Error{Name: "MEMCTL_THP", Value: v,
			Want: `keep, disable, except-advised, or "on" (the default) or "off" (keep)`}
	}
	return p, false, nil
}
