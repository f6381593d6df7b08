# Finishes the rdma-guest tree (run in it, chrooted, by `sh -eu`): a small
# initramfs that mounts the 9p root, then everything a guest never uses
# removed (the tree is exported read-only to every guest).
kver=$(ls /lib/modules)
case "$kver" in
*" "* | "") echo "expected one kernel in /lib/modules, found: $kver" >&2; exit 1 ;;
esac
# insmod lines in load order for the given modules and their dependencies.
modules_for() {
	modprobe -S "$kver" -a --show-depends "$@" | awk '$1 == "insmod" && !seen[$2]++ { print $2 }'
}

work=/tmp/rocev2-initramfs
rm -rf "$work"
mkdir -p "$work/bin" "$work/modules"
cp /bin/busybox "$work/bin/"
cp /usr/local/lib/rocev2-guest/initramfs-init "$work/init"
for m in $(modules_for virtio_pci 9pnet_virtio 9p); do
	cp "$m" "$work/modules/"
	basename "$m" .ko >>"$work/modules/order"
done
(cd "$work" && find . | cpio -o -H newc --quiet) | gzip -9 >/boot/rocev2-initrd.img
rm -rf "$work"
ln -sf "vmlinuz-$kver" /boot/rocev2-vmlinuz

# Only the modules a guest loads: the 9p root, the NIC, Soft-RoCE and the
# verbs and RDMA CM user interfaces. rxe computes the ICRC with the crypto
# API's "crc32", which it loads by name (no module dependency says so).
modules_for virtio_pci 9pnet_virtio 9p virtio_net rdma_rxe ib_uverbs rdma_ucm crc32_generic >/tmp/keep
find "/lib/modules/$kver/kernel" -name '*.ko*' | awk 'NR == FNR { keep[$0] = 1; next } !keep[$0]' /tmp/keep - | xargs rm -f
find "/lib/modules/$kver/kernel" -type d -empty -delete
rm -f /tmp/keep
depmod "$kver"

rm -f /boot/initrd.img-* /boot/System.map-*
rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/* /usr/share/info/*
