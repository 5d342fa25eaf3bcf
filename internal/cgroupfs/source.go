package cgroupfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// source is where Read finds its files: cgroupRel in proc, mountinfoRel
// in mountinfo (cgroupFile and mountinfoFile name them in messages), and the
// cgroup files, whose paths start with rootName (the root Read was given,
// prefixed to Limit.Dir and Limit.File), in root (opened from rootPath on
// first use when nil).
type source struct {
	proc, mountinfo           *safefs.Dir
	cgroupRel, mountinfoRel   string
	cgroupFile, mountinfoFile string
	root                      *safefs.Dir
	rootPath, rootName        string
	owned                     []*safefs.Dir // closed by close
	// pid is the process's PID in the reader's PID namespace, used to
	// find its cgroup under a mount whose root lies above its cgroup
	// namespace (resolve); 0 when not known (a fixture).
	pid int
}

// pidOf returns the PID of /proc/PID/cgroup file name ("/proc/self/cgroup":
// the caller's), or 0 when name is not such a file.
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

// openSource opens the files of Read(cgroupFile, mountinfoFile, root):
// the first two as the caller names them, the cgroup files inside root
// ("" is "/") through no symlink.
func openSource(cgroupFile, mountinfoFile, root string) (*source, error) {
	s := &source{cgroupFile: cgroupFile, mountinfoFile: mountinfoFile, rootName: root, rootPath: "/", pid: pidOf(cgroupFile)}
	var err error
	if s.cgroupRel, err = filepath.Abs(cgroupFile); err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	if s.mountinfoRel, err = filepath.Abs(mountinfoFile); err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	if root != "" {
		if s.rootPath, err = filepath.Abs(root); err != nil {
			return nil, fmt.Errorf("cgroupfs: %w", err)
		}
	}
	top, err := safefs.OpenDir("/", safefs.InRoot)
	if err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	s.owned = append(s.owned, top)
	s.proc, s.mountinfo = top, top
	return s, nil
}

// rootDir returns s.root, opening it on first use.
func (s *source) rootDir() (*safefs.Dir, error) {
	if s.root == nil {
		r, err := safefs.OpenDir(s.rootPath, safefs.InRoot|safefs.NoSymlinks)
		if err != nil {
			return nil, err
		}
		s.owned = append(s.owned, r)
		s.root = r
	}
	return s.root, nil
}

func (s *source) close() {
	for _, d := range s.owned {
		d.Close()
	}
	s.owned = nil
}

// rel returns path, which starts with s.rootName, as a name in s.root.
func (s *source) rel(path string) (string, error) {
	if s.rootName == "" {
		return path, nil
	}
	rel, ok := strings.CutPrefix(path, s.rootName)
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		return "", fmt.Errorf("%s is not under %s", safefs.Quote(path), safefs.Quote(s.rootName))
	}
	return rel, nil
}

// readFile reads the cgroup file path (root-prefixed, as in Limit.File),
// at most safefs.MaxCgroupFile bytes.
func (s *source) readFile(path string) ([]byte, error) {
	rel, err := s.rel(path)
	if err != nil {
		return nil, err
	}
	root, err := s.rootDir()
	if err != nil {
		return nil, err
	}
	return root.ReadFile(rel, safefs.MaxCgroupFile)
}

// stat returns nil when the cgroup directory dir (root-prefixed) exists.
func (s *source) stat(dir string) error {
	rel, err := s.rel(dir)
	if err != nil {
		return err
	}
	root, err := s.rootDir()
	if err != nil {
		return err
	}
	return root.Stat(rel)
}

// View says through which mount namespace OfProc read the cgroup files.
type View int

const (
	// ViewProcess: the process's own, through /proc/PID/root, as the
	// process sees its cgroup files.
	ViewProcess View = iota
	// ViewCaller: the caller's own mount namespace. OfProc reads there
	// when the process's namespace shows a cgroup v2 hierarchy without
	// the memory controller and no v1 memory hierarchy (a hybrid host
	// whose container mounts only cgroup2), while /proc/PID/cgroup lists
	// the process's v1 memory cgroup, or when the process is in another
	// mount namespace that shows no mount of its cgroup's hierarchy at
	// all (a container without /sys/fs/cgroup): the caller's
	// /proc/PID/cgroup paths are relative to the caller's cgroup
	// namespace, so they are found in the caller's mounts.
	ViewCaller
	// ViewCallerRoot: the caller's own mount namespace and root, for a
	// process in the same mount namespace whose root directory (a chroot)
	// shows no cgroup mount: its mountinfo is empty, or lists no mount of
	// its cgroup's hierarchy. The mounts are the same ones, so the
	// caller's view reads the same cgroup files, and trusts nothing the
	// process could arrange inside its root.
	ViewCallerRoot
)

// errEmptyMountinfo is matched by the error of a mountinfo with no line,
// which a chrooted process has when no mount point lies under its root.
var errEmptyMountinfo = errors.New("empty")

// FSTypes are the file systems of cgroup files (safefs.Dir.FSTypes): cgroup
// v1 and v2.
var FSTypes = []int64{safefs.CgroupMagic, safefs.Cgroup2Magic}
