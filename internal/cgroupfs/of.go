package cgroupfs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/memctl/memctl/internal/safefs"
)

// Of returns the memory limit of the cgroup process pid is in (0: the
// caller); see OfProc. In another mount namespace, Limit.Dir and
// Limit.File start with /proc/PID/root. Off Linux the error matches
// errors.ErrUnsupported.
func Of(pid int) (Limit, error) {
	l, _, _, err := ofPID(pid)
	return l, err
}

// ofPID is Of, with ofProc's view and mounts.
func ofPID(pid int) (Limit, View, []candidate, error) {
	name := "/proc/self"
	if pid != 0 {
		name = "/proc/" + strconv.Itoa(pid)
	}
	proc, err := safefs.OpenDir(name, safefs.NoSymlinks)
	if err != nil {
		return Limit{}, ViewProcess, nil, fmt.Errorf("cgroupfs: %w", err)
	}
	defer proc.Close()
	return ofProc(proc)
}

// OfProc is Of for the process whose /proc/PID directory proc is (opened
// with safefs.NoSymlinks, so a reused PID fails). It reads the cgroup files
// inside proc's "root" with proc's Timeout; see Read.
//
// It reads in the caller's mount namespace instead (ViewCaller) when the
// process's v2 hierarchy has no memory controller (a hybrid host) or its
// namespace shows no mount of its hierarchy, and in the caller's root
// (ViewCallerRoot) for a process chrooted in the caller's namespace.
func OfProc(proc *safefs.Dir) (Limit, View, error) {
	l, view, _, err := ofProc(proc)
	return l, view, err
}

// ofProc is OfProc, and the mounts the limit came through when it was read
// in the process's view (nil otherwise).
func ofProc(proc *safefs.Dir) (Limit, View, []candidate, error) {
	root, err := openRoot(proc)
	if err != nil {
		return Limit{}, ViewProcess, nil, err
	}
	defer root.Close()
	rootName := ""
	if !sameMountNS(proc) {
		rootName = proc.Name() + "/root"
	}
	s := procSource(proc, proc, root, rootName)
	l, err := s.read()
	chrooted := errors.Is(err, errEmptyMountinfo) || errors.Is(err, ErrNoCgroup) && !errors.Is(err, errNoV2Memory)
	if chrooted {
		// Read its /proc/PID/cgroup in the caller's mounts; if the caller
		// finds none either, the process's error stands.
		view := ViewCaller
		if rootName == "" {
			view = ViewCallerRoot
		}
		if c, err2 := callerLimit(proc); err2 == nil {
			return c, view, nil, nil
		}
		return l, ViewProcess, nil, err
	}
	if !errors.Is(err, errNoV2Memory) {
		return l, ViewProcess, s.used, err
	}
	why := err.Error()
	v1, err := callerLimit(proc)
	switch {
	case err == nil && v1.Version == 1:
		return v1, ViewCaller, nil, nil
	case err == nil || errors.Is(err, ErrNoCgroup):
		return Limit{}, ViewProcess, nil, fmt.Errorf("%w: %s, and no v1 memory cgroup of the process is mounted, in its mount namespace or memctl's", ErrNoCgroup, why)
	}
	return Limit{}, ViewProcess, nil, fmt.Errorf("%s; v1: %w", why, err)
}

// callerLimit reads proc's cgroup limit through the caller's mountinfo and root.
func callerLimit(proc *safefs.Dir) (Limit, error) {
	self, err := safefs.OpenDir("/proc/self", safefs.NoSymlinks)
	if err != nil {
		return Limit{}, fmt.Errorf("cgroupfs: %w", err)
	}
	defer self.Close()
	root, err := openRoot(self)
	if err != nil {
		return Limit{}, err
	}
	defer root.Close()
	root.Timeout = proc.Timeout
	return procSource(proc, self, root, "").read()
}

// openRoot opens the root of the process whose /proc/PID directory is d,
// to read cgroup files in.
func openRoot(d *safefs.Dir) (*safefs.Dir, error) {
	root, err := d.Sub("root", safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return nil, fmt.Errorf("cgroupfs: %w", err)
	}
	root.FSTypes = FSTypes
	return root, nil
}

// procSource reads proc's cgroup file, mi's mountinfo (both /proc/PID
// directories) and cgroup files in root, named under rootName.
func procSource(proc, mi, root *safefs.Dir, rootName string) *source {
	return &source{
		proc: proc, cgroupRel: "cgroup", cgroupFile: proc.Name() + "/cgroup",
		mountinfo: mi, mountinfoRel: "mountinfo", mountinfoFile: mi.Name() + "/mountinfo",
		root: root, rootName: rootName, pid: pidOf(proc.Name() + "/cgroup"),
	}
}

// sameMountNS reports whether proc's process is in the caller's mount
// namespace. The link can be EACCES for a moment during execve: retried
// for about 50 ms, then false (paths keep a /proc/PID/root prefix).
func sameMountNS(proc *safefs.Dir) bool {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return false
	}
	for try := 0; ; try++ {
		other, err := proc.Readlink("ns/mnt")
		if err == nil {
			return self == other
		}
		if try == 10 {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
