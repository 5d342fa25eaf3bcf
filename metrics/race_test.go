//go:build race

package metrics

// raceEnabled reports whether the test binary was built with -race, whose
// shadow memory makes a test in a 256 MiB cgroup meaningless.
const raceEnabled = true
