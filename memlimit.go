package memctl

import (
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/limits"
)

// startMemLimit applies MEMCTL_REFRESH, MEMCTL_KEEP_GOMEMLIMIT and
// MEMCTL_GOMEMLIMIT_FLOOR to cfg and starts the limiter.
func startMemLimit(cfg limits.MemLimitConfig, fail func(error)) (*limits.MemLimiter, limits.MemLimit, error) {
	if v, ok := envflag.Lookup("MEMCTL_REFRESH"); ok {
		d, err := parseRefresh(v)
		if err != nil {
			fail(err)
		}
		cfg.Refresh = d
	}
	cfg.KeepOperator = envSwitch("MEMCTL_KEEP_GOMEMLIMIT", cfg.KeepOperator, true, "the operator's GOMEMLIMIT is kept", fail)
	if v, ok := envflag.Lookup("MEMCTL_GOMEMLIMIT_FLOOR"); ok {
		n, err := parseFloor(v)
		if err != nil {
			ml := limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1), Reason: "GOMEMLIMIT left as it was: bad MEMCTL_GOMEMLIMIT_FLOOR"}
			return nil, ml, err
		}
		cfg.Floor = n
	}
	return limits.NewMemLimiter(cfg)
}

// parseRefresh parses MEMCTL_REFRESH; off, "0" or a bad value give -1 (no refresh).
func parseRefresh(v string) (time.Duration, error) {
	d, err := envflag.Duration("MEMCTL_REFRESH", v, limits.DefaultRefresh, time.Millisecond)
	if err != nil {
		return -1, fmt.Errorf("memctl: %w; the GOMEMLIMIT refresh is off", err)
	}
	if d == 0 {
		return -1, nil
	}
	return d, nil
}

// byteUnits are GOMEMLIMIT's suffixes (runtime/debug.SetMemoryLimit).
var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// parseFloor parses MEMCTL_GOMEMLIMIT_FLOOR, a byte count >= 1 as GOMEMLIMIT
// writes it ("64MiB"; any case).
func parseFloor(v string) (int64, error) {
	num, shift := v, uint(0)
	for _, u := range byteUnits {
		if len(v) > len(u.suffix) && strings.EqualFold(v[len(v)-len(u.suffix):], u.suffix) {
			num, shift = strings.TrimSpace(v[:len(v)-len(u.suffix)]), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("memctl: MEMCTL_GOMEMLIMIT_FLOOR=%q: want a byte count such as \"64MiB\" (B, KiB, MiB, GiB, TiB); GOMEMLIMIT left as it was", v)
	}
	return n << shift, nil
}

// MemLimit returns the limiter's latest GOMEMLIMIT decision; it reads and
// allocates nothing. With no limiter it holds GOMEMLIMIT alone.
func (c *Controller) MemLimit() limits.MemLimit {
	if c == nil || c.limiter == nil {
		return limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1), Source: limits.SourceNone}
	}
	return c.limiter.Last()
}

// WatchMemLimit returns a channel that receives MemLimit at each change, as
// limits.MemLimiter.Subscribe. Close closes it; with no limiter it is closed
// at once.
func (c *Controller) WatchMemLimit(buf int) (changes <-chan limits.MemLimit, cancel func()) {
	var m *limits.MemLimiter
	if c != nil {
		m = c.limiter
	}
	return m.Subscribe(buf)
}

// CurrentMemLimit returns MemLimit of the live controller of the latest
// Start; with none, GOMEMLIMIT alone.
func CurrentMemLimit() limits.MemLimit { return current.Load().MemLimit() }

// WatchMemLimit returns WatchMemLimit of the live controller of the latest
// Start; with none, a closed channel.
func WatchMemLimit(buf int) (changes <-chan limits.MemLimit, cancel func()) {
	return current.Load().WatchMemLimit(buf)
}

// Refresh re-reads the memory limit now and sets GOMEMLIMIT
// (limits.MemLimiter.Refresh). With no limiter it changes nothing and returns
// GOMEMLIMIT as it is.
func (c *Controller) Refresh() (limits.MemLimit, error) {
	if c == nil || c.limiter == nil {
		return limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}, nil
	}
	return c.limiter.Refresh()
}
