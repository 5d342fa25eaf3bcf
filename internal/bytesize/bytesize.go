// Package bytesize parses the byte counts of the example servers' and
// bench's flags.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Parse parses a non-negative byte count: digits with an optional KiB, MiB
// or GiB suffix ("123", "64KiB", "64 MiB", "1GiB"), spaces around the
// number and the suffix ignored. The error quotes s.
func Parse(s string) (int64, error) {
	num, shift := strings.TrimSpace(s), 0
	for i, unit := range []string{"KiB", "MiB", "GiB"} {
		if n, ok := strings.CutSuffix(num, unit); ok {
			num, shift = strings.TrimSpace(n), 10*(i+1)
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q is not a byte count (want for example 1048576, 64KiB, 64MiB or 1GiB)", s)
	}
	return n << shift, nil
}
