# An RDMA guest's boot, after /sbin/rocev2-guest-boot mounted the exchange
# directory on /mnt (the host writes this file and guest.conf there before
# each boot): the NIC with its addresses and routes, Soft-RoCE (rxe0) on it,
# then the command agent.
. /mnt/guest.conf
say() { echo "guest $GUEST_NAME: $*"; }
fail() {
	say "$*"
	echo o >/proc/sysrq-trigger
	sleep 60
}
uptime_s() { cut -d' ' -f1 /proc/uptime; }
say "init at $(uptime_s) s"
hostname "$GUEST_NAME"
# Debian's default qdisc, fq_codel, drops what waits over 5 ms: an
# emulated NIC is that slow, and rxe would retransmit what its own host
# dropped. A plain FIFO with a long queue instead (set before the NIC exists).
echo pfifo_fast >/proc/sys/net/core/default_qdisc
modprobe -a virtio_net crc32_generic rdma_rxe ib_uverbs rdma_ucm || say "modprobe failed"
# rxe (Linux 6.1) drops a packet whose ICRC is wrong without a counter or
# a log line: a return probe on its check counts both outcomes (a
# histogram by return value, read by the host).
t=/sys/kernel/tracing
mount -t tracefs tracefs $t &&
	echo 'r:rocev2/icrc rxe_icrc_check ret=$retval:s32' >>$t/kprobe_events &&
	echo 'hist:keys=ret' >$t/events/rocev2/icrc/trigger &&
	echo 1 >$t/events/rocev2/icrc/enable ||
	say "cannot probe rxe's ICRC check: ICRC errors will not be counted"
for f in all default; do
	echo 0 >/proc/sys/net/ipv6/conf/$f/accept_dad
done
ip link set lo up
dev=
for n in /sys/class/net/*; do
	[ "$(cat "$n/address")" = "$GUEST_MAC" ] && dev=${n##*/}
done
[ -n "$dev" ] || fail "no interface with MAC $GUEST_MAC: $(ls /sys/class/net)"
ip link set "$dev" txqueuelen 10000 up
echo "$dev" >/run/rocev2-dev
for a in $GUEST_ADDRS; do
	ip addr add "$a" dev "$dev" nodad 2>/dev/null || ip addr add "$a" dev "$dev"
done
[ -z "$GUEST_GW4" ] || ip route add default via "$GUEST_GW4" dev "$dev"
[ -z "$GUEST_GW6" ] || ip -6 route add default via "$GUEST_GW6" dev "$dev"
rdma link add rxe0 type rxe netdev "$dev" || say "rdma link add failed"
# RDMA CM's settings (RoCE mode, ToS) live in configfs.
mount -t configfs configfs /sys/kernel/config 2>/dev/null
port=/sys/class/infiniband/rxe0/ports/1
state=
for _ in $(seq 100); do
	state=$(cat $port/state 2>/dev/null)
	case "$state" in *ACTIVE*) break ;; esac
	sleep 0.1
done
mem=$(awk '/MemTotal/ { t = $2 } /MemAvailable/ { a = $2 } END { print t, a }' /proc/meminfo)
{
	echo "uptime_s $(uptime_s)"
	echo "dev $dev"
	echo "rxe_state $state"
	echo "mem_total_kib ${mem% *}"
	echo "mem_available_kib ${mem#* }"
} >/mnt/ready.tmp
mv /mnt/ready.tmp /mnt/ready
say "ready at $(uptime_s) s: rxe0 on $dev $state"

# The agent: runs each cmd/ID.sh the host drops in (write, then rename),
# in a session of its own, with output in job/ID.out and job/ID.err (line
# buffered, so the host sees a server's "waiting" line as it is printed)
# and the exit status in job/ID.rc at the end; sig/ID asks for a signal to
# job ID's session. A job started with & inherits SIGINT and SIGQUIT
# ignored, which no shell can undo: perl (essential in Debian) restores
# them before running the job, so Ctrl-C on `lab exec` reaches it.
cd /mnt || fail "cannot enter /mnt"
mkdir -p cmd job sig
while :; do
	for f in cmd/*.sh; do
		[ -e "$f" ] || continue
		id=${f#cmd/}
		id=${id%.sh}
		mv "$f" "job/$id.sh"
		(
			setsid stdbuf -oL -eL perl -e '$SIG{INT} = $SIG{QUIT} = "DEFAULT"; exec @ARGV or die "$!"' \
				sh "job/$id.sh" >"job/$id.out" 2>"job/$id.err" </dev/null &
			echo $! >"job/$id.pid"
			wait $!
			echo $? >"job/$id.rc.tmp"
			mv "job/$id.rc.tmp" "job/$id.rc"
		) &
	done
	for f in sig/*; do
		[ -e "$f" ] || continue
		id=${f#sig/}
		kill "-$(cat "$f")" "-$(cat "job/$id.pid")" 2>/dev/null
		rm -f "$f"
	done
	sleep 0.2
done
