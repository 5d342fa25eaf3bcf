//go:build race

package main

// raceEnabled reports whether the test binary was built with -race, whose
// shadow memory keeps RSS up after a trim.
const raceEnabled = true
