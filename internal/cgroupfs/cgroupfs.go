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
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

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
// namespace) is not visible, memory.high counts as a limit (see
// v2LimitFiles), and a cgroup directory without memory.max (the memory
// controller not enabled for it, or the root) sets no limit. v1 is read
// when /proc/PID/cgroup lists the memory controller and it is mounted; v2
// only when its mounted cgroup has the memory controller
// (cgroup.controllers), so a hybrid host whose v2 hierarchy has none gives
// the v1 limit or ErrNoCgroup, never a false "no limit" from v2.
//
// Errors name the file: a file that cannot be read, a malformed line or
// value. A "." or ".." element in a mount point, or after a name in a mount
// root or cgroup path, is malformed: the kernel never writes one, and it
// could lead outside root. When no memory cgroup can be found, the error
// matches ErrNoCgroup (a cgroup or mount root that starts with "/..", the
// kernel's way to show it lies outside the reader's cgroup namespace).
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
		dir, top, err := cgroupDir(mounts, v1, isV1Memory, root)
		if err == nil {
			return s.readV1(v1, dir, top)
		}
		why = append(why, "v1 memory: "+err.Error())
	}
	if v2 != "" {
		dir, top, err := cgroupDir(mounts, v2, isV2, root)
		if err == nil {
			err = s.v2Memory(top)
		}
		if err == nil {
			return s.readV2(v2, dir, top)
		}
		why = append(why, "v2: "+err.Error())
		if errors.Is(err, errNoV2Memory) {
			// Kept matchable: OfProc then looks for the v1 hierarchy in
			// its own mount namespace.
			return Limit{}, fmt.Errorf("%w: %s", errNoV2Memory, strings.Join(why, "; "))
		}
	}
	return Limit{}, fmt.Errorf("%w: %s", ErrNoCgroup, strings.Join(why, "; "))
}

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
	sc := bufio.NewScanner(r)
	n := 0
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
			v2 = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == ctrl {
				v1 = parts[2]
			}
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
	sc := bufio.NewScanner(r)
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
	pre, post, ok := strings.Cut(line, " - ")
	a, b := strings.Fields(pre), strings.Fields(post)
	if !ok || len(a) < 6 || len(b) < 2 || !isDecimal(a[0]) {
		return fmt.Errorf("cgroupfs: %s: line %d: malformed mountinfo line: %s", name, n, safefs.Quote(line))
	}
	m := mount{root: unescape(a[3]), point: unescape(a[4]), fstype: b[0]}
	if !strings.HasPrefix(m.root, "/") || !strings.HasPrefix(m.point, "/") {
		return fmt.Errorf("cgroupfs: %s: line %d: malformed mountinfo line, root and mount point must be absolute: %s", name, n, safefs.Quote(line))
	}
	if !cleanPath(m.root, true) || !cleanPath(m.point, false) {
		return fmt.Errorf("cgroupfs: %s: line %d: malformed mountinfo line, \".\" or \"..\" in the root or mount point: %s", name, n, safefs.Quote(line))
	}
	if m.fstype != "cgroup" && m.fstype != "cgroup2" {
		if _, ok := p.last[m.point]; ok {
			p.last[m.point] = -1
		}
		return nil
	}
	if len(b) >= 3 {
		m.superOpts = strings.Split(b[2], ",")
	}
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

// unescape undoes mountinfo's octal escapes (\040 for a space, \011, \012,
// \134); anything else is kept as is.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
// matches and contains it, and the directory of the mount point (root
// prefixed to both).
func cgroupDir(mounts []mount, cg string, match func(mount) bool, root string) (dir, top string, err error) {
	if outsideNamespace(cg) {
		return "", "", fmt.Errorf("cgroup %s is outside this cgroup namespace", safefs.Quote(cg))
	}
	found := false
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
		top = filepath.Join(root, m.point)
		return filepath.Join(top, filepath.FromSlash(rel)), top, nil
	}
	if !found {
		return "", "", errors.New("hierarchy not mounted")
	}
	return "", "", fmt.Errorf("cgroup %s is outside the mounted part of the hierarchy", safefs.Quote(cg))
}

// outsideNamespace reports whether cgroup path p climbs with "..": /proc/PID/cgroup
// shows a process outside the reader's cgroup namespace that way.
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
		if v != NoLimit && (l.Bytes == NoLimit || v < l.Bytes) {
			l.Bytes, l.File = v, file
		}
	}
	stat := filepath.Join(dir, "memory.stat")
	h, ok, err := s.hierarchicalLimit(stat)
	if err != nil {
		return Limit{}, err
	}
	if ok && h != NoLimit && (l.Bytes == NoLimit || h < l.Bytes) {
		l.Bytes, l.File = h, stat
	}
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
	sc := bufio.NewScanner(bytes.NewReader(b))
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
		return Limit{}, fmt.Errorf("cgroupfs: %w", err)
	}
	l := Limit{Version: 2, Cgroup: cg, Dir: dir, Bytes: NoLimit}
	for _, file := range v2LimitFiles(ancestors(dir, top)) {
		b, err := s.readFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %w", err)
		}
		v, err := parseLimit(string(b), true)
		if err != nil {
			return Limit{}, fmt.Errorf("cgroupfs: %s: %w", safefs.Quote(file), err)
		}
		if v != NoLimit && (l.Bytes == NoLimit || v < l.Bytes) {
			l.Bytes, l.File = v, file
		}
	}
	return l, nil
}

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
