package cheap_test

import (
	"errors"
	"fmt"

	"github.com/memctl/memctl/trim/cheap"
)

// After a burst, return what the C heap freed and show what stays.
func ExampleDetect() {
	s := cheap.Detect()
	released, err := s.Release()
	if errors.Is(err, cheap.ErrUnavailable) {
		fmt.Println("no C heap step:", err)
		return
	}
	st, _ := s.Stats()
	fmt.Printf("%s released %d bytes; %s\n", s.Allocator(), released, st)
}

// Cap glibc's arenas early in main, unless the operator did.
func ExampleSetArenaMax() {
	if err := cheap.SetArenaMax(2); err != nil {
		fmt.Println("arena cap skipped:", err)
	}
}

func ExampleStats_String() {
	st := cheap.Stats{Allocator: "glibc", Arena: 416 << 20, Mapped: 0, InUse: 7 << 20, Free: 409 << 20,
		Releasable: 128 << 10, Active: -1, Resident: -1, Retained: 409 << 20, Page: -1}
	fmt.Println(st)
	// Output: glibc: arena 416.0 MiB, mmapped 0 B, in use 7.0 MiB, free 409.0 MiB, retained 409.0 MiB
}
