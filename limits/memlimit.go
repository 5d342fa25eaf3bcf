package limits

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/gcend"
	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/internal/sandbox"
)

// DefaultRatio is the share of the memory limit that becomes GOMEMLIMIT when
// MemLimitConfig.Ratio is 0: the rest is headroom for memory the Go runtime
// does not count (cgo, thread stacks, the binary) and for the page cache the
// cgroup is charged for. It is automemlimit's default.
const DefaultRatio = 0.9

// DefaultFloor is the smallest GOMEMLIMIT memctl sets when
// MemLimitConfig.Floor is 0: 64 MiB. GOMEMLIMIT bounds the whole Go
// runtime, live heap included, so a limit near the live heap makes the
// collector run on almost every allocation: a tiny limit or ratio would
// trade an OOM kill for a process that does little but collect. With a
// small live heap (16 MiB), the GC cycles per MiB allocated rise steeply
// below a 64 MiB limit and from 64 MiB are those of GOGC alone: 64 MiB is
// where a small service's GC stops being paced by the limit (measured
// figures: docs/benchmarks.md). It is also the floor automemlimit users
// set with its WithMin. memctl warns when it applies it.
const DefaultFloor = 64 << 20

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
	// MEMCTL_MEMORY_LIMIT (DeclaredLimitEnv); MemLimit.File is
	// "MEMCTL_MEMORY_LIMIT=<value>".
	SourceDeclared
	// SourceLambda: AWS Lambda's AWS_LAMBDA_FUNCTION_MEMORY_SIZE
	// (LambdaMemoryEnv), in MB of 2^20 bytes.
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
	// Default: 0 (means DefaultRatio, 0.9).
	Ratio float64
	// Floor is the smallest GOMEMLIMIT set, in bytes: a limit, ratio or
	// headroom that would give less gives Floor (or the limit itself when
	// the limit is smaller), with a WARN that the GC will run often.
	// Negative is an error. Default: 0 (means DefaultFloor, 64 MiB).
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
	// LiveHeapFactor × the live heap and GOMEMLIMIT was held there.
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
// never under LiveHeapFactor × the live heap (so that GOMEMLIMIT is never
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
// SystemFallback). A limit the operator declares (DeclaredLimitEnv,
// LambdaMemoryEnv) is followed as a cgroup limit where no cgroup shows
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

// MemLimiter keeps GOMEMLIMIT at its MemLimitConfig's share of the memory
// limit: NewMemLimiter sets it once, and then, at the end of a GC cycle at
// most once per MemLimitConfig.Refresh (internal/gcend), and when its
// follower sees a limit file written, it re-reads the limit and the
// memory outside the Go runtime and
// sets GOMEMLIMIT again when the hard limit changed or the result moved by
// 1% or more (a fall toward memory.high: 5%, see SetGoMemLimit). The
// re-read runs on the runtime's cleanup goroutine, which it holds
// for a few small file reads (/proc/self/cgroup, mountinfo, the limit files
// up the hierarchy, /proc/self/status, and the limiting cgroup's
// memory.stat, in v1 also memory.kmem.usage_in_bytes), once per interval;
// every other GC end costs one atomic load (measured figures:
// docs/benchmarks.md). The files are kernel pseudo-files, which do not
// block on I/O.
//
// An idle process runs no GC, and one the kernel throttles under
// memory.high runs few: when a memory cgroup was found, a MemLimiter also
// runs one goroutine, its follower, stopped by Close. It watches
// memory.max and memory.high (v2) or memory.limit_in_bytes (v1) of the
// process's cgroup and each ancestor it can see with inotify (a write(2)
// to them is IN_MODIFY, from any cgroup namespace), parked in the
// runtime's network poller: no thread and no wake-up while no limit file
// is written. A write is followed at once, idle or not, except in a
// process throttled under memory.high, where it can take seconds: the
// follower wakes at once, but the kernel puts the re-reading thread to
// sleep for up to 2 s (MEMCG_MAX_HIGH_DELAY_JIFFIES) at each of its own
// charges while the cgroup is over memory.high. Where inotify is not
// available (the per-user limit fs.inotify.max_user_instances, 128 by
// default, is shared by every process of that user on the node), a file cannot be
// watched, or the limit is one no write reaches (v1's
// hierarchical_memory_limit, set above the mounted hierarchy), a timer
// takes over: only while GOMEMLIMIT follows a cgroup limit, at most once
// per Refresh, reading the limit files and re-reading in full only when
// one changed; each wake-up also costs what any Go timer's wake-up costs
// the runtime (measured figures for the follower and the timer:
// docs/benchmarks.md). Following says which way the limit is followed.
// The follower reads GOMEMLIMIT through runtime/metrics, not
// debug.SetMemoryLimit(-1), which takes the heap lock.
//
// It never overrides the operator (GOMEMLIMIT or AUTOMEMLIMIT=off in the
// environment: no refresh at all), never replaces a limit the program set
// itself with "no limit" (when a limit memctl followed goes away,
// GOMEMLIMIT goes back to its value before memctl set it), and stops when
// the program changes GOMEMLIMIT after memctl set it (logged once at
// INFO). A failed re-read leaves GOMEMLIMIT as it is. Its methods are safe
// for concurrent use; a nil *MemLimiter does nothing.
type MemLimiter struct {
	ratio     float64
	ratioFrom string
	floor     int64
	fallback  bool
	headroom  bool
	every     time.Duration
	log       *slog.Logger
	read      func() (cgroupfs.Limit, error)
	usage     func() (held, goMapped int64, err error)
	cgFile    string
	charge    func(version int, dir string) (charge, error)
	live      func() int64

	epoch time.Time
	next  atomic.Int64 // nanoseconds since epoch of the next due re-read
	last  atomic.Pointer[MemLimit]
	// subs receive each change of the decision (Subscribe); onChange is
	// MemLimitConfig.OnChange.
	disown   func() // removes m as GOMEMLIMIT's owner (gomemlimit.SetOwner)
	subMu    sync.Mutex
	subs     []chan MemLimit
	onChange func(MemLimit)
	sub      *gcend.Subscription

	on bool // the configuration is valid
	// op is the operator's GOMEMLIMIT (bytes; math.MaxInt64 for "off" or
	// none under AUTOMEMLIMIT=off), 0 when the operator set neither; opText
	// the variable as set. opWrites: memctl may set its own value while op
	// is above the hard limit (see MemLimitConfig.KeepOperator).
	op       int64
	opText   string
	opWrites bool
	mu       sync.Mutex        // serializes decisions; the fields below
	applied  int64             // GOMEMLIMIT memctl set last; 0: none yet
	before   int64             // GOMEMLIMIT before memctl set it
	limit    int64             // the limit behind applied
	maxFile  string            // the hard limit's file behind applied ("" for none)
	lift     int64             // bytes added over the decision while lifted (Lift)
	outside  int64             // the last estimate of memory outside the Go runtime
	goMapped int64             // what the Go runtime had mapped at that estimate
	charges  map[string]charge // the last account read from each cgroup directory
	seen     map[string]bool
	stopped  bool

	decl    declared // the limit the environment declares (hasDecl)
	hasDecl bool
	sandbox string   // internal/sandbox.Detect, read once
	dir     string   // the cgroup directory the last probe read ("" for none)
	version int      // its cgroup version
	files   []string // the files the last decision came from (bounds, memory.high)

	following  atomic.Pointer[string] // Following
	poked      atomic.Int64           // nanoseconds since epoch of the last Poke re-read
	folMu      sync.Mutex             // fol, folClosing
	fol        follower               // nil until started
	folClosing bool
	folDone    chan struct{}
	closed     atomic.Bool // Close was called: Poke re-reads nothing
}

// maxSeen bounds how many distinct failures a MemLimiter remembers (and
// logs once each).
const maxSeen = 64

// NewMemLimiter validates cfg, sets GOMEMLIMIT as SetGoMemLimit describes,
// and starts the refresh unless cfg.Refresh is negative, the operator's
// environment wins, or cfg is invalid. It always returns a usable
// *MemLimiter (Close it to stop the refresh), the decision, and the error
// SetGoMemLimit would return.
func NewMemLimiter(cfg MemLimitConfig) (*MemLimiter, MemLimit, error) {
	m := &MemLimiter{
		fallback: cfg.SystemFallback, headroom: !cfg.NoHeadroom, log: cfg.Logger,
		read: cfg.read, usage: cfg.usage, cgFile: cfg.cgroupFile, epoch: time.Now(),
		charge: cfg.charge, live: cfg.live, onChange: cfg.OnChange,
		seen: make(map[string]bool), charges: make(map[string]charge),
	}
	if m.charge == nil {
		m.charge = readCharge
	}
	if m.live == nil {
		m.live = readLive
	}
	if m.read == nil {
		m.read, m.cgFile = func() (cgroupfs.Limit, error) { return cgroupfs.Of(0) }, "/proc/self/cgroup"
	}
	if m.usage == nil {
		m.usage = readUsage
	}
	d := MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}
	m.sandbox = sandbox.Detect()
	d.Sandbox = m.sandbox
	var bad []error
	held, _, uerr := m.usage()
	if uerr != nil {
		held = 0 // not known: only the value itself is judged
	}
	m.decl, m.hasDecl, bad = readDeclared(held)
	for _, err := range bad {
		if m.log != nil {
			m.log.Warn("limits: declared memory limit", "error", err)
		}
	}
	m.ratio, m.ratioFrom = cfg.Ratio, "configured"
	if m.ratio == 0 {
		m.ratio, m.ratioFrom = DefaultRatio, "default"
	}
	// An empty GOMEMLIMIT is no limit to the Go runtime
	// (runtime.readGOMEMLIMIT treats "" as unset): it counts as unset. Any
	// other value is the operator's, already parsed by the runtime: it is
	// kept, and the limit is still followed, so that a value a resize put
	// above the hard limit is seen (see MemLimitConfig.KeepOperator).
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		m.op, m.opText = d.GoMemLimit, "GOMEMLIMIT="+v
		m.opWrites = !cfg.KeepOperator && d.GoMemLimit != math.MaxInt64
	} else if v, ok := envflag.Lookup("AUTOMEMLIMIT"); ok {
		// automemlimit's variable, read with memctl's one grammar
		// (internal/envflag): an off word leaves GOMEMLIMIT to the program
		// (memctl only follows the limit), an on word is the configured
		// ratio, a number in (0, 1] the ratio.
		r, err := envflag.Ratio("AUTOMEMLIMIT", os.Getenv("AUTOMEMLIMIT"), m.ratio)
		if err != nil {
			d.Reason = "GOMEMLIMIT left as it was: bad AUTOMEMLIMIT"
			m.store(d)
			return m, d, fmt.Errorf("limits: %w", err)
		}
		switch {
		case r == 0:
			m.op, m.opText = d.GoMemLimit, "AUTOMEMLIMIT="+v
		case !envflag.IsOn(v):
			m.ratio, m.ratioFrom = r, "AUTOMEMLIMIT"
		}
	}
	if !validRatio(m.ratio) {
		d.Reason = "GOMEMLIMIT left as it was: bad ratio"
		m.store(d)
		return m, d, fmt.Errorf("limits: GOMEMLIMIT ratio %v: want a ratio in (0.0, 1.0]", m.ratio)
	}
	if m.floor = orDefault(cfg.Floor, DefaultFloor); m.floor < 0 {
		d.Reason = "GOMEMLIMIT left as it was: bad floor"
		m.store(d)
		return m, d, fmt.Errorf("limits: GOMEMLIMIT floor %d: want a byte count of 0 (the default, %d) or more", cfg.Floor, DefaultFloor)
	}
	m.every = orDefault(cfg.Refresh, DefaultRefresh)
	m.on = true
	m.disown = gomemlimit.SetOwner(m) // lifts (package pressure) come here
	m.mu.Lock()
	d, err := m.decide(true)
	m.mu.Unlock()
	if m.every > 0 {
		m.next.Store(int64(m.every))
		if !cfg.noGCEnd {
			m.sub = gcend.Subscribe(m.atGCEnd)
		}
		m.mu.Lock()
		found := m.dir != "" && !m.stopped
		m.mu.Unlock()
		if found {
			nf := cfg.follower
			if nf == nil {
				nf = newFollower
			}
			m.startFollow(nf)
		}
	}
	return m, d, err
}

func orDefault[T int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Refresh re-reads the limit now, sets GOMEMLIMIT as the refresh does, and
// returns the decision; the error is that of SetGoMemLimit. Failures are
// logged as the refresh logs them. It does nothing (and returns Last) when
// the operator's environment wins, the configuration was invalid, or the
// program took GOMEMLIMIT over. Safe for concurrent use.
func (m *MemLimiter) Refresh() (MemLimit, error) {
	if m == nil {
		return MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.stopped {
		return m.Last(), nil
	}
	m.next.Store(dueAfter(time.Since(m.epoch), m.every))
	return m.decide(false)
}

// Last returns the latest decision. Safe for concurrent use.
func (m *MemLimiter) Last() MemLimit {
	if m == nil {
		return MemLimit{GoMemLimit: debug.SetMemoryLimit(-1)}
	}
	return *m.last.Load()
}

// Interval returns the least time between two re-reads, 0 when there is no
// refresh.
func (m *MemLimiter) Interval() time.Duration {
	if m == nil || m.sub == nil {
		return 0
	}
	return m.every
}

// Close stops the refresh and the follower, and waits for the follower's
// goroutine to exit; GOMEMLIMIT stays as it is. Idempotent, safe for
// concurrent use.
func (m *MemLimiter) Close() {
	if m != nil {
		m.closed.Store(true)
		if m.disown != nil {
			m.disown()
		}
		m.sub.Stop()
		m.closeFollow()
		m.subMu.Lock()
		for _, ch := range m.subs {
			close(ch)
		}
		m.subs = nil
		m.subMu.Unlock()
	}
}

// store publishes d as the latest decision and, when what it says is in
// force changed (GOMEMLIMIT, the limit, memory.high, where they came from,
// an operator's value overridden), tells the subscribers and OnChange.
func (m *MemLimiter) store(d MemLimit) {
	prev := m.last.Swap(&d)
	if prev != nil && prev.GoMemLimit == d.GoMemLimit && prev.MemoryLimit == d.MemoryLimit && prev.High == d.High &&
		prev.Source == d.Source && prev.File == d.File && prev.Overridden == d.Overridden {
		return
	}
	m.subMu.Lock()
	for _, ch := range m.subs {
		// The latest wins: a full channel gives up its stale value.
		select {
		case ch <- d:
		default:
			select {
			case <-ch:
			default:
			}
			select {
			case ch <- d:
			default:
			}
		}
	}
	m.subMu.Unlock()
	if m.onChange != nil && prev != nil {
		m.onChange(d)
	}
}

// Subscribe returns a channel that receives the decision each time what
// it says is in force changes: GOMEMLIMIT, the memory limit (a resize),
// memory.high, their source, an operator's value overridden or given back.
// buf is the channel's room, at least 1; when it is full the oldest
// decision is dropped for the newest, so the last one received is always
// the one in force. cancel stops the deliveries and closes the channel;
// Close closes it too. It costs nothing while nothing changes. Safe for
// concurrent use; on a nil *MemLimiter the channel is closed at once.
func (m *MemLimiter) Subscribe(buf int) (changes <-chan MemLimit, cancel func()) {
	ch := make(chan MemLimit, max(buf, 1))
	if m == nil {
		close(ch)
		return ch, func() {}
	}
	m.subMu.Lock()
	defer m.subMu.Unlock()
	if m.closed.Load() {
		close(ch)
		return ch, func() {}
	}
	m.subs = append(m.subs, ch)
	return ch, func() {
		m.subMu.Lock()
		defer m.subMu.Unlock()
		if i := slices.Index(m.subs, ch); i >= 0 {
			m.subs = slices.Delete(m.subs, i, i+1)
			close(ch)
		}
	}
}

// atGCEnd runs on the runtime's cleanup goroutine at each GC end: one
// atomic load until the interval has passed, then one re-read, skipped when
// a Refresh call holds the lock (it is re-reading anyway).
func (m *MemLimiter) atGCEnd(*gcend.Sample) bool {
	return m.tick(time.Since(m.epoch))
}

func (m *MemLimiter) tick(now time.Duration) bool {
	if int64(now) < m.next.Load() {
		return true
	}
	if !m.mu.TryLock() {
		return true
	}
	defer m.mu.Unlock()
	m.next.Store(dueAfter(now, m.every))
	if m.stopped {
		return false
	}
	_, _ = m.decide(false)
	return !m.stopped
}

// dueAfter returns now + every, or math.MaxInt64 (never) when the sum
// overflows: an interval near the largest time.Duration (MEMCTL_REFRESH=
// 2562047h) would otherwise wrap to a negative time, due at every GC end.
func dueAfter(now, every time.Duration) int64 {
	if every > math.MaxInt64-now {
		return math.MaxInt64
	}
	return int64(now + every)
}

// decide reads the limit and the memory outside the Go runtime, sets
// GOMEMLIMIT, records and returns the decision. first is the call of
// NewMemLimiter: its errors are returned, not logged. Called with m.mu held.
//
// The arithmetic, all in bytes:
//
//	outside(cg) = max(held − Go mapped,                          this process outside the Go runtime
//	                  anon + shmem + kernel − Go resident)      the cgroup's memory.stat (chargeOf)
//	hard        = min over each hard limit L on the path (memory.max, v1's limit) of
//	              Ratio × L − outside(L's cgroup), raised to the floor
//	target      = max(Ratio × memory.high − outside(memory.high's cgroup),
//	                  LiveHeapFactor × live heap, floor)
//	GOMEMLIMIT  = min(hard, target)       (target only when memory.high is under memory.max)
//
// A fall of the target is followed only when it is at least 1/20 of
// GOMEMLIMIT (hysteresis); a fall of hard is followed at once.
func (m *MemLimiter) decide(first bool) (d MemLimit, err error) {
	// The whole decision holds GOMEMLIMIT's one writer, so that a trim's
	// transient value is never read as the program's.
	gomemlimit.Do(func() { d, err = m.decideLocked(first) })
	m.store(d)
	return d, err
}

func (m *MemLimiter) decideLocked(first bool) (MemLimit, error) {
	cur := gomemlimit.Read()
	if expect := m.expected(); expect != 0 && cur != expect {
		m.stopped = true
		m.info(fmt.Sprintf("limits: GOMEMLIMIT was changed to %d by the program; memctl no longer refreshes it", cur))
		return MemLimit{GoMemLimit: cur, Reason: "GOMEMLIMIT was set by the program after memctl"}, nil
	}
	d, a, err := m.plan(first, cur)
	if m.op != 0 {
		return m.applyOperator(d, a, first), err
	}
	return m.apply(d, a, cur, first), err
}

// expected returns the GOMEMLIMIT the limiter expects in force: the value
// it set last, or the operator's; 0 when neither.
func (m *MemLimiter) expected() int64 {
	if m.applied != 0 {
		return m.applied
	}
	return m.op
}

// action is what plan leaves to apply: set want (kind actSet), go back to
// GOMEMLIMIT's value before memctl set it (actRestore), or nothing.
type action struct {
	kind       int
	want       int64 // GOMEMLIMIT memctl's rule gives
	hardWant   int64 // the most the hard limit allows, charges taken off
	hard       int64 // the hard limit followed; noLimit for memory.high alone
	hardMin    int64 // the smallest hard limit on the path; noLimit for none
	hardFile   string
	maxFile    string
	highDriven bool
	why        string // for actRestore
}

const (
	actNone = iota
	actSet
	actRestore
)

// plan reads the limit and the memory outside the Go runtime and returns
// the decision memctl's rule gives and what applying it takes; it writes
// nothing. Called with m.mu held.
func (m *MemLimiter) plan(first bool, cur int64) (MemLimit, action, error) {
	d := MemLimit{GoMemLimit: cur}
	f, err := m.probe()
	d.LimitUnknown, d.Sandbox = f.unknown, m.sandbox
	if err == nil {
		m.dir, m.version, m.files = f.dir, f.version, f.files()
	}
	if err != nil {
		d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
		m.warn(first, err.Error(), err)
		return d, action{}, err
	}
	if f.source == SourceNone {
		d.Reason = f.why + "; GOMEMLIMIT left as it was"
		return d, action{kind: actRestore, why: f.why, hardMin: noLimit}, nil
	}
	// held: what this process holds that the kernel cannot reclaim
	// (RssAnon + RssShmem; see readUsage).
	held, goMapped, uerr := m.usage()
	if uerr != nil {
		held = goMapped // no /proc here: judge by the Go runtime's share alone
	}
	// limit is the hard limit when there is one (memory.max, v1's
	// limit), else memory.high alone; high is memory.high when it is
	// under the hard limit (or there is none).
	limit, file, high, highFile := f.max, f.maxFile, f.high, f.highFile
	if high != noLimit && high <= 1 {
		// 0 and 1 are not a target any process could run under: a
		// malformed file. memory.max is honoured without it.
		err := fmt.Errorf("%w: %s says %d bytes; it is not followed", ErrImplausibleLimit, highFile, high)
		if limit == noLimit {
			d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
			m.warn(first, fmt.Sprintf("implausible %s %d", highFile, high), err)
			return d, action{}, err
		}
		m.warn(false, fmt.Sprintf("implausible %s %d", highFile, high), fmt.Errorf("limits: memory.high ignored: %w", err))
		high, highFile = noLimit, ""
	}
	hasHard := limit != noLimit
	if !hasHard {
		limit, file = high, highFile
	} else if high != noLimit && high >= limit {
		high, highFile = noLimit, ""
	}
	if hasHard && limit > 0 && limit <= held && !first && m.applied != 0 && f.maxFile != "" && f.maxFile == m.maxFile {
		// The hard limit memctl follows is at or under what this
		// process holds at run time: lowered (an in-place resize,
		// set-property MemoryMax=), or reached. The kernel reclaims, or
		// OOM-kills, above it, so it is honoured, not taken for a file
		// that is not this process's.
		// Said once per file, and only when the limit moved: a usage
		// at an unchanged limit is not a lowered limit.
		if limit < m.limit {
			m.warn(false, "under usage "+file, fmt.Errorf("limits: %s was lowered from %d to %d bytes, under the %d bytes this process holds (RssAnon + RssShmem): followed; the kernel reclaims or OOM-kills above it", file, m.limit, limit, held))
		}
	} else if hasHard && (limit <= 0 || limit <= held) {
		err := fmt.Errorf("%w: %s says %d bytes, but this process already holds %d bytes (RssAnon + RssShmem); GOMEMLIMIT left at %d",
			ErrImplausibleLimit, cmpString(file, f.source.String()), limit, held, cur)
		d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
		m.warn(first, fmt.Sprintf("implausible %s %d", file, limit), err)
		return d, action{}, err
	}
	d.MemoryLimit, d.Ratio, d.Source, d.File = limit, m.ratio, f.source, file

	outside := int64(0)
	if m.headroom && uerr == nil {
		// Held memory below what the runtime has mapped while that grows
		// (heap mapped during a burst that the kernel has not backed yet)
		// says nothing about the memory outside it: the last estimate is
		// kept rather than dropped to 0 exactly when the heap is large.
		// Otherwise the estimate is taken afresh (it errs low by the
		// pages the runtime mapped and never touched).
		if held >= goMapped || goMapped <= m.goMapped {
			m.outside = max(held-goMapped, 0)
		}
		m.goMapped = goMapped
		outside = m.outside
	}
	// The cgroup's own account, from the cgroup whose limit applies:
	// what it is charged that the Go runtime does not hold and the kernel
	// cannot reclaim.
	goResident := min(goMapped, held)
	charged := func(cgFile string) (int64, charge) {
		dir := f.chargeDir(cgFile)
		if !m.headroom || dir == "" {
			return 0, charge{}
		}
		c, ok := m.chargeOf(f.version, dir)
		if !ok {
			return 0, charge{}
		}
		return max(c.total()-goResident, 0), c
	}
	floor := min(m.floor, limit) // never over the tightest limit
	want := int64(math.MaxInt64)
	why := f.why
	var hardCharged int64 // of the hard limit followed
	var hc charge
	if hasHard {
		// Every hard limit on the path binds: the one that leaves the
		// least once its cgroup's charge is taken off is followed (a pod's
		// limit, with sidecars charged to the pod, can leave less than
		// the container's own).
		bounds := f.bounds
		if len(bounds) == 0 {
			bounds = []cgroupfs.Bound{{Bytes: limit, File: file}}
		}
		for i, b := range bounds {
			c, cc := charged(b.File)
			w := int64(min(float64(b.Bytes)*m.ratio, math.MaxInt64)) - max(outside, c)
			if i == 0 || w < want {
				want, hardCharged, hc, limit, file = w, c, cc, b.Bytes, b.File
			}
		}
		d.Reclaimable = max(hc.reclaimable, 0)
		if f.maxFile != "" && file != f.maxFile {
			why = fmt.Sprintf("from %s (with what its cgroup is charged, it leaves less than the tighter %s)", file, f.maxFile)
		}
		d.MemoryLimit, d.File, d.Source = limit, file, f.sourceOf(file)
		d.Outside = max(outside, hardCharged)
	}
	d.Reason = fmt.Sprintf("%s ratio %v of the %s limit %s", m.ratioFrom, m.ratio, d.Source, why)
	if hasHard {
		if hardCharged > outside {
			d.Charged = hardCharged
			d.Reason += fmt.Sprintf(", minus %s charged to the cgroup that the Go runtime does not hold and the kernel cannot reclaim (%s)", inMiB(hardCharged), hc)
		} else if d.Outside > 0 {
			d.Reason += fmt.Sprintf(", minus %s outside the Go runtime", inMiB(d.Outside))
		}
		if d.Outside > limit/2 {
			m.warn(false, "headroom "+file, fmt.Errorf("limits: %s of the %s limit of %s is charged outside the Go runtime, most of it: %s", inMiB(d.Outside), inMiB(limit), file, d.Reason))
		}
		if want < floor {
			want, d.AtFloor = floor, true
			if floor < m.floor {
				d.Reason += fmt.Sprintf(", raised to the limit itself (under the floor %s): the GC will run often", inMiB(m.floor))
			} else {
				d.Reason += fmt.Sprintf(", raised to the floor %s: the GC will run often", inMiB(floor))
			}
			m.warn(false, fmt.Sprintf("floor %s %d", file, limit),
				fmt.Errorf("limits: GOMEMLIMIT at the floor %d bytes (%s): the GC will run often", want, d.Reason))
		}
	}
	// hardWant is the most memory.max allows, charges taken off; the dead
	// band below never holds GOMEMLIMIT above it.
	hardWant := want
	highDriven := false
	if high != noLimit {
		// memory.high is a target: above it the kernel throttles and
		// reclaims but kills nothing, so GOMEMLIMIT follows it down only
		// as far as the live heap allows.
		highCharged, hc := charged(highFile)
		highOut := max(outside, highCharged)
		target := int64(min(float64(high)*m.ratio, math.MaxInt64)) - highOut
		why := ""
		if hasHard {
			why = fmt.Sprintf(", toward memory.high %s (%s: the throttle limit, a target under memory.max)", inMiB(high), highFile)
		} else {
			d.Outside = highOut
		}
		if highCharged > outside {
			d.Charged = max(d.Charged, highCharged)
			why += fmt.Sprintf(", minus %s charged to its cgroup that the Go runtime does not hold and the kernel cannot reclaim (%s)", inMiB(highCharged), hc)
		} else if !hasHard && highOut > 0 {
			why += fmt.Sprintf(", minus %s outside the Go runtime", inMiB(highOut))
		}
		live := m.live()
		if liveFloor := int64(min(float64(live)*LiveHeapFactor, math.MaxInt64/2)); target < liveFloor {
			target, d.LiveFloor = liveFloor, true
			why += fmt.Sprintf(", held at %v x the live heap of %s so that GOMEMLIMIT never drives the GC into a spiral", LiveHeapFactor, inMiB(live))
		}
		// Above memory.high the kernel throttles, it does not kill: the
		// floor is capped by the hard limit only.
		tfloor := m.floor
		if hasHard {
			tfloor = floor
		}
		if target < tfloor {
			target = tfloor
			why += fmt.Sprintf(", held at the floor %s", inMiB(tfloor))
		}
		if target < want {
			want, highDriven, d.AtFloor = target, true, false
			d.High, d.HighFile = high, highFile
			d.Reason += why
		}
	}
	if m.lift > 0 {
		// The lift ends at the limit less what the cgroup is charged
		// outside the Go runtime (a lift to the limit itself with 300 MiB
		// of tmpfs in a 512 MiB cgroup was an OOM kill); want and the lift
		// capped at limit (under 2^62) cannot overflow:
		// Lift(math.MaxInt64) means all the way up.
		lift := min(m.lift, max(limit-d.Outside-want, 0))
		want += lift
		hardWant = min(hardWant, math.MaxInt64-lift) + lift
		d.Reason += fmt.Sprintf(", lifted by %s (death spiral)", inMiB(lift))
	}
	d.GoMemLimit = want
	// hard is the limit a change of which is followed at once: memory.max
	// (or v1's), not a memory.high alone.
	hard, hardMin := limit, int64(noLimit)
	if !hasHard {
		hard = noLimit
	}
	for _, b := range f.bounds {
		if b.Bytes != noLimit && (hardMin == noLimit || b.Bytes < hardMin) {
			hardMin = b.Bytes
		}
	}
	if hasHard && hardMin == noLimit {
		hardMin = limit
	}
	return d, action{kind: actSet, want: want, hardWant: hardWant, hard: hard, hardMin: hardMin,
		hardFile: file, maxFile: f.maxFile, highDriven: highDriven}, nil
}

// apply sets GOMEMLIMIT as a says and returns d with the value in force.
// Hysteresis: a memory.high that falls step by step (a proactive reclaim
// agent) is followed in steps of at least 1/20 of GOMEMLIMIT, not at each
// refresh; the hard limit is followed at once, and the value held is never
// over what it allows (hardWant: a memory.high just under memory.max, and
// more charged outside the Go runtime, lowers both). Called with m.mu held.
func (m *MemLimiter) apply(d MemLimit, a action, cur int64, first bool) MemLimit {
	switch a.kind {
	case actRestore:
		if m.applied != 0 {
			// The limit memctl followed is gone (a resize to no limit):
			// back to what GOMEMLIMIT was before memctl set it.
			gomemlimit.Set(m.before)
			noteMemLimitSet()
			m.info(fmt.Sprintf("limits: GOMEMLIMIT %d (was %d), as before memctl set it: %s", m.before, cur, a.why))
			d.GoMemLimit, d.Reason = m.before, a.why+"; GOMEMLIMIT back to its value before memctl set it"
			m.applied, m.limit, m.maxFile = 0, 0, ""
		}
		return d
	case actNone:
		return d
	}
	falling := a.highDriven && m.applied != 0 && a.hard == m.limit && a.want < m.applied && m.applied-a.want < m.applied/20 && m.applied <= a.hardWant
	if !falling && (m.applied == 0 || a.hard != m.limit || !within(a.want, m.applied, 100)) {
		prev := gomemlimit.Set(a.want)
		noteMemLimitSet()
		if m.applied == 0 {
			m.before = prev
		}
		if !first && prev != a.want {
			m.info(fmt.Sprintf("limits: GOMEMLIMIT %d (was %d): %s", a.want, prev, d.Reason))
		}
		m.applied, m.limit, m.maxFile = a.want, a.hard, a.maxFile
	} else {
		d.GoMemLimit = m.applied // moved by less than 1% (5% down toward memory.high): left as it is
	}
	return d
}

// applyOperator keeps the operator's GOMEMLIMIT in force, except while it
// is above the smallest hard limit and memctl may write (see
// MemLimitConfig.KeepOperator): then memctl's own value d is applied, and
// the operator's comes back when the limit rises above it again. The
// result says which is in force. Called with m.mu held.
func (m *MemLimiter) applyOperator(own MemLimit, a action, first bool) MemLimit {
	over := a.kind == actSet && m.op != math.MaxInt64 && a.hardMin != noLimit && m.op > a.hardMin
	if over && m.opWrites {
		d := m.apply(own, a, m.expected(), first)
		d.Operator, d.Overridden = m.op, true
		d.Reason = fmt.Sprintf("%s (%s) is above the %s limit of %s (%s) and cannot take effect before the OOM killer: memctl sets %s until the limit rises above it again (MEMCTL_KEEP_GOMEMLIMIT=on keeps it); %s",
			m.opText, inMiB(m.op), own.Source, inMiB(a.hardMin), a.hardFile, inMiB(d.GoMemLimit), d.Reason)
		m.warnAlways(fmt.Sprintf("operator over %s %d", a.hardFile, a.hardMin), "limits: "+d.Reason)
		return d
	}
	if m.applied != 0 {
		// The limit rose above the operator's value again: back to it.
		gomemlimit.Set(m.op)
		noteMemLimitSet()
		m.info(fmt.Sprintf("limits: GOMEMLIMIT back to the operator's %s (%d bytes): the hard limit %d (%s) is above it again", m.opText, m.op, a.hardMin, a.hardFile))
		m.applied, m.limit, m.maxFile = 0, 0, ""
	}
	d := MemLimit{GoMemLimit: m.op, Source: SourceEnv, Operator: m.op, Sandbox: own.Sandbox, LimitUnknown: own.LimitUnknown,
		Reason: m.opText + " is set in the environment"}
	if strings.HasPrefix(m.opText, "AUTOMEMLIMIT") {
		d.Operator = 0
	}
	if a.kind != actSet {
		return d
	}
	d.MemoryLimit, d.Ratio, d.File, d.High, d.HighFile = own.MemoryLimit, own.Ratio, own.File, own.High, own.HighFile
	d.Outside, d.Charged = own.Outside, own.Charged
	switch {
	case over:
		d.Reason = fmt.Sprintf("%s (%s) is set in the environment; it is above the %s limit of %s (%s) and cannot take effect before the OOM killer, and is kept (MEMCTL_KEEP_GOMEMLIMIT)", m.opText, inMiB(m.op), own.Source, inMiB(a.hardMin), a.hardFile)
		m.warnAlways(fmt.Sprintf("operator over %s %d", a.hardFile, a.hardMin), "limits: "+d.Reason)
	case m.op != math.MaxInt64 && m.op > a.hardWant:
		// At or near the limit, leaving less than memctl's rule would:
		// said at WARN once per limit.
		err := fmt.Errorf("limits: %s (%s) is set in the environment and is left as set, but it leaves %s under the %s limit of %s (%s), where memctl's rule leaves %s: ratio %v of the limit (%s for what the Go runtime does not count) and %s charged outside the Go heap; "+
			"the OOM killer may act before the GC does: lower GOMEMLIMIT, or unset it and let memctl set it (%s for a limit no cgroup shows)",
			m.opText, inMiB(m.op), signedMiB(d.MemoryLimit-m.op), own.Source, inMiB(d.MemoryLimit), d.File, inMiB(d.MemoryLimit-a.hardWant),
			own.Ratio, inMiB(int64((1-own.Ratio)*float64(d.MemoryLimit))), inMiB(own.Outside), DeclaredLimitEnv)
		d.Reason += "; " + strings.TrimPrefix(err.Error(), "limits: "+m.opText+" ")
		if key := fmt.Sprintf("operator headroom %s %d", d.File, d.MemoryLimit); !m.seen[key] && len(m.seen) < maxSeen {
			m.seen[key] = true
			if m.log != nil {
				m.log.Warn("limits: GOMEMLIMIT leaves little headroom", "error", err,
					"gomemlimit", m.op, "limit", d.MemoryLimit, "limit_file", d.File,
					"headroom", d.MemoryLimit-m.op, "ratio", own.Ratio, "outside", own.Outside)
			}
		}
	}
	return d
}

// warnAlways logs msg at WARN once per key, the first decision's included.
func (m *MemLimiter) warnAlways(key, msg string) {
	if m.seen[key] || len(m.seen) >= maxSeen {
		return
	}
	m.seen[key] = true
	if m.log != nil {
		m.log.Warn(msg)
	}
}

// Lift adds extra bytes to the GOMEMLIMIT the limiter sets, never above
// the cgroup limit, from now until Lift(0), re-applying GOMEMLIMIT at once;
// the refresh keeps the lift, so a lift is not mistaken for the program
// taking GOMEMLIMIT over. It is how package pressure lifts GOMEMLIMIT during
// a GC death spiral while the limit is refreshed. It returns GOMEMLIMIT
// before and after, and false (changing nothing) when the limiter does not
// set GOMEMLIMIT (the operator's, no cgroup limit, stopped, closed) or
// extra is negative. Safe for concurrent use.
func (m *MemLimiter) Lift(extra int64) (from, to int64, ok bool) {
	if m == nil || extra < 0 {
		return 0, 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.stopped || m.applied == 0 {
		return 0, 0, false
	}
	from = debug.SetMemoryLimit(-1)
	m.lift = extra
	d, err := m.decide(false)
	if err != nil || m.stopped {
		m.lift = 0
		return from, debug.SetMemoryLimit(-1), false
	}
	return from, d.GoMemLimit, true
}

// Ceiling returns the cgroup's hard memory limit GOMEMLIMIT follows, the
// ceiling of a lift, in bytes; 0 when the limiter sets no GOMEMLIMIT from
// a cgroup limit. Safe for concurrent use.
func (m *MemLimiter) Ceiling() int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if src := m.Last().Source; m.applied == 0 || m.stopped || m.limit <= 0 || src != SourceCgroupV1 && src != SourceCgroupV2 {
		return 0
	}
	return m.limit
}

// Hold calls fn while no refresh and no Lift can set GOMEMLIMIT, and
// returns when fn does: a caller that lowers GOMEMLIMIT for a moment does
// it through the limiter (the trim's Go step holds internal/gomemlimit).
// fn must restore GOMEMLIMIT exactly before it returns, so that the
// refresh does not take the transient value for the program's; a refresh
// due meanwhile runs at a later GC end, a Lift waits. On a nil
// *MemLimiter fn is called directly. Safe for concurrent use; fn must not
// call the limiter's methods.
func (m *MemLimiter) Hold(fn func()) { gomemlimit.Do(fn) }

// within reports whether a is within 1/frac of b.
func within(a, b, frac int64) bool {
	diff := a - b
	if diff < 0 {
		diff = -diff
	}
	return diff < b/frac
}

func cmpString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func inMiB(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }

// found is what probe found: the hard limit (memory.max or v1's limit)
// and memory.high apart, each noLimit when absent, the source, the cgroup
// version, and a phrase on where the limit came from (or, for SourceNone,
// why there is none).
type found struct {
	max, high         int64
	maxFile, highFile string
	bounds            []cgroupfs.Bound // every hard limit on the path
	source            Source
	version           int
	why               string
	unknown           bool // the limit may be set above the cgroup namespace
	// cgSource is the cgroup's Source (v1 or v2); decl and declSource
	// the declared limit's file (declared.file) and Source.
	cgSource   Source
	decl       string
	declSource Source
	dir        string // the process's cgroup directory, "" when none was found
}

// files returns the cgroup files the limit came from: every hard limit on
// the path and memory.high (a declared limit's "VAR=value" is no file).
func (f found) files() []string {
	var out []string
	add := func(file string) {
		if filepath.IsAbs(file) {
			out = append(out, file)
		}
	}
	for _, b := range f.bounds {
		add(b.File)
	}
	if f.maxFile != "" && len(f.bounds) == 0 {
		add(f.maxFile)
	}
	if f.highFile != "" {
		add(f.highFile)
	}
	return out
}

const noLimit = cgroupfs.NoLimit

// probe returns the limit and where it came from. A missing cgroup is
// SourceNone, not an error; so is a v2 cgroup namespace whose visible top
// sets no limit, or a cgroup no mount shows (cgroupfs.ErrUnseen), with a
// why that says the limit is unknown and names the remedies. A limit the
// environment declares (MEMCTL_MEMORY_LIMIT, Lambda's) is one more hard
// limit: alone where no cgroup shows one, and beside the cgroup's, the
// smaller binding, when one does.
func (m *MemLimiter) probe() (found, error) {
	l, err := m.read()
	if err == nil && l.HighErr != nil {
		// A malformed memory.high is not the kernel's; memory.max,
		// read without it, is still honoured.
		m.warn(false, l.HighErr.Error(), fmt.Errorf("limits: memory.high ignored: %w", l.HighErr))
		if l.Bytes == cgroupfs.NoLimit && !m.hasDecl {
			return found{}, fmt.Errorf("limits: memory limit: %w", l.HighErr)
		}
	}
	if err == nil && l.StatErr != nil {
		// v1's memory.stat adds only a limit set above the mount: the
		// limit files read are still honoured.
		m.warn(false, l.StatErr.Error(), fmt.Errorf("limits: hierarchical_memory_limit not read (a limit set above the mounted part of the hierarchy may be missed): %w", l.StatErr))
	}
	if err == nil {
		for _, u := range l.Unreadable {
			// Another mount of the hierarchy showed the limit: the
			// unreadable one is passed over, said once at WARN.
			m.warn(false, u.Error(), fmt.Errorf("limits: a mount of the cgroup hierarchy could not be read, and the limit another mount shows is followed (a limit only this mount shows may be missed): %w", u))
		}
	}
	if l.MaxFile == "" && l.HighFile == "" && l.File != "" {
		// A Limit with Bytes and File only (made by hand): File says
		// which kind of limit Bytes is.
		l.Max, l.MaxFile, l.High = l.Bytes, l.File, noLimit
		if filepath.Base(l.File) == "memory.high" {
			l.Max, l.MaxFile, l.High, l.HighFile = noLimit, "", l.Bytes, l.File
		}
	}
	f := found{max: noLimit, high: noLimit, version: l.Version}
	if m.hasDecl {
		f.decl, f.declSource = m.decl.file(), m.decl.source
	}
	if err == nil {
		f.dir = l.Dir
	}
	var why string
	switch {
	case err == nil && l.Bytes != cgroupfs.NoLimit:
		f.source = SourceCgroupV1
		if l.Version == 2 {
			f.source = SourceCgroupV2
		}
		f.cgSource = f.source
		f.max, f.maxFile, f.high, f.highFile, f.bounds = l.Max, l.MaxFile, l.High, l.HighFile, l.Bounds
		if f.max != noLimit {
			f.why = "from " + f.maxFile
		} else {
			f.why = "from " + f.highFile + " (memory.high, the throttle limit; no memory.max is set)"
			if l.TopNotRoot {
				f.why = "from " + f.highFile + " (memory.high, the throttle limit; no memory.max is set up to the top of this cgroup namespace, and one may be set above it: the hard limit is unknown)"
			}
		}
		if m.hasDecl {
			// Both bind: the declared limit is one more hard limit
			// (the one that leaves the least is followed, decide).
			if len(f.bounds) == 0 && f.max != noLimit {
				f.bounds = []cgroupfs.Bound{{Bytes: f.max, File: f.maxFile}}
			}
			f.bounds = append(slices.Clone(f.bounds), cgroupfs.Bound{Bytes: m.decl.bytes, File: f.decl})
			if f.max == noLimit || m.decl.bytes < f.max {
				f.max, f.maxFile, f.source = m.decl.bytes, f.decl, m.decl.source
				f.why = "from " + f.decl + " (declared; " + strings.TrimPrefix(f.why, "from ") + ")"
			}
		}
		return f, nil
	case err == nil && l.TopNotRoot:
		why = fmt.Sprintf("no cgroup memory limit up to %s, the top of this cgroup namespace: the limit is unknown (it may be set above the namespace, as Kubernetes pod-level resources and podman's service cgroup do); "+
			"%s", l.Cgroup, remedy(m.sandbox))
	case err == nil:
		why = fmt.Sprintf("no cgroup memory limit: cgroup v%d %s and its ancestors set none", l.Version, l.Cgroup)
		if m.sandbox != "" {
			why += fmt.Sprintf(" (in a %s sandbox, whose cgroup files may not carry the limit its host enforces: %s)", m.sandbox, remedy(""))
		}
	case errors.Is(err, cgroupfs.ErrUnseen):
		// The process has a memory cgroup that no mount here shows: a
		// limit may apply, unknown, never "none".
		why = fmt.Sprintf("the cgroup memory limit is unknown: %v; %s", err, remedy(m.sandbox))
	case m.noCgroup(err):
		why = "no cgroup memory limit: " + err.Error()
		if m.sandbox != "" {
			why += fmt.Sprintf(" (in a %s sandbox: %s)", m.sandbox, remedy(""))
		}
	case m.hasDecl:
		// The cgroup files cannot be read; the declared limit stands,
		// and the error is said once at WARN.
		m.warn(false, err.Error(), fmt.Errorf("limits: memory limit: %w; %s is followed", err, f.decl))
		why = "the cgroup memory limit could not be read"
	default:
		return found{}, fmt.Errorf("limits: memory limit: %w", err)
	}
	f.why, f.unknown = why, err == nil && l.TopNotRoot || errors.Is(err, cgroupfs.ErrUnseen)
	if m.hasDecl {
		f.source, f.max, f.maxFile, f.unknown = m.decl.source, m.decl.bytes, f.decl, false
		f.bounds = []cgroupfs.Bound{{Bytes: m.decl.bytes, File: f.decl}}
		f.why = "from " + f.decl + " (declared; " + why + ")"
		return f, nil
	}
	if !m.fallback {
		return f, nil
	}
	sys, serr := memlimit.FromSystem()
	if serr != nil || sys == 0 {
		return f, nil
	}
	f.source, f.max, f.why = SourceSystem, int64(min(sys, 1<<62)), "(total memory; "+why+")"
	return f, nil
}

// remedy names what an operator can do where the limit is unknown: declare
// it (the downward API's resources.limits.memory in MEMCTL_MEMORY_LIMIT),
// or take total memory (SystemFallback). Setting GOMEMLIMIT to the limit
// itself is not one: it leaves no room for memory outside the Go heap.
func remedy(sandbox string) string {
	s := "set " + DeclaredLimitEnv + " to the container's limit (the downward API's resources.limits.memory), or use SystemFallback"
	if sandbox != "" {
		s = "in a " + sandbox + " sandbox, " + s
	}
	return s
}

// noCgroup reports whether err from the cgroup read means there is no
// memory cgroup to read: cgroupfs.ErrNoCgroup (no memory controller, not
// mounted, another cgroup namespace), no /proc/self/cgroup (no cgroups in
// the kernel, no /proc), or not Linux.
func (m *MemLimiter) noCgroup(err error) bool {
	return errors.Is(err, cgroupfs.ErrNoCgroup) || errors.Is(err, errors.ErrUnsupported)
}

// warn logs err at WARN once per key, except on the first decision (whose
// error is returned to the caller, who reports it; floor warnings are logged
// then too, as they come with a nil error).
func (m *MemLimiter) warn(first bool, key string, err error) {
	if m.seen[key] || len(m.seen) >= maxSeen {
		return
	}
	m.seen[key] = true
	if first || m.log == nil {
		return
	}
	m.log.Warn("limits: GOMEMLIMIT", "error", err)
}

func (m *MemLimiter) info(msg string) {
	if m.log != nil {
		m.log.Info(msg)
	}
}

func validRatio(r float64) bool { return !math.IsNaN(r) && r > 0 && r <= 1 }

// goMappedMetrics are the runtime/metrics samples whose difference is the
// memory the Go runtime has mapped and not returned to the OS.
var goMappedMetrics = [2]string{"/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}

// readUsage returns the memory this process holds that the kernel cannot
// reclaim (procfs.Held: RssAnon + RssShmem; file-backed pages such as mapped
// files and the binary's text are page cache) and what the Go runtime has
// mapped and not released (runtime/metrics); err is the /proc read's (not
// Linux, no /proc).
func readUsage() (held, goMapped int64, err error) {
	s := [2]metrics.Sample{{Name: goMappedMetrics[0]}, {Name: goMappedMetrics[1]}}
	metrics.Read(s[:])
	goMapped = int64(s[0].Value.Uint64() - s[1].Value.Uint64())
	held, err = procfs.Held(0)
	return held, goMapped, err
}

// LiveHeapFactor is how far above the live heap a memory.high target may
// bring GOMEMLIMIT down, at the least: 1.5 × the live heap
// (/gc/heap/live:bytes at the last GC). GOMEMLIMIT bounds the whole Go
// runtime, so a limit at 1.5 × live leaves the GC half the live heap of new
// allocation between cycles, twice as many cycles as GOGC=100's default
// goal of 2 × live, and well clear of the death-spiral detector's
// threshold (package pressure reports a spiral once the live heap passes
// 0.85 × GOMEMLIMIT). A memory.high under that is left to the kernel's
// throttling and reclaim: GOMEMLIMIT is never the cause of a spiral.
const LiveHeapFactor = 1.5

// charge is the part of a cgroup's account that neither the Go runtime
// holds nor the kernel can reclaim, in bytes, with the file it came from.
type charge struct {
	anon   int64 // anonymous memory; with fromUsage, the whole usage
	kept   int64 // file-backed memory off the file LRU lists (shmem, tmpfs, ramfs), and HugeTLB pages
	kernel int64 // 0 when the file has none
	// reclaimable is the page cache on the file LRU lists, mapped files
	// included: never subtracted, shown apart; -1 when unknown.
	reclaimable int64
	file        string
	// statErr, when not nil, is why memory.stat could not be used: the
	// charge is then the cgroup's usage counter (file), page cache
	// included.
	statErr error
}

func (c charge) total() int64 { return c.anon + c.kept + c.kernel }

func (c charge) String() string {
	if c.statErr != nil {
		return fmt.Sprintf("%s: %s, page cache included, as memory.stat could not be read", c.file, inMiB(c.anon))
	}
	return fmt.Sprintf("%s: anon %s, shmem, tmpfs, ramfs and hugetlb %s, kernel %s; page cache not counted", c.file, inMiB(c.anon), inMiB(c.kept), inMiB(c.kernel))
}

// chargeOf returns the account of the cgroup directory dir, read now; on a
// read error other than "not there" it is logged at WARN once (naming the
// file) and the last account read from dir is used. ok is false when there
// is none (no memory.stat: the v2 root, a made-up Limit).
func (m *MemLimiter) chargeOf(version int, dir string) (charge, bool) {
	c, err := m.charge(version, dir)
	if err == nil {
		if c.statErr != nil {
			m.warn(false, "charge "+dir, fmt.Errorf("limits: the cgroup's account for the GOMEMLIMIT headroom: %w; its usage %s is subtracted instead, page cache included (GOMEMLIMIT errs low)", c.statErr, c.file))
		}
		m.charges[dir] = c
		return c, true
	}
	if !errors.Is(err, fs.ErrNotExist) {
		m.warn(false, "charge "+dir, fmt.Errorf("limits: the cgroup's account for the GOMEMLIMIT headroom: %w", err))
	}
	c, ok := m.charges[dir]
	return c, ok
}

// chargeFiles are the reads behind readCharge (the fixture table's read
// plain files).
type chargeFiles struct {
	stat  func(dir string) (cgroupfs.MemoryStat, error)
	kmem  func(dir string) (int64, error)
	usage func(version int, dir string) (int64, string, error)
}

var cgroupCharge = chargeFiles{cgroupfs.ReadMemoryStat, cgroupfs.ReadKmemUsage, cgroupfs.ReadUsage}

// readCharge reads the account of the cgroup directory dir from its
// memory.stat (cgroupfs.ReadMemoryStat): anonymous memory (v2 "anon", v1
// "total_rss"); file-backed memory the kernel cannot reclaim as page cache
// (MemoryStat.FileUnreclaimable: "file" less the file LRU lists, that is
// shmem and tmpfs, ramfs, mlocked files), both charged to the cgroup and
// never reclaimed without swap; HugeTLB pages, when the v2 hierarchy charges
// them (v2 "hugetlb", the memory_hugetlb_accounting mount option); and the
// kernel memory it cannot reclaim:
// in v2 "kernel" less slab_reclaimable, plus sock (on kernels before 5.18
// slab_unreclaimable, kernel_stack, pagetables, sec_pagetables, percpu,
// vmalloc and sock; MemoryStat.KernelUnreclaimable;
// Documentation/admin-guide/cgroup-v2.rst, "memory.stat"); in v1, whose
// memory.stat has none, all of memory.kmem.usage_in_bytes
// (cgroup-v1/memory.rst, 2.7), reclaimable slab included (an estimate that
// errs high). The page cache (active_file, inactive_file) is reclaimed by
// the kernel before it kills: it is not counted.
//
// When memory.stat (or v1's memory.kmem.usage_in_bytes) is there but cannot
// be read or parsed (EACCES from an LSM, a malformed line), the cgroup's
// usage counter (cgroupfs.ReadUsage: memory.current, memory.usage_in_bytes)
// is the charge, with charge.statErr set: it counts the page cache too, so
// GOMEMLIMIT errs low, never high. The error is memory.stat's when neither
// can be read.
func readCharge(version int, dir string) (charge, error) { return cgroupCharge.read(version, dir) }

func (r chargeFiles) read(version int, dir string) (charge, error) {
	c, err := r.fromStat(version, dir)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return c, err
	}
	u, file, uerr := r.usage(version, dir)
	if uerr != nil {
		return charge{}, fmt.Errorf("%w (and %w)", err, uerr)
	}
	return charge{anon: u, reclaimable: -1, file: file, statErr: err}, nil
}

func (r chargeFiles) fromStat(version int, dir string) (charge, error) {
	st, err := r.stat(dir)
	if err != nil {
		return charge{}, err
	}
	c := charge{anon: st.Anon, kept: max(st.FileUnreclaimable(), 0) + max(st.Hugetlb, 0), kernel: max(st.KernelUnreclaimable(), 0),
		reclaimable: st.Reclaimable(), file: filepath.Join(dir, "memory.stat")}
	if st.Version == 1 || version == 1 {
		k, err := r.kmem(dir)
		switch {
		case err == nil:
			c.kernel = k
		case !errors.Is(err, fs.ErrNotExist):
			return charge{}, err
		}
	}
	return c, nil
}

// readLive returns the live heap at the last GC (runtime/metrics
// /gc/heap/live:bytes), in bytes.
func readLive() int64 {
	s := [1]metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s[:])
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}
