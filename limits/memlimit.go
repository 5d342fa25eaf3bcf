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
	// RefreshDone is closed when the refresh goroutine (MemLimitConfig.Refresh)
	// has exited after its context ended; nil when there is none.
	RefreshDone <-chan struct{} `json:"-"`
}

// SetGoMemLimit sets GOMEMLIMIT (debug.SetMemoryLimit) to cfg.Ratio of the
// process's cgroup memory limit, found by github.com/KimMachineGun/automemlimit
// (cgroup v1 or v2, the tightest limit of the cgroup and its ancestors).
//
// The operator wins: when GOMEMLIMIT is set in the environment, or
// AUTOMEMLIMIT=off, nothing is changed and Source is SourceEnv; a numeric
// AUTOMEMLIMIT is the ratio. An empty GOMEMLIMIT or AUTOMEMLIMIT counts as
// unset, as the Go runtime reads an empty GOMEMLIMIT. A process without a
// cgroup limit (or without cgroups, or off Linux) is normal: GOMEMLIMIT is left as it was, Source is
// SourceNone and the error is nil, unless cfg.SystemFallback asks for the
// system's memory instead.
//
// On error (an invalid ratio, a cgroup file that cannot be read or parsed)
// GOMEMLIMIT is unchanged, the returned MemLimit has Bytes set to it, and the
// error starts with "limits:". With cfg.Refresh > 0 a goroutine re-reads the
// limit every cfg.Refresh until ctx is done, sets GOMEMLIMIT when the limit
// appears or changes, and leaves it alone while there is none (even if the
// first read failed); MemLimit.RefreshDone is closed when it has exited. ctx
// is not used otherwise. It is safe to call
// from any goroutine, but GOMEMLIMIT is process-wide: the last call wins.
func SetGoMemLimit(ctx context.Context, cfg MemLimitConfig) (MemLimit, error) {
	current := debug.SetMemoryLimit(-1)
	d := MemLimit{Bytes: current}
	// An empty GOMEMLIMIT is no limit to the Go runtime (runtime.readGOMEMLIMIT
	// treats "" as unset), and an empty AUTOMEMLIMIT is no ratio: both count
	// as unset.
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		d.Source, d.Reason = SourceEnv, fmt.Sprintf("GOMEMLIMIT=%s is set in the environment", v)
		return d, nil
	}
	ratio, ratioFrom := cfg.Ratio, "configured"
	if ratio == 0 {
		ratio, ratioFrom = DefaultRatio, "default"
	}
	if v := os.Getenv("AUTOMEMLIMIT"); v != "" {
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
	switch {
	case err != nil:
		err = fmt.Errorf("limits: memory limit: %w", err)
	case source == SourceNone:
		d.Reason = "no cgroup memory limit; GOMEMLIMIT left as it was"
	default:
		d.Bytes = applyRatio(limit, ratio)
		debug.SetMemoryLimit(d.Bytes)
		d.Source, d.Limit, d.Ratio = source, int64(min(limit, math.MaxInt64)), ratio
		d.Reason = fmt.Sprintf("%s ratio %v of the %s limit", ratioFrom, ratio, source)
	}
	if cfg.Refresh > 0 {
		done := make(chan struct{})
		d.RefreshDone = done
		go refresh(ctx, p, ratio, cfg.Refresh, cfg.Logger, done)
	}
	return d, err
}

// applyRatio returns ratio of limit in bytes, as automemlimit's ApplyRatio
// computes it, capped at math.MaxInt64.
func applyRatio(limit uint64, ratio float64) int64 {
	return int64(min(uint64(float64(limit)*ratio), math.MaxInt64))
}

// refresh re-reads the limit every interval until ctx is done, then closes
// done. A limit that appears or changes sets GOMEMLIMIT; while there is none
// GOMEMLIMIT is left as it is (automemlimit's own refresh would set it to
// math.MaxInt64, wiping a limit the program set itself).
func refresh(ctx context.Context, p *limitProbe, ratio float64, every time.Duration, log *slog.Logger, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		limit, source, err := p.probe()
		if err != nil {
			if log != nil {
				log.Warn("limits: GOMEMLIMIT refresh failed", "error", err)
			}
			continue
		}
		if source == SourceNone {
			continue
		}
		if want := applyRatio(limit, ratio); want != debug.SetMemoryLimit(-1) {
			prev := debug.SetMemoryLimit(want)
			if log != nil {
				log.Info("limits: GOMEMLIMIT updated", "gomemlimit", want, "previous", prev, "source", source.String())
			}
		}
	}
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
