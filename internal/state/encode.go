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

// check returns an error naming the first field whose value no library
// writes: a negative size, count or duration, a ratio outside [0, 1], or a
// pool's peaks whose figures do not agree with each other.
func (r *Record) check() error {
	var c checker
	c.published(r)
	c.goMemLimit(r.GoMemLimit)
	c.trim(r.Trim)
	c.pressure(r.Pressure)
	c.autoBurst(r.AutoBurst)
	c.pools(r.Pools)
	c.cHeaps(r.CHeaps)
	c.swap(r.Swap)
	if len(c.errs) > 0 {
		return c.errs[0]
	}
	return nil
}

// checker collects Record.check's errors in record order; the first is reported.
type checker struct {
	errs []error
}

// field is a count or size and its JSON name, for checker.negs.
type field struct {
	name string
	n    int64
}

func (c *checker) add(err error) { c.errs = append(c.errs, err) }

// neg records an error when n is negative.
func (c *checker) neg(name string, n int64) {
	if n < 0 {
		c.add(fmt.Errorf("%s %d is negative", name, n))
	}
}

// negs checks each of fs with neg, its name prefixed with prefix.
func (c *checker) negs(prefix string, fs ...field) {
	for _, f := range fs {
		c.neg(prefix+f.name, f.n)
	}
}

// negPtr checks *n with neg when n is not nil.
func (c *checker) negPtr(name string, n *int64) {
	if n != nil {
		c.neg(name, *n)
	}
}

// secs records an error unless f (seconds) is in [0, 1e9).
func (c *checker) secs(name string, f float64) {
	if !(f >= 0 && f < 1e9) {
		c.add(fmt.Errorf("%s %v is not a duration", name, f))
	}
}

// published checks the fields Publish always writes.
func (c *checker) published(r *Record) {
	if r.PID <= 0 || r.Updated.IsZero() {
		c.add(fmt.Errorf("pid %d, updated %s: not a published record (both are set by Publish)",
			r.PID, r.Updated.Format(time.RFC3339)))
	}
	c.neg("seq", r.Seq)
	c.negs("", field{"pools_omitted", int64(r.PoolsOmitted)}, field{"c_heaps_omitted", int64(r.CHeapsOmitted)})
}

// goMemLimit checks the GOMEMLIMIT section; the ratio is in [0, 1].
func (c *checker) goMemLimit(g GoMemLimit) {
	c.negs("gomemlimit.", field{"memory_limit_bytes", g.MemoryLimitBytes}, field{"outside_bytes", g.OutsideBytes},
		field{"reclaimable_bytes", g.ReclaimableBytes})
	c.negPtr("gomemlimit.operator_bytes", g.OperatorBytes)
	c.secs("gomemlimit.refresh_seconds", g.RefreshSeconds)
	c.negPtr("gomemlimit.bytes", g.Bytes)
	if !(g.Ratio >= 0 && g.Ratio <= 1) {
		c.add(fmt.Errorf("gomemlimit.ratio %v is not in [0, 1]", g.Ratio))
	}
}

// trim checks the trimmer's section, its origins and skips.
func (c *checker) trim(t Trim) {
	c.negs("trim.", field{"trims", t.Trims}, field{"skipped", t.Skipped}, field{"go_skipped", t.GoSkipped},
		field{"c_skipped", t.CSkipped}, field{"released_bytes", t.ReleasedBytes},
		field{"last_released_bytes", t.LastReleasedBytes}, field{"deferred", t.Deferred},
		field{"early_starts", t.EarlyStarts})
	c.secs("trim.delay_seconds", t.DelaySeconds)
	c.secs("trim.cpu_seconds", t.CPUSeconds)
	for _, o := range []struct {
		name string
		o    Origin
	}{{"debounced", t.Origins.Debounced}, {"pressure", t.Origins.Pressure}, {"spiral", t.Origins.Spiral}, {"by_name", t.Origins.ByName}} {
		prefix := "trim.origins." + o.name + "."
		c.negs(prefix, field{"trims", o.o.Trims}, field{"skipped", o.o.Skipped}, field{"released_bytes", o.o.ReleasedBytes})
		c.secs(prefix+"cpu_seconds", o.o.CPUSeconds)
	}
	c.negs("trim.skipped_by.", field{"min_release", t.SkippedBy.MinRelease}, field{"cost", t.SkippedBy.Cost},
		field{"budget", t.SkippedBy.Budget}, field{"running", t.SkippedBy.Running})
}

// pressure checks the pressure section's counts and sizes.
func (c *checker) pressure(p Pressure) {
	c.negs("pressure.", field{"signals", p.Signals}, field{"acted", p.Acted}, field{"left_to_kernel", p.LeftToKernel},
		field{"cancels_held", p.CancelsHeld}, field{"spirals", p.Spirals}, field{"lifts", p.Lifts},
		field{"lifted_bytes", p.LiftedBytes})
}

// autoBurst checks the burst detector's section.
func (c *checker) autoBurst(a AutoBurst) {
	c.negs("auto_burst.", field{"bursts", a.Bursts}, field{"drops", a.Drops}, field{"marks", a.Marks},
		field{"settled", a.Settled}, field{"floor_bytes", a.FloorBytes}, field{"gc_ends", a.GCEnds})
}

// pools checks each pool, and its peaks with Peaks.check.
func (c *checker) pools(ps []Pool) {
	for i, p := range ps {
		prefix := fmt.Sprintf("pools[%d].", i)
		c.negPtr(prefix+"limit_bytes", p.LimitBytes)
		c.negs(prefix, field{"used_bytes", p.UsedBytes}, field{"peak_bytes", p.PeakBytes}, field{"in_flight", p.InFlight},
			field{"refused", p.Refused}, field{"observed", p.Observed}, field{"canceled", p.Canceled},
			field{"undercharged", p.Undercharged})
		if err := p.Peaks.check(); err != nil {
			c.add(fmt.Errorf("%speaks: %w", prefix, err))
		}
	}
}

// cHeaps checks each C heap; RetainedBytes may be -1 (unknown).
func (c *checker) cHeaps(hs []CHeap) {
	for i, h := range hs {
		prefix := fmt.Sprintf("c_heaps[%d].", i)
		c.negs(prefix, field{"releases", h.Releases}, field{"skipped", h.Skipped}, field{"released_bytes", h.ReleasedBytes})
		if h.RetainedBytes < -1 {
			c.add(fmt.Errorf("%sretained_bytes %d is neither a size nor -1", prefix, h.RetainedBytes))
		}
	}
}

// swap checks the swap section, if any; the cgroup version is 0, 1 or 2.
func (c *checker) swap(w *Swap) {
	if w == nil {
		return
	}
	c.negPtr("swap.vm_swap_bytes", w.VmSwapBytes)
	c.negPtr("swap.current_bytes", w.CurrentBytes)
	c.negPtr("swap.max_bytes", w.MaxBytes)
	if w.CgroupVersion < 0 || w.CgroupVersion > 2 {
		c.add(fmt.Errorf("swap.cgroup_version %d is not 0, 1 or 2", w.CgroupVersion))
	}
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
