//go:build !race

package pressure_test

const raceEnabled = false
