// Package gomemlimit is memctl's one writer of GOMEMLIMIT: the limit
// refresh, a death-spiral lift and the trim's transient lowering all write
// it through here, under one lock, so that none undoes another.
package gomemlimit

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

var (
	mu    sync.Mutex // held by Do: every memctl write of GOMEMLIMIT
	ownMu sync.Mutex // guards owner
	owner Owner

	readMu sync.Mutex // guards sample: metrics.Read's argument escapes
	sample = [1]metrics.Sample{{Name: "/gc/gomemlimit:bytes"}}
)

// Read returns GOMEMLIMIT in force, in bytes (math.MaxInt64: none), from
// runtime/metrics: unlike debug.SetMemoryLimit(-1) it does not take the
// heap lock. Safe for concurrent use; it allocates nothing.
func Read() int64 {
	readMu.Lock()
	metrics.Read(sample[:])
	v := sample[0].Value
	readMu.Unlock()
	if v.Kind() != metrics.KindUint64 {
		return debug.SetMemoryLimit(-1)
	}
	return int64(min(v.Uint64(), math.MaxInt64))
}

// IsSet reports whether v, a GOMEMLIMIT in bytes, is a limit: above 0
// and below math.MaxInt64, the runtime's "no limit".
func IsSet(v int64) bool { return v > 0 && v != math.MaxInt64 }

// Do runs fn while no other memctl part writes GOMEMLIMIT; fn writes with
// Set. fn must not call Do or Lift. A write by the program itself (its own
// debug.SetMemoryLimit) is not held off: fn sees it with Read.
func Do(fn func()) {
	mu.Lock()
	defer mu.Unlock()
	fn()
}

// Set sets GOMEMLIMIT to v bytes (v >= 0) and returns the value it
// replaced. Call it inside Do.
func Set(v int64) (prev int64) { return debug.SetMemoryLimit(v) }

// Owner is the part that sets GOMEMLIMIT from the memory limit (the
// limiter): the one a lift asks.
type Owner interface {
	// Lift adds extra bytes to the GOMEMLIMIT the owner sets until
	// Lift(0), never above the limit, and returns GOMEMLIMIT before and
	// after; ok is false when it sets no GOMEMLIMIT (an operator's value,
	// no limit) or extra is negative.
	Lift(extra int64) (from, to int64, ok bool)
	// Ceiling returns the memory limit a lift may not pass, in bytes; 0
	// when the owner sets no GOMEMLIMIT.
	Ceiling() int64
}

// SetOwner makes o the owner lifts go to, and returns the func that
// removes it (only if it is still the owner).
func SetOwner(o Owner) (remove func()) {
	ownMu.Lock()
	owner = o
	ownMu.Unlock()
	return func() {
		ownMu.Lock()
		if owner == o {
			owner = nil
		}
		ownMu.Unlock()
	}
}

func current() Owner {
	ownMu.Lock()
	defer ownMu.Unlock()
	return owner
}

// Lift asks the owner for extra bytes of GOMEMLIMIT (0 ends a lift); see
// Owner.Lift. With no owner it changes nothing and returns ok false.
func Lift(extra int64) (from, to int64, ok bool) {
	if o := current(); o != nil {
		return o.Lift(extra)
	}
	return 0, 0, false
}

// Ceiling returns the owner's Ceiling, 0 with no owner.
func Ceiling() int64 {
	if o := current(); o != nil {
		return o.Ceiling()
	}
	return 0
}
