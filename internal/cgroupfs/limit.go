package cgroupfs

import (
	"fmt"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// unlimitedFrom is the smallest value read as no limit: v1 writes an unset
// limit as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages);
// 4 EiB or more is beyond any machine.
const unlimitedFrom = 1 << 62

// parseLimit parses a limit file's value, ASCII spaces around a decimal
// byte count, or "max" when allowMax (v2) (limitValue). Values of
// unlimitedFrom or more are NoLimit.
func parseLimit(s string, allowMax bool) (int64, error) {
	if n, ok := limitValue([]byte(s), allowMax); ok {
		return n, nil
	}
	s = strings.TrimSpace(s)
	if allowMax {
		return 0, fmt.Errorf("malformed limit %s, want bytes or \"max\"", safefs.Quote(s))
	}
	return 0, fmt.Errorf("malformed limit %s, want bytes", safefs.Quote(s))
}
