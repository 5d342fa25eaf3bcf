package memctl

import (
	"cmp"

	"github.com/memctl/memctl/internal/relief"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/pressure"
)

// startPressure registers the pressure trim and starts the pressure
// monitor, unless MEMCTL_PRESSURE is off or invalid.
func startPressure(cfg config, c *Controller, fail func(error)) *pressure.Monitor {
	if !envSwitch("MEMCTL_PRESSURE", true, false, "the pressure watch is off", fail) {
		return nil
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

// pressureTrim is the trim kernel pressure asks for: a gated request, then
// (with a refresh) a re-read of the limit, which may be a memory.high just
// lowered.
func pressureTrim(c *Controller) func() {
	tr, lim := c.trimmer, c.limiter
	return func() {
		if tr != nil {
			c.mark(kindPressure)
			trimwire.Request(tr, trimwire.Pressure)
		}
		if lim != nil && lim.Interval() > 0 {
			lim.Poke()
		}
	}
}

// Subscribe returns a channel of the death-spiral and kernel-pressure events,
// as pressure.Monitor.Subscribe; Close closes it. With no monitor it is closed
// at once.
func (c *Controller) Subscribe(buf int) (events <-chan pressure.Event, cancel func()) {
	var m *pressure.Monitor
	if c != nil {
		m = c.monitor
	}
	return m.Subscribe(buf)
}
