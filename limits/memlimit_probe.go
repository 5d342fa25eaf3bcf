package limits

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// found is what probe found: the hard limit and memory.high (each noLimit
// when absent), the source, and why (where from, or why none).
type found struct {
	max, high         int64
	maxFile, highFile string
	bounds            []cgroupfs.Bound // every hard limit on the path
	source            Source
	version           int
	why               string // "": "from " + maxFile (appendWhy)
	unknown           bool   // the limit may be set above the cgroup namespace
	cgSource          Source // the cgroup's; decl and declSource the declared limit's
	decl              string
	declSource        Source
	dir               string // the process's cgroup directory, "" when none was found
}

// appendWhy appends why the limit is what it is: where from, or why none.
func (f found) appendWhy(b []byte) []byte {
	if f.why == "" {
		return append(append(b, "from "...), f.maxFile...)
	}
	return append(b, f.why...)
}

// appendFiles appends the cgroup files the limit came from.
func (f found) appendFiles(out []string) []string {
	add := func(file string) {
		if filepath.IsAbs(file) {
			out = append(out, file)
		}
	}
	for _, b := range f.bounds {
		add(b.File)
	}
	if len(f.bounds) == 0 {
		add(f.maxFile)
	}
	add(f.highFile)
	return out
}

const noLimit = cgroupfs.NoLimit

// probe returns the limit and where it came from; no cgroup, or none
// visible, is SourceNone, not an error.
func (m *MemLimiter) probe() (found, error) {
	l, err := m.read()
	if err == nil {
		if ferr := m.warnPartial(l); ferr != nil {
			return found{}, ferr
		}
	}
	l = byKind(l)
	f := found{max: noLimit, high: noLimit, version: l.Version}
	if m.hasDecl {
		f.decl, f.declSource = m.decl.file(), m.decl.source
	}
	if err == nil {
		f.dir = l.Dir
	}
	if err == nil && l.Bytes != cgroupfs.NoLimit {
		return m.fromCgroup(f, l), nil
	}
	why, werr := m.whyNoLimit(l, err, f.decl)
	if werr != nil {
		return found{}, werr
	}
	f.why, f.unknown = why, err == nil && l.TopNotRoot || errors.Is(err, cgroupfs.ErrUnseen)
	if m.hasDecl {
		f.source, f.max, f.maxFile, f.unknown = m.decl.source, m.decl.bytes, f.decl, false
		f.bounds = []cgroupfs.Bound{{Bytes: m.decl.bytes, File: f.decl}}
		f.why = "from " + f.decl + " (declared; " + why + ")"
		return f, nil
	}
	return m.systemFallback(f, why), nil
}

// warnPartial logs once each at WARN what a successful read l did without;
// it returns an error when a malformed memory.high was the only limit.
func (m *MemLimiter) warnPartial(l cgroupfs.Limit) error {
	if l.HighErr != nil {
		m.warn(false, l.HighErr.Error(), fmt.Errorf("limits: memory.high ignored: %w", l.HighErr))
		if l.Bytes == cgroupfs.NoLimit && !m.hasDecl {
			return fmt.Errorf("limits: memory limit: %w", l.HighErr)
		}
	}
	if l.StatErr != nil {
		m.warn(false, l.StatErr.Error(), fmt.Errorf("limits: hierarchical_memory_limit not read (a limit set above the mounted part of the hierarchy may be missed): %w", l.StatErr))
	}
	for _, u := range l.Unreadable {
		m.warn(false, u.Error(), fmt.Errorf("limits: a mount of the cgroup hierarchy could not be read, and the limit another mount shows is followed (a limit only this mount shows may be missed): %w", u))
	}
	return nil
}

// byKind fills in Max or High, by File's name, for an l that carries only
// Bytes and File.
func byKind(l cgroupfs.Limit) cgroupfs.Limit {
	if l.MaxFile == "" && l.HighFile == "" && l.File != "" {
		l.Max, l.MaxFile, l.High = l.Bytes, l.File, noLimit
		if filepath.Base(l.File) == "memory.high" {
			l.Max, l.MaxFile, l.High, l.HighFile = noLimit, "", l.Bytes, l.File
		}
	}
	return l
}

// fromCgroup returns f filled in from l, a read that found a limit, with
// the declared limit added.
func (m *MemLimiter) fromCgroup(f found, l cgroupfs.Limit) found {
	f.source = SourceCgroupV1
	if l.Version == 2 {
		f.source = SourceCgroupV2
	}
	f.cgSource = f.source
	f.max, f.maxFile, f.high, f.highFile, f.bounds = l.Max, l.MaxFile, l.High, l.HighFile, l.Bounds
	if f.max != noLimit && len(f.bounds) == 0 {
		m.oneBound[0] = cgroupfs.Bound{Bytes: f.max, File: f.maxFile}
		f.bounds = m.oneBound[:]
	}
	if f.max == noLimit {
		f.why = "from " + f.highFile + " (memory.high, the throttle limit; no memory.max is set)"
		if l.TopNotRoot {
			f.why = "from " + f.highFile + " (memory.high, the throttle limit; no memory.max is set up to the top of this cgroup namespace, and one may be set above it: the hard limit is unknown)"
		}
	}
	if m.hasDecl {
		f = m.withDeclared(f)
	}
	return f
}

// withDeclared returns f with the declared limit added to a copy of its
// bounds, and as the hard limit when it is the smaller.
func (m *MemLimiter) withDeclared(f found) found {
	if len(f.bounds) == 0 && f.max != noLimit {
		f.bounds = []cgroupfs.Bound{{Bytes: f.max, File: f.maxFile}}
	}
	f.bounds = append(slices.Clone(f.bounds), cgroupfs.Bound{Bytes: m.decl.bytes, File: f.decl})
	if f.max == noLimit || m.decl.bytes < f.max {
		f.max, f.maxFile, f.source = m.decl.bytes, f.decl, m.decl.source
		f.why = "from " + f.decl + " (declared; " + strings.TrimPrefix(string(f.appendWhy(nil)), "from ") + ")"
	}
	return f
}

// whyNoLimit returns why the read (l, err) gave no limit; a read error is
// returned, unless a declared limit (decl) stands: then it is a WARN.
func (m *MemLimiter) whyNoLimit(l cgroupfs.Limit, err error, decl string) (string, error) {
	var why string
	switch {
	case err == nil && l.TopNotRoot:
		why = fmt.Sprintf("no cgroup memory limit up to %s, the top of this cgroup namespace: the limit is unknown (it may be set above the namespace, as Kubernetes pod-level resources and podman's service cgroup do); "+
			"%s", l.Cgroup, remedy(m.sandbox))
	case err == nil:
		why = fmt.Sprintf("no cgroup memory limit: cgroup v%d %s and its ancestors set none", l.Version, l.Cgroup)
		if m.sandbox != "" {
			why += fmt.Sprintf(" (in a %s sandbox, whose cgroup files may not carry the limit its host enforces: %s)", m.sandbox, remedy(""))
		}
	case errors.Is(err, cgroupfs.ErrUnseen):
		why = fmt.Sprintf("the cgroup memory limit is unknown: %v; %s", err, remedy(m.sandbox))
	case errors.Is(err, cgroupfs.ErrNoCgroup) || errors.Is(err, errors.ErrUnsupported):
		why = "no cgroup memory limit: " + err.Error()
		if m.sandbox != "" {
			why += fmt.Sprintf(" (in a %s sandbox: %s)", m.sandbox, remedy(""))
		}
	case m.hasDecl:
		m.warn(false, err.Error(), fmt.Errorf("limits: memory limit: %w; %s is followed", err, decl))
		why = "the cgroup memory limit could not be read"
	default:
		return "", fmt.Errorf("limits: memory limit: %w", err)
	}
	return why, nil
}

// systemFallback returns f with total memory as the limit when
// SystemFallback is set and it can be read.
func (m *MemLimiter) systemFallback(f found, why string) found {
	if !m.fallback {
		return f
	}
	sys, serr := memlimit.FromSystem()
	if serr != nil || sys == 0 {
		return f
	}
	f.source, f.max, f.why = SourceSystem, int64(min(sys, 1<<62)), "(total memory; "+why+")"
	return f
}

// remedy names what an operator can do where the limit is unknown.
func remedy(sandbox string) string {
	s := "set " + declaredLimitEnv + " to the container's limit (the downward API's resources.limits.memory), or use SystemFallback"
	if sandbox != "" {
		s = "in a " + sandbox + " sandbox, " + s
	}
	return s
}

// warn logs err at WARN once per key, unless first (the first decision
// returns its errors).
func (m *MemLimiter) warn(first bool, key string, err error) {
	if m.once(key) && !first && m.log != nil {
		m.log.Warn("limits: GOMEMLIMIT", "error", err)
	}
}

func (m *MemLimiter) info(msg string) {
	if m.log != nil {
		m.log.Info(msg)
	}
}

func validRatio(r float64) bool { return !math.IsNaN(r) && r > 0 && r <= 1 }
