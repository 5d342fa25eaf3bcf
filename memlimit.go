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
// MEMCTL_GOMEMLIMIT_FLOOR to cfg and starts the limiter. A bad
// MEMCTL_REFRESH turns the refresh off; a bad MEMCTL_GOMEMLIMIT_FLOOR
// leaves GOMEMLIMIT alone.
func startMemLimit(cfg limits.MemLimitConfig, fail func(error)) (*limits.MemLimiter, limits.MemLimit, error) {
	if v, ok := envflag.Lookup("MEMCTL_REFRESH"); ok {
		d, err := parseRefresh(v)
		if err != nil {
			fail(err)
		}
		cfg.Refresh = d
	}
	if v, ok := envflag.Lookup("MEMCTL_KEEP_GOMEMLIMIT"); ok {
		keep, err := envflag.Bool("MEMCTL_KEEP_GOMEMLIMIT", v)
		if err != nil {
			// The variable's presence asks to keep it.
			fail(fmt.Errorf("memctl: %w; the operator's GOMEMLIMIT is kept", err))
			keep = true
		}
		cfg.KeepOperator = keep
	}
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

// parseFloor parses MEMCTL_GOMEMLIMIT_FLOOR, a byte count of at least 1
// written as GOMEMLIMIT is ("64MiB"; suffixes case-insensitive here).
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

// MemLimit returns the latest GOMEMLIMIT decision of the controller's
// limiter, followed whoever set GOMEMLIMIT (unless MEMCTL_REFRESH=off). It
// reads and allocates nothing, so a cache may call it on a hot path. With no
// limiter (MEMCTL=off, a nil Controller) it holds GOMEMLIMIT alone.
func (c *Controller) MemLimit() limits.MemLimit {
	if c == nil || c.limiter == nil {
		return limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1), Source: limits.SourceNone}
	}
	return c.limiter.Last()
}

// WatchMemLimit returns a channel that receives MemLimit each time what is in
// force changes, for a cache that sizes itself from the limit; buf, the
// dropping rule and cancel are limits.MemLimiter.Subscribe's. Close closes the
// channel. With no limiter it is closed at once.
func (c *Controller) WatchMemLimit(buf int) (changes <-chan limits.MemLimit, cancel func()) {
	var m *limits.MemLimiter
	if c != nil {
		m = c.limiter
	}
	return m.Subscribe(buf)
}

// CurrentMemLimit returns MemLimit of the live controller of the latest
// Start (see Controller.MemLimit); with none, GOMEMLIMIT in force alone.
func CurrentMemLimit() limits.MemLimit { return current.Load().MemLimit() }

// WatchMemLimit returns WatchMemLimit of the live controller of the latest
// Start; with none, a closed channel.
func WatchMemLimit(buf int) (changes <-chan limits.MemLimit, cancel func()) {
	return current.Load().WatchMemLimit(buf)
}

// Refresh re-reads the memory limit now and sets GOMEMLIMIT as the refresh at
// GC end does (limits.MemLimiter.Refresh), for a caller that knows the limit
// changed, and returns the decision and the error Start would report. With no
// limiter (MEMCTL=off, the operator's GOMEMLIMIT, a nil Controller) it changes
// nothing and returns GOMEMLIMIT as it is.
func (c *Controller) Refresh() (limits.MemLimit, error) {
	if c == nil || c.limiter == nil {
		return limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}, nil
	}
	return c.limiter.Refresh()
}
