package plot

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Read parses an SVG written by WriteSVG and returns the data drawn: the
// title, series (finite points), lines and marks, in order; sizes and axis
// labels are not read back. Input that is not XML or a bad attribute is an
// error; unknown elements are skipped.
func Read(r io.Reader) (Chart, error) {
	var c Chart
	d := xml.NewDecoder(r)
	inTitle := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return c, nil
		}
		if err != nil {
			return c, fmt.Errorf("plot: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			inTitle = t.Name.Local == "title"
			if err := c.readElement(t); err != nil {
				return c, err
			}
		case xml.CharData:
			if inTitle {
				c.Title += string(t)
			}
		case xml.EndElement:
			inTitle = false
		}
	}
}

// readElement adds the series, line or mark that e holds, if any.
func (c *Chart) readElement(e xml.StartElement) error {
	attr := func(name string) string {
		for _, a := range e.Attr {
			if a.Name.Local == name {
				return a.Value
			}
		}
		return ""
	}
	var err error
	switch attr("class") {
	case "series":
		s := Series{Name: attr("data-name")}
		s.Points, err = ParsePoints(attr("data-points"))
		c.Series = append(c.Series, s)
	case "line":
		l := Line{Label: attr("data-label")}
		l.Y, err = strconv.ParseFloat(attr("data-y"), 64)
		c.Lines = append(c.Lines, l)
	case "mark":
		m := Mark{Label: attr("data-label")}
		m.X, err = strconv.ParseFloat(attr("data-x"), 64)
		c.Marks = append(c.Marks, m)
	}
	if err != nil {
		return fmt.Errorf("plot: %s element: %w", attr("class"), err)
	}
	return nil
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
