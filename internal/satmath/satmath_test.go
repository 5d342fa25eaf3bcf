package satmath

import (
	"math"
	"testing"
)

// TestAdd: each bound just short of, at, and past it, both signs, and
// sums whose operands have opposite signs (which never overflow).
func TestAdd(t *testing.T) {
	const maxI, minI = math.MaxInt64, math.MinInt64
	for _, tc := range []struct {
		name       string
		a, b, want int64
	}{
		{"small", 2, 3, 5},
		{"zero", 0, 0, 0},
		{"just below math.MaxInt64", maxI - 2, 1, maxI - 1},
		{"at math.MaxInt64", maxI - 1, 1, maxI},
		{"just past math.MaxInt64", maxI - 1, 2, maxI},
		{"far past math.MaxInt64", maxI, maxI, maxI},
		{"past math.MaxInt64, operands swapped", 2, maxI - 1, maxI},
		{"just above math.MinInt64", minI + 2, -1, minI + 1},
		{"at math.MinInt64", minI + 1, -1, minI},
		{"just past math.MinInt64", minI + 1, -2, minI},
		{"far past math.MinInt64", minI, minI, minI},
		{"past math.MinInt64, operands swapped", -2, minI + 1, minI},
		{"opposite signs at the bounds", maxI, minI, -1},
		{"math.MaxInt64 less 1", maxI, -1, maxI - 1},
		{"math.MinInt64 plus 1", minI, 1, minI + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Add(tc.a, tc.b); got != tc.want {
				t.Errorf("Add(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
			}
		})
	}
}
