// Package plot draws line charts of time series as self-contained SVG:
// named series of (X, Y) points, horizontal reference lines, labelled
// vertical marks, axes with ticks and a legend.
//
// The same Chart gives the same bytes. The output refers to no script,
// style sheet, font or image, and every string is escaped. The data are
// written beside the drawing as data- attributes, which Read gives back.
package plot

import (
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Point is one sample: X is usually seconds, Y a value in the chart's unit.
type Point struct{ X, Y float64 }

// Series is a named line.
type Series struct {
	Name   string
	Points []Point // drawn in this order; points with a NaN or an infinity are left out
}

// Line is a horizontal reference line at Y (a limit).
type Line struct {
	Label string
	Y     float64
}

// Mark is a vertical line at X (an event) with its label at the top.
type Mark struct {
	Label string
	X     float64
}

// Chart is what WriteSVG draws. The zero value is an empty 720x360 chart.
type Chart struct {
	Title          string
	XLabel, YLabel string // the axes' names with their units: "seconds", "RSS (MiB)"
	Width, Height  int    // pixels; Default: 720 and 360
	Series         []Series
	Lines          []Line
	Marks          []Mark
}

// palette holds the series' colours, reused in turn past the last.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

const (
	marginLeft, marginRight = 64, 24
	marginTop, marginBottom = 40, 72 // the bottom holds the ticks, the X label and the legend
	fontSize                = 12
	charWidth               = 7 // an estimate of a character's width at fontSize, for the legend
)

// WriteSVG writes the chart as one SVG document. The axes span the data,
// the lines and the marks, widened to round ticks; the Y axis starts at 0
// unless a value is negative. It returns the first error from w.
func (c *Chart) WriteSVG(w io.Writer) error {
	width, height := c.Width, c.Height
	if width <= 0 {
		width = 720
	}
	if height <= 0 {
		height = 360
	}
	xs, ys := c.extent()
	xt := newAxis(xs[0], xs[1], marginLeft, float64(width-marginRight))
	yt := newAxis(min(ys[0], 0), ys[1], float64(height-marginBottom), marginTop)

	b := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n",
		width, height, width, height, fontSize)
	p(`<title>%s</title>`+"\n", esc(c.Title))
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="20" font-size="14">%s</text>`+"\n", marginLeft, esc(c.Title))
	c.writeAxes(p, xt, yt, height)
	for _, m := range c.Marks {
		if !finite(m.X) {
			continue
		}
		x := num(xt.px(m.X))
		p(`<g class="mark" data-label="%s" data-x="%s"><line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#555" stroke-dasharray="2 3"/><text x="%s" y="%s" text-anchor="middle" fill="#555">%s</text></g>`+"\n",
			esc(m.Label), data(m.X), x, num(yt.p1), x, num(yt.p0), x, num(yt.p1-4), esc(m.Label))
	}
	for _, l := range c.Lines {
		if !finite(l.Y) {
			continue
		}
		y := num(yt.px(l.Y))
		p(`<g class="line" data-label="%s" data-y="%s"><line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#000" stroke-dasharray="6 4"/><text x="%s" y="%s" text-anchor="end">%s</text></g>`+"\n",
			esc(l.Label), data(l.Y), num(xt.p0), y, num(xt.p1), y, num(xt.p1-4), num(yt.px(l.Y)-4), esc(l.Label))
	}
	for i, s := range c.Series {
		pts := slices.DeleteFunc(slices.Clone(s.Points), func(pt Point) bool { return !finite(pt.X) || !finite(pt.Y) })
		var px []string
		for _, pt := range pts {
			px = append(px, num(xt.px(pt.X))+","+num(yt.px(pt.Y)))
		}
		p(`<g class="series" data-name="%s" data-points="%s"><polyline fill="none" stroke="%s" stroke-width="2" points="%s"/></g>`+"\n",
			esc(s.Name), FormatPoints(pts), palette[i%len(palette)], strings.Join(px, " "))
	}
	c.writeLegend(p, height)
	p("</svg>\n")
	return b.Flush()
}

// WriteFile writes the chart as SVG to the file at path, replacing it.
func (c *Chart) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// FormatPoints writes points as "x,y x,y ...", each number in the fewest
// digits that ParsePoints reads back exactly.
func FormatPoints(pts []Point) string {
	var b strings.Builder
	for i, pt := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(data(pt.X) + "," + data(pt.Y))
	}
	return b.String()
}

// writeAxes draws the frame, the ticks with their labels and the axes' names.
func (c *Chart) writeAxes(p func(string, ...any), xt, yt axis, height int) {
	p(`<g class="axes" stroke="#999">`)
	p(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`, num(xt.p0), num(yt.p0), num(xt.p1), num(yt.p0))
	p(`<line x1="%s" y1="%s" x2="%s" y2="%s"/></g>`+"\n", num(xt.p0), num(yt.p0), num(xt.p0), num(yt.p1))
	for _, v := range xt.ticks() {
		x := num(xt.px(v))
		p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#999"/><text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n",
			x, num(yt.p0), x, num(yt.p0+4), x, num(yt.p0+16), xt.label(v))
	}
	for _, v := range yt.ticks() {
		y := num(yt.px(v))
		p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#eee"/><text x="%s" y="%s" text-anchor="end">%s</text>`+"\n",
			num(xt.p0), y, num(xt.p1), y, num(xt.p0-6), num(yt.px(v)+4), yt.label(v))
	}
	p(`<text x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", num((xt.p0+xt.p1)/2), height-marginBottom+34, esc(c.XLabel))
	p(`<text transform="translate(16 %s) rotate(-90)" text-anchor="middle">%s</text>`+"\n", num((yt.p0+yt.p1)/2), esc(c.YLabel))
}

// writeLegend draws the series and reference lines under the X axis.
func (c *Chart) writeLegend(p func(string, ...any), height int) {
	x, y := marginLeft, height-14
	p(`<g class="legend">`)
	item := func(stroke, dash, label string) {
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d">%s</text>`,
			x, y-4, x+20, y-4, stroke, dash, x+26, y, esc(label))
		x += 26 + charWidth*len([]rune(label)) + 16
	}
	for i, s := range c.Series {
		item(palette[i%len(palette)], "", s.Name)
	}
	for _, l := range c.Lines {
		item("#000", ` stroke-dasharray="6 4"`, l.Label)
	}
	p("</g>\n")
}

// extent returns the finite data's X and Y ranges; [0, 1] where none.
func (c *Chart) extent() (xs, ys [2]float64) {
	var xv, yv []float64
	for _, s := range c.Series {
		for _, pt := range s.Points {
			if finite(pt.X) && finite(pt.Y) {
				xv, yv = append(xv, pt.X), append(yv, pt.Y)
			}
		}
	}
	for _, l := range c.Lines {
		yv = append(yv, l.Y)
	}
	for _, m := range c.Marks {
		xv = append(xv, m.X)
	}
	return finiteRange(xv), finiteRange(yv)
}

// finiteRange returns the least and greatest finite v; [0, 1] where none.
func finiteRange(v []float64) [2]float64 {
	v = slices.DeleteFunc(v, func(x float64) bool { return !finite(x) })
	if len(v) == 0 {
		return [2]float64{0, 1}
	}
	return [2]float64{slices.Min(v), slices.Max(v)}
}

// axis maps values in [lo, hi] to pixels in [p0, p1]; step is its tick step.
type axis struct{ lo, hi, p0, p1, step float64 }

// newAxis returns an axis over at least [lo, hi], widened to whole round
// steps (niceStep) giving about 5 ticks.
func newAxis(lo, hi, p0, p1 float64) axis {
	if hi <= lo {
		lo, hi = lo-1, hi+1
	}
	step := niceStep((hi - lo) / 5)
	return axis{math.Floor(lo/step) * step, math.Ceil(hi/step) * step, p0, p1, step}
}

// niceStep returns the least 1, 2 or 5 × 10^k at least raw (> 0, finite).
func niceStep(raw float64) float64 {
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, f := range []float64{1, 2, 5} {
		if raw <= f*mag*(1+1e-9) {
			return f * mag
		}
	}
	return 10 * mag
}

func (a axis) px(v float64) float64 { return a.p0 + (v-a.lo)/(a.hi-a.lo)*(a.p1-a.p0) }

// ticks returns the tick values from lo to hi, one step apart.
func (a axis) ticks() []float64 {
	n := int(math.Round((a.hi - a.lo) / a.step))
	t := make([]float64, 0, n+1)
	for i := 0; i <= n; i++ {
		t = append(t, a.lo+float64(i)*a.step)
	}
	return t
}

// label formats a tick value with as many decimals as the step needs.
func (a axis) label(v float64) string {
	d := max(0, int(math.Ceil(-math.Log10(a.step)-1e-9)))
	s := strconv.FormatFloat(v, 'f', d, 64)
	if strings.TrimLeft(s, "-0.") == "" {
		return strings.TrimPrefix(s, "-") // no "-0"
	}
	return s
}

// esc escapes s for XML; characters XML cannot hold become U+FFFD.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder never fails
	return b.String()
}

// num formats a pixel coordinate; data a value ParseFloat gives back exactly.
func num(v float64) string  { return strconv.FormatFloat(v, 'f', 1, 64) }
func data(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// Read parses an SVG written by WriteSVG and returns the data drawn: the
// title, series (finite points), lines and marks, in order; sizes and axis
// labels are not read back. Input that is not XML or a bad attribute is an
// error; unknown elements are skipped.
func Read(r io.Reader) (Chart, error) {
	var doc struct {
		Title string `xml:"title"`
		G     []struct {
			Class  string `xml:"class,attr"`
			Name   string `xml:"data-name,attr"`
			Points string `xml:"data-points,attr"`
			Label  string `xml:"data-label,attr"`
			X      string `xml:"data-x,attr"`
			Y      string `xml:"data-y,attr"`
		} `xml:"g"`
	}
	c := Chart{}
	if err := xml.NewDecoder(r).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("plot: %w", err)
	}
	c.Title = doc.Title
	for _, g := range doc.G {
		var err error
		switch g.Class {
		case "series":
			s := Series{Name: g.Name}
			s.Points, err = ParsePoints(g.Points)
			c.Series = append(c.Series, s)
		case "line":
			l := Line{Label: g.Label}
			l.Y, err = strconv.ParseFloat(g.Y, 64)
			c.Lines = append(c.Lines, l)
		case "mark":
			m := Mark{Label: g.Label}
			m.X, err = strconv.ParseFloat(g.X, 64)
			c.Marks = append(c.Marks, m)
		}
		if err != nil {
			return c, fmt.Errorf("plot: %s element: %w", g.Class, err)
		}
	}
	return c, nil
}

// ParsePoints parses what FormatPoints writes.
func ParsePoints(s string) ([]Point, error) {
	var pts []Point
	for _, f := range strings.Fields(s) {
		xs, ys, ok := strings.Cut(f, ",")
		x, err1 := strconv.ParseFloat(xs, 64)
		y, err2 := strconv.ParseFloat(ys, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("point %q: want x,y", f)
		}
		pts = append(pts, Point{x, y})
	}
	return pts, nil
}
