package procfs

// AnonHugePages returns the bytes of anonymous memory of the process pid
// (0: the calling process) backed by PMD-sized transparent huge pages:
// AnonHugePages in /proc/PID/smaps_rollup (proc(5), Linux 4.14 and later).
// Another process's needs ptrace read access; each call walks the mappings.
func AnonHugePages(pid int) (int64, error) {
	return ReadBytes(Path(pid, "smaps_rollup"), "AnonHugePages")
}
