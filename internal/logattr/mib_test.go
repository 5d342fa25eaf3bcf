package logattr_test

import (
	"fmt"

	"github.com/memctl/memctl/internal/logattr"
)

func ExampleMiB() {
	fmt.Println(logattr.MiB(333975552), logattr.MiBCompact(333975552), logattr.MiB(-1<<20), logattr.MiB(0))
	// Output: 318.5 MiB 318.5MiB -1.0 MiB 0.0 MiB
}
