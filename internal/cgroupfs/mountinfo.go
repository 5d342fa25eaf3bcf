package cgroupfs

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

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
// /proc/PID/mountinfo file (proc_pid_mountinfo(5)), in file order, less
// those shadowed by a later mount on the same point. The file is streamed,
// and only cgroup mounts are kept.
func (s *source) parseMountinfoFile() ([]mount, error) {
	p := newMountinfoParser(s.mountinfoFile)
	err := s.mountinfo.ScanLines(s.mountinfoRel, safefs.MaxMountinfo, func(line []byte) error { return p.line(string(line)) })
	// ScanLines's own errors are *safefs.PathError; p.line's name the line.
	// p is read only after a nil error: after a timeout the scan may go on.
	var pe *safefs.PathError
	if errors.As(err, &pe) {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	if err != nil {
		return nil, err
	}
	return p.mounts()
}

// errEmptyMountinfo: no mount point under a chrooted process's root.
var errEmptyMountinfo = errors.New("empty")

// mountinfoParser parses mountinfo line by line, keeping cgroup mounts.
type mountinfoParser struct {
	name string
	n    int     // lines seen
	all  []mount // cgroup and cgroup2 mounts, in file order
	// last maps each cgroup mount point to the index in all of the last
	// cgroup mount on it, -1 when a later mount of another kind shadows it.
	last map[string]int
	each func(mount) // when set, called with every mount parsed
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
	// Fields are split on one ' ' (the kernel escapes ' ', '\t', '\n' and
	// '\\' in paths: show_mountinfo); the source may be empty and the
	// super options, last, may hold raw spaces (cifs).
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
	// Only a cgroup mount's root is used; another's need not be a path
	// (nsfs: "net:[4026531833]"). Every mount point is one (d_path).
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

// unescape undoes mountinfo's octal escapes in a path (\040 for a space);
// a '\\' that does not start three octal digits of a byte is an error.
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
		v, err := strconv.ParseUint(s[i+1:min(i+4, len(s))], 8, 8)
		if err != nil || i+3 >= len(s) {
			return "", errors.New("bad octal escape")
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}

// cleanPath reports whether the absolute path p has no "." or ".."
// element, except, when up, ".." elements at its start (the kernel writes
// a cgroup outside the reader's namespace as "/../../x", cgroup_path_ns).
// A path that breaks this could lead outside the root Read was given.
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

// parseCgroupFile reads a /proc/PID/cgroup file ("ID:controllers:path"
// lines, cgroups(7)) and returns the cgroup of the v1 controller ctrl and
// the v2 cgroup ("0::path"), each "" when absent.
func (s *source) parseCgroupFile(ctrl string) (v1, v2 string, err error) {
	b, err := s.proc.ReadFile(s.cgroupRel, safefs.MaxProcFile)
	if errors.Is(err, fs.ErrNotExist) {
		// A kernel without cgroups has no /proc/PID/cgroup.
		return "", "", fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	if err != nil {
		return "", "", fmt.Errorf("cgroupfs: %w", err)
	}
	return parseCgroupFor(b, s.cgroupFile, ctrl)
}

// parseCgroupFor parses a /proc/PID/cgroup file. A second line for one
// hierarchy, a path with "." or ".." after a name, is malformed.
func parseCgroupFor(b []byte, name, ctrl string) (v1, v2 string, err error) {
	seenV1, seenV2 := false, false
	n := 0
	for rest := b; len(rest) > 0; {
		var raw []byte
		raw, rest = nextLine(rest)
		n++
		line := string(raw)
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
	if n == 0 {
		return "", "", fmt.Errorf("cgroupfs: %s: empty", name)
	}
	return v1, v2, nil
}

func isDecimal[T string | []byte](s T) bool {
	if len(s) == 0 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
