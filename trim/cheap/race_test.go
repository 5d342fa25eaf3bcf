//go:build linux && cgo && race

package cheap_test

const raceEnabled = true
