//go:build race

package memsignal_test

const raceEnabled = true
