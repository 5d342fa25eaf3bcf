#!/bin/busybox sh
# PID 1 of the memctl v2 suite's guest (internal/v2vm): mounts /proc, /sys,
# /dev, tmpfs /tmp and /run, cgroup2 at /sys/fs/cgroup with nsdelegate (as
# systemd mounts it on a Kubernetes node), enables +memory +cpu +io +pids for
# children, a RAM disk at /dev/ram0, runs /payload/run.sh, prints V2VM_EXIT=<rc> and powers off.
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin /proc /sys /dev /tmp /run /root
/bin/busybox --install -s
export PATH=/payload/bin:/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TMPDIR=/tmp V2VM_GUEST=1
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || echo "v2vm: cgroup2 mount failed"
for c in memory cpu io pids; do
	grep -qw $c /sys/fs/cgroup/cgroup.controllers &&
		echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control
done
# A RAM disk, /dev/ram0: what is written to it or read from it through
# the block device is page cache, which the kernel reclaims at a cgroup's
# limit (tmpfs, without swap, is not reclaimable; ext4 is a module here).
# Tests find it through V2VM_BLOCKDEV.
if [ -f /lib/brd.ko ] && insmod /lib/brd.ko rd_nr=1 rd_size=524288 && [ -b /dev/ram0 ]; then
	export V2VM_BLOCKDEV=/dev/ram0
	echo "v2vm: block device: /dev/ram0, a 512 MiB RAM disk"
else
	echo "v2vm: no block device (no brd.ko, or insmod failed)"
fi
echo "v2vm: kernel $(uname -r), cpus $(grep -c ^processor /proc/cpuinfo), $(grep MemTotal /proc/meminfo)"
echo "v2vm: mount: $(grep ' /sys/fs/cgroup ' /proc/mounts)"
echo "v2vm: cgroup.subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
[ -e /proc/pressure/memory ] && echo "v2vm: PSI on" || echo "v2vm: PSI off"
hostname v2vm
echo "V2VM_START uptime=$(cut -d' ' -f1 /proc/uptime)"
cd /payload
sh /payload/run.sh
rc=$?
echo "V2VM_EXIT=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
poweroff -f
reboot -f
