// Package sandbox recognises a sandbox that runs Linux programs on a kernel
// of its own, where the cgroup files a process sees may not carry the limit
// its host enforces: today gVisor, by the signs gVisor's own docs give.
package sandbox

// GVisor is what Detect returns inside a gVisor sandbox.
const GVisor = "gVisor"

// Detect returns GVisor when the process runs on gVisor's kernel (the
// Sentry), and "" when no sign is found (always off Linux). The signs, as
// gVisor documents them:
//
//   - the marker file /proc/gvisor (runsc --gvisor-marker-file;
//     gvisor.dev/gvisor/pkg/gvisordetect);
//   - a kernel log starting "Starting gVisor..." (g3doc/user_guide/
//     quick_start/docker.md), read with syslog(2), which a host kernel
//     may refuse (dmesg_restrict).
//
// The log is easily imitated: the answer is for the startup line, never a
// security decision. Safe for concurrent use.
func Detect() string {
	if markerExists() || logSaysGVisor() {
		return GVisor
	}
	return ""
}
