// Package state is memctl's state record: a small JSON document in which the
// library says what it decided (GOMEMLIMIT in force and its source, the THP
// policy, the trims run and skipped, the budget pools, the pressure source),
// published where `memctl status -pid PID` finds it for any process.
//
// # Mechanism
//
// The record is a sealed memfd (memfd_create(2), name MemfdName) that the
// process keeps open on one descriptor. To publish, the library writes the
// whole record into a new memfd, seals it (F_SEAL_WRITE, F_SEAL_GROW,
// F_SEAL_SHRINK, F_SEAL_SEAL) and moves it onto the same descriptor number
// with dup3(2), which replaces the file atomically: a reader sees the old
// record or the new one, never half of each, and needs no lock. The command
// finds it by the link names in /proc/PID/fd ("/memfd:memctl-state
// (deleted)"). Why this and not the alternatives:
//
//   - It works for any PID from the host: /proc/PID/fd is the command's own
//     /proc, whatever the process's mount, PID or network namespace, its
//     chroot, or its (read-only) file systems. A file under the process's
//     runtime directory needs a writable directory that the command can
//     name from outside, and names the PID as the process sees it; an
//     abstract socket lives in the process's network namespace and needs a
//     goroutine to answer.
//   - It dies with the process: no stale record after a crash, nothing to
//     clean up.
//   - It costs nothing while idle and nothing on hot paths: the library
//     publishes only when a decision changes (at Start, after a trim or a
//     skipped trim, when GOMEMLIMIT or the set of pools changed at the end
//     of a GC cycle, at Close), 35 to 130 µs each time (BenchmarkPublish); no
//     goroutine, no timer, nothing on AfterBurst or Account.Grow.
//   - Reading it needs what reading /proc/PID/environ needs (the ptrace
//     read check: the same user, or root), so it shows nothing that
//     `memctl status` could not already see.
//
// # Format
//
// The record is one JSON object (Record) of at most MaxSize bytes. Its
// "version" is Version; it changes only when a field changes meaning, so a
// reader shows records of the versions it knows. Within a version fields are
// only added: a reader ignores the keys it does not know, so a newer library
// can add a decision without breaking an older command. To add a field, add
// it to Record (or one of its parts) with a new JSON key and a comment that
// says its unit and source.
//
// The record is input from the process it describes, not a fact: a process
// can forge it. memctl status reads it with Read (a regular file of the
// memfd's file system only, bounded), parses it with Parse (any error
// rejects the whole record) and shows every string quoted, labeled
// "reported by the process".
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Version is the record format's version.
const Version = 1

// MemfdName is the name of the memfd that holds the record; /proc/PID/fd
// shows it as "/memfd:" + MemfdName + " (deleted)".
const MemfdName = "memctl-state"

// MaxSize is the largest record, in bytes, that Publish writes and Read
// accepts: a record is about 1 KiB plus about 80 bytes a pool.
const MaxSize = 64 << 10

// MaxPools is the most pools a record lists; Record.PoolsOmitted counts the
// rest.
const MaxPools = 64

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
	// Pools are the open budget pools (limits.Pool), oldest first, at most
	// MaxPools.
	Pools        []Pool   `json:"pools"`
	PoolsOmitted int      `json:"pools_omitted,omitempty"`
	Pressure     Pressure `json:"pressure"`
	// CHeap names the allocator that owns malloc ("glibc", "none", ...).
	CHeap string `json:"c_heap"`
}

// GoMemLimit is the GOMEMLIMIT decision (limits.MemLimit).
type GoMemLimit struct {
	// Bytes is GOMEMLIMIT in force when the record was published; null
	// when there is none (the Go default, math.MaxInt64).
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
	// RefreshSeconds is the least time between two re-reads of the limit,
	// 0 when there is no refresh.
	RefreshSeconds float64 `json:"refresh_seconds"`
	// Reason is the decision's one sentence.
	Reason string `json:"reason"`
}

// THP is the transparent huge pages decision.
type THP struct {
	Policy string `json:"policy"` // the policy applied (thp.Policy)
	State  string `json:"state"`  // the process's flag read back (thp.State)
	System string `json:"system"` // the system mode, "" if unknown
}

// Trim is the trimmer's configuration and counters (trim.Stats) when the
// record was published.
type Trim struct {
	// DelaySeconds is the trim delay; 0 means trimming is off.
	DelaySeconds float64 `json:"delay_seconds"`
	Trims        int64   `json:"trims"`
	Skipped      int64   `json:"skipped"`
	GoSkipped    int64   `json:"go_skipped"`
	CSkipped     int64   `json:"c_skipped"`
	// ReleasedBytes is the bytes all trims released, LastReleasedBytes the
	// last one's.
	ReleasedBytes     int64 `json:"released_bytes"`
	LastReleasedBytes int64 `json:"last_released_bytes"`
	// CPUSeconds is the CPU all trims were charged with.
	CPUSeconds  float64 `json:"cpu_seconds"`
	Deferred    int64   `json:"deferred"`
	EarlyStarts int64   `json:"early_starts"`
}

// Pool is one budget pool (limits.Pool).
type Pool struct {
	Name string `json:"name"`
	Mode string `json:"mode"` // enforce, observe, off
	// LimitBytes is the pool's limit; null means unlimited.
	LimitBytes *int64 `json:"limit_bytes"`
}

// Pressure is the kernel memory-pressure watch.
type Pressure struct {
	// Source names the signal watched, "none" when none is.
	Source string `json:"source"`
}

// Encode returns r as the record's JSON text, with Version set. A record
// longer than MaxSize is an error.
func Encode(r *Record) ([]byte, error) {
	r.Version = Version
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("state: record of %d bytes, more than %d", len(b), MaxSize)
	}
	return b, nil
}

// ErrVersion is matched by the error of Parse for a record of a version
// this package does not read.
var ErrVersion = errors.New("unknown record version")

// Parse parses a record read from another process. Anything but one JSON
// object of the known types is an error, and so is a record longer than
// MaxSize, a version other than Version (ErrVersion), more than MaxPools
// pools, a negative size or count, or a duration that is negative or not a
// number: the whole record is rejected, never shown in part. Unknown keys
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
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	return &r, nil
}

// check returns an error naming the first field whose value no library
// writes: a negative size, count or duration, or a ratio outside [0, 1].
func (r *Record) check() error {
	neg := func(name string, n int64) error {
		if n < 0 {
			return fmt.Errorf("%s %d is negative", name, n)
		}
		return nil
	}
	secs := func(name string, f float64) error {
		if !(f >= 0 && f < 1e9) {
			return fmt.Errorf("%s %v is not a duration", name, f)
		}
		return nil
	}
	g, t := r.GoMemLimit, r.Trim
	errs := []error{
		neg("pid", int64(r.PID)), neg("seq", r.Seq), neg("pools_omitted", int64(r.PoolsOmitted)),
		neg("gomemlimit.memory_limit_bytes", g.MemoryLimitBytes), neg("gomemlimit.outside_bytes", g.OutsideBytes),
		secs("gomemlimit.refresh_seconds", g.RefreshSeconds),
		neg("trim.trims", t.Trims), neg("trim.skipped", t.Skipped), neg("trim.go_skipped", t.GoSkipped),
		neg("trim.c_skipped", t.CSkipped), neg("trim.released_bytes", t.ReleasedBytes),
		neg("trim.last_released_bytes", t.LastReleasedBytes), neg("trim.deferred", t.Deferred),
		neg("trim.early_starts", t.EarlyStarts),
		secs("trim.delay_seconds", t.DelaySeconds), secs("trim.cpu_seconds", t.CPUSeconds),
	}
	if g.Bytes != nil {
		errs = append(errs, neg("gomemlimit.bytes", *g.Bytes))
	}
	if !(g.Ratio >= 0 && g.Ratio <= 1) {
		errs = append(errs, fmt.Errorf("gomemlimit.ratio %v is not in [0, 1]", g.Ratio))
	}
	for i, p := range r.Pools {
		if p.LimitBytes != nil {
			errs = append(errs, neg(fmt.Sprintf("pools[%d].limit_bytes", i), *p.LimitBytes))
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// now is time.Now; tests replace it.
var now = time.Now
