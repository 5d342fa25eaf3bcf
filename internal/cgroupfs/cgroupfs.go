// Package cgroupfs finds the memory limit of the cgroup a process is in,
// for any process: cgroup v1 (memory.limit_in_bytes) or v2 (memory.max and
// memory.high), the tightest limit of the cgroup and its ancestors, and the
// file it came from; and reads the cgroup's memory.stat, memory.events,
// swap and CPU throttling counters.
//
// Every error names its file, and malformed input is an error, never a
// guess. Every file is read through package safefs (cgroup files inside
// root, through no symlink, bounded) and every string from them is quoted
// in errors: a process controls what its own mount namespace shows.
package cgroupfs

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/safefs"
)

// NoLimit is a limit in bytes when no cgroup on the path sets one.
const NoLimit = -1

// ErrNoCgroup is matched by the error of a process whose memory cgroup
// cannot be found here (none listed, or not mounted): the limit is
// unknown, not absent.
var ErrNoCgroup = errors.New("cgroupfs: memory cgroup not found")

// ErrUnseen is matched, with ErrNoCgroup, by the error of a process whose
// listed memory cgroup no mount here shows.
var ErrUnseen = fmt.Errorf("%w (its cgroup is not visible here: the limit is unknown)", ErrNoCgroup)

// Limit is the memory limit of the cgroup a process is in. Sizes are in
// bytes, NoLimit when none is set; each File names where its figure came
// from ("" with NoLimit).
type Limit struct {
	Version int    // 1 (the v1 memory controller, preferred when mounted) or 2
	Cgroup  string // as /proc/PID/cgroup shows it: "/system.slice/app.service"
	Dir     string // its directory: "/sys/fs/cgroup/system.slice/app.service"
	// Bytes is the effective limit: the smallest of the cgroup's and its
	// ancestors' (v2: memory.max or memory.high; v1: limit_in_bytes, or the
	// cgroup's memory.stat hierarchical_memory_limit when tighter). The
	// kernel's value as written: 0 is possible and returned.
	Bytes int64
	File  string // memory.max is named when equal to a memory.high
	// Max is the hard limit (the OOM killer's): v1 as Bytes, v2 the
	// smallest memory.max.
	Max     int64
	MaxFile string
	// High is the smallest v2 memory.high, the throttle limit
	// (Documentation/admin-guide/cgroup-v2.rst); NoLimit in v1.
	High     int64
	HighFile string
	// Bounds are every hard limit on the path, nearest first; a looser one
	// can be enforced first when siblings are charged more.
	Bounds []Bound `json:",omitempty"`
	// HighErr is the error of a memory.high that is malformed or
	// unreadable, left out so that memory.max is still read.
	HighErr error `json:"-"`
	// StatErr is the error of a v1 memory.stat that could not be read or
	// parsed while a limit file sets a limit (which is returned).
	StatErr error `json:"-"`
	// TopNotRoot is true in v2 when the topmost visible cgroup is not the
	// hierarchy's root (it has a memory.max): NoLimit then means unknown.
	TopNotRoot bool `json:",omitempty"`
	// Unreadable are the errors (EACCES) of other mounts of the hierarchy
	// passed over because a readable one sets a limit.
	Unreadable []error `json:"-"`
}

// Bound is one hard memory limit: Bytes from File, whose directory is the
// cgroup it applies to.
type Bound struct {
	Bytes int64
	File  string
}

// Read returns the memory limit of the process whose /proc/PID/cgroup is
// cgroupFile and /proc/PID/mountinfo is mountinfoFile. root is prefixed to
// every mount point ("" for the caller's mount namespace, "/proc/PID/root"
// for another, or a fixture directory); cgroup files are read inside it.
// v1 is read when listed and mounted, v2 only with the memory controller;
// of several mounts of the hierarchy the tightest limit is kept, and a
// mount whose root climbs above the reader's cgroup namespace is searched
// for the process's cgroup by its PID. Safe for concurrent use.
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
	v1, v2, err := s.parseCgroupFile("memory")
	if err != nil {
		return Limit{}, err
	}
	if v1 == "" && v2 == "" {
		return Limit{}, fmt.Errorf("%w: %s lists neither the memory controller nor a cgroup v2 hierarchy", ErrNoCgroup, s.cgroupFile)
	}
	mounts, err := s.parseMountinfoFile()
	if err != nil {
		return Limit{}, err
	}
	var why []string
	if v1 != "" {
		cands, err := s.cgroupDirs(mounts, v1, isV1Memory)
		if err == nil {
			return s.readAll(1, v1, cands)
		}
		why = append(why, "v1 memory: "+err.Error())
	}
	if v2 != "" {
		cands, err := s.cgroupDirs(mounts, v2, isV2)
		if err == nil {
			var l Limit
			l, err = s.readAll(2, v2, cands)
			if !errors.Is(err, ErrNoCgroup) {
				return l, err // a limit, or an error naming a file
			}
		}
		why = append(why, "v2: "+err.Error())
		if errors.Is(err, errNoV2Memory) {
			// Kept matchable for OfProc's fallback.
			return Limit{}, fmt.Errorf("%w: %s", errNoV2Memory, strings.Join(why, "; "))
		}
	}
	return Limit{}, fmt.Errorf("%w: %s", ErrUnseen, strings.Join(why, "; "))
}

// readAll reads the limit of cgroup cg through every candidate mount and
// keeps the tightest (a mount showing more ancestors can show more
// limits). A mount whose files are gone is passed over unless none can be
// read; an EACCES one is passed over (in Unreadable) when another sets a
// limit.
func (s *source) readAll(version int, cg string, cands []candidate) (Limit, error) {
	var out Limit
	var gone, denied error
	var unreadable []error
	n := 0
	for _, c := range cands {
		l, err := s.limit(version, cg, c)
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
		s.used = append(s.used, c)
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
