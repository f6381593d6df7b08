//! The set-up the BPF_PROG_TEST_RUN tests share: a dataplane on the
//! loopback device, the "small leaf" it is usually seeded as, the RoCEv2
//! frames a host sends to the switch port, and userspace's prediction of
//! what the program does with them.
//!
//! Test files keep their own rows; only what several of them built the same
//! way lives here. Where files differ (seed, member count, opcode, PSN, ...)
//! the value is a parameter, never a new common default.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rocev2_common::{
    bth::Bth,
    buckets::{even_table, member_for},
    checksum::internet_checksum,
    features::Features,
    hash::{member_hash, FlowKey, HashMode, HashVersion},
    maps::{DEFAULT_FLOWLET_TABLE_SIZE, ROUTE_LOCAL},
};
use rocev2_user::{
    control::config::Prefix,
    control::dataplane::{Dataplane, MemberSpec},
    tools::packet::RoceFrameSpec,
};

use crate::require_root;

/// In a test run the ingress interface is lo (ifindex 1); members send there too.
pub const LOOPBACK: u32 = 1;
/// The port slot lo is given: its counters are `port_counter(PORT_SLOT, ..)`.
pub const PORT_SLOT: u32 = 1;
/// The leaf's hash seed.
pub const SEED: u32 = 1234;
/// The sending host's MAC (source of every input frame).
pub const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// The switch port's MAC (destination of every input frame).
pub const PORT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xFE];
/// The leaf's `qp` group.
pub const QP_GROUP: u32 = 0;
/// The leaf's `five-tuple` group.
pub const FIVE_TUPLE_GROUP: u32 = 1;
/// The sending host.
pub const SRC4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// Routed to the `qp` group (10.1.0.0/16).
pub const DST4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
/// Routed to the `five-tuple` group (10.2.0.0/16).
pub const DST4_FIVE_TUPLE: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
/// A local address of the switch (10.0.0.254/32).
pub const LOCAL4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
/// No route covers it.
pub const UNROUTED4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

/// The sending host, IPv6.
pub fn src6() -> Ipv6Addr {
    "fd00::1".parse().unwrap()
}

/// Routed to the `qp` group (fd01::/64).
pub fn dst6() -> Ipv6Addr {
    "fd01::1".parse().unwrap()
}

/// `count` members on lo for group number `group`: member i sends from
/// 02:aa:00:00:gg:ii to next hop 02:bb:00:00:gg:ii.
pub fn group_members(group: u8, count: u8) -> Vec<MemberSpec> {
    (0..count)
        .map(|i| MemberSpec {
            ifindex: LOOPBACK,
            src_mac: [0x02, 0xAA, 0, 0, group, i],
            dst_mac: [0x02, 0xBB, 0, 0, group, i],
        })
        .collect()
}

/// The leaf's four members (the same list for both of its groups).
pub fn members() -> Vec<MemberSpec> {
    group_members(0, 4)
}

/// The leaf's routes: 10.1.0.0/16 and fd01::/64 to the `qp` group,
/// 10.2.0.0/16 to the `five-tuple` group, 10.0.0.254 and fd00::fe local.
pub const LEAF_ROUTES: [(&str, u32); 5] = [
    ("10.1.0.0/16", QP_GROUP),
    ("10.2.0.0/16", FIVE_TUPLE_GROUP),
    ("fd01::/64", QP_GROUP),
    ("10.0.0.254/32", ROUTE_LOCAL),
    ("fd00::fe/128", ROUTE_LOCAL),
];

/// Loads the eBPF object (root only) with lo as the one port, in slot
/// [`PORT_SLOT`], and as an egress device. No seed, groups or routes.
pub fn loopback_dataplane() -> Dataplane {
    loopback_dataplane_at(None)
}

/// [`loopback_dataplane`] with its maps pinned under `pin_dir` (so a
/// second handle, `Maps::open_pinned`, can change them from another thread).
pub fn loopback_dataplane_at(pin_dir: Option<&std::path::Path>) -> Dataplane {
    let mut dp = loopback_object_at(pin_dir);
    // Verified now, not at the first run: tests that time their runs must
    // not count the verifier.
    dp.preload(&[rocev2_user::control::dataplane::XDP_PROGRAM]).expect("the kernel accepts the forwarding program");
    dp
}

/// The object loaded with lo as its port, no program verified yet (each
/// is, when first run).
fn loopback_object_at(pin_dir: Option<&std::path::Path>) -> Dataplane {
    require_root();
    let mut dp = Dataplane::load(pin_dir).expect("load the eBPF object");
    add_loopback_port(&mut dp);
    dp
}

/// [`seeded_dataplane`] (no extra routes) with programs carrying only
/// `features` (the others removed at load time, as `rocev2 run` does for a
/// config that does not use them).
pub fn seeded_dataplane_with(features: Features) -> Dataplane {
    require_root();
    let mut dp =
        Dataplane::load_with_features(None, DEFAULT_FLOWLET_TABLE_SIZE, features).expect("load the eBPF object");
    add_loopback_port(&mut dp);
    with_two_groups(dp, SEED, &members(), &LEAF_ROUTES)
}

/// Makes lo the port in slot [`PORT_SLOT`] and an egress device.
pub fn add_loopback_port(dp: &mut Dataplane) {
    dp.maps.set_port(LOOPBACK, PORT_SLOT).unwrap();
    dp.maps.add_egress_dev(LOOPBACK).unwrap();
}

/// A dataplane on lo hashing with `seed` and hash version 1 (a config
/// without `hash_version`; tests of version 2 set it with
/// `dp.maps.set_hash`), with a `qp` group ([`QP_GROUP`])
/// and a `five-tuple` group ([`FIVE_TUPLE_GROUP`]) of the same `members`,
/// and exactly `routes` (prefix text, group or `ROUTE_LOCAL`).
pub fn two_group_dataplane(seed: u32, members: &[MemberSpec], routes: &[(&str, u32)]) -> Dataplane {
    with_two_groups(loopback_dataplane(), seed, members, routes)
}

fn with_two_groups(mut dp: Dataplane, seed: u32, members: &[MemberSpec], routes: &[(&str, u32)]) -> Dataplane {
    dp.maps.set_hash(seed, HashVersion::V1).unwrap();
    dp.maps.publish_group(QP_GROUP, HashMode::Qp, members).unwrap();
    dp.maps.publish_group(FIVE_TUPLE_GROUP, HashMode::FiveTuple, members).unwrap();
    sync_routes(&mut dp, routes);
    dp
}

/// The small leaf: seed [`SEED`], the four [`members`] in both groups,
/// [`LEAF_ROUTES`] and then `extra_routes`.
pub fn seeded_dataplane(extra_routes: &[(&str, u32)]) -> Dataplane {
    let routes: Vec<_> = LEAF_ROUTES.iter().chain(extra_routes).copied().collect();
    two_group_dataplane(SEED, &members(), &routes)
}

/// [`seeded_dataplane`] (no extra routes) with its maps pinned under `pin_dir`.
pub fn seeded_dataplane_pinned(pin_dir: &std::path::Path) -> Dataplane {
    with_two_groups(loopback_dataplane_at(Some(pin_dir)), SEED, &members(), &LEAF_ROUTES)
}

/// Replaces the route table with `routes` (prefix text, group).
pub fn sync_routes(dp: &mut Dataplane, routes: &[(&str, u32)]) {
    let wanted = routes.iter().map(|(p, g)| (parse_prefix(p), *g)).collect();
    dp.sync_routes(&wanted).unwrap();
}

/// "10.1.0.0/16" or "fd01::/64" as a [`Prefix`].
pub fn parse_prefix(text: &str) -> Prefix {
    let (addr, len) = text.split_once('/').unwrap();
    let len: u8 = len.parse().unwrap();
    match addr.parse::<IpAddr>().unwrap() {
        IpAddr::V4(addr) => Prefix::V4 { addr, len },
        IpAddr::V6(addr) => Prefix::V6 { addr, len },
    }
}

/// A BTH with opcode `op`, P_Key 0xFFFF, no FECN/BECN, AckReq set.
pub fn bth(op: u8, dest_qp: u32, psn: u32) -> Bth {
    Bth { ack_req: true, ..Bth::new(op, dest_qp, psn) }
}

/// A RoCEv2 frame from [`HOST_MAC`] to [`PORT_MAC`] carrying `bth`: no VLAN,
/// DSCP 26, ECT(0), UDP source port 0xC000, 64 payload bytes. Rows that
/// send something else say so with `RoceFrameSpec { field, ..roce_spec(..) }`.
pub fn roce_spec(src: IpAddr, dst: IpAddr, ttl: u8, bth: Bth) -> RoceFrameSpec {
    RoceFrameSpec {
        src_mac: HOST_MAC,
        dst_mac: PORT_MAC,
        vlan: None,
        src_ip: src,
        dst_ip: dst,
        ttl,
        dscp: 26,
        ecn: 2,
        src_port: 0xC000,
        bth,
        payload_len: 64,
    }
}

/// Offset of the IP header: after Ethernet and at most one 802.1Q/802.1ad tag.
pub fn l3_offset(f: &[u8]) -> usize {
    if matches!(u16::from_be_bytes([f[12], f[13]]), 0x8100 | 0x88A8) {
        18
    } else {
        14
    }
}

/// Recomputes the IPv4 header checksum from scratch. A header longer than
/// the frame (hostile rows) is summed as far as it goes.
pub fn fix_ipv4_checksum(f: &mut [u8]) {
    let l3 = l3_offset(f);
    let end = (l3 + usize::from(f[l3] & 0x0F) * 4).min(f.len());
    f[l3 + 10..l3 + 12].fill(0);
    let c = internet_checksum(&f[l3..end]);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// Inserts `options` (a multiple of 4 bytes) after a 20-byte IPv4 header
/// and fixes IHL, total length and header checksum (not the ICRC).
pub fn with_ipv4_options(mut f: Vec<u8>, options: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let l3 = l3_offset(&f);
    f.splice(l3 + 20..l3 + 20, options.iter().copied());
    f[l3] = 0x45 + (options.len() / 4) as u8;
    let total = u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]) + options.len() as u16;
    f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
    fix_ipv4_checksum(&mut f);
    f
}

/// The member position the kernel should pick for `key` in a group of
/// `count` members hashing in `mode` with `seed` and `version`
/// (rocev2-common's hash, the code the program runs).
pub fn predicted_member(key: &FlowKey, mode: HashMode, seed: u32, version: HashVersion, count: u32) -> usize {
    member_for(&even_table(count), member_hash(key, mode, seed, version)) as usize
}

/// [`predicted_member`] in one of the leaf's groups (hash version 1).
pub fn leaf_member(key: &FlowKey, mode: HashMode) -> usize {
    predicted_member(key, mode, SEED, HashVersion::V1, members().len() as u32)
}

/// The frame the leaf should emit for `input` sent to its member `member`:
/// the member's MACs, TTL/hop limit minus one, the IPv4 checksum recomputed
/// from scratch.
pub fn expected_forward(input: &[u8], member: usize) -> Vec<u8> {
    let m = &members()[member];
    let mut out = input.to_vec();
    out[0..6].copy_from_slice(&m.dst_mac);
    out[6..12].copy_from_slice(&m.src_mac);
    let l3 = l3_offset(&out);
    if out[l3] >> 4 == 4 {
        out[l3 + 8] -= 1;
        fix_ipv4_checksum(&mut out);
    } else {
        out[l3 + 7] -= 1;
    }
    out
}

// ---------------------------------------------------------------------------
// Host bridge mode: lo is a bridge port in slot PORT_SLOT, and the FDB
// knows the sending host (on lo), a host behind another port (whose frames
// are redirected to lo, the only device a test run has), the uplink
// group's MAC and the bridge's own MAC.

/// The uplink group: the leaf's four members, `qp` hashing, seed [`SEED`].
pub const UPLINK_GROUP: u32 = QP_GROUP;
/// Reachable through every member of [`UPLINK_GROUP`] (an anycast gateway).
pub const GATEWAY_MAC: [u8; 6] = PORT_MAC;
/// A host the FDB has on another bridge port (slot [`OTHER_PORT_SLOT`]).
pub const OTHER_HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const OTHER_PORT_SLOT: u32 = 2;
/// The bridge's own MAC (a local FDB entry).
pub const BRIDGE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xBB];

/// Installs one FDB entry.
pub fn set_fdb(dp: &mut Dataplane, mac: [u8; 6], kind: u32, target: u32, port_slot: u32) {
    let entry = rocev2_common::maps::FdbEntry { kind, target, port_slot, active: 0 };
    dp.maps.set_fdb(rocev2_common::maps::FdbKey { mac, vlan: 0 }, entry).unwrap();
}

/// The bridge-mode dataplane described above: lo forwarding, the sender
/// ([`HOST_MAC`]) on lo, [`OTHER_HOST_MAC`] on another port,
/// [`GATEWAY_MAC`] through [`UPLINK_GROUP`], [`BRIDGE_MAC`] local.
pub fn bridge_dataplane() -> Dataplane {
    bridge_dataplane_at(None)
}

/// [`bridge_dataplane`] with its maps (and the telemetry's) pinned under
/// `pin_dir`.
pub fn bridge_dataplane_at(pin_dir: Option<&std::path::Path>) -> Dataplane {
    let mut dp = loopback_object_at(pin_dir);
    dp.preload(&[rocev2_user::control::dataplane::XDP_BRIDGE_PROGRAM]).expect("the kernel accepts the bridge program");
    reseed_bridge(&mut dp);
    dp
}

/// Puts a [`bridge_dataplane`] back as it started: the FDB emptied and
/// seeded again, lo forwarding, the uplink group's four members.
pub fn reseed_bridge(dp: &mut Dataplane) {
    use rocev2_common::maps::{BridgePort, BRIDGE_PORT_FORWARDING, FDB_LOCAL, FDB_PORT, FDB_UPLINK};
    for (key, _) in dp.maps.fdb_entries() {
        dp.maps.remove_fdb(&key).unwrap();
    }
    dp.maps.set_hash(SEED, HashVersion::V1).unwrap();
    dp.maps.publish_group(UPLINK_GROUP, HashMode::Qp, &members()).unwrap();
    dp.maps.set_bridge_port(PORT_SLOT, BridgePort { flags: BRIDGE_PORT_FORWARDING, uplink: 0 }).unwrap();
    set_fdb(dp, HOST_MAC, FDB_PORT, LOOPBACK, PORT_SLOT);
    set_fdb(dp, OTHER_HOST_MAC, FDB_PORT, LOOPBACK, OTHER_PORT_SLOT);
    set_fdb(dp, GATEWAY_MAC, FDB_UPLINK, UPLINK_GROUP, 0);
    set_fdb(dp, BRIDGE_MAC, FDB_LOCAL, 0, 0);
}
