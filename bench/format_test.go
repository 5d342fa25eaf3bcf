package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		u    unit
		v    float64
		want string
	}{
		{unitBytes, 1055 << 20, "1,055"},
		{unitBytes, 27.4 * (1 << 20), "27"},
		{unitBytes, 1234567 << 20, "1,234,567"},
		{unitBytes, 0, "0"},
		{unitSeconds, 2.1, "2.1 s"},
		{unitSeconds, 2.149, "2.1 s"},
		{unitSeconds, 30, "30 s"},
		{unitLatency, 85e-6, "85 µs"},
		{unitLatency, 1.24e-3, "1.2 ms"},
		{unitLatency, 2.5, "2.50 s"},
		{unitCount, 28, "28"},
		{unitCount, 27.5, "27.5"},
		{unitFraction, 0.0041, "0.41%"},
		{unitFraction, 0, "0.00%"},
		{unitRate, 12345.6, "12,346"},
		{unitRatio, 0.98712, "0.987"},
	} {
		assert.Equal(t, tc.want, formatValue(tc.u, tc.v), "%v %v", tc.u, tc.v)
	}
}

func TestFormatObs(t *testing.T) {
	assert.Equal(t, "> 30 s", formatObs(unitSeconds, over(30)), `"> T" when the window ends first`)
	assert.Equal(t, "> 3.5 s", formatObs(unitSeconds, over(3.5)))
	assert.Equal(t, "2.1 s", formatObs(unitSeconds, v(2.1)))
	assert.Equal(t, "–", formatObs(unitBytes, na))
}

func TestFormatCell(t *testing.T) {
	const mib = 1 << 20
	assert.Equal(t, "27", formatCell(unitBytes, summarize([]Obs{v(27 * mib)})), "one run: the median alone")
	assert.Equal(t, "27 (26 – 29)", formatCell(unitBytes, summarize([]Obs{v(26 * mib), v(27 * mib), v(29 * mib), v(27 * mib), v(28 * mib)})))
	assert.Equal(t, "27", formatCell(unitBytes, summarize([]Obs{v(27 * mib), v(27.2 * mib), v(26.9 * mib)})), "min and max render as the median")
	assert.Equal(t, "> 30 s", formatCell(unitSeconds, summarize([]Obs{over(30), over(30), over(30)})))
	assert.Equal(t, "> 30 s (2.1 s – > 30 s)", formatCell(unitSeconds, summarize([]Obs{over(30), v(2.1), over(30)})))
	assert.Equal(t, "–", formatCell(unitBytes, summarize([]Obs{na, na})))
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 12345: "12,345", 1e9: "1,000,000,000", -1234: "-1,234"} {
		assert.Equal(t, want, thousands(v))
	}
}

func TestUnitString(t *testing.T) {
	assert.Equal(t, "bytes", unitBytes.String())
	assert.Equal(t, "seconds", unitLatency.String())
	assert.Equal(t, "per second", unitRate.String())
	assert.Equal(t, "unit(99)", unit(99).String())
}
