package memctl

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/memctl/memctl/thp"
)

// moreChildren are child processes that test files building only in some
// configurations (a platform, cgo) add to TestMain's.
var moreChildren = map[string]func(){}

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
