// Package v2vm runs memctl's cgroup v2 tests on a real cgroup v2 kernel: it
// boots Debian's stock kernel (linux-image-amd64, 6.1) and busybox-static
// under qemu, with cgroup2 mounted at /sys/fs/cgroup as systemd mounts it
// on a Kubernetes node (nsdelegate; memory, cpu, io and pids enabled for
// children; PSI on with psi=1), and runs the TestV2 tests of every package
// of the module inside it, each package's test binary (built on the host
// with CGO_ENABLED=0) with -test.run '^TestV2' -test.v. Each test makes its
// own fresh child cgroup (internal/cgrouptest.NewV2).
//
// The package's suite test is the entry point; the README gives the
// command that runs it (MEMCTL_V2VM=1 turns it on).
//
// The kernel and busybox are fetched with `apt-get download` into a cache
// directory (V2VM_CACHE, default $TMPDIR/v2vm-cache) on first use. qemu runs
// with KVM where a stock kernel boots under it (/dev/kvm writable and vmx or
// svm in /proc/cpuinfo; a PVM host has /dev/kvm without them and hangs a
// stock kernel) and with TCG otherwise (V2VM_ACCEL=kvm|tcg forces one).
//
// The package is test infrastructure: its code is in its test files, and
// nothing in the library imports it.
package v2vm
