package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNiceStep(t *testing.T) {
	for _, tc := range []struct{ raw, want float64 }{
		{1, 1}, {1.2, 2}, {2, 2}, {2.1, 5}, {5, 5}, {5.1, 10}, {7, 10},
		{0.03, 0.05}, {0.3, 0.5}, {110, 200}, {108.4, 200}, {1e6, 1e6},
	} {
		assert.InDelta(t, tc.want, niceStep(tc.raw), tc.want*1e-12, "niceStep(%v)", tc.raw)
	}
}

func TestAxis(t *testing.T) {
	for _, tc := range []struct {
		name           string
		lo, hi         float64
		wantLo, wantHi float64
		labels         string
	}{
		{"MiB from 0", 0, 542, 0, 600, "0 200 400 600"},
		{"seconds around 0", -1.7, 5.6, -2, 6, "-2 0 2 4 6"},
		{"fractions", 0, 0.9, 0, 1, "0.0 0.2 0.4 0.6 0.8 1.0"},
		{"tenths", 0.1, 0.33, 0.1, 0.35, "0.10 0.15 0.20 0.25 0.30 0.35"},
		{"one value", 3, 3, 2, 4, "2.0 2.5 3.0 3.5 4.0"},
		{"large", 1e9, 3e9, 1e9, 3e9, "1000000000 1500000000 2000000000 2500000000 3000000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAxis(tc.lo, tc.hi, 100, 500)
			assert.InDelta(t, tc.wantLo, a.lo, 1e-9)
			assert.InDelta(t, tc.wantHi, a.hi, 1e-9)
			var labels []string
			for _, v := range a.ticks() {
				labels = append(labels, a.label(v))
			}
			assert.Equal(t, tc.labels, strings.Join(labels, " "))
			assert.InDelta(t, 100, a.px(a.lo), 1e-9)
			assert.InDelta(t, 500, a.px(a.hi), 1e-9)
			assert.InDelta(t, 300, a.px((a.lo+a.hi)/2), 1e-9)
		})
	}
}

// TestYAxisDown checks that Y grows upward: a larger value is drawn higher.
func TestYAxisDown(t *testing.T) {
	a := newAxis(0, 100, 300, 40)
	assert.Less(t, a.px(80), a.px(20))
	assert.InDelta(t, 300, a.px(0), 1e-9)
}

func chart() Chart {
	return Chart{
		Title:  "RSS after a burst",
		XLabel: "seconds after the burst",
		YLabel: "RSS (MiB)",
		Series: []Series{
			{Name: "plain", Points: []Point{{-1.5, 27.25}, {0, 542}, {1, 542.125}, {4, 541.9}}},
			{Name: "memctl", Points: []Point{{-1.5, 28}, {0, 544}, {2.0625, 31.5}, {4, 32}}},
		},
		Lines: []Line{{Label: "GOMEMLIMIT", Y: 921.6}},
		Marks: []Mark{{Label: "burst ends", X: 0}, {Label: "trim", X: 2.0625}},
	}
}

func TestRoundTrip(t *testing.T) {
	c := chart()
	var b bytes.Buffer
	require.NoError(t, c.WriteSVG(&b))
	got, err := Read(&b)
	require.NoError(t, err)
	assert.Equal(t, c.Title, got.Title)
	assert.Equal(t, c.Series, got.Series)
	assert.Equal(t, c.Lines, got.Lines)
	assert.Equal(t, c.Marks, got.Marks)
}

func TestDeterministic(t *testing.T) {
	c := chart()
	var a, b bytes.Buffer
	require.NoError(t, c.WriteSVG(&a))
	require.NoError(t, c.WriteSVG(&b))
	assert.Equal(t, a.String(), b.String())
}

// TestNonFinite checks that NaN and infinite values are left out and do not
// spoil the scale.
func TestNonFinite(t *testing.T) {
	c := Chart{
		Series: []Series{{Name: "s", Points: []Point{{0, 1}, {math.NaN(), 2}, {1, math.Inf(1)}, {2, 3}}}},
		Lines:  []Line{{Label: "nan", Y: math.NaN()}},
		Marks:  []Mark{{Label: "inf", X: math.Inf(-1)}},
	}
	var b bytes.Buffer
	require.NoError(t, c.WriteSVG(&b))
	assert.NotContains(t, b.String(), "NaN")
	assert.NotContains(t, b.String(), "Inf")
	got, err := Read(&b)
	require.NoError(t, err)
	assert.Equal(t, []Point{{0, 1}, {2, 3}}, got.Series[0].Points)
	assert.Empty(t, got.Lines)
	assert.Empty(t, got.Marks)
}

func TestEmpty(t *testing.T) {
	var c Chart
	var b bytes.Buffer
	require.NoError(t, c.WriteSVG(&b))
	assert.Contains(t, b.String(), `width="720" height="360"`)
	_, err := Read(&b)
	require.NoError(t, err)
}

// TestEscaping draws hostile strings in every place a string goes and checks
// that the output is one inert SVG element whose data read back unchanged.
func TestEscaping(t *testing.T) {
	for _, s := range []string{
		`</svg><script>alert(1)</script>`,
		`" onload="alert(1)`,
		`' onmouseover='alert(1)`,
		`<![CDATA[x]]>&amp;&lt;`,
		"line\nbreak\ttab",
		"<!-- -->",
	} {
		t.Run(s, func(t *testing.T) {
			c := Chart{
				Title: s, XLabel: s, YLabel: s,
				Series: []Series{{Name: s, Points: []Point{{0, 1}, {1, 2}}}},
				Lines:  []Line{{Label: s, Y: 1.5}},
				Marks:  []Mark{{Label: s, X: 0.5}},
			}
			var b bytes.Buffer
			require.NoError(t, c.WriteSVG(&b))
			out := b.String()
			assert.NotContains(t, out, "<script")
			assert.NotContains(t, out, "<!")
			assert.Subset(t, []string{"svg", "title", "rect", "text", "g", "line", "polyline"}, elementNames(t, out))
			got, err := Read(strings.NewReader(out))
			require.NoError(t, err)
			assert.Equal(t, s, got.Title)
			assert.Equal(t, s, got.Series[0].Name)
			assert.Equal(t, s, got.Lines[0].Label)
			assert.Equal(t, s, got.Marks[0].Label)
		})
	}
}

// TestInvalidCharacters checks that characters XML cannot hold are replaced,
// so that the document stays well formed.
func TestInvalidCharacters(t *testing.T) {
	c := Chart{Series: []Series{{Name: "a\x00b\x1b[31m"}}}
	var b bytes.Buffer
	require.NoError(t, c.WriteSVG(&b))
	got, err := Read(&b)
	require.NoError(t, err)
	assert.Equal(t, "a\uFFFDb\uFFFD[31m", got.Series[0].Name)
}

func TestReadErrors(t *testing.T) {
	for _, in := range []string{
		`<svg><g class="series" data-points="1,x"/></svg>`,
		`<svg><g class="series" data-points="1"/></svg>`,
		`<svg><g class="mark" data-x=""/></svg>`,
		`<svg><g class="line"`,
	} {
		_, err := Read(strings.NewReader(in))
		assert.Error(t, err, in)
	}
}

// elementNames returns the distinct element names in an XML document, in
// the order first seen, and checks that it has one root.
func elementNames(t *testing.T, doc string) []string {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(doc))
	var names []string
	seen := map[string]bool{}
	depth, roots := 0, 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch e := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				roots++
			}
			depth++
			if !seen[e.Name.Local] {
				seen[e.Name.Local] = true
				names = append(names, e.Name.Local)
			}
		case xml.EndElement:
			depth--
		}
	}
	assert.Equal(t, 1, roots)
	return names
}
