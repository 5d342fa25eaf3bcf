// Package satmath is saturating int64 arithmetic: a result past the int64
// range is clamped to math.MaxInt64 or math.MinInt64 instead of wrapping.
package satmath

import "math"

// Add returns a+b, saturating at math.MaxInt64 and math.MinInt64.
func Add(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}
