package memctl

import (
	"cmp"
	"fmt"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/history"
	"github.com/memctl/memctl/internal/relief"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/pressure"
)

// startPressure registers the pressure trim (internal/relief) and starts
// the death-spiral detector and the kernel watcher, unless MEMCTL_PRESSURE
// is off (or invalid: then off, and reported); a watcher that cannot start
// is reported through fail and the detector runs all the same.
func startPressure(cfg config, c *Controller, fail func(error)) *pressure.Monitor {
	if v, ok := envflag.Lookup("MEMCTL_PRESSURE"); ok {
		on, err := envflag.Bool("MEMCTL_PRESSURE", v)
		if err != nil {
			fail(fmt.Errorf("memctl: %w; the pressure watch is off", err))
			return nil
		}
		if !on {
			return nil
		}
	}
	c.untrim = relief.SetTrim(pressureTrim(c))
	pc := cfg.pressure
	pc.Logger = cmp.Or(pc.Logger, cfg.logger)
	m, err := pressure.Start(pc)
	if err != nil {
		fail(err)
	}
	return m
}

// pressureTrim is the trim kernel pressure asks for (through
// internal/relief): the trimmer's gated request (trimwire.Request), the gate of
// every trim (the estimate, the cost rule, the 2% CPU budget), never a
// forced TrimNow. With a GOMEMLIMIT refresh it then re-reads the limit
// (MemLimiter.Poke, at most once a second): the pressure may be a
// memory.high just lowered under the usage, where the kernel throttles
// allocation and GC ends are rare. The trim comes first: it is what
// relieves the cgroup, and a re-read at its limit is slow (every page the
// reading allocates is reclaimed for).
func pressureTrim(c *Controller) func() {
	tr, lim := c.trimmer, c.limiter
	return func() {
		if tr != nil {
			c.mark(history.KindPressure)
			trimwire.Request(tr, trimwire.Pressure)
		}
		if lim != nil && lim.Interval() > 0 {
			lim.Poke()
		}
	}
}

// Subscribe returns a channel of the death-spiral and kernel-pressure events;
// buf, the dropping and cancel are pressure.Monitor.Subscribe's, and Close
// closes it too. On a nil controller, or one without a monitor, the channel is
// closed at once.
func (c *Controller) Subscribe(buf int) (events <-chan pressure.Event, cancel func()) {
	var m *pressure.Monitor
	if c != nil {
		m = c.monitor
	}
	return m.Subscribe(buf)
}
