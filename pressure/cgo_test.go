//go:build cgo

package pressure_test

// cgoEnabled reports whether the test binary was built with cgo.
const cgoEnabled = true
