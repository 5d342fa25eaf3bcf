//go:build !race

package auto_test

const raceEnabled = false
