package cgroupfs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// candidate is one mount that holds the process's cgroup: dir is the
// cgroup's directory through it, top its mount point (root prefixed). With
// search > 0, dir is not known yet: it is top/N1/.../Nsearch/below, under
// names /proc/PID/cgroup does not show; source.resolve finds them.
type candidate struct {
	dir, top string
	search   int
	below    string
}

// cgroupDir returns cgroupDirs' first directory and mount point.
func cgroupDir(mounts []mount, cg string, match func(mount) bool, root string) (dir, top string, err error) {
	cands, err := cgroupDirs(mounts, cg, match, root)
	if err != nil {
		return "", "", err
	}
	return cands[0].dir, cands[0].top, nil
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

// outsideNamespace reports whether cgroup path p (cleanPath with up)
// climbs with "..".
func outsideNamespace(p string) bool {
	n, _ := climbs(p)
	return n > 0
}

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
