package trim_test

import (
	"fmt"
	"time"

	"github.com/memctl/memctl/trim"
)

func Example() {
	t, err := trim.New(trim.Config{Delay: 2 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer t.Close() // stops the pending trim

	end := t.Begin()
	// ... a burst: work that allocates far more than the steady state ...
	end() // the trim runs 2 s from now unless another burst ends first

	s := t.Stats()
	fmt.Println("pending:", s.Pending, "in flight:", s.InFlight, "trims:", s.Trims)
	// Output: pending: true in flight: 0 trims: 0
}

func ExampleNew_invalidConfig() {
	_, err := trim.New(trim.Config{Delay: time.Microsecond})
	fmt.Println(err)
	// Output: trim: Config.Delay 1µs: want 0 (the default, 2s) or at least 1ms and at most 24h0m0s
}
