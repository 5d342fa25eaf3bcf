package memctl

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/thp"
)

// The choice on a kernel without PR_THP_DISABLE_EXCEPT_ADVISED (before
// 6.18) and with the operator's glibc.malloc.hugetlb, with the prctl
// faked: the whole kind of inputs.
func TestDecideTHP(t *testing.T) {
	unsupported := fmt.Errorf("thp: fake: %w", errors.ErrUnsupported)
	for _, tc := range []struct {
		name     string
		p        thp.Policy
		set      bool // WithTHP or MEMCTL_THP given
		tunables string
		old      bool // no except-advised
		want     thp.Policy
		note     string
		err      bool
	}{
		{"default", thp.PolicyDisable, false, "", false, thp.PolicyExceptAdvised, "inherited by child processes", false},
		{"default, old kernel", thp.PolicyDisable, false, "", true, thp.PolicyDisable, "no PR_THP_DISABLE_EXCEPT_ADVISED", false},
		{"default, hugetlb=1", thp.PolicyDisable, false, "glibc.malloc.hugetlb=1", false, thp.PolicyExceptAdvised, "hugetlb=1 kept", false},
		{"default, hugetlb=1, old kernel", thp.PolicyDisable, false, "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", true, thp.PolicyKeep, "left as it is", false},
		{"default, hugetlb=2", thp.PolicyDisable, false, "glibc.malloc.hugetlb=2", true, thp.PolicyDisable, "hugetlbfs pages", false},
		{"default, hugetlb=0", thp.PolicyDisable, false, "glibc.malloc.hugetlb=0", true, thp.PolicyDisable, "no PR_THP_DISABLE_EXCEPT_ADVISED", false},
		{"WithTHP disable", thp.PolicyDisable, true, "", false, thp.PolicyDisable, "inherited", false},
		{"WithTHP disable, hugetlb=1", thp.PolicyDisable, true, "glibc.malloc.hugetlb=1", false, thp.PolicyExceptAdvised, "rather than WithTHP's disable", false},
		{"WithTHP disable, hugetlb=1, old kernel", thp.PolicyDisable, true, "glibc.malloc.hugetlb=1", true, thp.PolicyKeep, "left as it is", false},
		{"WithTHP except-advised, old kernel", thp.PolicyExceptAdvised, true, "", true, thp.PolicyExceptAdvised, "inherited", true},
		{"WithTHP keep", thp.PolicyKeep, true, "glibc.malloc.hugetlb=1", true, thp.PolicyKeep, "inherited", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var applied []thp.Policy
			apply := func(p thp.Policy) (thp.State, error) {
				applied = append(applied, p)
				if p == thp.PolicyExceptAdvised && tc.old {
					return thp.StateEnabled, unsupported
				}
				return thp.State(p), nil
			}
			var errs []error
			got, _, note := decideTHP(tc.p, tc.set, tc.tunables, apply, func(err error) { errs = append(errs, err) })
			assert.Equal(t, tc.want, got, "applied %v", applied)
			assert.Equal(t, tc.want, applied[len(applied)-1], "the last applied is the one reported")
			assert.Contains(t, note, tc.note)
			assert.Contains(t, note, "inherited by child processes")
			assert.Equal(t, tc.err, len(errs) > 0, "%v", errs)
		})
	}
	assert.Equal(t, "", glibcHugeTLB(""))
	assert.Equal(t, "2", glibcHugeTLB("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=2"), "the last wins")
	assert.Equal(t, "", glibcHugeTLB("glibc.malloc.arena_max=2"))
}

// hugetlbInputs are GLIBC_TUNABLES strings with the value glibc 2.36 reads
// for glibc.malloc.hugetlb (ld.so --list-tunables on this repository's
// test machine; "" is unset, which glibc shows as 0). The malformed ones
// (a pair without '=' at the end, a value with '=') glibc 2.39 and later
// ignore whole; they are not checked against the loader.
var hugetlbInputs = []struct {
	tunables, want string
	malformed      bool
}{
	{"glibc.malloc.hugetlb=1", "1", false},
	{"glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=0", "1", false},
	{"glibc.malloc.hugetlb=1:junk", "1", true},
	{"glibc.malloc.hugetlb=1:a=b=c", "1", true},
	{"::glibc.malloc.hugetlb=1:", "1", true},
	{"::glibc.malloc.hugetlb=1", "1", false},
	{" glibc.malloc.hugetlb=1", "", false}, // another name
	{"GLIBC.malloc.hugetlb=1", "", false},
	{"glibc.malloc.hugetlb=0x1", "1", false},
	{"glibc.malloc.hugetlb=01", "1", false},
	{"glibc.malloc.hugetlb=1abc", "1", false},
	{"glibc.malloc.hugetlb= 1", "1", false},
	{"glibc.malloc.hugetlb=+1", "1", false},
	{"glibc.malloc.hugetlb=-1", "18446744073709551615", false},
	{"glibc.malloc.hugetlb=99999999999999999999999", "18446744073709551615", false},
	{"glibc.malloc.hugetlb=", "0", false},
	{"glibc.malloc.hugetlb=one", "0", false},
	{"glibc.malloc.hugetlb=08", "0", false}, // octal: 8 is not a digit
	{"glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0", "0", false},
	{"glibc.malloc.hugetlb=2", "2", false},
	{"glibc.malloc.hugetlb=0x200000", "2097152", false},
	{"glibc.malloc.arena_max=2", "", false},
	{"", "", false},
}

// Attack inputs (issue 19): GLIBC_TUNABLES with several tunables and
// malformed values. Before, the value was compared as written after
// trimming blanks: "0x1", "01" and "1abc", which glibc reads as 1 (it
// advises its heap with MADV_HUGEPAGE), were taken as hugetlbfs page
// sizes, so WithTHP(PolicyDisable) took the operator's huge pages away;
// " glibc.malloc.hugetlb=1", which glibc does not read, was taken as 1.
func TestGlibcHugeTLB(t *testing.T) {
	for _, in := range hugetlbInputs {
		assert.Equal(t, in.want, glibcHugeTLB(in.tunables), "%q", in.tunables)
	}
	apply := func(p thp.Policy) (thp.State, error) { return thp.State(p), nil }
	for _, v := range []string{"0x1", "01", "1abc", " 1"} {
		p, _, note := decideTHP(thp.PolicyDisable, true, "glibc.malloc.hugetlb="+v, apply, func(error) {})
		assert.Equal(t, thp.PolicyExceptAdvised, p, "%q is 1 to glibc: its advised heap keeps its huge pages", v)
		assert.Contains(t, note, "hugetlb=1")
	}
	p, _, note := decideTHP(thp.PolicyDisable, true, " glibc.malloc.hugetlb=1", apply, func(error) {})
	assert.Equal(t, thp.PolicyDisable, p, "glibc does not read the name with a blank")
	assert.NotContains(t, note, "hugetlb")
}

var listedHugeTLB = regexp.MustCompile(`(?m)^glibc\.malloc\.hugetlb: 0x([0-9a-f]+) `)

// The same inputs against glibc itself: the dynamic loader's
// --list-tunables prints the value it read. Skipped where there is no
// glibc loader that has the option (musl, glibc before 2.33).
func TestGlibcHugeTLBAsGlibcReads(t *testing.T) {
	ld := ""
	for _, p := range []string{"/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"} {
		if _, err := os.Stat(p); err == nil {
			ld = p
			break
		}
	}
	if ld == "" {
		t.Skip("no glibc dynamic loader at a known path")
	}
	if out, err := exec.Command(ld, "--list-tunables").Output(); err != nil || !listedHugeTLB.Match(out) {
		t.Skipf("%s --list-tunables does not list glibc.malloc.hugetlb (%v)", ld, err)
	}
	for _, in := range hugetlbInputs {
		if in.malformed {
			continue
		}
		cmd := exec.Command(ld, "--list-tunables")
		cmd.Env = []string{"GLIBC_TUNABLES=" + in.tunables}
		out, err := cmd.Output()
		require.NoError(t, err)
		m := listedHugeTLB.FindSubmatch(out)
		require.NotNil(t, m, "%s", out)
		n, err := strconv.ParseUint(string(m[1]), 16, 64)
		require.NoError(t, err)
		got := glibcHugeTLB(in.tunables)
		if got == "" {
			got = "0" // unset: glibc's default
		}
		assert.Equal(t, strconv.FormatUint(n, 10), got, "%q: glibc read %#x", in.tunables, n)
	}
}
