// Package logattr writes the figures memctl logs, so that no log line
// shows a sentinel as a number (-1 is "unknown", GOMEMLIMIT's
// math.MaxInt64 is "off"), and byte counts in MiB for sentences.
package logattr

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
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

// MiB writes b bytes in MiB (2^20 bytes) with one decimal and a space, as
// memctl's sentences do: "318.5 MiB". A negative b keeps its sign.
func MiB(b int64) string { return mib(b) + " MiB" }

// AppendMiB appends MiB(b) to dst, allocating only to grow dst.
func AppendMiB(dst []byte, b int64) []byte {
	return append(strconv.AppendFloat(dst, float64(b)/(1<<20), 'f', 1, 64), " MiB"...)
}

// MiBCompact writes b bytes in MiB with one decimal and no space, as the
// startup line writes GOMEMLIMIT: "318.5MiB".
func MiBCompact(b int64) string { return mib(b) + "MiB" }

func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }

// MiBOrNone writes b as MiBCompact does, or "none" for math.MaxInt64.
func MiBOrNone(b int64) string {
	if b == math.MaxInt64 {
		return "none"
	}
	return MiBCompact(b)
}

// BytesOrNone writes b in bytes, or "none" for math.MaxInt64.
func BytesOrNone(b int64) string {
	if b == math.MaxInt64 {
		return "none"
	}
	return strconv.FormatInt(b, 10)
}

// Size writes *n as "N bytes" under 1 KiB, else as "N bytes (1.5 MiB)" in
// the largest binary unit up to EiB; "unknown" for nil.
func Size(n *int64) string {
	if n == nil {
		return Unknown
	}
	b := *n
	if b < 1024 {
		return strconv.FormatInt(b, 10) + " bytes"
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	f, i := float64(b)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return fmt.Sprintf("%d bytes (%.1f %s)", b, f, units[i])
}
