// Package cgroupfs finds the memory limit of the cgroup a process is in, for
// any process: cgroup v1 (the memory controller's memory.limit_in_bytes) or
// v2 (memory.max and memory.high), the tightest limit of the cgroup and its
// ancestors, and the file that limit came from.
//
// It reads /proc/PID/cgroup (which cgroup the process is in, cgroups(7)),
// /proc/PID/mountinfo (where each hierarchy is mounted, proc(5)) and the
// cgroup files under the mount point. Read takes those paths, so parsing is
// tested with fixture trees under testdata/ and never touches /proc; Of
// reads the real files of a PID. Every error names the file it came from,
// and malformed input is an error, never a guess.
//
// Package limits reads the calling process's limit with it (Of(0)) to set
// GOMEMLIMIT, and memctl status reads any PID's (OfProc).
//
// Every file is read through package safefs: the cgroup files inside root
// (openat2 RESOLVE_IN_ROOT), never through a symlink, only when regular,
// and at most safefs.MaxCgroupFile bytes (mountinfo: safefs.MaxMountinfo),
// and every string from them is quoted in errors with safefs.Quote: a
// process controls what its own mount namespace shows (see safefs).
package cgroupfs

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/memctl/memctl/internal/safefs"
)

// NoLimit is Limit.Bytes when neither the cgroup nor any of its visible
// ancestors sets a memory limit.
const NoLimit = -1

// unlimitedFrom is the smallest value read as "no limit": cgroup v1 writes
// an unset limit as PAGE_COUNTER_MAX pages, 9223372036854771712 bytes with
// 4 KiB pages (math.MaxInt64 rounded down to the page size). Any value of
// 4 EiB or more is beyond any machine and is taken as no limit.
const unlimitedFrom = 1 << 62

// ErrNoCgroup is matched (errors.Is) by the error of a process whose memory
// cgroup cannot be found here: the kernel lists no memory controller and no
// cgroup v2 hierarchy for it, the hierarchy is not mounted in the process's
// mount namespace, or its cgroup lies outside the mounted part (another
// cgroup namespace). The limit is then unknown, not absent.
var ErrNoCgroup = errors.New("cgroupfs: memory cgroup not found")

// ErrUnseen is matched (errors.Is), with ErrNoCgroup, by the error of a
// process whose /proc/PID/cgroup lists a memory cgroup (the v1 memory
// controller or a v2 hierarchy) that no mount here shows: the hierarchy is
// not mounted, or no mount holds the cgroup, or the cgroup could not be
// found under a mount whose root lies above the reader's cgroup namespace.
// A limit may apply that cannot be read: it is unknown, never "none".
var ErrUnseen = fmt.Errorf("%w (its cgroup is not visible here: the limit is unknown)", ErrNoCgroup)

// Limit is the memory limit of the cgroup a process is in.
type Limit struct {
	// Version is the cgroup version the limit was read from: 1 (the v1
	// memory controller, chosen when /proc/PID/cgroup lists it and it is
	// mounted, as on hybrid systems) or 2 (the unified hierarchy).
	Version int
	// Cgroup is the process's cgroup as /proc/PID/cgroup shows it, for
	// example "/system.slice/app.service".
	Cgroup string
	// Dir is that cgroup's directory, for example
	// "/sys/fs/cgroup/system.slice/app.service".
	Dir string
	// Bytes is the effective memory limit in bytes: the smallest limit of
	// the cgroup and its ancestors (in v2 the smallest memory.max or
	// memory.high). NoLimit (-1) when none sets one. It is the kernel's
	// value as written: 0 is possible (memory.max accepts it) and is
	// returned as 0, not judged here.
	Bytes int64
	// File is the file Bytes came from: the memory.limit_in_bytes (v1), or
	// the memory.max or memory.high (v2; its base name says which, and
	// memory.max is named when they are equal) of the cgroup or of the
	// ancestor that sets the tightest limit, or, in v1, the cgroup's memory.stat when its
	// hierarchical_memory_limit is tighter than every visible ancestor's
	// (a limit set above the mounted part of the hierarchy). Empty when
	// Bytes is NoLimit.
	File string
	// Max is the hard limit in bytes, above which the OOM killer runs: in
	// v1 the same as Bytes, in v2 the smallest memory.max of the cgroup
	// and its ancestors (memory.high left out). NoLimit when none sets
	// one. MaxFile is the file it came from ("" with NoLimit).
	Max     int64
	MaxFile string
	// High is the throttle limit in bytes: the smallest v2 memory.high of
	// the cgroup and its ancestors, NoLimit when none sets one and in v1
	// (which has none). Above it the kernel reclaims from the cgroup and
	// stalls its allocating tasks, but kills nothing
	// (Documentation/admin-guide/cgroup-v2.rst, "memory.high").
	// HighFile is the file it came from ("" with NoLimit).
	High     int64
	HighFile string
	// Bounds are every hard limit on the path, nearest first: each
	// memory.limit_in_bytes (v1) or memory.max (v2) of the cgroup and its
	// ancestors that sets one, and in v1 the hierarchical_memory_limit of
	// the cgroup's memory.stat when it is tighter than all of them. Max is
	// the smallest; a looser one can still be the one the OOM killer
	// enforces first when the cgroups under it (a pod's sidecars) are
	// charged more. Empty when Max is NoLimit.
	Bounds []Bound `json:",omitempty"`
	// HighErr is the error of a memory.high whose value is malformed (not
	// bytes nor "max"; it names the file and quotes the value) or that
	// could not be read (EACCES; it names the file): such a file is left
	// out of High and Bytes, so that memory.max is still read. nil when
	// every memory.high parsed.
	HighErr error `json:"-"`
	// StatErr is the error of a v1 memory.stat that is there but could
	// not be read (EACCES from an LSM or for an unprivileged reader) or
	// parsed for hierarchical_memory_limit (it names the file), when a
	// memory.limit_in_bytes on the path sets a limit: that limit is
	// returned, and only a tighter one set above the mounted part of the
	// hierarchy may be missed. (When none sets one, the error is Read's.)
	// nil when memory.stat was read, or is absent.
	StatErr error `json:"-"`
	// TopNotRoot is true in v2 when the topmost cgroup this process can
	// see (its mount point, the top of a private cgroup namespace) is not
	// the hierarchy's root: it has a memory.max file, which the root
	// cgroup never has. A limit set on a cgroup above it (Kubernetes
	// pod-level resources, podman's service cgroup) is then not visible,
	// so NoLimit in Bytes means "unknown", not "none".
	TopNotRoot bool `json:",omitempty"`
	// Unreadable are the errors of the other mounts of the hierarchy
	// that hold the cgroup but whose files could not be read (EACCES;
	// each names its file), passed over because a readable mount sets a
	// limit (see Read). A limit set on an ancestor only they show may be
	// missed. nil when every mount was read.
	Unreadable []error `json:"-"`
}

// Bound is one hard memory limit: Bytes from File, whose directory is the
// cgroup it applies to (for v1's memory.stat, the process's own cgroup).
type Bound struct {
	Bytes int64
	File  string
}

// Read returns the memory limit of the process whose /proc/PID/cgroup file
// is cgroupFile and /proc/PID/mountinfo file is mountinfoFile. root is
// prefixed to every mount point: "" for the calling process's own mount
// namespace, "/proc/PID/root" for a process in another one, or a fixture
// directory in tests.
//
// The limit is the smallest of the cgroup's and its ancestors' limits, up to
// the hierarchy's mount point; in v1 the kernel's hierarchical_memory_limit
// (memory.stat) also counts, which covers ancestors above the mount. In v2
// a limit set above the mounted part (a container with its own cgroup
// namespace) is not visible (Limit.TopNotRoot says when one may be),
// memory.high counts as a limit in Bytes and apart in High (see
// v2LimitFiles; a malformed memory.high is kept aside in HighErr, so that
// memory.max is still read), and a cgroup directory without memory.max (the
// memory controller not enabled for it, or the root) sets no limit. When
// the hierarchy is mounted several times, every mount that holds the cgroup
// is read and the tightest limit kept (one may show ancestors another does
// not); a cgroup path that climbs ("/../../x", outside the reader's cgroup
// namespace) is held by a mount whose root climbs as far. A mount whose
// root climbs further (a cgroup namespace made while the host's mount was
// kept: root "/..", cgroup "/pod") holds the cgroup under names the kernel
// does not show: it is the one directory at that depth, with the cgroup's
// path below it, whose cgroup.procs lists the process's PID (known for
// /proc/PID/cgroup and /proc/self/cgroup; at most 16384 directories are
// searched, and the place found is looked at first next time); every
// limit up to the mount point counts. v1 is read
// when /proc/PID/cgroup lists the memory controller and it is mounted; v2
// only when its mounted cgroup has the memory controller
// (cgroup.controllers), so a hybrid host whose v2 hierarchy has none gives
// the v1 limit or ErrNoCgroup, never a false "no limit" from v2.
//
// Errors name the file: a file that cannot be read for any reason but "not
// there" (cgroup.controllers unreadable to an LSM included), a malformed
// line or value. A "." or ".." element in a mount point, or after a name in
// a cgroup mount's root or a cgroup path, is malformed: the kernel never
// writes one, and it could lead outside root (another mount's root is not
// used, and need not be a path: nsfs writes "net:[4026531833]"). mountinfo fields are split on ' ' alone
// and only octal escapes of a byte are undone, as the kernel writes them;
// lines are split at '\n' alone (a '\r' before it is part of a cgroup's
// name), and a second /proc/PID/cgroup line for one hierarchy is
// malformed. When no memory cgroup can be found, the error matches
// ErrNoCgroup (not mounted, a cgroup that no mount's root holds, such as
// one that starts with "/.." where no mount root climbs as far, or a
// removed v2 cgroup, which the kernel marks " (deleted)"), and ErrUnseen
// when /proc/PID/cgroup lists the cgroup but no mount shows it (the limit
// is then unknown, not absent). When a mount's files cannot be read
// (EACCES) and another mount of the hierarchy sets a limit, that limit is
// returned with the error in Limit.Unreadable.
// Read only reads files, so it is safe for concurrent use.
//
// cgroupFile and mountinfoFile are read as the caller names them (symlinks
// followed); the cgroup files are read inside root and through no symlink
// (see the package doc), with the limits of package safefs.
func Read(cgroupFile, mountinfoFile, root string) (Limit, error) {
	s, err := openSource(cgroupFile, mountinfoFile, root)
	if err != nil {
		return Limit{}, err
	}
	defer s.close()
	return s.read()
}

// read is Read on the files of s.
func (s *source) read() (Limit, error) {
	cgroupFile, mountinfoFile, root := s.cgroupFile, s.mountinfoFile, s.rootName
	v1, v2, err := s.parseCgroupFile(cgroupFile)
	if err != nil {
		return Limit{}, err
	}
	if v1 == "" && v2 == "" {
		return Limit{}, fmt.Errorf("%w: %s lists neither the memory controller nor a cgroup v2 hierarchy", ErrNoCgroup, cgroupFile)
	}
	mounts, err := s.parseMountinfoFile(mountinfoFile)
	if err != nil {
		return Limit{}, err
	}
	var why []string
	if v1 != "" {
		cands, err := s.cgroupDirs(mounts, v1, isV1Memory, root)
		if err == nil {
			return s.readAll(cands, func(c candidate) (Limit, error) { return s.readV1(v1, c.dir, c.top) })
		}
		why = append(why, "v1 memory: "+err.Error())
	}
	if v2 != "" {
		cands, err := s.cgroupDirs(mounts, v2, isV2, root)
		if err == nil {
			var l Limit
			l, err = s.readAll(cands, func(c candidate) (Limit, error) {
				if err := s.v2Memory(c.top); err != nil {
					return Limit{}, err
				}
				return s.readV2(v2, c.dir, c.top)
			})
			if !errors.Is(err, ErrNoCgroup) {
				// A limit, or a file that could not be read for
				// another reason than "not there" (EACCES from an
				// LSM on cgroup.controllers): an error that names
				// the file, never "no cgroup".
				return l, err
			}
		}
		why = append(why, "v2: "+err.Error())
		if errors.Is(err, errNoV2Memory) {
			// Kept matchable: OfProc then looks for the v1 hierarchy in
			// its own mount namespace.
			return Limit{}, fmt.Errorf("%w: %s", errNoV2Memory, strings.Join(why, "; "))
		}
	}
	// The process has a memory cgroup (/proc/PID/cgroup lists it), but
	// no mount here shows it: its limit is unknown, not absent.
	return Limit{}, fmt.Errorf("%w: %s", ErrUnseen, strings.Join(why, "; "))
}

// candidate is one mount that holds the process's cgroup: dir is the
// cgroup's directory through it, top its mount point (root prefixed).
// When search is more than 0, dir is not known yet: the cgroup is
// top/N1/.../Nsearch/below, under search names that /proc/PID/cgroup does
// not show (a mount whose root lies above the reader's cgroup namespace
// root); source.resolve finds them.
type candidate struct {
	dir, top string
	search   int
	below    string
}

// readAll reads the limit through every candidate mount of the same
// hierarchy and keeps the tightest: a hierarchy can be mounted several times
// (a bind mount of a sub-cgroup beside the whole tree, a chroot's own
// mount), and one that shows more ancestors can show a limit set on one of
// them that the others cannot. A mount whose files are not there (a mount
// point over-mounted at a parent directory, a stale bind mount: mountinfo
// still lists it) is passed over, and its error returned only when no
// candidate can be read; any other error is returned as it is. Dir is the
// first candidate read's, TopNotRoot is true only when no candidate shows
// the root.
//
// A mount whose files the reader may not read (EACCES: an LSM, a mount
// with other permissions) is passed over when another mount of the
// hierarchy is read and sets a limit: its error is kept in
// Limit.Unreadable, naming the file, so that one unreadable mount does not
// hide the limit a readable one shows. When no readable mount sets a
// limit, its error is returned (the limit is unknown, not "none").
func (s *source) readAll(cands []candidate, read func(candidate) (Limit, error)) (Limit, error) {
	var out Limit
	var gone, denied error
	var unreadable []error
	n := 0
	for _, c := range cands {
		l, err := read(c)
		if err != nil && errors.Is(err, fs.ErrNotExist) && !errors.Is(err, ErrNoCgroup) {
			gone = cmp.Or(gone, err)
			continue
		}
		if err != nil && errors.Is(err, fs.ErrPermission) {
			denied = cmp.Or(denied, err)
			unreadable = append(unreadable, err)
			continue
		}
		if err != nil {
			return Limit{}, err
		}
		n++
		if n == 1 {
			out = l
			continue
		}
		out.TopNotRoot = out.TopNotRoot && l.TopNotRoot
		out.HighErr = cmp.Or(out.HighErr, l.HighErr)
		out.StatErr = cmp.Or(out.StatErr, l.StatErr)
		out.Bounds = append(out.Bounds, l.Bounds...)
		if tighter(l.Max, out.Max) {
			out.Max, out.MaxFile = l.Max, l.MaxFile
		}
		if tighter(l.High, out.High) {
			out.High, out.HighFile = l.High, l.HighFile
		}
		if tighter(l.Bytes, out.Bytes) {
			out.Bytes, out.File = l.Bytes, l.File
		}
	}
	if n == 0 || (denied != nil && out.Bytes == NoLimit) {
		return Limit{}, cmp.Or(denied, gone)
	}
	out.Unreadable = unreadable
	return out, nil
}

// tighter reports whether limit a (NoLimit or bytes) is tighter than b.
func tighter(a, b int64) bool { return a != NoLimit && (b == NoLimit || a < b) }

// parseCgroupFile reads a /proc/PID/cgroup file ("ID:controllers:path"
// lines, cgroups(7)) and returns the path of the v1 memory controller's
// cgroup and of the v2 cgroup ("0::path"), each "" when absent.
func (s *source) parseCgroupFile(name string) (v1, v2 string, err error) {
	return s.parseCgroupFileFor(name, "memory")
}

// parseCgroupFileFor is parseCgroupFile for the v1 controller ctrl.
func (s *source) parseCgroupFileFor(name, ctrl string) (v1, v2 string, err error) {
	b, err := s.proc.ReadFile(s.cgroupRel, safefs.MaxProcFile)
	if errors.Is(err, fs.ErrNotExist) {
		// A kernel without cgroups has no /proc/PID/cgroup.
		return "", "", fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	if err != nil {
		return "", "", fmt.Errorf("cgroupfs: %w", err)
	}
	return parseCgroupFor(bytes.NewReader(b), name, ctrl)
}

func parseCgroup(r io.Reader, name string) (v1, v2 string, err error) {
	return parseCgroupFor(r, name, "memory")
}

// parseCgroupFor parses a /proc/PID/cgroup file and returns the cgroup of
// the v1 controller ctrl and the v2 cgroup.
func parseCgroupFor(r io.Reader, name, ctrl string) (v1, v2 string, err error) {
	sc := lines(r)
	n := 0
	seenV1, seenV2 := false, false
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !isDecimal(parts[0]) || !strings.HasPrefix(parts[2], "/") {
			return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed, want ID:controllers:/path: %s", name, n, safefs.Quote(line))
		}
		if !cleanPath(parts[2], true) {
			return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed cgroup path, \".\" or \"..\" after a name: %s", name, n, safefs.Quote(line))
		}
		if parts[0] == "0" && parts[1] == "" {
			if seenV2 {
				return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed, a second cgroup v2 line (the kernel writes one line a hierarchy): %s", name, n, safefs.Quote(line))
			}
			v2, seenV2 = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c != ctrl {
				continue
			}
			if seenV1 {
				return "", "", fmt.Errorf("cgroupfs: %s: line %d: malformed, a second line for the %s controller (the kernel writes one line a hierarchy): %s", name, n, ctrl, safefs.Quote(line))
			}
			v1, seenV1 = parts[2], true
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	if n == 0 {
		return "", "", fmt.Errorf("cgroupfs: %s: empty", name)
	}
	return v1, v2, nil
}

// lines returns a scanner of r's lines split at '\n' alone. bufio.ScanLines
// also drops a '\r' before the '\n', but the kernel writes none there:
// a '\r' at the end of a line of /proc/PID/cgroup is the last byte of a
// cgroup's name (names may hold any byte but '/', and are not escaped), so
// dropping it would name another cgroup's directory.
func lines(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	return sc
}

func isDecimal(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// mount is one cgroup line of mountinfo.
type mount struct {
	root, point, fstype string
	superOpts           []string
}

func isV1Memory(m mount) bool { return isV1(m, "memory") }

// isV1 reports whether m is a v1 hierarchy with controller ctrl.
func isV1(m mount, ctrl string) bool {
	if m.fstype != "cgroup" {
		return false
	}
	for _, o := range m.superOpts {
		if o == ctrl {
			return true
		}
	}
	return false
}

func isV2(m mount) bool { return m.fstype == "cgroup2" }

// parseMountinfoFile reads the cgroup and cgroup2 mounts of a
// /proc/PID/mountinfo file (proc(5)), in file order, leaving out mounts
// shadowed by a later mount on the same mount point. The file is streamed
// (safefs.Dir.ScanLines), and only the cgroup mounts are kept: a host with
// tens of thousands of mounts costs time, not memory.
func (s *source) parseMountinfoFile(name string) ([]mount, error) {
	p := newMountinfoParser(name)
	err := s.mountinfo.ScanLines(s.mountinfoRel, safefs.MaxMountinfo, func(line []byte) error {
		if err := p.line(string(line)); err != nil {
			return parseError{err}
		}
		return nil
	})
	// p is read only after a nil error: after a timeout the scan may go on.
	var pe parseError
	if errors.As(err, &pe) {
		return nil, pe.err
	}
	if err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	return p.mounts()
}

// parseError carries a parse error out of safefs.Dir.ScanLines as it is.
type parseError struct{ err error }

func (e parseError) Error() string { return e.err.Error() }

// parseMountinfo is parseMountinfoFile on r.
func parseMountinfo(r io.Reader, name string) ([]mount, error) {
	p := newMountinfoParser(name)
	sc := lines(r)
	sc.Buffer(make([]byte, 0, 4096), safefs.MaxLine)
	for sc.Scan() {
		if err := p.line(sc.Text()); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cgroupfs: %s: %w", name, err)
	}
	return p.mounts()
}

// mountinfoParser parses mountinfo one line at a time, keeping the cgroup
// mounts only.
type mountinfoParser struct {
	name string
	n    int     // lines seen
	all  []mount // cgroup and cgroup2 mounts, in file order
	// last maps the mount point of each cgroup mount to the index in all
	// of the last cgroup mount on it, or -1 when a later mount of another
	// file system shadows it.
	last map[string]int
	// each, when set (tests), is called with every mount parsed, cgroup
	// or not.
	each func(mount)
}

func newMountinfoParser(name string) *mountinfoParser {
	return &mountinfoParser{name: name, last: make(map[string]int)}
}

// line parses the next line; every line is checked, cgroup or not.
func (p *mountinfoParser) line(line string) error {
	p.n++
	if line == "" {
		return nil
	}
	name, n := p.name, p.n
	// "36 35 98:0 /root /point rw,noatime [optional...] - fstype source superopts"
	// The kernel separates the fields with one ' ' and escapes only ' ',
	// '\t', '\n' and '\\' in paths (show_mountinfo, mangle: "\040" and
	// so on, proc_pid_mountinfo(5)); any other byte, a '\r', U+00A0 or
	// U+3000, is part of a field. The source may be empty and the super
	// options, last, may hold raw spaces (cifs writes its unc= so): they
	// are the rest of the line.
	pre, post, ok := strings.Cut(line, " - ")
	a, b := strings.Split(pre, " "), strings.SplitN(post, " ", 3)
	if !ok || len(a) < 6 || len(b) < 3 || !isDecimal(a[0]) || slices.Contains(a, "") || b[0] == "" {
		return fmt.Errorf("cgroupfs: %s: line %d: malformed mountinfo line: %s", name, n, safefs.Quote(line))
	}
	root, rerr := unescape(a[3])
	point, perr := unescape(a[4])
	if rerr != nil || perr != nil {
		return fmt.Errorf("cgroupfs: %s: line %d: malformed mountinfo line, %w: %s", name, n, cmp.Or(rerr, perr), safefs.Quote(line))
	}
	m := mount{root: root, point: point, fstype: b[0]}
	if p.each != nil {
		p.each(m)
	}
	// Only a cgroup mount's root is used, and another's need not be a
	// path: a bind-mounted namespace file's is "net:[4026531833]" (nsfs:
	// ip netns, the CNI plugins' /run/netns), as the kernel writes it.
	// Every mount point is one (d_path).
	cg := m.fstype == "cgroup" || m.fstype == "cgroup2"
	if !strings.HasPrefix(m.point, "/") || (cg && !strings.HasPrefix(m.root, "/")) {
		return fmt.Errorf("cgroupfs: %s: line %d: malformed mountinfo line, root and mount point must be absolute: %s", name, n, safefs.Quote(line))
	}
	if !cleanPath(m.point, false) || (cg && !cleanPath(m.root, true)) {
		return fmt.Errorf("cgroupfs: %s: line %d: malformed mountinfo line, \".\" or \"..\" in the root or mount point: %s", name, n, safefs.Quote(line))
	}
	if !cg {
		if _, ok := p.last[m.point]; ok {
			p.last[m.point] = -1
		}
		return nil
	}
	m.superOpts = strings.Split(b[2], ",")
	p.last[m.point] = len(p.all)
	p.all = append(p.all, m)
	return nil
}

// mounts returns the cgroup mounts not shadowed by a later mount.
func (p *mountinfoParser) mounts() ([]mount, error) {
	if p.n == 0 {
		return nil, fmt.Errorf("cgroupfs: %s: %w", p.name, errEmptyMountinfo)
	}
	var mounts []mount
	for i, m := range p.all {
		if p.last[m.point] == i {
			mounts = append(mounts, m)
		}
	}
	return mounts, nil
}

// unescape undoes mountinfo's octal escapes in a path (\040 for a space,
// \011, \012, \134: the kernel's mangle). The kernel escapes every '\\',
// so a '\\' that does not start three octal digits of a byte value is not
// the kernel's: an error.
func unescape(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+3 >= len(s) {
			return "", errors.New("bad octal escape")
		}
		v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", errors.New("bad octal escape")
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}

// cleanPath reports whether the absolute path p has no "." element and no
// ".." element, except, when up, ".." elements at its start: the kernel
// writes a cgroup, or the root of a cgroup mount, that lies outside the
// reader's cgroup namespace as "/../../x" (cgroup_path_ns), and never
// writes "." or ".." anywhere else (they are not valid names, and mount
// points are canonical, d_path). A path that breaks this could take a
// directory built from it outside the root Read was given.
func cleanPath(p string, up bool) bool {
	for _, e := range strings.Split(p[1:], "/") {
		switch {
		case e == ".." && up:
		case e == "." || e == "..":
			return false
		default:
			up = false // ".." is only valid before the first name
		}
	}
	return true
}

// cgroupDir returns the directory of cgroup cg in the first mount that
// matches and holds it, and the directory of the mount point (root
// prefixed to both); see cgroupDirs.
func cgroupDir(mounts []mount, cg string, match func(mount) bool, root string) (dir, top string, err error) {
	cands, err := cgroupDirs(mounts, cg, match, root)
	if err != nil {
		return "", "", err
	}
	return cands[0].dir, cands[0].top, nil
}

// cgroupDirs returns, in mountinfo order, every mount that matches and
// holds cgroup cg: its root is "/" or a path prefix of cg, and what is left
// of cg below the root does not climb ("..").
//
// A cgroup outside the reader's cgroup namespace reads "/../../x"
// (cgroup_path_ns); a mount made in another namespace, or a bind mount of a
// cgroup above the namespace's root, has a root that climbs too
// ("/../../.."). Such a mount holds the cgroup when its root climbs at least
// as far: root "/../.." holds "/../../x" as "/x", as the Go runtime
// (internal/runtime/cgroup) resolves it; root "/" or "/.." does not. The
// error says whether no mount matched, or none held cg; it does not match
// ErrNoCgroup (the caller wraps it).
func cgroupDirs(mounts []mount, cg string, match func(mount) bool, root string) ([]candidate, error) {
	found := false
	var out []candidate
	for _, m := range mounts {
		if !match(m) {
			continue
		}
		found = true
		var rel string
		switch {
		case m.root == "/":
			rel = cg
		case cg == m.root:
			rel = "/"
		case strings.HasPrefix(cg, m.root+"/"):
			rel = cg[len(m.root):]
		default:
			continue
		}
		if outsideNamespace(rel) {
			continue // climbs above the mount's root: not reachable through it
		}
		top := filepath.Join(root, m.point)
		out = append(out, candidate{dir: filepath.Join(top, filepath.FromSlash(rel)), top: top})
	}
	switch {
	case len(out) > 0:
		return out, nil
	case !found:
		return nil, errors.New("hierarchy not mounted")
	case outsideNamespace(cg):
		return nil, fmt.Errorf("cgroup %s is outside this cgroup namespace, and no mount root reaches it", safefs.Quote(cg))
	}
	return nil, fmt.Errorf("cgroup %s is outside the mounted part of the hierarchy", safefs.Quote(cg))
}

// climbs returns how many ".." elements path p starts with, and the rest
// of p after them ("/" when nothing is left).
func climbs(p string) (int, string) {
	n := 0
	for strings.HasPrefix(p, "/..") && (len(p) == 3 || p[3] == '/') {
		n, p = n+1, p[3:]
	}
	if p == "" {
		p = "/"
	}
	return n, p
}

// searchMounts returns the mounts that match and whose root lies above the
// cgroup namespace the paths are relative to, by more levels than cgroup cg
// climbs: a cgroup namespace made (unshare -C, a container runtime) while
// the hierarchy's mount stayed as it was (the host's /sys/fs/cgroup left
// in the container's mount namespace). mountinfo then shows the mount's
// root as "/.." (one level above the namespace root) and /proc/PID/cgroup
// the cgroup relative to the namespace root ("/pod"): the cgroup is
// top/N1/.../Nk/pod for k names the kernel does not show. Only a root of
// ".." elements alone is such a mount: a root with a name after them
// ("/../other") is a cgroup beside the namespace, which cannot hold it.
// Each is returned with search k and below the rest of cg.
func searchMounts(mounts []mount, cg string, match func(mount) bool, root string) []candidate {
	b, below := climbs(cg)
	var out []candidate
	for _, m := range mounts {
		if !match(m) {
			continue
		}
		a, rest := climbs(m.root)
		if rest != "/" || a <= b {
			continue
		}
		out = append(out, candidate{top: filepath.Join(root, m.point), search: a - b, below: below})
	}
	return out
}

// maxSearch bounds the directories source.resolve visits for one mount
// (a variable for tests).
var maxSearch = 1 << 14

// cgroupDirs returns the directories of cgroup cg: every mount that holds
// it (the package-level cgroupDirs), and every mount whose root lies above
// the reader's cgroup namespace (searchMounts) where the process's cgroup
// is found by its PID (resolve). The error says why none was found; it
// does not match ErrNoCgroup (the caller wraps it).
func (s *source) cgroupDirs(mounts []mount, cg string, match func(mount) bool, root string) ([]candidate, error) {
	cands, err := cgroupDirs(mounts, cg, match, root)
	var why []string
	for _, c := range searchMounts(mounts, cg, match, root) {
		dir, serr := s.resolve(c)
		if serr != nil {
			why = append(why, serr.Error())
			continue
		}
		c.dir, c.search = dir, 0
		cands = append(cands, c)
	}
	if len(cands) > 0 {
		return cands, nil
	}
	if len(why) > 0 {
		return nil, fmt.Errorf("%w; %s", err, strings.Join(why, "; "))
	}
	return nil, err
}

// resolve finds the directory of the process's cgroup under the mount of
// c (c.search > 0): the one directory c.search levels below c.top that has
// c.below under it and whose cgroup.procs lists the process's PID (s.pid,
// as the reader's PID namespace numbers it, as cgroup.procs does). At most
// maxSearch directories are visited. The error names the mount and says
// why nothing was found.
func (s *source) resolve(c candidate) (string, error) {
	if s.pid <= 0 {
		return "", fmt.Errorf("the mount at %s holds the hierarchy from %d levels above the cgroup namespace of %s, and the process's PID is not known to find its cgroup there", safefs.Quote(c.top), c.search, s.cgroupFile)
	}
	pid := []byte(strconv.Itoa(s.pid))
	key := resolvedKey{s.rootName, c.top, c.below, c.search, s.pid}
	if v, ok := resolved.Load(key); ok {
		// Where the last search found it (a refresh re-reads every 10
		// s): taken again when its cgroup.procs still lists the PID.
		if dir := v.(string); s.lists(dir, pid) {
			return dir, nil
		}
		resolved.Delete(key)
	}
	level := []string{c.top}
	visited := 0
	var skipped []string // directories passed over: not listable, or gone
	for i := 0; i < c.search; i++ {
		var next []string
		for _, d := range level {
			rel, err := s.rel(d)
			if err != nil {
				return "", err
			}
			rd, err := s.rootDir()
			if err != nil {
				return "", fmt.Errorf("cgroupfs: %w", err)
			}
			names, err := rd.SubDirs(rel, maxSearch-visited)
			if err != nil && d != c.top && (errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist)) {
				// Another tenant's cgroup the reader may not list, or one
				// removed since its parent was listed: it cannot hold the
				// process's (whose cgroup.procs is read, so readable).
				skipped = append(skipped, err.Error())
				continue
			}
			if err != nil {
				return "", fmt.Errorf("cgroupfs: looking for the cgroup of PID %d under %s: %w", s.pid, safefs.Quote(c.top), err)
			}
			visited += len(names)
			for _, n := range names {
				next = append(next, filepath.Join(d, n))
			}
		}
		level = next
	}
	var found []string
	for _, d := range level {
		if dir := filepath.Join(d, filepath.FromSlash(c.below)); s.lists(dir, pid) {
			found = append(found, dir)
		}
	}
	switch len(found) {
	case 1:
		if resolvedLen.Add(1) <= maxResolved {
			resolved.Store(key, found[0])
		}
		return found[0], nil
	case 0:
		why := ""
		if len(skipped) > 0 {
			why = fmt.Sprintf(" (%d directories passed over, the first: %s)", len(skipped), skipped[0])
		}
		return "", fmt.Errorf("the mount at %s holds the hierarchy from %d levels above the cgroup namespace of %s, and no cgroup %d levels below it with %s under it lists PID %d in cgroup.procs%s", safefs.Quote(c.top), c.search, s.cgroupFile, c.search, safefs.Quote(c.below), s.pid, why)
	}
	return "", fmt.Errorf("the mount at %s holds the hierarchy from %d levels above the cgroup namespace of %s, and %d cgroups list PID %d (%s, %s): ambiguous", safefs.Quote(c.top), c.search, s.cgroupFile, len(found), s.pid, safefs.Quote(found[0]), safefs.Quote(found[1]))
}

// lists reports whether the cgroup.procs of cgroup directory dir lists
// pid; a cgroup.procs that is not there (most directories searched) or not
// readable does not.
func (s *source) lists(dir string, pid []byte) bool {
	b, err := s.readFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if bytes.Equal(bytes.TrimSpace(line), pid) {
			return true
		}
	}
	return false
}

// resolved remembers where resolve found a process's cgroup (resolvedKey
// to the directory), so that a re-read looks there first instead of
// searching the tree again; at most maxResolved entries are ever stored
// (resolvedLen counts them), so that reading many processes (memctl
// status) cannot grow it without bound.
var (
	resolved    sync.Map
	resolvedLen atomic.Int64
)

const maxResolved = 256

type resolvedKey struct {
	root, top, below string
	search, pid      int
}

// outsideNamespace reports whether cgroup path p climbs with "..":
// /proc/PID/cgroup shows a process outside the reader's cgroup namespace
// that way, and a mount made in another namespace has such a root.
func outsideNamespace(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}

// ancestors returns dir and its parents up to and including top (the
// mount point), nearest first. dir is top or below it.
func ancestors(dir, top string) []string {
	out := []string{dir}
	for d := dir; d != top; {
		p := filepath.Dir(d)
		if p == d {
			break // not below top: cannot happen for dirs made by cgroupDir
		}
		d = p
		out = append(out, d)
	}
	return out
}

// readV1 reads memory.limit_in_bytes of dir and every ancestor up to the
// mount point, and hierarchical_memory_limit in dir's memory.stat.
func (s *source) readV1(cg, dir, top string) (Limit, error) {
	l := Limit{Version: 1, Cgroup: cg, Dir: dir, Bytes: NoLimit}
	for _, d := range ancestors(dir, top) {
		file := filepath.Join(d, "memory.limit_in_bytes")
		b, err := s.readFile(file)
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %w", err)
		}
		v, err := parseLimit(string(b), false)
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err)
		}
		if v != NoLimit {
			l.Bounds = append(l.Bounds, Bound{v, file})
		}
		if v != NoLimit && (l.Bytes == NoLimit || v < l.Bytes) {
			l.Bytes, l.File = v, file
		}
	}
	stat := filepath.Join(dir, "memory.stat")
	h, ok, err := s.hierarchicalLimit(stat)
	if err != nil {
		if l.Bytes == NoLimit {
			return Limit{}, err // "no limit" would be a guess
		}
		// A limit file sets one: memory.stat only adds a limit set
		// above the mount, so its error must not hide it.
		l.StatErr = err
	}
	if ok && h != NoLimit && (l.Bytes == NoLimit || h < l.Bytes) {
		l.Bytes, l.File = h, stat
		l.Bounds = append(l.Bounds, Bound{h, stat})
	}
	l.Max, l.MaxFile, l.High = l.Bytes, l.File, NoLimit
	return l, nil
}

// hierarchicalLimit reads hierarchical_memory_limit from a v1 memory.stat
// file. ok is false when the file or the key is absent.
func (s *source) hierarchicalLimit(file string) (int64, bool, error) {
	b, err := s.readFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("cgroupfs: %w", err)
	}
	sc := lines(bytes.NewReader(b))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		if k != "hierarchical_memory_limit" {
			continue
		}
		n, err := parseLimit(v, false)
		if err != nil {
			return 0, false, fmt.Errorf("cgroupfs: %s: hierarchical_memory_limit: %w", safefs.Quote(file), err)
		}
		return n, true, nil
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err)
	}
	return 0, false, nil
}

// readV2 reads memory.max and memory.high (v2LimitFiles) of dir and every
// ancestor up to the mount point; a directory without them sets no limit,
// but dir itself must exist.
func (s *source) readV2(cg, dir, top string) (Limit, error) {
	if err := s.stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) && strings.HasSuffix(cg, deletedSuffix) {
			// The kernel marks a removed v2 cgroup that still has a
			// task (one that is exiting) so (proc_cgroup_show): its
			// directory and limits are gone. A live cgroup whose name
			// ends so was found above.
			return Limit{}, fmt.Errorf("%w: cgroup %s was removed (the kernel marks it %q): its limit cannot be read", ErrNoCgroup, safefs.Quote(strings.TrimSuffix(cg, deletedSuffix)), deletedSuffix)
		}
		return Limit{}, fmt.Errorf("cgroupfs: %w", err)
	}
	l := Limit{Version: 2, Cgroup: cg, Dir: dir, Bytes: NoLimit, Max: NoLimit, High: NoLimit}
	topMax := filepath.Join(top, "memory.max")
	for _, file := range v2LimitFiles(ancestors(dir, top)) {
		b, err := s.readFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil && filepath.Base(file) == "memory.high" {
			// An unreadable memory.high (EACCES from an LSM) must not
			// hide memory.max either: kept aside as a malformed one.
			if l.HighErr == nil {
				l.HighErr = fmt.Errorf("cgroupfs: %w", err)
			}
			continue
		}
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %w", err)
		}
		if file == topMax {
			l.TopNotRoot = true // the root cgroup has no memory.max
		}
		v, err := parseLimit(string(b), true)
		isMax := filepath.Base(file) == "memory.max"
		if err != nil && !isMax {
			// A bad memory.high must not hide memory.max (the OOM
			// killer's limit): kept aside for the caller to report.
			if l.HighErr == nil {
				l.HighErr = fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err)
			}
			continue
		}
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err)
		}
		if tighter(v, l.Bytes) {
			l.Bytes, l.File = v, file
		}
		if isMax {
			if v != NoLimit {
				l.Bounds = append(l.Bounds, Bound{v, file})
			}
			if tighter(v, l.Max) {
				l.Max, l.MaxFile = v, file
			}
		} else if tighter(v, l.High) {
			l.High, l.HighFile = v, file
		}
	}
	return l, nil
}

// deletedSuffix is what the kernel appends to a /proc/PID/cgroup v2 line
// whose cgroup was removed.
const deletedSuffix = " (deleted)"

// parseLimit parses a limit file's value: a decimal byte count, or "max"
// when allowMax (v2). Values of unlimitedFrom or more are NoLimit.
func parseLimit(s string, allowMax bool) (int64, error) {
	s = strings.TrimSpace(s)
	if allowMax && s == "max" {
		return NoLimit, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		if allowMax {
			return 0, fmt.Errorf("malformed limit %s, want bytes or \"max\"", safefs.Quote(s))
		}
		return 0, fmt.Errorf("malformed limit %s, want bytes", safefs.Quote(s))
	}
	if n >= unlimitedFrom {
		return NoLimit, nil
	}
	return int64(n), nil
}
