package cgroupfs

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// source is where Read finds its files; cgroup file paths start with
// rootName, and root is opened from rootPath on first use when nil.
type source struct {
	proc, mountinfo           *safefs.Dir
	cgroupRel, mountinfoRel   string
	cgroupFile, mountinfoFile string
	root                      *safefs.Dir
	rootPath, rootName        string
	owned                     []*safefs.Dir // closed by close
	pid                       int           // for resolve; 0 when not known
	used                      []candidate   // the mounts read's limit came through
}

// pidOf returns the PID of /proc/PID/cgroup file name, 0 when it is none.
func pidOf(name string) int {
	rest, ok := strings.CutPrefix(filepath.Clean(name), "/proc/")
	if !ok {
		return 0
	}
	p, file, ok := strings.Cut(rest, "/")
	if !ok || file != "cgroup" {
		return 0
	}
	if p == "self" || p == "thread-self" {
		return os.Getpid()
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// openSource opens the files of Read(cgroupFile, mountinfoFile, root).
func openSource(cgroupFile, mountinfoFile, root string) (*source, error) {
	s := &source{cgroupFile: cgroupFile, mountinfoFile: mountinfoFile, rootName: root, rootPath: "/", pid: pidOf(cgroupFile)}
	var cgErr, miErr, rootErr error
	s.cgroupRel, cgErr = filepath.Abs(cgroupFile)
	s.mountinfoRel, miErr = filepath.Abs(mountinfoFile)
	if root != "" {
		s.rootPath, rootErr = filepath.Abs(root)
	}
	if err := cmp.Or(cgErr, miErr, rootErr); err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	top, err := safefs.OpenDir("/", safefs.InRoot)
	if err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	s.owned = append(s.owned, top)
	s.proc, s.mountinfo = top, top
	return s, nil
}

func (s *source) close() {
	for _, d := range s.owned {
		d.Close()
	}
	s.owned = nil
}

// at returns s.root (opened on first use) and path relative to it.
func (s *source) at(path string) (*safefs.Dir, string, error) {
	rel, ok := strings.CutPrefix(path, s.rootName)
	if !ok || (s.rootName != "" && rel != "" && !strings.HasPrefix(rel, "/")) {
		return nil, "", fmt.Errorf("%s is not under %s", safefs.Quote(path), safefs.Quote(s.rootName))
	}
	if s.root == nil {
		r, err := safefs.OpenDir(s.rootPath, safefs.InRoot|safefs.NoSymlinks)
		if err != nil {
			return nil, "", err
		}
		s.owned = append(s.owned, r)
		s.root = r
	}
	return s.root, rel, nil
}

// readFile reads the cgroup file path, at most safefs.MaxCgroupFile bytes.
func (s *source) readFile(path string) ([]byte, error) {
	root, rel, err := s.at(path)
	if err != nil {
		return nil, err
	}
	return root.ReadFile(rel, safefs.MaxCgroupFile)
}

// stat returns nil when the cgroup directory dir exists.
func (s *source) stat(dir string) error {
	root, rel, err := s.at(dir)
	if err != nil {
		return err
	}
	return root.Stat(rel)
}

// View says through which mount namespace OfProc read the cgroup files.
type View int

const (
	ViewProcess    View = iota // the process's own, through /proc/PID/root
	ViewCaller                 // the caller's mount namespace (see OfProc)
	ViewCallerRoot             // the caller's mount namespace and root: a chrooted process
)

// FSTypes are the file systems of cgroup files, v1 and v2 (safefs.Dir.FSTypes).
var FSTypes = []int64{safefs.CgroupMagic, safefs.Cgroup2Magic}
