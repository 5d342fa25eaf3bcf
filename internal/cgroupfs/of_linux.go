package cgroupfs

import (
	"os"
	"strconv"
)

// Of returns the memory limit of the cgroup process pid is in (0 means the
// calling process), from /proc/PID/cgroup, /proc/PID/mountinfo and the
// cgroup files; see Read. When the process is in another mount namespace
// (a container), the cgroup files are read through /proc/PID/root, and
// Limit.Dir and Limit.File start with it. Reading another user's process
// may need root. Errors name the file; see Read.
func Of(pid int) (Limit, error) {
	dir := "/proc/self"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid)
	}
	root := ""
	if pid != 0 {
		self, err1 := os.Readlink("/proc/self/ns/mnt")
		other, err2 := os.Readlink(dir + "/ns/mnt")
		if err1 == nil && err2 == nil && self != other {
			root = dir + "/root"
		}
	}
	return Read(dir+"/cgroup", dir+"/mountinfo", root)
}
