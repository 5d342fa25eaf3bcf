// Package state is memctl's state record: a small JSON document of what the
// library decided, published where `memctl status -pid PID` finds it.
//
// # Mechanism
//
// The record is a sealed memfd (name MemfdName) that the process keeps open
// on one descriptor. Publish writes the whole record into a new memfd, seals
// it and moves it onto that descriptor with dup3(2): a reader sees the old
// record or the new one, never half of each. The command finds it in
// /proc/PID/fd; reading it needs the ptrace read check. Why a memfd, and when
// the library publishes: docs/command.md.
//
// # Format
//
// The record is one JSON object (Record) of at most MaxSize bytes. Its
// "version" is Version; it changes only when a field changes meaning. Within
// a version fields are only added and a reader ignores keys it does not
// know. A new field gets a new JSON key and a comment with its unit and
// source.
//
// The record is input from the process it describes and can be forged:
// memctl status reads it with safefs.Dir.ReadMemfd (sealed, bounded), parses
// it with Parse (any error rejects the whole record) and quotes every string.
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

// Version is the record format's version.
const Version = 1

// MemfdName is the record memfd's name; /proc/PID/fd shows "/memfd:NAME (deleted)".
const MemfdName = "memctl-state"

// NoSwapAccounting says why a cgroup has no swap files; Swap.Note and the
// memctl command's swap note carry it.
const NoSwapAccounting = "the kernel does not account swap for this cgroup (the root cgroup has none; " +
	"nor has a kernel built without CONFIG_MEMCG_SWAP or booted with swapaccount=0)"

const (
	MaxSize   = 64 << 10 // the largest record, in bytes, that Publish writes and Parse accepts
	MaxPools  = 64       // the most pools a record lists; PoolsOmitted counts the rest
	MaxCHeaps = 16       // the most C heaps a record lists; CHeapsOmitted counts the rest
	// MaxString is the longest string, in bytes, that Publish writes (Cut).
	MaxString  = 512
	PeakCounts = 22 // the length of Peaks.Counts (limits.PeakHistogram's buckets)
)

// PeakBound returns the upper bound of Peaks.Counts[i] in bytes: 64 KiB << i
// for i < PeakCounts-1, math.MaxInt64 for the last bucket (above 64 GiB).
func PeakBound(i int) int64 {
	if i >= PeakCounts-1 {
		return math.MaxInt64
	}
	return 64 << 10 << i
}

// Record is what the library decided. Sizes are bytes, durations are
// seconds (float64), counts are int64.
type Record struct {
	Version int       `json:"version"` // Version
	PID     int       `json:"pid"`     // as the process's PID namespace numbers it
	Seq     int64     `json:"seq"`     // records published, from 1
	Updated time.Time `json:"updated"` // when published (UTC)
	// Off: MEMCTL=off switched memctl off; Closed: the controller was closed
	// (what it set stays).
	Off    bool `json:"off"`
	Closed bool `json:"closed"`

	GoMemLimit   GoMemLimit `json:"gomemlimit"`
	THP          THP        `json:"thp"`
	Trim         Trim       `json:"trim"`
	Pools        []Pool     `json:"pools"` // the open pools, oldest first
	PoolsOmitted int        `json:"pools_omitted,omitempty"`
	Pressure     Pressure   `json:"pressure"`
	// CHeap names the allocator that owns malloc ("glibc", "none", ...);
	// CHeaps are those found (trim/cheap.Heap), the owner of malloc first.
	CHeap         string    `json:"c_heap"`
	CHeaps        []CHeap   `json:"c_heaps"`
	CHeapsOmitted int       `json:"c_heaps_omitted,omitempty"`
	AutoBurst     AutoBurst `json:"auto_burst"`
	Swap          *Swap     `json:"swap,omitempty"` // null from an older library
}

// Swap is the swap of the process and of its cgroup (memctl.SwapStats) when
// the record was published.
type Swap struct {
	VmSwapBytes *int64 `json:"vm_swap_bytes"` // VmSwap of /proc/self/status, null when unknown
	// CgroupVersion is 2 (memory.swap.*), 1 (memory.memsw.*: memory plus
	// swap, MemoryPlusSwap) or 0 when not read (Note says why).
	CgroupVersion  int    `json:"cgroup_version"`
	MemoryPlusSwap bool   `json:"memory_plus_swap,omitempty"`
	CurrentBytes   *int64 `json:"current_bytes"`
	MaxBytes       *int64 `json:"max_bytes"`      // the cgroup's own limit, null when none
	File           string `json:"file,omitempty"` // the usage file read
	Note           string `json:"note,omitempty"`
}

// GoMemLimit is the GOMEMLIMIT decision (limits.MemLimit).
type GoMemLimit struct {
	Bytes *int64 `json:"bytes"` // GOMEMLIMIT in force; null when unset
	// Source is where the memory limit came from ("cgroup v1", "cgroup v2",
	// "system", "environment", "none"), File the file read.
	Source string `json:"source"`
	File   string `json:"file,omitempty"`
	// MemoryLimitBytes is the memory limit found (0: none), Ratio the share
	// of it used, OutsideBytes the memory outside the Go runtime taken off,
	// ReclaimableBytes the cgroup's page cache (not taken off).
	MemoryLimitBytes int64   `json:"memory_limit_bytes"`
	Ratio            float64 `json:"ratio"`
	OutsideBytes     int64   `json:"outside_bytes"`
	ReclaimableBytes int64   `json:"reclaimable_bytes"`
	// OperatorBytes is the operator's GOMEMLIMIT (null: none); Overridden
	// while memctl sets its own because the operator's is above the limit.
	OperatorBytes  *int64  `json:"operator_bytes,omitempty"`
	Overridden     bool    `json:"overridden,omitempty"`
	RefreshSeconds float64 `json:"refresh_seconds"` // least time between re-reads; 0: none
	Reason         string  `json:"reason"`
	LimitUnknown   bool    `json:"limit_unknown"` // limits.MemLimit.LimitUnknown
}

// THP is the transparent huge pages decision.
type THP struct {
	Policy string `json:"policy"` // the policy applied (thp.Policy)
	State  string `json:"state"`  // the process's flag read back (thp.State)
	System string `json:"system"` // the system mode, "" if unknown
}

// Trim is the trimmer's configuration and counters (trim.Stats).
type Trim struct {
	DelaySeconds      float64   `json:"delay_seconds"` // 0: trimming is off
	Trims             int64     `json:"trims"`
	Skipped           int64     `json:"skipped"`
	GoSkipped         int64     `json:"go_skipped"`
	CSkipped          int64     `json:"c_skipped"`
	ReleasedBytes     int64     `json:"released_bytes"`
	LastReleasedBytes int64     `json:"last_released_bytes"`
	CPUSeconds        float64   `json:"cpu_seconds"`
	Deferred          int64     `json:"deferred"`
	EarlyStarts       int64     `json:"early_starts"`
	Origins           Origins   `json:"origins"`
	SkippedBy         SkippedBy `json:"skipped_by"` // Skipped by reason
}

// Origins is trim.Stats' Debounced, Pressure, Spiral and ByName.
type Origins struct {
	Debounced Origin `json:"debounced"` // Delay after the last burst
	Pressure  Origin `json:"pressure"`  // asked for on kernel memory pressure
	Spiral    Origin `json:"spiral"`    // asked for by the GC death-spiral detector
	ByName    Origin `json:"by_name"`   // TrimNow, forced
}

// Origin counts the trims of one origin (trim.OriginStats).
type Origin struct {
	Trims         int64   `json:"trims"`
	Skipped       int64   `json:"skipped"`
	CPUSeconds    float64 `json:"cpu_seconds"`
	ReleasedBytes int64   `json:"released_bytes"`
}

// SkippedBy is trim.Stats' Skipped* counters.
type SkippedBy struct {
	MinRelease int64 `json:"min_release"` // estimate below MinRelease
	Cost       int64 `json:"cost"`        // estimate below what the trim's GC is worth
	Budget     int64 `json:"budget"`      // the 2% CPU budget did not allow it yet
	Running    int64 `json:"running"`     // another trim was running
}

// AutoBurst is the burst detector's counters (trim.AutoBurstStats); 0 when off.
type AutoBurst struct {
	Bursts     int64 `json:"bursts"`      // rises of the live heap detected
	Drops      int64 `json:"drops"`       // collections of a burst outside a detected one
	Marks      int64 `json:"marks"`       // GC ends that called AfterBurst
	Settled    int64 `json:"settled"`     // bursts taken as growth for good
	FloorBytes int64 `json:"floor_bytes"` // the live heap the next rise is measured from
	GCEnds     int64 `json:"gc_ends"`     // GC ends looked at
}

// CHeap is one allocator found in the process (trim/cheap.Heap).
type CHeap struct {
	Allocator string `json:"allocator"` // "glibc", "jemalloc", ...
	Library   string `json:"library"`   // the object that holds its code
	// OwnsMalloc: it serves malloc; Trimmed: the C heap step releases it
	// (if not, Note says why).
	OwnsMalloc bool   `json:"owns_malloc"`
	Trimmed    bool   `json:"trimmed"`
	Note       string `json:"note,omitempty"`
	// Releases and Skipped count the C heap steps that released it or left
	// it; ReleasedBytes is what they returned by the allocator's account.
	Releases      int64 `json:"releases"`
	Skipped       int64 `json:"skipped"`
	ReleasedBytes int64 `json:"released_bytes"`
	RetainedBytes int64 `json:"retained_bytes"` // held but unused, -1 unknown
}

// Peaks is a pool's distribution of request peaks (limits.PeakHistogram).
type Peaks struct {
	Count int64 `json:"count"` // peaks recorded (closed top-level accounts)
	// P50Bytes, P99Bytes and MaxBytes are the PeakBound of the buckets that
	// hold the median, the 99th percentile and the largest peak; 0 when
	// Count is 0.
	P50Bytes int64 `json:"p50_bytes"`
	P99Bytes int64 `json:"p99_bytes"`
	MaxBytes int64 `json:"max_bytes"`
	// Counts[i] counts the peaks in (PeakBound(i-1), PeakBound(i)]: empty
	// when Count is 0, else PeakCounts long, summing to Count.
	Counts []int64 `json:"counts,omitempty"`
}

// Pool is one budget pool (limits.Pool, limits.PoolStats).
type Pool struct {
	Name         string `json:"name"`
	Mode         string `json:"mode"`        // enforce, observe, off
	LimitBytes   *int64 `json:"limit_bytes"` // null: unlimited
	UsedBytes    int64  `json:"used_bytes"`
	PeakBytes    int64  `json:"peak_bytes"`
	InFlight     int64  `json:"in_flight"`
	Refused      int64  `json:"refused"`
	Observed     int64  `json:"observed"`
	Canceled     int64  `json:"canceled"`
	Undercharged int64  `json:"undercharged"` // GC ends at which charges looked too small
	Peaks        Peaks  `json:"peaks"`
}

// Pressure is the pressure watch and spiral detector's counters (pressure.Stats).
type Pressure struct {
	Source string `json:"source"` // the signal watched, "none"
	Note   string `json:"note,omitempty"`
	// Signals counts the kernel's signals, Acted the trims requested on
	// them, LeftToKernel those not acted on (mostly page cache), and
	// CancelsHeld host-wide ones acted on without canceling.
	Signals      int64 `json:"signals"`
	Acted        int64 `json:"acted"`
	LeftToKernel int64 `json:"left_to_kernel"`
	CancelsHeld  int64 `json:"cancels_held"`
	// Spirals counts death-spiral episodes, Lifts GOMEMLIMIT lifts;
	// LiftedBytes is the lift now (0: none).
	Spirals     int64 `json:"spirals"`
	Lifts       int64 `json:"lifts"`
	LiftedBytes int64 `json:"lifted_bytes"`
}

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
