// Package trimwire connects the facade and package pressure to package
// trim's entry points that are not public API: a gated trim request, the
// hook called after each trim, and the burst detector. Package trim sets
// the variables in its init; t is always a *trim.Trimmer (nil: nothing is
// done), and any is used where naming trim's types would be an import
// cycle.
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

// AutoBurst is a running burst detector. Its counters are read through
// its Counters method, which returns a trim.AutoBurstStats: named here it
// would be an import cycle, and returned as an any it would be boxed, an
// allocation at every GC end.
type AutoBurst interface {
	// Close stops it; idempotent.
	Close()
}

var (
	// Request asks t for a trim now through its gate (the 2% CPU budget
	// and the estimate against the trim's cost; see trim.Trimmer) on
	// behalf of o, Pressure or Spiral, in the calling goroutine, and
	// reports whether a step ran. It never waits for a running trim.
	Request func(t any, o Origin) (ran bool)

	// OnTrim sets fn to be called after each trim and each counted skip
	// of t, once its counters are in its Stats, on the goroutine that ran
	// or asked for it. fn may call Stats and must be short.
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
