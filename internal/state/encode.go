package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// Parse parses a record read from another process. Anything but one JSON
// object of the known types is an error, and so is a record longer than
// MaxSize, a version other than Version (ErrVersion), one without a pid
// and a publication time, more than MaxPools pools or MaxCHeaps C heaps, a
// negative size or count, a duration that is negative or not a number, or
// a pool's Peaks whose counts, count and quantiles disagree: the whole
// record is rejected, never shown in part. Unknown keys
// are ignored. The strings are as the process wrote them (any bytes that
// JSON can carry): quote them when showing them.
func Parse(b []byte) (*Record, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("record of %d bytes, more than %d", len(b), MaxSize)
	}
	// Read the version first, so that a record of another version is
	// named as such rather than by its first type error.
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

// check returns an error naming the first field whose value no library
// writes: a negative size, count or duration, a ratio outside [0, 1], or a
// pool's peaks whose figures do not agree with each other.
func (r *Record) check() error {
	var errs []error
	neg := func(name string, n int64) {
		if n < 0 {
			errs = append(errs, fmt.Errorf("%s %d is negative", name, n))
		}
	}
	secs := func(name string, f float64) {
		if !(f >= 0 && f < 1e9) {
			errs = append(errs, fmt.Errorf("%s %v is not a duration", name, f))
		}
	}
	type field struct {
		name string
		n    int64
	}
	negs := func(prefix string, fs ...field) {
		for _, f := range fs {
			neg(prefix+f.name, f.n)
		}
	}
	// What Publish (and memctl.Handler's page) always writes.
	if r.PID <= 0 || r.Updated.IsZero() {
		errs = append(errs, fmt.Errorf("pid %d, updated %s: not a published record (both are set by Publish)",
			r.PID, r.Updated.Format(time.RFC3339)))
	}
	neg("seq", r.Seq)
	g, t, p, a := r.GoMemLimit, r.Trim, r.Pressure, r.AutoBurst
	negs("", field{"pools_omitted", int64(r.PoolsOmitted)}, field{"c_heaps_omitted", int64(r.CHeapsOmitted)})
	negs("gomemlimit.", field{"memory_limit_bytes", g.MemoryLimitBytes}, field{"outside_bytes", g.OutsideBytes},
		field{"reclaimable_bytes", g.ReclaimableBytes})
	if g.OperatorBytes != nil {
		neg("gomemlimit.operator_bytes", *g.OperatorBytes)
	}
	secs("gomemlimit.refresh_seconds", g.RefreshSeconds)
	if g.Bytes != nil {
		neg("gomemlimit.bytes", *g.Bytes)
	}
	if !(g.Ratio >= 0 && g.Ratio <= 1) {
		errs = append(errs, fmt.Errorf("gomemlimit.ratio %v is not in [0, 1]", g.Ratio))
	}
	negs("trim.", field{"trims", t.Trims}, field{"skipped", t.Skipped}, field{"go_skipped", t.GoSkipped},
		field{"c_skipped", t.CSkipped}, field{"released_bytes", t.ReleasedBytes},
		field{"last_released_bytes", t.LastReleasedBytes}, field{"deferred", t.Deferred},
		field{"early_starts", t.EarlyStarts})
	secs("trim.delay_seconds", t.DelaySeconds)
	secs("trim.cpu_seconds", t.CPUSeconds)
	for _, o := range []struct {
		name string
		o    Origin
	}{{"debounced", t.Origins.Debounced}, {"pressure", t.Origins.Pressure}, {"spiral", t.Origins.Spiral}, {"by_name", t.Origins.ByName}} {
		prefix := "trim.origins." + o.name + "."
		negs(prefix, field{"trims", o.o.Trims}, field{"skipped", o.o.Skipped}, field{"released_bytes", o.o.ReleasedBytes})
		secs(prefix+"cpu_seconds", o.o.CPUSeconds)
	}
	negs("trim.skipped_by.", field{"min_release", t.SkippedBy.MinRelease}, field{"cost", t.SkippedBy.Cost},
		field{"budget", t.SkippedBy.Budget}, field{"running", t.SkippedBy.Running})
	negs("pressure.", field{"signals", p.Signals}, field{"acted", p.Acted}, field{"left_to_kernel", p.LeftToKernel},
		field{"cancels_held", p.CancelsHeld}, field{"spirals", p.Spirals}, field{"lifts", p.Lifts},
		field{"lifted_bytes", p.LiftedBytes})
	negs("auto_burst.", field{"bursts", a.Bursts}, field{"drops", a.Drops}, field{"marks", a.Marks},
		field{"settled", a.Settled}, field{"floor_bytes", a.FloorBytes}, field{"gc_ends", a.GCEnds})
	for i, p := range r.Pools {
		prefix := fmt.Sprintf("pools[%d].", i)
		if p.LimitBytes != nil {
			neg(prefix+"limit_bytes", *p.LimitBytes)
		}
		negs(prefix, field{"used_bytes", p.UsedBytes}, field{"peak_bytes", p.PeakBytes}, field{"in_flight", p.InFlight},
			field{"refused", p.Refused}, field{"observed", p.Observed}, field{"canceled", p.Canceled},
			field{"undercharged", p.Undercharged})
		if err := p.Peaks.check(); err != nil {
			errs = append(errs, fmt.Errorf("%speaks: %w", prefix, err))
		}
	}
	for i, h := range r.CHeaps {
		prefix := fmt.Sprintf("c_heaps[%d].", i)
		negs(prefix, field{"releases", h.Releases}, field{"skipped", h.Skipped}, field{"released_bytes", h.ReleasedBytes})
		if h.RetainedBytes < -1 {
			errs = append(errs, fmt.Errorf("%sretained_bytes %d is neither a size nor -1", prefix, h.RetainedBytes))
		}
	}
	if w := r.Swap; w != nil {
		for _, f := range []struct {
			name string
			n    *int64
		}{{"vm_swap_bytes", w.VmSwapBytes}, {"current_bytes", w.CurrentBytes}, {"max_bytes", w.MaxBytes}} {
			if f.n != nil {
				neg("swap."+f.name, *f.n)
			}
		}
		if w.CgroupVersion < 0 || w.CgroupVersion > 2 {
			errs = append(errs, fmt.Errorf("swap.cgroup_version %d is not 0, 1 or 2", w.CgroupVersion))
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// check returns an error when the figures of h disagree: counts of another
// length than PeakCounts, negative or not summing to Count, or quantiles
// that are not the bounds of the buckets the counts put them in.
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

// quantiles returns the bounds of the buckets of the median, the 99th
// percentile and the largest peak of h.Counts (limits.PeakHistogram's
// Quantile rule: at least a share q of the peaks at or under the bound).
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
