package cgroupfs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/memctl/memctl/internal/safefs"
)

// Of returns the memory limit of the cgroup process pid is in (0 means the
// calling process), from /proc/PID/cgroup, /proc/PID/mountinfo and the
// cgroup files; see Read and OfProc. When the process is in another mount
// namespace (a container), Limit.Dir and Limit.File start with
// /proc/PID/root. Reading another user's process may need root. Errors
// name the file; see Read.
func Of(pid int) (Limit, error) {
	name := "/proc/self"
	if pid != 0 {
		name = "/proc/" + strconv.Itoa(pid)
	}
	proc, err := safefs.OpenDir(name, safefs.NoSymlinks)
	if err != nil {
		return Limit{}, fmt.Errorf("cgroupfs: %w", err)
	}
	defer proc.Close()
	l, _, err := OfProc(proc)
	return l, err
}

// OfProc is Of for the process whose /proc/PID directory proc is (opened
// with safefs.OpenDir("/proc/PID", safefs.NoSymlinks)): it reads "cgroup"
// and "mountinfo" in proc, and the cgroup files inside proc's "root" (the
// process's root directory) through no symlink, only on a cgroup file
// system (FSTypes), with proc's Timeout. A
// Dir pinned on /proc/PID keeps reading the same process: once it exits,
// reads fail (ENOENT or ESRCH) even when its PID is reused.
//
// A cgroup v2 hierarchy whose cgroup has no memory controller
// (cgroup.controllers without "memory") and no limit above it is not taken
// as "no limit": OfProc looks for the v1 memory cgroup of the process
// instead, in the caller's mount namespace (ViewCaller), and when there is
// none returns an error matching ErrNoCgroup that says so.
//
// A process in the caller's mount namespace whose root (a chroot) shows no
// cgroup mount (an empty mountinfo, or no mount of its hierarchy) is read in
// the caller's mountinfo and root instead (ViewCallerRoot): the same mounts,
// seen from the caller's root. A process in another mount namespace whose
// view shows no mount of its hierarchy is read in the caller's mount
// namespace (ViewCaller), as for the hybrid case above.
func OfProc(proc *safefs.Dir) (Limit, View, error) {
	root, err := proc.Sub("root", safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return Limit{}, ViewProcess, fmt.Errorf("cgroupfs: %w", err)
	}
	defer root.Close()
	root.FSTypes = FSTypes
	rootName := ""
	if !sameMountNS(proc) {
		rootName = proc.Name() + "/root"
	}
	s := &source{
		proc: proc, cgroupRel: "cgroup", cgroupFile: proc.Name() + "/cgroup",
		mountinfo: proc, mountinfoRel: "mountinfo", mountinfoFile: proc.Name() + "/mountinfo",
		root: root, rootName: rootName, pid: pidOf(proc.Name() + "/cgroup"),
	}
	l, err := s.read()
	chrooted := errors.Is(err, errEmptyMountinfo) || errors.Is(err, ErrNoCgroup) && !errors.Is(err, errNoV2Memory)
	if rootName == "" && chrooted {
		// The same mount namespace, and the process's root shows no
		// cgroup mount (chrooted): the same mounts, read in the caller's
		// root. When the caller finds none either, the process's own
		// error stands.
		if c, err2 := callerLimit(proc); err2 == nil {
			return c, ViewCallerRoot, nil
		}
		return l, ViewProcess, err
	}
	if rootName != "" && chrooted {
		// Another mount namespace whose view shows no mount of the
		// process's hierarchy (a container without /sys/fs/cgroup, or a
		// chroot in one): its /proc/PID/cgroup, which the kernel writes
		// relative to the caller's cgroup namespace, is found in the
		// caller's own mounts. Nothing the process arranged is read.
		if c, err2 := callerLimit(proc); err2 == nil {
			return c, ViewCaller, nil
		}
		return l, ViewProcess, err
	}
	if !errors.Is(err, errNoV2Memory) {
		return l, ViewProcess, err
	}
	why := err.Error()
	v1, err := callerLimit(proc)
	switch {
	case err == nil && v1.Version == 1:
		return v1, ViewCaller, nil
	case err == nil || errors.Is(err, ErrNoCgroup):
		return Limit{}, ViewProcess, fmt.Errorf("%w: %s, and no v1 memory cgroup of the process is mounted, in its mount namespace or memctl's", ErrNoCgroup, why)
	}
	return Limit{}, ViewProcess, fmt.Errorf("%s; v1: %w", why, err)
}

// callerLimit reads the memory limit of the cgroup that proc's
// /proc/PID/cgroup lists (paths relative to the caller's cgroup namespace)
// through the caller's own mountinfo and root directory.
func callerLimit(proc *safefs.Dir) (Limit, error) {
	self, err := safefs.OpenDir("/proc/self", safefs.NoSymlinks)
	if err != nil {
		return Limit{}, fmt.Errorf("cgroupfs: %w", err)
	}
	defer self.Close()
	selfRoot, err := self.Sub("root", safefs.InRoot|safefs.NoSymlinks)
	if err != nil {
		return Limit{}, fmt.Errorf("cgroupfs: %w", err)
	}
	defer selfRoot.Close()
	selfRoot.FSTypes = FSTypes
	selfRoot.Timeout = proc.Timeout
	c := &source{
		proc: proc, cgroupRel: "cgroup", cgroupFile: proc.Name() + "/cgroup",
		mountinfo: self, mountinfoRel: "mountinfo", mountinfoFile: "/proc/self/mountinfo",
		root: selfRoot, pid: pidOf(proc.Name() + "/cgroup"),
	}
	return c.read()
}

// sameMountNS reports whether the process of proc is in the caller's mount
// namespace (then Limit paths need no /proc/PID/root prefix).
//
// The process's link can be unreadable for a moment (EACCES while it is in
// execve, as a wrapper that execs its program is right after start): the
// read is tried a few times over about 50 ms; when it still fails the
// answer is false, and the paths keep the /proc/PID/root prefix, which is
// longer but still right.
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
