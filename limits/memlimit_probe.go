package limits

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/procfs"
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

// goMappedMetrics are the runtime/metrics samples whose difference is the
// memory the Go runtime has mapped and not returned to the OS.
var goMappedMetrics = [2]string{"/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}

// liveHeapFactor × the live heap is the lowest a memory.high target brings
// GOMEMLIMIT, clear of package pressure's spiral threshold.
const liveHeapFactor = 1.5

// charge is the part of a cgroup's account that neither the Go runtime
// holds nor the kernel can reclaim, in bytes, with the file it came from.
type charge struct {
	anon        int64 // anonymous memory; with fromUsage, the whole usage
	kept        int64 // file-backed memory off the file LRU lists (shmem, tmpfs, ramfs), and HugeTLB pages
	kernel      int64 // 0 when the file has none
	reclaimable int64 // page cache, never subtracted; -1 when unknown
	file        string
	statErr     error // memory.stat failed: anon is the usage counter (file)
}

func (c charge) total() int64 { return c.anon + c.kept + c.kernel }

// write says what c holds.
func (c charge) write(s *sentence) {
	if c.statErr != nil {
		s.add(c.file, ": ").mib(c.anon).add(", page cache included, as memory.stat could not be read")
		return
	}
	s.add(c.file, ": anon ").mib(c.anon).add(", shmem, tmpfs, ramfs and hugetlb ").mib(c.kept).add(", kernel ").mib(c.kernel).add("; page cache not counted")
}

// sentence is a Reason being written into a buffer that compute's caller
// keeps, so that writing it allocates nothing once the buffer is large
// enough.
type sentence struct{ b []byte }

func (s *sentence) add(parts ...string) *sentence {
	for _, p := range parts {
		s.b = append(s.b, p...)
	}
	return s
}

// mib writes logattr.MiB(n).
func (s *sentence) mib(n int64) *sentence { s.b = logattr.AppendMiB(s.b, n); return s }

// num writes f as fmt's %v does.
func (s *sentence) num(f float64) *sentence { s.b = strconv.AppendFloat(s.b, f, 'g', -1, 64); return s }

// chargeFiles are readCharge's reads.
type chargeFiles struct {
	stat  func(dir string) (cgroupfs.MemoryStat, error)
	kmem  func(dir string) (int64, error)
	usage func(version int, dir string) (int64, string, error)
}

var cgroupCharge = chargeFiles{cgroupfs.ReadMemoryStat, cgroupfs.ReadKmemUsage, cgroupfs.ReadUsage}

// readCharge reads dir's account from its memory.stat: anonymous memory,
// file memory off the LRU lists, HugeTLB pages and unreclaimable kernel
// memory (v1: memory.kmem.usage_in_bytes), not the page cache. When
// memory.stat cannot be read or parsed, the usage counter is the charge, with
// statErr set: GOMEMLIMIT errs low, never high.
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
	c := statCharge(st, filepath.Join(dir, "memory.stat"))
	if st.Version == 1 || version == 1 {
		k, err := r.kmem(dir)
		return withKmem(c, k, err)
	}
	return c, nil
}

// statCharge is the charge memory.stat st, read from file, gives.
func statCharge(st cgroupfs.MemoryStat, file string) charge {
	return charge{anon: st.Anon, kept: max(st.FileUnreclaimable(), 0) + max(st.Hugetlb, 0), kernel: max(st.KernelUnreclaimable(), 0),
		reclaimable: st.Reclaimable(), file: file}
}

// withKmem returns c with v1's kernel memory k, read with err; a missing
// file leaves c as it is.
func withKmem(c charge, k int64, err error) (charge, error) {
	switch {
	case err == nil:
		c.kernel = k
	case !errors.Is(err, fs.ErrNotExist):
		return charge{}, err
	}
	return c, nil
}

// readLive returns the live heap at the last GC, in bytes.
func readLive() int64 {
	s := [1]metrics.Sample{{Name: liveHeapMetric}}
	metrics.Read(s[:])
	return sampleBytes(s[0])
}

// selfReads are the limiter's reads of its own process (cgroup limit, held
// memory, cgroup accounts) through files kept open, allocating nothing once
// warm; on anything unexpected each falls back to the full read. Not safe
// for concurrent use: the limiter calls them with m.mu held.
type selfReads struct {
	limit  cgroupfs.Self
	held   procfs.SelfHeld
	mapped [2]metrics.Sample // goMappedMetrics; kept, as metrics.Read's slice escapes
}

// close closes the files kept open; a later read opens them again.
func (r *selfReads) close() {
	r.limit.Reset()
	r.held.Close()
}

// usage returns what this process holds that the kernel cannot reclaim
// (RssAnon + RssShmem) and what the Go runtime has mapped and not released,
// in bytes; err is the /proc read's.
func (r *selfReads) usage() (held, goMapped int64, err error) {
	if r.mapped[0].Name == "" {
		r.mapped[0].Name, r.mapped[1].Name = goMappedMetrics[0], goMappedMetrics[1]
	}
	metrics.Read(r.mapped[:])
	goMapped = int64(r.mapped[0].Value.Uint64() - r.mapped[1].Value.Uint64())
	held, err = r.held.Held()
	return held, goMapped, err
}

// charge is readCharge through r.limit's kept-open files; anything
// unexpected is read again by readCharge.
func (r *selfReads) charge(version int, dir string) (charge, error) {
	st, file, err := r.limit.MemoryStat(dir)
	if err != nil {
		return readCharge(version, dir)
	}
	c := statCharge(st, file)
	if st.Version == 1 || version == 1 {
		k, err := r.limit.KmemUsage(dir)
		if c, err = withKmem(c, k, err); err != nil {
			return readCharge(version, dir)
		}
	}
	return c, nil
}
