package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// unit is a figure's unit: values are in the base unit String names,
// rendered as each constant's comment says.
type unit int

const (
	unitBytes    unit = iota // MiB, rounded, thousands separated: "1,055"
	unitSeconds              // "2.1 s", "> 30 s"
	unitLatency              // seconds, rendered "85 µs", "1.2 ms"
	unitCount                // "28"
	unitFraction             // a share in [0, 1], rendered "0.41%"
	unitRate                 // per second, rendered "12,345"
	unitRatio                // "0.987"
)

// unitNames are the base units' names as written in the JSON output.
var unitNames = []string{"bytes", "seconds", "seconds", "count", "fraction", "per second", "ratio"}

func (u unit) String() string {
	if u >= 0 && int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unit(" + strconv.Itoa(int(u)) + ")"
}

// MarshalText writes the unit's name.
func (u unit) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// formatValue renders v (in the base unit u) for a table cell.
func formatValue(u unit, v float64) string {
	switch u {
	case unitBytes:
		return thousands(math.Round(v / (1 << 20)))
	case unitSeconds:
		return trimZero(strconv.FormatFloat(v, 'f', 1, 64)) + " s"
	case unitLatency:
		switch {
		case v < 1e-3:
			return strconv.FormatFloat(v*1e6, 'f', 0, 64) + " µs"
		case v < 1:
			return strconv.FormatFloat(v*1e3, 'f', 1, 64) + " ms"
		}
		return strconv.FormatFloat(v, 'f', 2, 64) + " s"
	case unitCount:
		return trimZero(strconv.FormatFloat(v, 'f', 1, 64))
	case unitFraction:
		return strconv.FormatFloat(v*100, 'f', 2, 64) + "%"
	case unitRate:
		return thousands(math.Round(v))
	case unitRatio:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// formatObs renders one observation: "> T" for Over, "–" for NA.
func formatObs(u unit, o Obs) string {
	switch {
	case o.NA:
		return "–"
	case o.Over:
		return "> " + formatValue(u, o.Value)
	}
	return formatValue(u, o.Value)
}

// formatCell renders "median (min – max)", or the median alone when min
// and max render the same.
func formatCell(u unit, s Summary) string {
	med := formatObs(u, s.Median)
	if s.N() <= 1 {
		return med
	}
	lo, hi := formatObs(u, s.Min), formatObs(u, s.Max)
	if lo == hi {
		return med
	}
	return fmt.Sprintf("%s (%s – %s)", med, lo, hi)
}

// thousands renders an integral v with comma thousands separators.
func thousands(v float64) string {
	s := strconv.FormatFloat(math.Abs(v), 'f', 0, 64)
	var b strings.Builder
	if v < 0 && s != "0" {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// trimZero drops a trailing ".0".
func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }

// UnmarshalText accepts any name: readReport sets the unit ("seconds"
// names two).
func (u *unit) UnmarshalText([]byte) error { return nil }

// secs renders a duration in seconds as the tables do: "30 s", "2.1 s".
func secs(d time.Duration) string { return formatValue(unitSeconds, d.Seconds()) }
