package memctl

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/thp"
)

// thpInherited is the part of Report.THPNote that is always true.
const thpInherited = "the flag is inherited by child processes (fork and exec)"

// decideTHP decides and applies the THP policy (see WithTHP) under the
// GLIBC_TUNABLES tunables with apply, and returns the policy, the state read
// back and the note.
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

// glibcHugeTLB returns, in decimal, the glibc.malloc.hugetlb value glibc
// reads from GLIBC_TUNABLES (elf/dl-tunables.c: the last pair wins, the value
// read as _dl_strtoul, so "0x1", "01" and "1abc" are 1), "" when unset.
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
	v = strings.TrimLeft(v, " \t")
	neg := strings.HasPrefix(v, "-")
	if neg || strings.HasPrefix(v, "+") {
		v = v[1:]
	}
	base, digits := 10, "0123456789"
	switch {
	case strings.HasPrefix(v, "0x") || strings.HasPrefix(v, "0X"):
		base, digits, v = 16, "0123456789abcdefABCDEF", v[2:]
	case strings.HasPrefix(v, "0"):
		base, digits = 8, "01234567"
	}
	if i := strings.IndexFunc(v, func(r rune) bool { return !strings.ContainsRune(digits, r) }); i >= 0 {
		v = v[:i]
	}
	n, err := strconv.ParseUint(v, base, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		n = math.MaxUint64
	case neg:
		n = -n
	}
	return strconv.FormatUint(n, 10)
}

// parseTHP parses MEMCTL_THP: a thp.Policy word, off (thp.PolicyKeep) or on
// (def: Start's default).
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
