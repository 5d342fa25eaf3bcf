// Package logattr writes the figures memctl logs: the slog attributes of
// figures that may be unknown or absent, so that no log line shows a
// sentinel as a number (a byte count of -1, unknown, is written "unknown",
// and GOMEMLIMIT's math.MaxInt64, no limit, "off"), and byte counts in MiB
// for sentences (MiB, MiBCompact). Every package that logs such a figure
// uses it.
package logattr

import (
	"log/slog"
	"math"
)

// Unknown is the value written for a figure that could not be read.
const Unknown = "unknown"

// Bytes returns key=v for a byte count v >= 0, and key="unknown" for a
// negative v (the -1 by which memctl's figures say unknown).
func Bytes(key string, v int64) slog.Attr {
	if v < 0 {
		return slog.String(key, Unknown)
	}
	return slog.Int64(key, v)
}

// GoMemLimit returns key=v for a GOMEMLIMIT in bytes, key="off" for
// math.MaxInt64 (the Go runtime's "no limit", what debug.SetMemoryLimit(-1)
// returns when none is set), and key="unknown" for a negative v.
func GoMemLimit(key string, v int64) slog.Attr {
	if v == math.MaxInt64 {
		return slog.String(key, "off")
	}
	return Bytes(key, v)
}
