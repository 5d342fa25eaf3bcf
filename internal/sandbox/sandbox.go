// Package sandbox recognises a sandbox that runs Linux programs on a kernel
// of its own, where the cgroup files a process sees may not carry the limit
// its host enforces: today gVisor, by the signs gVisor's own docs give.
package sandbox

// GVisor is what Detect returns inside a gVisor sandbox.
const GVisor = "gVisor"

// Detect returns GVisor when the process runs on gVisor's kernel (the
// Sentry), and "" when no sign of a sandbox is found. The signs, in order,
// are the two gVisor documents:
//
//   - the marker file /proc/gvisor, which runsc exposes with its
//     --gvisor-marker-file flag and which gVisor's own detection package
//     checks (gvisor.dev/gvisor/pkg/gvisordetect, RunningInGVisor);
//   - the kernel log starting with "Starting gVisor...", which gVisor's
//     Docker quick start gives as the way to verify the runtime ("You can
//     verify that you are running in gVisor using the dmesg command",
//     g3doc/user_guide/quick_start/docker.md): the last 4 KiB of the log are
//     read with syslog(2) SYSLOG_ACTION_READ_ALL, which a host kernel may
//     refuse (dmesg_restrict without CAP_SYSLOG; then no sign).
//
// gVisor's docs warn that the log is easily imitated: the answer is for
// what memctl says at startup, never a security decision. Detect reads one
// file and makes one system call; it is safe for concurrent use. Off
// Linux it returns "".
func Detect() string {
	if markerExists() || logSaysGVisor() {
		return GVisor
	}
	return ""
}
