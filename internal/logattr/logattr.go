// Package logattr writes the figures memctl logs, so that no log line
// shows a sentinel as a number (-1 is "unknown", GOMEMLIMIT's
// math.MaxInt64 is "off"), and byte counts in MiB for sentences.
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
// math.MaxInt64 (no limit), and key="unknown" for a negative v.
func GoMemLimit(key string, v int64) slog.Attr {
	if v == math.MaxInt64 {
		return slog.String(key, "off")
	}
	return Bytes(key, v)
}
