package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"
)

// Encode returns r as the record's JSON text, with Version set. When the
// text would be longer than MaxSize, the last pools and then the last C
// heaps are left out (counted in PoolsOmitted and CHeapsOmitted) until it
// fits; a record that does not fit even then is an error.
func Encode(r *Record) ([]byte, error) {
	r.Version = Version
	for {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		if len(b) <= MaxSize {
			return b, nil
		}
		switch {
		case len(r.Pools) > 0:
			r.Pools = r.Pools[:len(r.Pools)-1]
			r.PoolsOmitted++
		case len(r.CHeaps) > 0:
			r.CHeaps = r.CHeaps[:len(r.CHeaps)-1]
			r.CHeapsOmitted++
		default:
			return nil, fmt.Errorf("state: record of %d bytes, more than %d", len(b), MaxSize)
		}
	}
}

// Cut returns s cut to at most MaxString bytes at a rune boundary, the cut
// one ending with "...".
func Cut(s string) string {
	if len(s) <= MaxString {
		return s
	}
	n := MaxString - len("...")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}

// ErrVersion is matched by the error of Parse for a record of a version
// this package does not read.
var ErrVersion = errors.New("unknown record version")

// Parse parses a record read from another process. It rejects the whole
// record on anything but one JSON object of the known types, longer than
// MaxSize, a version other than Version (ErrVersion), no pid or publication
// time, more than MaxPools pools or MaxCHeaps C heaps, a negative size,
// count or duration, or a pool's Peaks that disagree. Unknown keys are
// ignored. Strings are as the process wrote them: quote them when shown.
func Parse(b []byte) (*Record, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("record of %d bytes, more than %d", len(b), MaxSize)
	}
	// The version first, so another version is named as such.
	var v struct {
		Version json.RawMessage `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	if string(v.Version) != "1" {
		n := string(v.Version)
		if len(n) > 20 {
			n = n[:20] + "..."
		}
		if n == "" {
			n = "missing"
		}
		return nil, fmt.Errorf("record: %w %q (this memctl reads version %d)", ErrVersion, n, Version)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	if len(r.Pools) > MaxPools {
		return nil, fmt.Errorf("record: %d pools, more than %d", len(r.Pools), MaxPools)
	}
	if len(r.CHeaps) > MaxCHeaps {
		return nil, fmt.Errorf("record: %d c_heaps, more than %d", len(r.CHeaps), MaxCHeaps)
	}
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	return &r, nil
}

// check returns an error naming the first field, in record order, whose
// value no library writes: a negative size, count or duration, a ratio
// outside [0, 1], or a pool's peaks whose figures do not agree.
func (r *Record) check() error {
	if r.PID <= 0 || r.Updated.IsZero() {
		return fmt.Errorf("pid %d, updated %s: not a published record (both are set by Publish)",
			r.PID, r.Updated.Format(time.RFC3339))
	}
	return checkFields("", reflect.ValueOf(r).Elem())
}

// checkFields checks each field of the struct v, named by its JSON key
// after prefix.
func checkFields(prefix string, v reflect.Value) error {
	for i := range v.NumField() {
		key, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		if err := checkValue(prefix+key, v.Field(i)); err != nil {
			return err
		}
	}
	return nil
}

// checkValue checks the field name of value f by its kind and name.
func checkValue(name string, f reflect.Value) error {
	switch {
	case f.Kind() == reflect.Pointer && !f.IsNil():
		return checkValue(name, f.Elem())
	case f.Type() == reflect.TypeFor[Peaks]():
		p := f.Interface().(Peaks)
		if err := p.check(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	case f.Kind() == reflect.Struct && f.Type() != reflect.TypeFor[time.Time]():
		return checkFields(name+".", f)
	case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Struct:
		for i := range f.Len() {
			if err := checkFields(fmt.Sprintf("%s[%d].", name, i), f.Index(i)); err != nil {
				return err
			}
		}
	case f.CanInt():
		n := f.Int()
		switch {
		case name == "swap.cgroup_version" && (n < 0 || n > 2):
			return fmt.Errorf("%s %d is not 0, 1 or 2", name, n)
		case strings.HasSuffix(name, ".retained_bytes"): // -1: unknown
			if n < -1 {
				return fmt.Errorf("%s %d is neither a size nor -1", name, n)
			}
		case n < 0:
			return fmt.Errorf("%s %d is negative", name, n)
		}
	case f.CanFloat():
		x := f.Float()
		if name == "gomemlimit.ratio" && !(x >= 0 && x <= 1) {
			return fmt.Errorf("%s %v is not in [0, 1]", name, x)
		}
		if strings.HasSuffix(name, "_seconds") && !(x >= 0 && x < 1e9) {
			return fmt.Errorf("%s %v is not a duration", name, x)
		}
	}
	return nil
}

// check returns an error unless h.Counts has PeakCounts non-negative
// entries summing to Count and the quantiles are their buckets' bounds.
func (h *Peaks) check() error {
	if h.Count < 0 {
		return fmt.Errorf("count %d is negative", h.Count)
	}
	if h.Count == 0 {
		if len(h.Counts) > 0 || h.P50Bytes != 0 || h.P99Bytes != 0 || h.MaxBytes != 0 {
			return errors.New("no peaks recorded, but counts or quantiles given")
		}
		return nil
	}
	if len(h.Counts) != PeakCounts {
		return fmt.Errorf("%d counts, want %d", len(h.Counts), PeakCounts)
	}
	var sum int64
	for i, c := range h.Counts {
		if c < 0 || sum > math.MaxInt64-c {
			return fmt.Errorf("counts[%d] %d is negative or overflows", i, c)
		}
		sum += c
	}
	if sum != h.Count {
		return fmt.Errorf("counts sum to %d, not count %d", sum, h.Count)
	}
	want := h.quantiles()
	for _, q := range []struct {
		name      string
		got, want int64
	}{{"p50_bytes", h.P50Bytes, want[0]}, {"p99_bytes", h.P99Bytes, want[1]}, {"max_bytes", h.MaxBytes, want[2]}} {
		if q.got != q.want {
			return fmt.Errorf("%s %d is not %d, the bound of its bucket", q.name, q.got, q.want)
		}
	}
	return nil
}

// quantiles returns the bucket bounds of the median, p99 and max of
// h.Counts, by limits.PeakHistogram.Quantile's rule.
func (h *Peaks) quantiles() [3]int64 {
	var out [3]int64
	for j, q := range []float64{0.5, 0.99, 1} {
		want := int64(math.Ceil(q * float64(h.Count)))
		var n int64
		for i, c := range h.Counts {
			if n += c; n >= want && n > 0 {
				out[j] = PeakBound(i)
				break
			}
		}
	}
	return out
}

// Set fills h from a histogram's counts (len PeakCounts) and the
// quantiles that Parse checks; it is what Publish writes.
func (h *Peaks) Set(counts []int64) {
	*h = Peaks{}
	for _, c := range counts {
		h.Count += c
	}
	if h.Count == 0 {
		return
	}
	h.Counts = counts
	q := h.quantiles()
	h.P50Bytes, h.P99Bytes, h.MaxBytes = q[0], q[1], q[2]
}

// now is time.Now; tests replace it.
var now = time.Now
