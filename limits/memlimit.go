package limits

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultRatio is the share of the memory limit that becomes GOMEMLIMIT when
// MemLimitConfig.Ratio is 0: the rest is headroom for memory the Go runtime
// does not count (cgo, thread stacks, the binary). It is automemlimit's
// default.
const DefaultRatio = 0.9

// Source says where the memory limit behind GOMEMLIMIT came from.
type Source int

const (
	// SourceNone: no limit was found; GOMEMLIMIT was left as it was.
	SourceNone Source = iota
	// SourceCgroupV1: the cgroup v1 memory controller (memory.limit_in_bytes,
	// hierarchical_memory_limit in memory.stat).
	SourceCgroupV1
	// SourceCgroupV2: the cgroup v2 memory.max of the process's cgroup or
	// the smallest of its ancestors'.
	SourceCgroupV2
	// SourceSystem: total system memory (MemLimitConfig.SystemFallback).
	SourceSystem
	// SourceEnv: the operator set GOMEMLIMIT (not empty), or
	// AUTOMEMLIMIT=off, in the environment; memctl did not touch GOMEMLIMIT.
	SourceEnv
)

// String returns "none", "cgroup v1", "cgroup v2", "system" or "env".
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
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText returns String's word, so that a Source (and a MemLimit) reads
// "cgroup v1" in JSON and in slog, not a number. It never fails.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a word that String returns ("none", "cgroup v1",
// "cgroup v2", "system", "env"). Any other text is an error that quotes it,
// and s is left as it was.
func (s *Source) UnmarshalText(b []byte) error {
	for v := SourceNone; v <= SourceEnv; v++ {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("limits: unknown Source %q, want none, cgroup v1, cgroup v2, system or env", b)
}

// MemLimitConfig configures SetGoMemLimit. The zero value is the default:
// 90% of the cgroup limit, no fallback, no refresh, no logging.
type MemLimitConfig struct {
	// Ratio is the share of the memory limit used for GOMEMLIMIT, in
	// (0.0, 1.0]. An AUTOMEMLIMIT ratio in the environment wins over it.
	// Default: 0 (means DefaultRatio, 0.9).
	Ratio float64
	// SystemFallback uses total system memory as the limit when the process
	// has no cgroup limit. Default: false.
	SystemFallback bool
	// Refresh, when positive, re-reads the limit at this interval (for a
	// limit that changes while the process runs, such as an in-place pod
	// resize) until the context given to SetGoMemLimit ends. Default: 0 (no
	// refresh, no goroutine).
	Refresh time.Duration
	// Logger receives refresh updates and refresh errors. Default: nil (no
	// logging).
	Logger *slog.Logger

	// provider replaces automemlimit's cgroup provider in tests; version is
	// then reported from cgroupFile.
	provider   memlimit.Provider
	cgroupFile string
}

// MemLimit is what SetGoMemLimit decided, and why.
type MemLimit struct {
	// Bytes is GOMEMLIMIT after the call, in bytes; math.MaxInt64 means no
	// limit (the Go default).
	Bytes int64
	// Limit is the memory limit that was found (cgroup or system), in
	// bytes; 0 when none was.
	Limit int64
	// Ratio is the share of Limit that Bytes is (0 when Limit is 0).
	Ratio float64
	// Source says where Limit came from.
	Source Source
	// Reason is one human-readable sentence about the decision.
	Reason string
}

// SetGoMemLimit sets GOMEMLIMIT (debug.SetMemoryLimit) to cfg.Ratio of the
// process's cgroup memory limit, found by github.com/KimMachineGun/automemlimit
// (cgroup v1 or v2, the tightest limit of the cgroup and its ancestors).
//
// The operator wins: when GOMEMLIMIT is set in the environment, or
// AUTOMEMLIMIT=off, nothing is changed and Source is SourceEnv; a numeric
// AUTOMEMLIMIT is the ratio. An empty GOMEMLIMIT or AUTOMEMLIMIT is unset,
// as the Go runtime reads an empty GOMEMLIMIT: SetGoMemLimit removes it from
// the environment (os.Unsetenv) and goes on as if it were absent. A process without a cgroup limit (or without
// cgroups, or off Linux) is normal: GOMEMLIMIT is left as it was, Source is
// SourceNone and the error is nil, unless cfg.SystemFallback asks for the
// system's memory instead.
//
// On error (an invalid ratio, a cgroup file that cannot be read or parsed)
// GOMEMLIMIT is unchanged, the returned MemLimit has Bytes set to it, and the
// error starts with "limits:". With cfg.Refresh > 0 a goroutine re-reads the
// limit until ctx is done; ctx is not used otherwise. It is safe to call
// from any goroutine, but GOMEMLIMIT is process-wide: the last call wins.
func SetGoMemLimit(ctx context.Context, cfg MemLimitConfig) (MemLimit, error) {
	current := debug.SetMemoryLimit(-1)
	d := MemLimit{Bytes: current}
	// An empty GOMEMLIMIT is no limit to the Go runtime (runtime.readGOMEMLIMIT
	// treats "" as unset), and an empty AUTOMEMLIMIT is no ratio. Both mean
	// unset here too; and since automemlimit's Set looks the variables up
	// itself (an empty-but-present GOMEMLIMIT makes it skip, an empty
	// AUTOMEMLIMIT fails to parse), they are removed from the environment.
	for _, k := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
		if v, ok := os.LookupEnv(k); ok && v == "" {
			os.Unsetenv(k)
		}
	}
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		d.Source, d.Reason = SourceEnv, fmt.Sprintf("GOMEMLIMIT=%s is set in the environment", v)
		return d, nil
	}
	ratio, ratioFrom := cfg.Ratio, "configured"
	if ratio == 0 {
		ratio, ratioFrom = DefaultRatio, "default"
	}
	if v, ok := os.LookupEnv("AUTOMEMLIMIT"); ok {
		if v == "off" {
			d.Source, d.Reason = SourceEnv, "AUTOMEMLIMIT=off is set in the environment"
			return d, nil
		}
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || !validRatio(r) {
			return d, fmt.Errorf("limits: AUTOMEMLIMIT=%q: want \"off\" or a ratio in (0.0, 1.0]", v)
		}
		ratio, ratioFrom = r, "AUTOMEMLIMIT"
	}
	if !validRatio(ratio) {
		return d, fmt.Errorf("limits: GOMEMLIMIT ratio %v: want a ratio in (0.0, 1.0]", ratio)
	}

	p := &limitProbe{
		cgroup:     cfg.provider,
		cgroupFile: cfg.cgroupFile,
		fallback:   cfg.SystemFallback,
	}
	if p.cgroup == nil {
		p.cgroup, p.cgroupFile = memlimit.FromCgroup, "/proc/self/cgroup"
	}
	limit, source, err := p.probe()
	if err != nil {
		return d, fmt.Errorf("limits: memory limit: %w", err)
	}
	if source == SourceNone && cfg.Refresh <= 0 {
		d.Reason = "no cgroup memory limit; GOMEMLIMIT left as it was"
		return d, nil
	}

	// automemlimit logs its own first update at INFO; memctl reports the
	// decision once itself, so the logger is muted until Set returns and
	// passes on only what the refresh goroutine says.
	h := gatedHandler{started: new(atomic.Bool)}
	if cfg.Logger != nil {
		h.next = cfg.Logger.Handler()
	}
	opts := []memlimit.Option{
		memlimit.WithProvider(p.provider),
		memlimit.WithRatio(ratio),
		memlimit.WithLogger(slog.New(h)),
	}
	if cfg.Refresh > 0 {
		opts = append(opts, memlimit.WithRefreshInterval(ctx, cfg.Refresh))
	}
	set, err := memlimit.Set(opts...)
	h.started.Store(true)
	if err != nil {
		return d, fmt.Errorf("limits: %w", err)
	}
	d.Bytes, d.Source = set, source
	if source == SourceNone {
		d.Reason = "no cgroup memory limit yet; refreshing every " + cfg.Refresh.String()
		return d, nil
	}
	d.Limit, d.Ratio = int64(min(limit, math.MaxInt64)), ratio
	d.Reason = fmt.Sprintf("%s ratio %v of the %s limit", ratioFrom, ratio, source)
	return d, nil
}

func validRatio(r float64) bool { return !math.IsNaN(r) && r > 0 && r <= 1 }

// limitProbe wraps automemlimit's providers: it maps "no cgroup here" to
// memlimit.ErrNoLimit (normal, not an error), applies the system fallback,
// and remembers where the limit came from.
type limitProbe struct {
	cgroup     memlimit.Provider
	cgroupFile string
	fallback   bool
}

func (p *limitProbe) provider() (uint64, error) {
	limit, source, err := p.probe()
	if err != nil {
		return 0, err
	}
	if source == SourceNone {
		return 0, memlimit.ErrNoLimit
	}
	return limit, nil
}

func (p *limitProbe) probe() (uint64, Source, error) {
	limit, err := p.cgroup()
	switch {
	case err == nil:
		v, verr := cgroupVersionFile(p.cgroupFile)
		if verr != nil {
			return 0, SourceNone, verr
		}
		return limit, v, nil
	case errors.Is(err, memlimit.ErrNoLimit), errors.Is(err, memlimit.ErrNoCgroup),
		errors.Is(err, memlimit.ErrCgroupsNotSupported):
		if !p.fallback {
			return 0, SourceNone, nil
		}
		limit, err := memlimit.FromSystem()
		if err != nil {
			return 0, SourceNone, nil
		}
		return limit, SourceSystem, nil
	default:
		return 0, SourceNone, err
	}
}

var cgroupVersionCache sync.Map // path -> Source

// cgroupVersionFile reports which hierarchy automemlimit read the limit from,
// by the same rule it uses: cgroup v1 when /proc/self/cgroup names a v1
// hierarchy with the memory controller, else v2.
func cgroupVersionFile(path string) (Source, error) {
	if v, ok := cgroupVersionCache.Load(path); ok {
		return v.(Source), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return SourceNone, fmt.Errorf("limits: %w", err)
	}
	defer f.Close()
	v, err := cgroupVersion(f, path)
	if err == nil {
		cgroupVersionCache.Store(path, v)
	}
	return v, err
}

// cgroupVersion parses a /proc/PID/cgroup file ("ID:controllers:path" lines,
// see cgroups(7)); name is used in errors.
func cgroupVersion(r io.Reader, name string) (Source, error) {
	sc := bufio.NewScanner(r)
	n, v2 := 0, false
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return SourceNone, fmt.Errorf("limits: %s: line %d: malformed, want ID:controllers:path: %q", name, n, line)
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				return SourceCgroupV1, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return SourceNone, fmt.Errorf("limits: %s: %w", name, err)
	}
	if !v2 {
		return SourceNone, fmt.Errorf("limits: %s: no memory controller and no cgroup v2 line", name)
	}
	return SourceCgroupV2, nil
}

// gatedHandler passes records to next only once started is set; handlers
// derived from it share the flag.
type gatedHandler struct {
	started *atomic.Bool
	next    slog.Handler
}

func (h gatedHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next != nil && h.started.Load() && h.next.Enabled(ctx, l)
}

func (h gatedHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.next.Handle(ctx, r)
}

func (h gatedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if h.next == nil {
		return h
	}
	return gatedHandler{started: h.started, next: h.next.WithAttrs(as)}
}

func (h gatedHandler) WithGroup(g string) slog.Handler {
	if h.next == nil {
		return h
	}
	return gatedHandler{started: h.started, next: h.next.WithGroup(g)}
}
