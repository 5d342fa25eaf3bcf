package realsvc

import (
	"fmt"
	"strings"
	"text/tabwriter"
)

// Row is one check: a memctl variant's figure beside the plain service's
// in the same run, and the bound it is held to.
type Row struct {
	Service, Check string
	// Plain is the plain control's figure; Arm names the memctl variant
	// (auto, budget) and Value is its figure.
	Plain, Arm, Value string
	// Bound says what Value must meet and where the bound comes from.
	Bound string
	OK    bool
	// Issue names the open issue whose fix the check depends on ("32"),
	// empty for a check that holds today.
	Issue string
}

// Result is "ok" or "FAIL", with the issue the check depends on: "FAIL
// (needs issue 32)", or "ok (issue 32's case)" when such a check passed
// anyway.
func (r Row) Result() string {
	switch {
	case r.Issue == "" && r.OK:
		return "ok"
	case r.Issue == "":
		return "FAIL"
	case r.OK:
		return "ok (issue " + r.Issue + "'s case)"
	}
	return "FAIL (needs issue " + r.Issue + ")"
}

// Table is the suite's results, one row per check.
type Table struct{ Rows []Row }

// Add appends r and returns it.
func (t *Table) Add(r Row) Row {
	t.Rows = append(t.Rows, r)
	return r
}

// String formats the rows as aligned columns with a header.
func (t *Table) String() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "service\tcheck\tplain (control)\tmemctl\tbound\tresult")
	for _, r := range t.Rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s: %s\t%s\t%s\n", r.Service, r.Check, r.Plain, r.Arm, r.Value, r.Bound, r.Result())
	}
	w.Flush()
	return b.String()
}
