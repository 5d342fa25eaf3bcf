#!/bin/busybox sh
# PID 1 of the memctl v2 suite's guest (internal/v2vm): mounts /proc, /sys,
# /dev, tmpfs /tmp and /run, cgroup2 at /sys/fs/cgroup with nsdelegate (as
# systemd mounts it on a Kubernetes node), enables +memory +cpu +io +pids for
# children, swap on zram, runs /payload/run.sh, prints V2VM_EXIT=<rc> and powers off.
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
# Swap on zram (a compressed RAM disk), so that anonymous memory is
# reclaimable at a cgroup's limit as on a node with swap (Kubernetes
# NodeSwap); cgroups get memory.swap.max 0 unless a test allows it.
ok=1
for m in /lib/*.ko; do [ -f "$m" ] && insmod "$m" || ok=0; done
if [ $ok = 1 ] && [ -b /dev/zram0 ] && echo 1G > /sys/block/zram0/disksize &&
	mkswap /dev/zram0 >/dev/null && swapon /dev/zram0; then
	echo "v2vm: swap: 1 GiB on /dev/zram0"
else
	echo "v2vm: no swap (zram modules missing or failed)"
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
