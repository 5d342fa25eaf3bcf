package cgrouptest

// Layout is one way a container runtime shows a process its cgroup v2
// memory limit.
type Layout struct {
	// Name is a short name for subtest names: "host", "container", "pod",
	// "readonly" or "wholetree".
	Name string
	// Namespace: the child runs in a new cgroup namespace rooted at its own
	// cgroup, so /proc/self/cgroup shows "0::/".
	Namespace bool
	// Remount: cgroup2 is mounted anew at /sys/fs/cgroup in a private mount
	// namespace, its top the namespace root; without it the child keeps the
	// host's mount and sees the whole tree.
	Remount bool
	// ReadOnly: that new mount is read-only (the Docker and Kubernetes
	// default for a container without privileges).
	ReadOnly bool
	// LimitAbove: the limit is on the parent of the child's cgroup
	// (Kubernetes pod-level resources).
	LimitAbove bool
}

// The layouts containers use. The child's cgroup is always a fresh leaf,
// made by NewV2, with memory.swap.max 0.
var (
	// LayoutHost: the host's cgroup namespace and mount (a systemd service,
	// --cgroupns=host).
	LayoutHost = Layout{Name: "host"}
	// LayoutContainer: a private cgroup namespace rooted at the limit,
	// cgroup2 remounted read-write (--cgroupns=private).
	LayoutContainer = Layout{Name: "container", Namespace: true, Remount: true}
	// LayoutPod: as LayoutContainer, but the limit is on the parent of the
	// namespace root (pod-level resources).
	LayoutPod = Layout{Name: "pod", Namespace: true, Remount: true, LimitAbove: true}
	// LayoutReadOnly: as LayoutContainer with cgroup2 mounted read-only.
	LayoutReadOnly = Layout{Name: "readonly", Namespace: true, Remount: true, ReadOnly: true}
	// LayoutWholeTree: a new cgroup namespace, the host's mount kept, the
	// limit on the parent.
	LayoutWholeTree = Layout{Name: "wholetree", Namespace: true, LimitAbove: true}
)

// Layouts returns every layout, LayoutHost first.
func Layouts() []Layout {
	return []Layout{LayoutHost, LayoutContainer, LayoutPod, LayoutReadOnly, LayoutWholeTree}
}
