//go:build race

package main

// raceEnabled reports whether the test binary was built with -race, whose
// shadow memory hides a process's peak RSS.
const raceEnabled = true
