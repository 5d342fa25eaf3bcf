package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// defaultRatio is the share of the memory limit that becomes GOMEMLIMIT when
// MemLimitConfig.Ratio is 0: the rest is headroom for memory the Go runtime
// does not count (cgo, thread stacks, the binary) and for the page cache the
// cgroup is charged for. It is automemlimit's default.
const defaultRatio = 0.9

// defaultFloor is the smallest GOMEMLIMIT memctl sets when
// MemLimitConfig.Floor is 0: 64 MiB. GOMEMLIMIT bounds the whole Go
// runtime, live heap included, so a limit near the live heap makes the
// collector run on almost every allocation: a tiny limit or ratio would
// trade an OOM kill for a process that does little but collect. With a
// small live heap (16 MiB), the GC cycles per MiB allocated rise steeply
// below a 64 MiB limit and from 64 MiB are those of GOGC alone: 64 MiB is
// where a small service's GC stops being paced by the limit (measured
// figures: docs/benchmarks.md). It is also the floor automemlimit users
// set with its WithMin. memctl warns when it applies it.
const defaultFloor = 64 << 20

// DefaultRefresh is how often, at most, the limit is re-read when
// MemLimitConfig.Refresh is 0: 10 s, so that an in-place pod resize is
// followed within about 10 s by a process that allocates; a write to a
// limit file is followed at once, idle or not (see MemLimiter).
const DefaultRefresh = 10 * time.Second

// ErrImplausibleLimit is matched (errors.Is) by the error for a memory limit
// that this process could not be running under: a hard limit (v1's limit,
// memory.max) of 0, or one not above the memory it already holds (RssAnon + RssShmem) when
// first read, or a memory.high of 0 or 1. Such a value comes from a cgroup
// file that is wrong or not this process's: GOMEMLIMIT is left as it was,
// except that a malformed memory.high beside a memory.max is only warned
// about and memory.max is followed. A memory.high under the usage is not
// implausible: it is a throttle target (see SetGoMemLimit); nor is the hard
// limit memctl already follows lowered under what it holds at run time (an
// in-place resize): it is followed, with a WARN.
var ErrImplausibleLimit = errors.New("limits: implausible memory limit")

// Source says where the memory limit behind GOMEMLIMIT came from.
type Source int

const (
	// SourceNone: no limit was found; GOMEMLIMIT was left as it was.
	SourceNone Source = iota
	// SourceCgroupV1: the cgroup v1 memory controller (memory.limit_in_bytes,
	// hierarchical_memory_limit in memory.stat).
	SourceCgroupV1
	// SourceCgroupV2: the smallest cgroup v2 memory.max of the process's
	// cgroup and its ancestors, or, with none, their smallest memory.high;
	// MemLimit.File says which, MemLimit.High a memory.high followed as a
	// target under memory.max.
	SourceCgroupV2
	// SourceSystem: total system memory (MemLimitConfig.SystemFallback).
	SourceSystem
	// SourceEnv: the operator set GOMEMLIMIT (not empty), or
	// AUTOMEMLIMIT=off, in the environment; memctl did not touch GOMEMLIMIT.
	SourceEnv
	// SourceDeclared: the operator declared the limit in
	// MEMCTL_MEMORY_LIMIT; MemLimit.File is
	// "MEMCTL_MEMORY_LIMIT=<value>".
	SourceDeclared
	// SourceLambda: AWS Lambda's AWS_LAMBDA_FUNCTION_MEMORY_SIZE,
	// in MB of 2^20 bytes.
	SourceLambda
)

// String returns "none", "cgroup v1", "cgroup v2", "system", "env",
// "declared" or "lambda".
func (s Source) String() string {
	switch s {
	case SourceNone:
		return "none"
	case SourceCgroupV1:
		return "cgroup v1"
	case SourceCgroupV2:
		return "cgroup v2"
	case SourceSystem:
		return "system"
	case SourceEnv:
		return "env"
	case SourceDeclared:
		return "declared"
	case SourceLambda:
		return "lambda"
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText returns String's word, so that a Source (and a MemLimit) reads
// "cgroup v1" in JSON and in slog, not a number. It never fails.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a word that String returns ("none", "cgroup v1",
// "cgroup v2", "system", "env", "declared", "lambda"). Any other text is an
// error that quotes it, and s is left as it was.
func (s *Source) UnmarshalText(b []byte) error {
	for v := SourceNone; v <= SourceLambda; v++ {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("limits: unknown Source %q, want none, cgroup v1, cgroup v2, system, env, declared or lambda", b)
}

// MemLimitConfig configures SetGoMemLimit and NewMemLimiter. The zero value
// is the default: 90% of the cgroup limit less what the cgroup is charged
// outside the Go runtime, never under 64 MiB, re-read at most every 10 s at the end of a
// GC cycle and when a limit file is written, no system fallback, no logging.
type MemLimitConfig struct {
	// Ratio is the share of the memory limit used for GOMEMLIMIT, in
	// (0.0, 1.0]. An AUTOMEMLIMIT ratio in the environment wins over it.
	// Default: 0, which means 0.9.
	Ratio float64
	// Floor is the smallest GOMEMLIMIT set, in bytes: a limit, ratio or
	// headroom that would give less gives Floor (or the limit itself when
	// the limit is smaller), with a WARN that the GC will run often.
	// Negative is an error. Default: 0, which means 64 MiB.
	// Environment (through memctl.Start): MEMCTL_GOMEMLIMIT_FLOOR.
	Floor int64
	// SystemFallback uses total system memory as the limit when the process
	// has no cgroup limit. Default: false.
	SystemFallback bool
	// Refresh is the least time between two re-reads of the limit at the
	// end of a GC cycle, and between two wake-ups of the follower's timer
	// where one is needed (see MemLimiter): a process that allocates
	// follows a changed limit (an in-place pod resize) within about
	// Refresh, and a write to a limit file is followed at once, idle or
	// throttled. Negative turns the refresh and the follower off.
	// Default: 0 (means DefaultRefresh, 10 s).
	// Environment (through memctl.Start): MEMCTL_REFRESH=off|<duration>.
	Refresh time.Duration
	// NoHeadroom turns off the headroom for memory outside the Go runtime.
	// By default GOMEMLIMIT is Ratio of the limit minus the larger of two
	// readings, both taken again at each refresh:
	//
	//   - what this process holds that the Go runtime did not map and the
	//     kernel cannot reclaim (RssAnon + RssShmem minus the
	//     runtime/metrics /memory/classes/total:bytes less
	//     /memory/classes/heap/released:bytes: C heap, C thread stacks,
	//     shmem it maps; file-backed pages, mapped files and the binary's
	//     text, are page cache and not counted);
	//   - what the cgroup whose limit applies is charged that neither the
	//     Go runtime holds nor the kernel can reclaim, from its own
	//     account (memory.stat; see readCharge for the fields): other
	//     processes' anonymous memory (a sidecar in a pod cgroup), file
	//     memory off the page-cache lists (shmem and tmpfs, Kubernetes
	//     emptyDir medium Memory; ramfs; mlocked files), unreclaimable
	//     kernel memory (slab, stacks, page tables, sockets, zswap), less
	//     the Go runtime's resident memory (the smaller of the held memory
	//     above and its mapped memory). The OOM killer counts all of it; the page cache
	//     is not subtracted, as the kernel reclaims it before it kills.
	//     When memory.stat cannot be read or parsed, the cgroup's usage
	//     (memory.current, memory.usage_in_bytes) stands in for it, page
	//     cache included, with a WARN naming the file: GOMEMLIMIT then errs
	//     low, never high.
	//
	// It is on by default because the cgroup charges that memory as it
	// charges the Go heap: a pure-Go process alone in its cgroup gives up
	// only a few MiB, while a cgo process holding 300 MiB of C heap, or a
	// cgroup with 300 MiB in a tmpfs or a ramfs, gets a GOMEMLIMIT about
	// 300 MiB lower than it would without them, the difference it would
	// otherwise lose to the OOM killer (measured figures:
	// docs/benchmarks.md). A headroom over half the limit is logged at
	// WARN once.
	// Turn it off where GOMEMLIMIT is computed for another process (memctl
	// exec). Default: false (headroom on).
	NoHeadroom bool
	// OnChange, when set, is called after each decision that changes what
	// is in force (see MemLimiter.Subscribe), on the goroutine that made
	// it, while the limiter is locked: it must be short and must not call
	// the limiter. The facade republishes its state record with it.
	// Default: nil.
	OnChange func(MemLimit)
	// KeepOperator keeps an operator's GOMEMLIMIT whatever the cgroup
	// limit does. By default a GOMEMLIMIT set in the environment that is
	// above the cgroup's hard limit (after a resize down, or from the
	// start) cannot take effect before the OOM killer does: memctl then
	// sets what it would set without the variable, says so at WARN with
	// both values and the file, and gives the operator's value back when
	// the limit rises above it again. With KeepOperator the WARN is all.
	// Default: false. Environment (through memctl.Start):
	// MEMCTL_KEEP_GOMEMLIMIT=on.
	KeepOperator bool
	// Logger receives what happens after the first decision: each change of
	// GOMEMLIMIT once at INFO, each distinct failure and each floor
	// warning once at WARN. The first decision is returned, not logged,
	// except its floor warning. Default: nil (no logging).
	Logger *slog.Logger

	// read and usage replace cgroupfs.Of(0) and the held-memory and runtime/metrics
	// reads in tests; cgroupFile is the file read's "no such file" means no
	// cgroup.
	read       func() (cgroupfs.Limit, error)
	usage      func() (held, goMapped int64, err error)
	cgroupFile string
	// charge reads a cgroup directory's account (readCharge), live the
	// live heap (readLive); tests replace them.
	charge func(version int, dir string) (charge, error)
	live   func() int64
	// follower replaces the inotify follower in tests; noGCEnd leaves
	// out the refresh at GC end (a test in a synctest bubble).
	follower func() (follower, error)
	noGCEnd  bool
}

// MemLimit is what SetGoMemLimit or a refresh decided, and why.
type MemLimit struct {
	// GoMemLimit is GOMEMLIMIT after the call, in bytes; math.MaxInt64
	// means no limit (the Go default).
	GoMemLimit int64
	// MemoryLimit is the memory limit that was found (cgroup or system), in
	// bytes; 0 when none was.
	MemoryLimit int64
	// Ratio is the share of MemoryLimit used (0 when MemoryLimit is 0);
	// GoMemLimit is Ratio × MemoryLimit − Outside, raised to the floor.
	Ratio float64
	// Source says where MemoryLimit came from, File the file it was read from
	// ("" for none and system): memory.limit_in_bytes or memory.stat (v1),
	// memory.max or memory.high (v2).
	Source Source
	File   string `json:",omitempty"`
	// Outside is what was subtracted from the limit, in bytes: the larger
	// of the process's memory outside the Go runtime (RssAnon + RssShmem minus the
	// runtime's mapped, unreleased memory) and Charged; 0 with
	// MemLimitConfig.NoHeadroom.
	Outside int64 `json:",omitempty"`
	// Charged is the part of Outside read from the cgroup's own account
	// (memory.stat of the cgroup whose limit applies): what the cgroup is
	// charged that the Go runtime does not hold and the kernel cannot
	// reclaim (see MemLimitConfig.NoHeadroom), in bytes; 0 when the
	// process's own reading (held minus Go mapped) was the larger.
	Charged int64 `json:",omitempty"`
	// Reclaimable is the page cache of the limit's cgroup (memory.stat's
	// file LRU lists: files read or mapped, the binary's text), in bytes:
	// the kernel reclaims it before it kills, so it is not subtracted; 0
	// when unknown.
	Reclaimable int64 `json:",omitempty"`
	// High and HighFile are the cgroup v2 memory.high that GOMEMLIMIT was
	// lowered toward (a target under memory.max, or alone), in bytes; 0
	// and "" when memory.high did not lower it.
	High     int64  `json:",omitempty"`
	HighFile string `json:",omitempty"`
	// LiveFloor is true when memory.high asked for less than
	// 1.5 × the live heap and GOMEMLIMIT was held there.
	LiveFloor bool `json:",omitempty"`
	// AtFloor is true when GoMemLimit was raised to the floor (or to
	// MemoryLimit when the limit is under the floor): the GC will run
	// often.
	AtFloor bool `json:",omitempty"`
	// LimitUnknown is true when no cgroup up to the top of the process's
	// cgroup namespace sets a memory limit but that top is not the
	// hierarchy's root: a limit may be set above it, out of sight (as
	// Kubernetes pod-level resources and podman's service cgroup do).
	// Source is then SourceNone, or SourceSystem with
	// MemLimitConfig.SystemFallback.
	LimitUnknown bool `json:",omitempty"`
	// Sandbox names the sandbox the process runs in when one is
	// recognised ("gVisor", by the signs its docs give: see
	// internal/sandbox), where the cgroup files may not carry the limit
	// the host enforces; "" otherwise.
	Sandbox string `json:",omitempty"`
	// Operator is the operator's GOMEMLIMIT in bytes when the environment
	// sets one (math.MaxInt64 for "off"), 0 otherwise; Overridden is true
	// while memctl sets its own value because Operator is above the hard
	// limit (see MemLimitConfig.KeepOperator).
	Operator   int64 `json:",omitempty"`
	Overridden bool  `json:",omitempty"`
	// Reason is one human-readable sentence about the decision.
	Reason string
}

// SetGoMemLimit sets GOMEMLIMIT (debug.SetMemoryLimit) from the process's
// cgroup memory limit, read by internal/cgroupfs: cgroup v1 (the tightest
// memory.limit_in_bytes, and hierarchical_memory_limit) or v2 (the smallest
// memory.max or memory.high of the cgroup and its ancestors), v1 when the
// v2 hierarchy has no memory controller (a hybrid host).
//
// GOMEMLIMIT = Ratio × limit − memory outside the Go runtime and charged to
// the cgroup (see MemLimitConfig.NoHeadroom), never under the floor
// (MemLimitConfig.Floor, 64 MiB) nor over the limit. The limit is a hard
// one, above which the OOM killer runs: v1's, or v2's memory.max; each
// one on the path to the root is taken with its own cgroup's charge, and
// the one that leaves the least is followed (MemLimit.File names it). A v2
// memory.high under it is a target, not a limit: above it the kernel
// throttles and reclaims but kills nothing, and systemd's MemoryHigh= or a
// proactive-reclaim agent may set it under the usage on purpose. GOMEMLIMIT
// is then lowered toward Ratio × memory.high less its cgroup's charge, but
// never under 1.5 × the live heap (so that GOMEMLIMIT is never
// the cause of a GC death spiral) nor the floor, and never over what
// memory.max gives; a memory.high that keeps falling is followed in steps
// of at least 1/20 of GOMEMLIMIT (hysteresis, never holding GOMEMLIMIT over
// what memory.max gives), a memory.max at once. A hard limit that this
// process could not run under (0, or, when first read, not above what it holds),
// or a memory.high of 0 or 1, is a malformed file (see ErrImplausibleLimit);
// the hard limit already followed, lowered under what it holds at run time, is
// followed with a WARN.
// When a private cgroup namespace's visible top has a memory.max and
// nothing up to it sets a limit, or /proc/self/cgroup names a cgroup no
// mount shows (cgroupfs.ErrUnseen), the limit is unknown, never "none":
// Source is SourceNone, LimitUnknown is true, and Reason says so and names
// the remedies (MEMCTL_MEMORY_LIMIT from the downward API,
// SystemFallback). A limit the operator declares (MEMCTL_MEMORY_LIMIT,
// AWS_LAMBDA_FUNCTION_MEMORY_SIZE) is followed as a cgroup limit where no cgroup shows
// one, and beside a cgroup limit the smaller binds.
//
// The operator wins: when GOMEMLIMIT is set in the environment, or
// AUTOMEMLIMIT=off, Source is SourceEnv and GOMEMLIMIT is left as set; a
// GOMEMLIMIT above what memctl would set from the limit (its ratio less
// the memory charged outside the Go heap) is logged at WARN, naming
// GOMEMLIMIT, the limit, its file and the headroom. The one exception: an
// operator's GOMEMLIMIT above the smallest hard limit is replaced by
// memctl's value while it is above it (MemLimitConfig.KeepOperator). A numeric AUTOMEMLIMIT is the ratio. AUTOMEMLIMIT is read as memctl reads its own
// variables: surrounding space is ignored, "off" in any case, empty is unset
// (as the Go runtime reads an empty GOMEMLIMIT). A process without a cgroup
// limit (no cgroup mounted, no /proc/self/cgroup, a cgroup without a limit,
// off Linux) is normal: GOMEMLIMIT is left as it was, Source is SourceNone,
// Reason starts with "no cgroup memory limit" and says why, and the error is
// nil, unless cfg.SystemFallback asks for the system's memory instead.
//
// On error (an invalid ratio or floor, a cgroup file that cannot be read or
// parsed) GOMEMLIMIT is unchanged, the returned MemLimit has GoMemLimit set to
// it, and the error starts with "limits:". Unless cfg.Refresh is negative
// or the operator set GOMEMLIMIT or AUTOMEMLIMIT=off, the limit is then
// re-read at GC ends and when a limit file is written (see MemLimiter)
// until ctx is done. It is safe to call
// from any goroutine, but GOMEMLIMIT is process-wide: the last call wins.
func SetGoMemLimit(ctx context.Context, cfg MemLimitConfig) (MemLimit, error) {
	m, d, err := NewMemLimiter(cfg)
	context.AfterFunc(ctx, m.Close)
	return d, err
}
