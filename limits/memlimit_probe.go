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
