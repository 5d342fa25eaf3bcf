// Package trimwire connects the facade and package pressure to trim's
// non-public entry points. Package trim sets the variables in its init; t
// is always a *trim.Trimmer (nil: nothing is done), and any avoids an
// import cycle.
package trimwire

import "time"

// The default and the bounds of trim.Config.Delay, which memctl.WithTrimDelay
// and MEMCTL_TRIM_DELAY check too.
const (
	DefaultDelay = 2 * time.Second
	MinDelay     = time.Millisecond
	MaxDelay     = 24 * time.Hour
)

// Origin says who asks for a gated trim.
type Origin int

// The origins of a Request. Debounced and ByName are the Trimmer's own.
const (
	Debounced Origin = iota // Delay after the last AfterBurst
	Pressure                // kernel memory pressure
	Spiral                  // the GC death-spiral detector
	ByName                  // TrimNow
)

// AutoBurst is a running burst detector. Its Counters method (returning
// trim.AutoBurstStats, not named here: an import cycle, and boxing as any
// would allocate at every GC end) is reached by type assertion.
type AutoBurst interface {
	// Close stops it; idempotent.
	Close()
}

var (
	// Request asks t for a gated trim now for o (Pressure or Spiral), in
	// the calling goroutine, and reports whether a step ran. It never waits
	// for a running trim.
	Request func(t any, o Origin) (ran bool)

	// OnTrim sets fn to be called after each trim and counted skip of t,
	// its Stats updated, on that goroutine; fn must be short.
	OnTrim func(t any, fn func())

	// StartAutoBurst starts a burst detector (cfg: a trim.AutoBurstConfig)
	// that marks t's bursts at GC ends. It returns nil and no error when
	// cfg.Off is set or t is nil, and an error naming an invalid field.
	StartAutoBurst func(t any, cfg any) (AutoBurst, error)
)

// String returns "debounced", "pressure", "spiral" or "by_name" (the
// metrics' label values).
func (o Origin) String() string {
	if o < Debounced || o > ByName {
		return "unknown"
	}
	return [...]string{"debounced", "pressure", "spiral", "by_name"}[o]
}
