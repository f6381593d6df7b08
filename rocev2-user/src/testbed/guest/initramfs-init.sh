#!/bin/busybox sh
# /init of the RDMA guests' initramfs: loads the modules that mount the 9p
# root (virtio PCI, 9p; listed in load order by the tree's finish script),
# mounts the root read-only and switches to it.
B=/bin/busybox
$B mkdir -p /dev /newroot
$B mount -t devtmpfs dev /dev
for m in $($B cat /modules/order); do
	$B insmod "/modules/$m.ko" || echo "initramfs: insmod $m failed"
done
# cache=loose: the root is read-only on both sides, so the guest may cache it.
if ! $B mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=262144,cache=loose rootfs /newroot; then
	echo "initramfs: cannot mount the 9p root (tag rootfs)"
	$B poweroff -f
fi
$B mount --move /dev /newroot/dev
exec $B switch_root /newroot /sbin/rocev2-guest-boot
