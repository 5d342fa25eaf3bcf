// Package state is memctl's state record: a small JSON document of what the
// library decided, published where `memctl status -pid PID` finds it.
//
// # Mechanism
//
// The record is a sealed memfd (memfd_create(2), name MemfdName) that the
// process keeps open on one descriptor. Publish writes the whole record into
// a new memfd, seals it (F_SEAL_WRITE, F_SEAL_GROW, F_SEAL_SHRINK,
// F_SEAL_SEAL) and moves it onto that descriptor with dup3(2): a reader sees
// the old record or the new one, never half of each, and needs no lock. The
// command finds it in /proc/PID/fd ("/memfd:memctl-state (deleted)"); reading
// it needs the ptrace read check (the same user, or root). Why a memfd, and
// when the library publishes: docs/command.md.
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
	"math"
	"time"
)

// Version is the record format's version.
const Version = 1

// MemfdName is the record memfd's name; /proc/PID/fd shows "/memfd:NAME (deleted)".
const MemfdName = "memctl-state"

// MaxSize is the largest record, in bytes, that Publish writes and Parse accepts.
const MaxSize = 64 << 10

// MaxPools is the most pools a record lists; Record.PoolsOmitted counts the rest.
const MaxPools = 64

// MaxCHeaps is the most C heaps a record lists; Record.CHeapsOmitted counts the rest.
const MaxCHeaps = 16

// MaxString is the longest string, in bytes, that Publish writes; a longer
// one is cut at a rune boundary and ends with "...". Parse accepts longer
// ones (MaxSize bounds them).
const MaxString = 512

// PeakCounts is the length of Peaks.Counts (limits.PeakHistogram's buckets).
const PeakCounts = 22

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
	// Version is the format's version (Version).
	Version int `json:"version"`
	// PID is the process's own PID, as its PID namespace numbers it.
	PID int `json:"pid"`
	// Seq counts the records the process published, from 1.
	Seq int64 `json:"seq"`
	// Updated is when this record was published (UTC).
	Updated time.Time `json:"updated"`
	// Off is true when MEMCTL=off switched memctl off; Closed when the
	// controller was closed (what it set, such as GOMEMLIMIT, stays).
	Off    bool `json:"off"`
	Closed bool `json:"closed"`

	GoMemLimit GoMemLimit `json:"gomemlimit"`
	THP        THP        `json:"thp"`
	Trim       Trim       `json:"trim"`
	// Pools are the open pools (limits.Pool), oldest first, at most MaxPools.
	Pools        []Pool   `json:"pools"`
	PoolsOmitted int      `json:"pools_omitted,omitempty"`
	Pressure     Pressure `json:"pressure"`
	// CHeap names the allocator that owns malloc ("glibc", "none", ...).
	CHeap string `json:"c_heap"`
	// CHeaps are the allocators found in the process (trim/cheap.Heap), the
	// owner of malloc first, at most MaxCHeaps.
	CHeaps        []CHeap   `json:"c_heaps"`
	CHeapsOmitted int       `json:"c_heaps_omitted,omitempty"`
	AutoBurst     AutoBurst `json:"auto_burst"`
	// Swap is the swap at Updated; null from an older library.
	Swap *Swap `json:"swap,omitempty"`
}

// Swap is the swap of the process and of its cgroup (memctl.SwapStats) when
// the record was published, which may be long ago: publishing follows
// decisions, not swap. Sizes are bytes.
type Swap struct {
	// VmSwapBytes is VmSwap of /proc/self/status, null when unknown.
	VmSwapBytes *int64 `json:"vm_swap_bytes"`
	// CgroupVersion is 2 (memory.swap.current, memory.swap.max), 1
	// (memory.memsw.*: memory plus swap, MemoryPlusSwap) or 0 when the
	// cgroup's swap was not read (Note says why).
	CgroupVersion  int    `json:"cgroup_version"`
	MemoryPlusSwap bool   `json:"memory_plus_swap,omitempty"`
	CurrentBytes   *int64 `json:"current_bytes"`
	// MaxBytes is the cgroup's own limit, null when none is set or read.
	MaxBytes *int64 `json:"max_bytes"`
	// File is the usage file read (memory.swap.current or memory.memsw.usage_in_bytes).
	File string `json:"file,omitempty"`
	Note string `json:"note,omitempty"`
}

// GoMemLimit is the GOMEMLIMIT decision (limits.MemLimit).
type GoMemLimit struct {
	// Bytes is GOMEMLIMIT in force; null when unset (math.MaxInt64).
	Bytes *int64 `json:"bytes"`
	// Source is where the memory limit came from ("cgroup v1", "cgroup
	// v2", "system", "environment", "none"), File the file it was read
	// from ("" when none).
	Source string `json:"source"`
	File   string `json:"file,omitempty"`
	// MemoryLimitBytes is the memory limit found (0: none), Ratio the share
	// of it used, OutsideBytes the memory outside the Go runtime taken off.
	MemoryLimitBytes int64   `json:"memory_limit_bytes"`
	Ratio            float64 `json:"ratio"`
	OutsideBytes     int64   `json:"outside_bytes"`
	// ReclaimableBytes is the limit's cgroup's page cache, never taken off.
	ReclaimableBytes int64 `json:"reclaimable_bytes"`
	// OperatorBytes is the operator's GOMEMLIMIT when the environment sets
	// one (null otherwise); Overridden is true while memctl sets its own
	// value because the operator's is above the hard limit.
	OperatorBytes *int64 `json:"operator_bytes,omitempty"`
	Overridden    bool   `json:"overridden,omitempty"`
	// RefreshSeconds is the least time between two re-reads; 0: no refresh.
	RefreshSeconds float64 `json:"refresh_seconds"`
	// Reason is the decision's one sentence.
	Reason string `json:"reason"`
	// LimitUnknown: a limit may be set out of sight (limits.MemLimit.LimitUnknown).
	LimitUnknown bool `json:"limit_unknown"`
}

// THP is the transparent huge pages decision.
type THP struct {
	Policy string `json:"policy"` // the policy applied (thp.Policy)
	State  string `json:"state"`  // the process's flag read back (thp.State)
	System string `json:"system"` // the system mode, "" if unknown
}

// Trim is the trimmer's configuration and counters (trim.Stats).
type Trim struct {
	// DelaySeconds is the trim delay; 0 means trimming is off.
	DelaySeconds float64 `json:"delay_seconds"`
	Trims        int64   `json:"trims"`
	Skipped      int64   `json:"skipped"`
	GoSkipped    int64   `json:"go_skipped"`
	CSkipped     int64   `json:"c_skipped"`
	// ReleasedBytes is what all trims released, LastReleasedBytes the last's.
	ReleasedBytes     int64 `json:"released_bytes"`
	LastReleasedBytes int64 `json:"last_released_bytes"`
	// CPUSeconds is the CPU all trims were charged with.
	CPUSeconds  float64 `json:"cpu_seconds"`
	Deferred    int64   `json:"deferred"`
	EarlyStarts int64   `json:"early_starts"`
	// Origins splits the counters by who asked (trim.Stats.Debounced...);
	// SkippedBy splits Skipped by reason (trim.Stats.SkippedMinRelease...).
	Origins   Origins   `json:"origins"`
	SkippedBy SkippedBy `json:"skipped_by"`
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
	// OwnsMalloc is true for the allocator that serves malloc; Trimmed
	// when the C heap step runs its release call (false: present, not
	// trimmed; Note says why, or how it was found).
	OwnsMalloc bool   `json:"owns_malloc"`
	Trimmed    bool   `json:"trimmed"`
	Note       string `json:"note,omitempty"`
	// Releases and Skipped count the C heap steps that released it or
	// left it alone; ReleasedBytes is what they returned by the
	// allocator's own account (0 when it could not tell).
	Releases      int64 `json:"releases"`
	Skipped       int64 `json:"skipped"`
	ReleasedBytes int64 `json:"released_bytes"`
	// RetainedBytes is what it holds that no live block uses, -1 unknown.
	RetainedBytes int64 `json:"retained_bytes"`
}

// Peaks is a pool's distribution of request peaks (limits.PeakHistogram).
type Peaks struct {
	// Count is the number of peaks recorded (closed top-level accounts).
	Count int64 `json:"count"`
	// P50Bytes, P99Bytes and MaxBytes are the upper bounds of the buckets
	// that hold the median, the 99th percentile and the largest peak
	// (PeakBound: math.MaxInt64 above 64 GiB); 0 when Count is 0.
	P50Bytes int64 `json:"p50_bytes"`
	P99Bytes int64 `json:"p99_bytes"`
	MaxBytes int64 `json:"max_bytes"`
	// Counts[i] counts the peaks in (PeakBound(i-1), PeakBound(i)]: empty
	// when Count is 0, else PeakCounts long, summing to Count.
	Counts []int64 `json:"counts,omitempty"`
}

// Pool is one budget pool (limits.Pool).
type Pool struct {
	Name string `json:"name"`
	Mode string `json:"mode"` // enforce, observe, off
	// LimitBytes is the pool's limit; null means unlimited.
	LimitBytes *int64 `json:"limit_bytes"`
	// UsedBytes, PeakBytes, InFlight are limits.PoolStats' Used, Peak, InFlight.
	UsedBytes int64 `json:"used_bytes"`
	PeakBytes int64 `json:"peak_bytes"`
	InFlight  int64 `json:"in_flight"`
	// Refused, Observed and Canceled are limits.PoolStats' counters.
	Refused  int64 `json:"refused"`
	Observed int64 `json:"observed"`
	Canceled int64 `json:"canceled"`
	// Undercharged counts GC ends at which the charges looked too small
	// (limits.PoolStats.Undercharged).
	Undercharged int64 `json:"undercharged"`
	Peaks        Peaks `json:"peaks"`
}

// Pressure is the pressure watch and spiral detector's counters (pressure.Stats).
type Pressure struct {
	// Source names the signal watched, "none" when none is.
	Source string `json:"source"`
	// Note is Report.PressureNote.
	Note string `json:"note,omitempty"`
	// Signals counts the kernel's signals, Acted the trims requested on
	// them, LeftToKernel those not acted on (mostly page cache), and
	// CancelsHeld host-wide ones acted on without canceling (same reason).
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
