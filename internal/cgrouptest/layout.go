package cgrouptest

// Layout is one way a container runtime shows a process its cgroup v2
// memory limit. The layouts are what cgroup v2 tests run in: Layouts lists
// them all.
type Layout struct {
	// Name is a short name for subtest names: "host", "container", "pod",
	// "readonly" or "wholetree".
	Name string
	// Namespace: the child runs in a new cgroup namespace whose root is
	// its own cgroup (it enters the cgroup first, then unshares
	// CLONE_NEWCGROUP), so /proc/self/cgroup shows "0::/".
	Namespace bool
	// Remount: the child also runs in a private mount namespace where
	// cgroup2 is mounted anew at /sys/fs/cgroup, so that the mount shows
	// the namespace root as its top, as a container runtime mounts it.
	// Without it (and with Namespace) the child keeps the host's mount and
	// sees the whole tree.
	Remount bool
	// ReadOnly: that new mount is read-only (the Docker and Kubernetes
	// default for a container without privileges).
	ReadOnly bool
	// LimitAbove: the memory limit is on the parent of the child's cgroup
	// (Kubernetes pod-level resources: the pod's cgroup holds the limit,
	// the container's cgroup below it has none); the child cannot see it
	// where its mount shows only its own cgroup.
	LimitAbove bool
}

// The layouts containers use. The child's cgroup is always a fresh leaf,
// made by NewV2, with memory.swap.max 0.
var (
	// LayoutHost: the host's cgroup namespace and mount; the limit on the
	// child's own cgroup (a systemd service, a container with
	// --cgroupns=host).
	LayoutHost = Layout{Name: "host"}
	// LayoutContainer: a private cgroup namespace whose root is the cgroup
	// with the limit, cgroup2 mounted read-write at /sys/fs/cgroup (a plain
	// container with --cgroupns=private, the default on cgroup v2).
	LayoutContainer = Layout{Name: "container", Namespace: true, Remount: true}
	// LayoutPod: as LayoutContainer, but the limit is on the parent of the
	// namespace root (pod-level resources).
	LayoutPod = Layout{Name: "pod", Namespace: true, Remount: true, LimitAbove: true}
	// LayoutReadOnly: as LayoutContainer with cgroup2 mounted read-only.
	LayoutReadOnly = Layout{Name: "readonly", Namespace: true, Remount: true, ReadOnly: true}
	// LayoutWholeTree: a new cgroup namespace rooted at the child's cgroup
	// but the host's cgroup2 mount kept, so the child sees the whole tree
	// and the limit is on the parent of its cgroup (the issue's /ns/pod
	// under /ns/memory.max).
	LayoutWholeTree = Layout{Name: "wholetree", Namespace: true, LimitAbove: true}
)

// Layouts returns every layout, LayoutHost first.
func Layouts() []Layout {
	return []Layout{LayoutHost, LayoutContainer, LayoutPod, LayoutReadOnly, LayoutWholeTree}
}
