package memctl

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/trim"
)

// WithAutoBurst configures the burst detector (trim.AutoBurstConfig), which
// finds bursts at GC end and trims after them. An invalid field leaves it off
// and is returned by Start. Default: the zero trim.AutoBurstConfig.
// Environment: MEMCTL_AUTOBURST=on|off, which wins over cfg.Off.
func WithAutoBurst(cfg trim.AutoBurstConfig) Option { return func(c *config) { c.autoBurst = cfg } }

// startAutoBurst starts the detector unless MEMCTL_AUTOBURST or cfg says off.
func startAutoBurst(cfg trim.AutoBurstConfig, tr *trim.Trimmer, fail func(error)) trimwire.AutoBurst {
	if v, ok := envflag.Lookup("MEMCTL_AUTOBURST"); ok {
		on, err := envflag.Bool("MEMCTL_AUTOBURST", v)
		if err != nil {
			fail(fmt.Errorf("memctl: %w; burst detection is off", err))
		}
		cfg.Off = !on
	}
	a, err := trimwire.StartAutoBurst(tr, cfg)
	if err != nil {
		fail(fmt.Errorf("memctl: %w; burst detection is off", err))
	}
	return a
}

// autoBurstStats returns a's counters (zero for nil) without allocating.
func autoBurstStats(a trimwire.AutoBurst) trim.AutoBurstStats {
	if c, ok := a.(interface{ Counters() trim.AutoBurstStats }); ok {
		return c.Counters()
	}
	return trim.AutoBurstStats{}
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// warnUnknownEnv warns of each unknown MEMCTL_* variable, naming the closest.
func warnUnknownEnv(l *slog.Logger) {
	for _, u := range envflag.Unknown(os.Environ()) {
		l.Warn("memctl: unknown environment variable ignored", "name", u.Name, "closest", u.Closest)
	}
}
