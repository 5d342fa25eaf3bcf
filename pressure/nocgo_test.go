//go:build !cgo

package pressure_test

const cgoEnabled = false
