package auto_test

import (
	"fmt"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/thp"
)

// A program that imports the auto package for its side effect
//
//	import _ "github.com/memctl/memctl/auto"
//
// has run memctl.Start with its defaults before main: the THP flag is off
// for the process except where it asks for huge pages (except-advised on
// Linux 6.18, disable before), bursts are detected at GC end, and the
// package-level memctl.AfterBurst and memctl.Begin reach the controller
// auto started (the startup line went to slog.Default).
func Example() {
	end := memctl.Begin() // a burst of work in flight: no trim runs
	// ... the burst ...
	end() // the trim follows two seconds later

	state, err := thp.Process() // PR_GET_THP_DISABLE
	fmt.Println("THP off for this process:", state != thp.StateEnabled, err)
	// Output:
	// THP off for this process: true <nil>
}
