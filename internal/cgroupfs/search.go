package cgroupfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/memctl/memctl/internal/safefs"
)

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
// directories are visited; the place found is looked at first next time.
func (s *source) resolve(c candidate) (string, error) {
	if s.pid <= 0 {
		return "", fmt.Errorf("the mount at %s holds the hierarchy from %d levels above the cgroup namespace of %s, and the process's PID is not known to find its cgroup there", safefs.Quote(c.top), c.search, s.cgroupFile)
	}
	pid := []byte(strconv.Itoa(s.pid))
	key := resolvedKey{s.rootName, c.top, c.below, c.search, s.pid}
	if v, ok := resolved.Load(key); ok {
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

// resolved remembers where resolve found a process's cgroup; at most
// maxResolved entries are ever stored (resolvedLen counts them).
var (
	resolved    sync.Map
	resolvedLen atomic.Int64
)

const maxResolved = 256

type resolvedKey struct {
	root, top, below string
	search, pid      int
}
