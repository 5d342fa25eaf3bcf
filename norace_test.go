//go:build !race

package memctl

const raceEnabled = false
