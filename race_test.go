//go:build race

package memctl

// raceEnabled reports whether the test binary was built with -race, whose
// shadow memory makes RSS figures meaningless.
const raceEnabled = true
