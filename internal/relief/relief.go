// Package relief is the process-wide registry through which memctl's parts
// relieve memory pressure without wiring each other: shedding, canceling
// the largest request, and the pressure trim. Every function is safe for
// concurrent use and allocates nothing.
package relief

import "sync/atomic"

var (
	shedding atomic.Bool
	canceler atomic.Pointer[func() int]
	trimmer  atomic.Pointer[func()]
)

// Shed turns load shedding on or off: while it is on, the pools refuse a
// Grow that takes a request past its shed size.
func Shed(on bool) { shedding.Store(on) }

// Shedding reports whether Shed is on.
func Shedding() bool { return shedding.Load() }

// SetCanceler registers f as the cancel of the largest request in flight;
// f returns how many requests it cancelled. The last one set wins.
func SetCanceler(f func() int) { canceler.Store(&f) }

// CancelLargest calls the registered cancel and returns its count: 0 when
// none is registered.
func CancelLargest() int {
	if f := canceler.Load(); f != nil {
		return (*f)()
	}
	return 0
}

// SetTrim registers f as the trim request of a pressure signal; f must pass
// the gate of every trim (never a forced trim). It returns the func that
// removes f, if f is still the one registered.
func SetTrim(f func()) (remove func()) {
	p := &f
	trimmer.Store(p)
	return func() { trimmer.CompareAndSwap(p, nil) }
}

// Trim calls the registered trim request, if any, and reports whether
// there was one.
func Trim() bool {
	if f := trimmer.Load(); f != nil {
		(*f)()
		return true
	}
	return false
}
