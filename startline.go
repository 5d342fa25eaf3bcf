package memctl

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/memctl/memctl/internal/envflag"
	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/trimwire"
	"github.com/memctl/memctl/limits"
	"github.com/memctl/memctl/thp"
)

// logStarted writes the startup INFO line (under 300 characters), then the
// DEBUG line "memctl details" with every decision in full.
func (c *Controller) logStarted(l *slog.Logger) {
	r := c.report
	info := []slog.Attr{
		slog.String("gomemlimit", logattr.MiBOrNone(r.MemLimit.GoMemLimit)),
		slog.String("gomemlimit_source", limitSource(r.MemLimit)),
		slog.String("thp", r.THPState.String()),
		slog.String("trim_delay", delayOrOff(r.TrimDelay)),
		slog.String("auto_burst", onOff(r.AutoBurst)),
		slog.String("pressure", shortPressure(r.Pressure, r.PressureNote)),
	}
	if r.MemLimit.Sandbox != "" {
		info = append(info, slog.String("sandbox", r.MemLimit.Sandbox))
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, "memctl started", info...)
	if !l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{
		slog.String("thp_policy", r.THPPolicy.String()),
		slog.String("thp_system", cmp.Or(r.THPSystem, "unknown")),
		slog.String("thp_note", r.THPNote),
		slog.String("gomemlimit_bytes", logattr.BytesOrNone(r.MemLimit.GoMemLimit)),
		slog.String("gomemlimit_file", cmp.Or(r.MemLimit.File, "none")),
		slog.String("gomemlimit_outside", strconv.FormatInt(r.MemLimit.Outside, 10)),
		slog.String("gomemlimit_reclaimable", strconv.FormatInt(r.MemLimit.Reclaimable, 10)),
		slog.String("gomemlimit_refresh", delayOrOff(r.MemLimitRefresh)),
		slog.String("gomemlimit_follow", cmp.Or(c.limiter.Following(), "none")),
		slog.String("gomemlimit_reason", r.MemLimit.Reason),
		slog.String("c_heap", r.CHeap),
		slog.String("c_heap_stats", c.Stats().CHeap.String()),
		slog.String("c_heaps", cmp.Or(strings.Join(c.Report().CHeaps, "; "), "none")),
		slog.String("pressure_source", r.Pressure),
	}
	if r.PressureNote != "" {
		attrs = append(attrs, slog.String("pressure_note", r.PressureNote))
	}
	if r.ArenaMax > 0 {
		attrs = append(attrs, slog.String("arena_max", strconv.Itoa(r.ArenaMax)))
	} else {
		attrs = append(attrs, slog.String("arena_max", "off"), slog.String("arena_max_reason", r.ArenaMaxNote))
	}
	l.LogAttrs(context.Background(), slog.LevelDebug, "memctl details", attrs...)
}

// limitSource says in a few words where GOMEMLIMIT came from.
func limitSource(m limits.MemLimit) string {
	switch {
	case m.Source == limits.SourceEnv && len(m.Reason) <= 64:
		return m.Reason // "GOMEMLIMIT=… is set in the environment"
	case m.Source == limits.SourceEnv:
		return "the operator's GOMEMLIMIT or AUTOMEMLIMIT"
	case m.MemoryLimit <= 0 && m.LimitUnknown:
		return "none: no cgroup limit in sight (may be set above the namespace)"
	case m.MemoryLimit <= 0:
		return "none: no memory limit found"
	}
	s := fmt.Sprintf("%g%% of %s limit %s", m.Ratio*100, m.Source, logattr.MiBCompact(m.MemoryLimit))
	if m.High > 0 {
		s = fmt.Sprintf("memory.high %s", logattr.MiBCompact(m.High))
	}
	if m.Outside > 0 {
		s += " less " + logattr.MiBCompact(m.Outside) + " outside Go"
	}
	if m.AtFloor {
		s += ", at the floor"
	}
	if m.Overridden {
		s += ", the operator's " + logattr.MiBCompact(m.Operator) + " being above the limit"
	}
	return s
}

// shortPressure shortens the pressure source and note for the INFO line.
func shortPressure(src, note string) string {
	f := strings.Fields(src)
	for i, w := range f {
		if strings.HasPrefix(w, "/") {
			f[i] = filepath.Base(w)
		}
	}
	s := cmp.Or(strings.Join(f, " "), "none")
	if i := strings.Index(note, ";"); i > 0 {
		note = note[:i]
	}
	if i := strings.Index(note, ":"); len(note) > 80 && i > 0 {
		note = note[:i]
	}
	if note = strings.TrimSpace(note); note != "" {
		s += "; " + note
	}
	return s
}

// startOff fills the report of a controller that MEMCTL=off switched off,
// and logs why.
func (c *Controller) startOff(l *slog.Logger, why string) {
	c.report = Report{Off: true, THPPolicy: thp.PolicyKeep, ArenaMaxNote: why}
	if st, err := thp.Process(); err == nil {
		c.report.THPState = st
	}
	c.report.MemLimit = limits.MemLimit{GoMemLimit: debug.SetMemoryLimit(-1), Source: limits.SourceNone,
		Reason: why + ": GOMEMLIMIT left as it was"}
	l.LogAttrs(context.Background(), slog.LevelInfo, "memctl is off",
		slog.String("reason", why), slog.String("gomemlimit", logattr.BytesOrNone(c.report.MemLimit.GoMemLimit)))
}

func delayOrOff(d time.Duration) string {
	if d <= 0 {
		return "off"
	}
	return d.String()
}

// parseDelay parses MEMCTL_TRIM_DELAY; a bad value gives 0 (off) and an error.
func parseDelay(v string) (time.Duration, error) {
	d, err := envflag.Duration("MEMCTL_TRIM_DELAY", v, trimwire.DefaultDelay, trimwire.MinDelay)
	if err != nil || d > trimwire.MaxDelay {
		return 0, &envflag.Error{Name: "MEMCTL_TRIM_DELAY", Value: v,
			Want: fmt.Sprintf(`"off" or a duration from %v to %v such as "2s"`, trimwire.MinDelay, trimwire.MaxDelay)}
	}
	return d, nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// warnUnknownEnv warns of each unknown MEMCTL_* variable, naming the closest.
func warnUnknownEnv(l *slog.Logger) {
	for _, u := range envflag.Unknown(os.Environ()) {
		l.Warn("memctl: unknown environment variable ignored", "name", u.Name, "closest", u.Closest)
	}
}
