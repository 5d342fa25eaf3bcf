package cgroupfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// candidate is one mount that holds the process's cgroup: dir is the
// cgroup's directory through it, top its mount point (root prefixed). With
// search > 0, dir is top/N1/.../Nsearch/below, for resolve to find.
type candidate struct {
	dir, top string
	search   int
	below    string
}

// cgroupDirs returns, in mountinfo order, every mount that matches and
// holds cgroup cg: its root is "/" or a path prefix of cg, and what is left
// below it does not climb. A root that climbs ("/../..") holds a cgroup
// that climbs as far ("/../../x" as "/x"), as the Go runtime resolves it.
// The error says whether no mount matched or none held cg; the caller
// wraps it in ErrNoCgroup.
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

// cgroupDirs returns the directories of cgroup cg: every mount that holds
// it, and every mount whose root lies above the reader's cgroup namespace
// where the process's cgroup is found by its PID (resolve).
func (s *source) cgroupDirs(mounts []mount, cg string, match func(mount) bool) ([]candidate, error) {
	cands, err := cgroupDirs(mounts, cg, match, s.rootName)
	var why []string
	for _, c := range searchMounts(mounts, cg, match, s.rootName) {
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

// outsideNamespace reports whether cgroup path p climbs with "..".
func outsideNamespace(p string) bool { return p == "/.." || strings.HasPrefix(p, "/../") }

// ancestors returns dir and its parents up to top, nearest first.
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

// climbs returns the count of leading ".." in p and the rest ("/" if none).
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

// searchMounts returns the matching mounts whose root (".." only) climbs
// above the reader's cgroup namespace further than cg does (mountinfo root
// "/..", cgroup "/pod": the cgroup is top/N1/.../Nk/pod, with k unseen
// names), each with search k and below the rest of cg.
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

// maxSearch bounds the directories resolve visits for one mount.
var maxSearch = 1 << 14

// resolve finds the directory of the process's cgroup under the mount of
// c (c.search > 0): the one directory c.search levels below c.top with
// c.below under it whose cgroup.procs lists s.pid. At most maxSearch
// directories are visited.
func (s *source) resolve(c candidate) (string, error) {
	where := fmt.Sprintf("the mount at %s holds the hierarchy from %d levels above the cgroup namespace of %s", safefs.Quote(c.top), c.search, s.cgroupFile)
	if s.pid <= 0 {
		return "", fmt.Errorf("%s, and the process's PID is not known to find its cgroup there", where)
	}
	pid := []byte(strconv.Itoa(s.pid))
	level := []string{c.top}
	visited := 0
	var skipped []string // directories passed over: not listable, or gone
	for i := 0; i < c.search; i++ {
		var next []string
		for _, d := range level {
			rd, rel, err := s.at(d)
			if err != nil {
				return "", fmt.Errorf("cgroupfs: %w", err)
			}
			names, err := rd.SubDirs(rel, maxSearch-visited)
			if err != nil && d != c.top && (errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist)) {
				// Unlistable or removed: it cannot hold the process's cgroup.
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
		return found[0], nil
	case 0:
		why := ""
		if len(skipped) > 0 {
			why = fmt.Sprintf(" (%d directories passed over, the first: %s)", len(skipped), skipped[0])
		}
		return "", fmt.Errorf("%s, and no cgroup %d levels below it with %s under it lists PID %d in cgroup.procs%s", where, c.search, safefs.Quote(c.below), s.pid, why)
	}
	return "", fmt.Errorf("%s, and %d cgroups list PID %d (%s, %s): ambiguous", where, len(found), s.pid, safefs.Quote(found[0]), safefs.Quote(found[1]))
}

// lists reports whether dir's cgroup.procs lists pid (absent or unreadable: no).
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
