#!/bin/sh
# PID 1 of an RDMA guest once the initramfs switched to the read-only 9p
# root: scratch space on tmpfs, then the host's script for this boot, from
# the exchange directory (9p tag xchg, mounted on /mnt).
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
for d in /run /tmp /var/tmp /var/log /root; do
	mount -t tmpfs tmpfs "$d"
done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xchg /mnt; then
	echo "guest: cannot mount the exchange directory (9p tag xchg)"
	echo o >/proc/sysrq-trigger
fi
exec /bin/sh /mnt/init
