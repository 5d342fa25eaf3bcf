package thp_test

import (
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/memctl/memctl/thp"
)

// Turn THP off at the top of main, before the program allocates, and read the
// flag back. The output depends on the machine.
func ExamplePolicy() {
	s, err := thp.PolicyDisable.Apply()
	if err != nil {
		log.Print(err) // off Linux: matches errors.ErrUnsupported
	}
	fmt.Println("THP:", s) // THP: disabled
}

// Print the system's THP settings and this process's flag, as `memctl
// status` does. The output depends on the machine, for example:
//
//	system: enabled=madvise (PMD: madvise) defrag=madvise huge page 2097152 bytes
//	process: enabled
func ExampleSystem() {
	sys, err := thp.System()
	if errors.Is(err, errors.ErrUnsupported) {
		fmt.Println("no THP here:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("system: enabled=%s (PMD: %s) defrag=%s huge page %d bytes\n",
		sys.Enabled, sys.PMDMode(), sys.Defrag, sys.PMDSize)

	st, err := thp.Process()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("process: %s\n", st)
}

// Apply the operator's choice from an environment variable, falling back to
// a full opt-out where the kernel lacks the except-advised flag.
func ExamplePolicy_Apply() {
	p := thp.PolicyDisable // the default when the variable is unset
	if w, ok := os.LookupEnv("MEMCTL_THP"); ok {
		var err error
		if p, err = thp.ParsePolicy(w); err != nil {
			log.Fatal(err)
		}
	}
	st, err := p.Apply()
	if p == thp.PolicyExceptAdvised && errors.Is(err, errors.ErrUnsupported) {
		st, err = thp.PolicyDisable.Apply() // Linux before 6.18
	}
	if err != nil {
		log.Print(err)
	}
	log.Printf("THP: %s", st)
}

func ExampleParsePolicy() {
	for _, w := range []string{"keep", "disable", "Except-Advised", "off"} {
		p, err := thp.ParsePolicy(w)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(p)
	}
	// Output:
	// keep
	// disable
	// except-advised
	// thp: unknown policy "off", want keep, disable or except-advised
}
