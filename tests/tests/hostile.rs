//! Hostile-input fixture table for the XDP forwarding program (issue 6).
//!
//! Every row is a malformed, truncated, unusual or out-of-profile frame with
//! a defined action and a named `PortCounter`. For every row the test checks:
//!
//! - the action is the row's (and never XDP_ABORTED);
//! - `rx_packets` moved by 1, `rx_bytes` by the frame length, and exactly the
//!   counters the outcome implies moved (one outcome counter; forwarded rows
//!   also `forwarded_bytes`, `forwarded_roce`, `roce_short_bth` as fit) and
//!   no other counter at all;
//! - passed/dropped frames come back byte for byte unchanged;
//! - forwarded frames went to the member userspace predicts (member counter
//!   and destination MAC) and differ from the input only in the MACs, the
//!   TTL/hop limit and the IPv4 header checksum (recomputed from scratch
//!   here). A wrong IPv4 checksum on a packet to forward is dropped, and
//!   IPv4 options go to the kernel. RoCE rows are also checked with
//!   `packet::invariant_bytes_equal` and `packet::parse_roce` (ICRC valid,
//!   IPv4 checksum valid).
//!
//! BPF_PROG_TEST_RUN itself refuses XDP input shorter than an Ethernet
//! header (14 bytes) with EINVAL, so the shortest rows here are 14 bytes;
//! `kernel_rejects_frames_below_14_bytes` pins that down.
//!
//! Frames above ~3.5 KB are split by BPF_PROG_TEST_RUN into a multi-buffer
//! XDP buffer; `jumbo_frames` records what the program (not loaded with
//! BPF_F_XDP_HAS_FRAGS) does with them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rocev2_common::{
    bth::opcode,
    checksum::internet_checksum,
    counters::PortCounter,
    hash::{FlowKey, HashMode},
};
use rocev2_tests::{
    action_name,
    fixture::{
        bth, dst6, expected_forward, fix_ipv4_checksum, l3_offset, leaf_member, roce_spec, seeded_dataplane, src6,
        with_ipv4_options, DST4, DST4_FIVE_TUPLE, FIVE_TUPLE_GROUP, LOCAL4, PORT_SLOT, QP_GROUP, SRC4, UNROUTED4,
    },
    test_run, XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_REDIRECT,
};
use rocev2_user::{
    control::dataplane::Dataplane,
    tools::packet::{
        build_roce_frame, build_tcp_frame, build_udp_frame, icrc, invariant_bytes_equal, parse_roce, RoceFrameSpec,
    },
};

// Seeding: `seeded_dataplane`, the leaf of tests/src/fixture.rs, as in
// fixtures.rs (10.1.0.0/16 and fd01::/64 to the `qp` group, 10.2.0.0/16 to
// `five-tuple`, 10.0.0.254 and fd00::fe local, four members, seed 1234).

// ---------------------------------------------------------------------------
// Frame builders.

/// PSN 0x1234, from the host: DSCP 26, ECT(0), UDP sport 0xC000.
fn spec(src: IpAddr, dst: IpAddr, ttl: u8, op: u8, dest_qp: u32, payload_len: usize) -> RoceFrameSpec {
    RoceFrameSpec { payload_len, ..roce_spec(src, dst, ttl, bth(op, dest_qp, 0x00_1234)) }
}

fn spec4(dst: Ipv4Addr, ttl: u8) -> RoceFrameSpec {
    spec(SRC4.into(), dst.into(), ttl, opcode::WRITE_ONLY, 0x123, 64)
}

fn spec6(dst: Ipv6Addr, ttl: u8) -> RoceFrameSpec {
    spec(src6().into(), dst.into(), ttl, opcode::WRITE_ONLY, 0x123, 64)
}

/// IPv4 RoCE WRITE_ONLY to the `qp` group: 122 bytes.
fn roce4() -> Vec<u8> {
    build_roce_frame(&spec4(DST4, 64))
}

/// IPv6 RoCE WRITE_ONLY to the `qp` group: 142 bytes.
fn roce6() -> Vec<u8> {
    build_roce_frame(&spec6(dst6(), 64))
}

fn udp4(dst_port: u16, payload_len: usize) -> Vec<u8> {
    build_udp_frame(&spec4(DST4, 64).plain(0xC000, dst_port, payload_len))
}

fn udp6(dst_port: u16, payload_len: usize) -> Vec<u8> {
    build_udp_frame(&spec6(dst6(), 64).plain(0xC000, dst_port, payload_len))
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn set16(f: &mut [u8], at: usize, v: u16) {
    f[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Rewrites the ICRC after a change to ICRC-covered bytes (the frame must end
/// at the end of the IP packet: no Ethernet padding yet).
fn fix_icrc(f: &mut [u8]) {
    // A frame etherparse cannot take apart as RoCE keeps its ICRC; such
    // rows are checked byte for byte only.
    if let Ok(crc) = icrc(f) {
        let n = f.len();
        f[n - 4..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Inserts an 8-byte IPv6 extension header of type `kind` in front of the
/// transport header.
fn with_ipv6_ext(mut f: Vec<u8>, kind: u8) -> Vec<u8> {
    let l3 = l3_offset(&f);
    let next = f[l3 + 6];
    let ext: [u8; 8] = match kind {
        // Fragment header: next, reserved, offset 0 + M=1, identification.
        44 => [next, 0, 0, 1, 0, 0, 0x12, 0x34],
        // Routing header type 4 (SRH-like shape, 0 segments left) or options (PadN).
        43 => [next, 0, 4, 0, 0, 0, 0, 0],
        _ => [next, 0, 1, 4, 0, 0, 0, 0],
    };
    f.splice(l3 + 40..l3 + 40, ext);
    f[l3 + 6] = kind;
    let plen = be16(&f, l3 + 4) + 8;
    set16(&mut f, l3 + 4, plen);
    f
}

fn with_vlan(s: &RoceFrameSpec, id: u16) -> Vec<u8> {
    let mut s = s.clone();
    s.vlan = Some(id);
    build_roce_frame(&s)
}

// ---------------------------------------------------------------------------
// Userspace prediction of a forwarded frame.

/// The member the dataplane should choose, worked out from the frame with
/// the documented rules: the five-tuple from the IP header and the first 4
/// bytes of TCP/UDP (ports 0 for other protocols); the DestQP only for UDP
/// to 4791 when a whole BTH lies inside the IP packet (the IP length decides;
/// the UDP length field is ignored); `five-tuple` mode for 10.2.0.0/16.
fn predict_member(f: &[u8]) -> usize {
    let l3 = l3_offset(f);
    let (mut key, l4, end, dst4) = if f[l3] >> 4 == 4 {
        let hl = usize::from(f[l3] & 0x0F) * 4;
        let (l4, end) = (l3 + hl, l3 + usize::from(be16(f, l3 + 2)));
        let proto = f[l3 + 9];
        let (sp, dp) = ports(f, proto, l4);
        let src: [u8; 4] = f[l3 + 12..l3 + 16].try_into().unwrap();
        let dst: [u8; 4] = f[l3 + 16..l3 + 20].try_into().unwrap();
        (FlowKey::v4(src, dst, proto, sp, dp), l4, end, Some(dst))
    } else {
        let (l4, end) = (l3 + 40, l3 + 40 + usize::from(be16(f, l3 + 4)));
        let proto = f[l3 + 6];
        let (sp, dp) = ports(f, proto, l4);
        let src: [u8; 16] = f[l3 + 8..l3 + 24].try_into().unwrap();
        let dst: [u8; 16] = f[l3 + 24..l3 + 40].try_into().unwrap();
        (FlowKey::v6(src, dst, proto, sp, dp), l4, end, None)
    };
    if key.protocol == 17 && key.dst_port == 4791 && l4 + 8 + 12 <= end {
        let b = l4 + 8;
        key = key.with_dest_qp(u32::from_be_bytes([0, f[b + 5], f[b + 6], f[b + 7]]));
    }
    let mode = match dst4 {
        Some([10, 2, ..]) => HashMode::FiveTuple,
        _ => HashMode::Qp,
    };
    leaf_member(&key, mode)
}

fn ports(f: &[u8], proto: u8, l4: usize) -> (u16, u16) {
    if proto == 6 || proto == 17 {
        (be16(f, l4), be16(f, l4 + 2))
    } else {
        (0, 0)
    }
}

// ---------------------------------------------------------------------------
// The table.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Redirected; `roce` = the input is a complete RoCEv2 frame that
    /// parse_roce accepts (ICRC valid), so the ICRC checks apply.
    Forwarded { roce: bool },
    /// Passed or dropped: output identical to the input.
    Unchanged,
}

struct Row {
    name: String,
    frame: Vec<u8>,
    action: u32,
    counter: PortCounter,
    kind: Kind,
}

#[derive(Default)]
struct Table(Vec<Row>);

impl Table {
    fn fwd(&mut self, name: impl Into<String>, frame: Vec<u8>, counter: PortCounter) {
        let roce = parse_roce(&frame).is_ok_and(|p| p.icrc_ok);
        self.0.push(Row { name: name.into(), frame, action: XDP_REDIRECT, counter, kind: Kind::Forwarded { roce } });
    }
    fn pass(&mut self, name: impl Into<String>, frame: Vec<u8>, counter: PortCounter) {
        self.0.push(Row { name: name.into(), frame, action: XDP_PASS, counter, kind: Kind::Unchanged });
    }
    fn dropped(&mut self, name: impl Into<String>, frame: Vec<u8>, counter: PortCounter) {
        self.0.push(Row { name: name.into(), frame, action: XDP_DROP, counter, kind: Kind::Unchanged });
    }
}

fn rows() -> Vec<Row> {
    use PortCounter::*;
    let mut t = Table::default();

    // --- Ethernet / VLAN -------------------------------------------------
    let mut eth_only = roce4();
    eth_only.truncate(14);
    t.dropped("14 bytes: Ethernet header only, ether type IPv4", eth_only, DropBadIpHeader);
    let mut eth_only6 = roce6();
    eth_only6.truncate(14);
    t.dropped("14 bytes: Ethernet header only, ether type IPv6", eth_only6, DropBadIpHeader);
    let mut eth_arp = roce4();
    eth_arp.truncate(14);
    eth_arp[12..14].copy_from_slice(&[0x08, 0x06]);
    t.pass("14 bytes: Ethernet header only, ether type ARP", eth_arp, PassNotIp);
    let tagged = with_vlan(&spec4(DST4, 64), 100);
    for len in 14..18 {
        let mut f = tagged.clone();
        f.truncate(len);
        t.dropped(format!("{len} bytes: 802.1Q tag cut short"), f, DropRunt);
    }
    let mut f = tagged.clone();
    f.truncate(18);
    t.dropped("18 bytes: 802.1Q tag, no IPv4 header", f, DropBadIpHeader);
    let mut qinq_short = tagged.clone();
    qinq_short[12..14].copy_from_slice(&[0x88, 0xA8]);
    qinq_short.truncate(16);
    t.dropped("16 bytes: 802.1ad tag cut short", qinq_short, DropRunt);
    t.fwd("one 802.1Q tag (VLAN 4095), RoCE", with_vlan(&spec4(DST4, 64), 4095), ForwardedRoce);
    let mut ad = with_vlan(&spec4(DST4, 64), 7);
    ad[12..14].copy_from_slice(&[0x88, 0xA8]);
    t.fwd("one 802.1ad tag, RoCE", ad, ForwardedRoce);
    t.fwd("one 802.1Q tag, IPv6 RoCE", with_vlan(&spec6(dst6(), 64), 12), ForwardedRoce);
    let mut stacked = with_vlan(&spec4(DST4, 64), 10);
    stacked.splice(16..16, [0x81u8, 0x00, 0x00, 0x14]);
    t.pass("two 802.1Q tags", stacked, PassStackedVlan);
    let mut qinq = with_vlan(&spec4(DST4, 64), 10);
    qinq[12..14].copy_from_slice(&[0x88, 0xA8]);
    qinq.splice(16..16, [0x81u8, 0x00, 0x00, 0x14]);
    t.pass("QinQ: 802.1ad outer + 802.1Q inner", qinq, PassStackedVlan);
    let mut stacked_short = with_vlan(&spec4(DST4, 64), 10);
    stacked_short[16..18].copy_from_slice(&[0x81, 0x00]);
    stacked_short.truncate(18);
    t.pass("18 bytes: second tag's TPID, nothing after", stacked_short, PassStackedVlan);
    let mut llc = roce4();
    llc[12..14].copy_from_slice(&[0x00, 0x6C]); // 802.3 length field
    t.pass("802.3 length instead of an ether type", llc, PassNotIp);
    let mut lldp = roce4();
    lldp[12..14].copy_from_slice(&[0x88, 0xCC]);
    t.pass("LLDP ether type, unicast MAC", lldp, PassNotIp);
    let mut mac_mc = roce4();
    mac_mc[0..6].copy_from_slice(&[0x01, 0x00, 0x5E, 0x01, 0x01, 0x01]);
    t.pass("IPv4 multicast destination MAC", mac_mc, PassL2Multicast);
    let mut mac_bc = roce4();
    mac_bc[0..6].fill(0xFF);
    t.pass("broadcast destination MAC", mac_bc, PassL2Multicast);
    let mut mac_mc6 = roce6();
    mac_mc6[0..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    t.pass("IPv6 multicast destination MAC", mac_mc6, PassL2Multicast);
    let mut mac_mc_runt = vec![0xFFu8; 14];
    mac_mc_runt[12..14].copy_from_slice(&[0x81, 0x00]);
    t.pass("14 bytes: broadcast MAC with a cut VLAN tag (MAC checked first)", mac_mc_runt, PassL2Multicast);
    let mut src_mc = roce4();
    src_mc[6..12].copy_from_slice(&[0x01, 0x00, 0x5E, 0, 0, 1]);
    t.fwd("multicast source MAC (only the destination MAC is checked)", src_mc, ForwardedRoce);

    // --- IPv4 header ------------------------------------------------------
    for n in 1..=19 {
        let mut f = roce4();
        f.truncate(14 + n);
        t.dropped(format!("IPv4 header cut at {n} bytes"), f, DropBadIpHeader);
    }
    let mut f = roce4();
    f.truncate(14 + 20);
    t.dropped("IPv4 header only (total length says more)", f, DropBadIpHeader);
    for ihl in 0..5u8 {
        let mut f = roce4();
        f[14] = 0x40 | ihl;
        t.dropped(format!("IPv4 IHL {ihl}"), f, DropBadIpHeader);
    }
    let mut f = udp4(9, 0); // 28-byte IP packet
    f[14] = 0x4F;
    fix_ipv4_checksum(&mut f);
    t.dropped("IPv4 IHL 15 beyond a 28-byte packet (total length 28)", f, DropBadIpHeader);
    let mut f = udp4(9, 0);
    f[14] = 0x4F;
    set16(&mut f, 16, 60);
    fix_ipv4_checksum(&mut f);
    t.dropped("IPv4 IHL 15, total length 60, frame has 28", f, DropBadIpHeader);
    let mut f = roce4();
    f[14] = 0x4F;
    fix_ipv4_checksum(&mut f);
    t.pass("IPv4 IHL 15 inside a 108-byte RoCE packet: bytes 20..60 are options, for the kernel", f, PassIpv4Options);
    let mut f = roce4();
    f[14] = 0x65;
    t.dropped("version 6 in an IPv4 ether type", f, DropBadIpHeader);
    let mut f = roce6();
    f[14] = 0x45;
    t.dropped("version 4 in an IPv6 ether type", f, DropBadIpHeader);
    let mut f = roce4();
    f[12..14].copy_from_slice(&[0x86, 0xDD]);
    t.dropped("IPv4 packet behind the IPv6 ether type (122 bytes < 40 + payload length)", f, DropBadIpHeader);
    for total in [0u16, 10, 19] {
        let mut f = roce4();
        set16(&mut f, 16, total);
        fix_ipv4_checksum(&mut f);
        t.dropped(format!("IPv4 total length {total} below the header length"), f, DropBadIpHeader);
    }
    let mut f = roce4();
    set16(&mut f, 16, 109);
    fix_ipv4_checksum(&mut f);
    t.dropped("IPv4 total length 1 byte beyond the frame", f, DropBadIpHeader);
    let mut f = roce4();
    set16(&mut f, 16, 0xFFFF);
    fix_ipv4_checksum(&mut f);
    t.dropped("IPv4 total length 65535", f, DropBadIpHeader);
    // Total length shorter than the frame: Ethernet padding.
    let mut f = build_roce_frame(&RoceFrameSpec { payload_len: 0, ..spec4(DST4, 64) });
    assert_eq!(f.len(), 58);
    f.resize(60, 0);
    t.fwd("58-byte RoCE frame padded to the 60-byte Ethernet minimum", f, ForwardedRoce);
    let mut f = roce4();
    f.extend_from_slice(&[0xEE; 64]);
    t.fwd("RoCE frame with 64 bytes of trailing garbage after the IP packet", f, ForwardedRoce);
    let mut f = udp4(4791, 0);
    f.resize(60, 0);
    t.fwd("UDP 4791 without a BTH, padded to 60 bytes", f, RoceShortBth);
    let mut f = roce4();
    // IP length ends 4 bytes into the BTH; the frame still holds all of it.
    set16(&mut f, 16, 20 + 8 + 4);
    fix_ipv4_checksum(&mut f);
    t.fwd("IPv4 length ends inside the BTH, rest of the frame as padding: short BTH", f, RoceShortBth);
    let mut f = roce4();
    f[15] = 0xFF; // DSCP 63, CE
    fix_ipv4_checksum(&mut f);
    fix_icrc(&mut f);
    t.fwd("IPv4 TOS 0xFF (DSCP 63, CE)", f, ForwardedRoce);
    let mut f = roce4();
    f[24] ^= 0x5A;
    t.dropped("IPv4 header checksum wrong: dropped, as the kernel does", f, DropBadIpv4Checksum);
    let mut f = roce4();
    f[33] ^= 0x01; // a destination bit flipped on the wire (still routed), checksum not
    t.dropped("IPv4 destination corrupted (checksum no longer matches)", f, DropBadIpv4Checksum);
    let mut f = build_roce_frame(&spec4(UNROUTED4, 64));
    f[24] ^= 0x5A;
    t.pass("IPv4 header checksum wrong, unrouted: the kernel checks (and drops) it", f, PassNoRoute);
    let mut f = roce4();
    f[22] = 1;
    f[24] ^= 0x5A;
    t.pass("IPv4 header checksum wrong, TTL 1: the kernel checks it before any ICMP", f, PassTtlExpired);
    let mut f = roce4();
    f[26..30].copy_from_slice(&[0, 0, 0, 0]);
    fix_ipv4_checksum(&mut f);
    fix_icrc(&mut f);
    t.fwd("IPv4 source 0.0.0.0", f, ForwardedRoce);
    let mut f = roce4();
    f[26..30].copy_from_slice(&[255, 255, 255, 255]);
    fix_ipv4_checksum(&mut f);
    fix_icrc(&mut f);
    t.fwd("IPv4 source 255.255.255.255", f, ForwardedRoce);

    // --- fragments, options -------------------------------------------------
    for (name, frags) in [
        ("first fragment (MF)", 0x2000u16),
        ("later fragment (offset 1480)", 0x00B9),
        ("last fragment (offset, no MF)", 0x0010),
        ("fragment with DF and MF (contradictory)", 0x6000),
        ("offset 8191 (maximum)", 0x1FFF),
    ] {
        let mut f = roce4();
        set16(&mut f, 20, frags);
        fix_ipv4_checksum(&mut f);
        t.pass(format!("IPv4 {name}"), f, PassFragment);
    }
    let mut f = roce4();
    set16(&mut f, 20, 0x8000 | 0x4000);
    fix_ipv4_checksum(&mut f);
    fix_icrc(&mut f);
    t.fwd("IPv4 reserved flag (evil bit) + DF: not a fragment", f, ForwardedRoce);
    let mut f = roce4();
    set16(&mut f, 20, 0x2000);
    f[22] = 1;
    fix_ipv4_checksum(&mut f);
    t.pass("IPv4 fragment with TTL 1: fragment wins", f, PassFragment);
    let mut f = build_roce_frame(&spec4(UNROUTED4, 64));
    set16(&mut f, 20, 0x2000);
    fix_ipv4_checksum(&mut f);
    t.pass("IPv4 fragment to an unrouted address: route lookup comes first", f, PassNoRoute);
    let mut f = with_ipv4_options(roce4(), &[1, 1, 1, 1]);
    fix_icrc(&mut f);
    t.pass("IPv4 options: 4 NOPs (IHL 6)", f, PassIpv4Options);
    let mut f = with_ipv4_options(roce4(), &[1; 40]);
    fix_icrc(&mut f);
    t.pass("IPv4 options: 40 bytes (IHL 15)", f, PassIpv4Options);
    let mut f = with_ipv4_options(roce4(), &[0x94, 0x04, 0x00, 0x00]);
    fix_icrc(&mut f);
    t.pass("IPv4 Router Alert option: to the kernel, which honours it", f, PassIpv4Options);
    let mut f = with_ipv4_options(roce4(), &[0x07, 0x27, 0x04, 0, 0, 0, 0, 0]);
    fix_icrc(&mut f);
    t.pass("IPv4 malformed record-route option (length 39 > IHL): the kernel judges it", f, PassIpv4Options);
    let mut f = with_ipv4_options(roce4(), &[1, 1, 1, 1]);
    f[24] ^= 0x5A;
    t.pass("IPv4 options and a wrong checksum: options first, the kernel checks the sum", f, PassIpv4Options);
    let mut f = with_ipv4_options(udp4(4791, 0), &[1; 40]);
    set16(&mut f, 16, 40);
    fix_ipv4_checksum(&mut f);
    f.truncate(14 + 40);
    t.dropped("IPv4 IHL 15, frame ends inside the options", f, DropBadIpHeader);

    // --- IPv6 -----------------------------------------------------------------
    for n in [1usize, 8, 20, 24, 39] {
        let mut f = roce6();
        f.truncate(14 + n);
        t.dropped(format!("IPv6 header cut at {n} bytes"), f, DropBadIpHeader);
    }
    let mut f = roce6();
    f.truncate(14 + 40);
    t.dropped("IPv6 header only (payload length says more)", f, DropBadIpHeader);
    let mut f = roce6();
    let plen = be16(&f, 18) + 1;
    set16(&mut f, 18, plen);
    t.dropped("IPv6 payload length 1 byte beyond the frame", f, DropBadIpHeader);
    let mut f = roce6();
    f.extend_from_slice(&[0; 18]);
    t.fwd("IPv6 RoCE with 18 bytes of trailing padding", f, ForwardedRoce);
    let mut f = roce6();
    set16(&mut f, 18, 0);
    t.pass("IPv6 payload length 0 (jumbogram shape), UDP: cut short", f, PassL4Truncated);
    for (kind, name) in [(0u8, "hop-by-hop"), (43, "routing"), (44, "fragment"), (60, "destination options")] {
        t.pass(format!("IPv6 {name} extension header"), with_ipv6_ext(roce6(), kind), PassIpv6ExtHeader);
    }
    for kind in [51u8, 135, 139, 140, 253, 254] {
        t.pass(format!("IPv6 next header {kind} (extension)"), with_ipv6_ext(roce6(), kind), PassIpv6ExtHeader);
    }
    let mut f = with_ipv6_ext(build_roce_frame(&spec6("fd99::1".parse().unwrap(), 64)), 0);
    f[21] = 64;
    t.pass("IPv6 hop-by-hop to an unrouted address: route lookup comes first", f, PassNoRoute);
    let mut f = with_ipv6_ext(roce6(), 0);
    f[21] = 1;
    t.pass("IPv6 hop-by-hop with hop limit 1: extension wins", f, PassIpv6ExtHeader);
    let mut f = udp6(9, 8);
    f[20] = 59; // no next header
    t.fwd("IPv6 next header 59 (no next header): forwarded, ports 0", f, Forwarded);
    let mut f = roce6();
    f[15] = 0xFF; // traffic class low nibble + flow label high bits
    f[16] = 0xFF;
    f[17] = 0xFF;
    fix_icrc(&mut f);
    t.fwd("IPv6 traffic class / flow label all ones", f, ForwardedRoce);

    // --- transport ------------------------------------------------------------
    for n in 0..8 {
        let mut f = udp4(4791, 0);
        let total = 20 + n as u16;
        set16(&mut f, 16, total);
        f.truncate(14 + 20 + n);
        fix_ipv4_checksum(&mut f);
        t.pass(format!("IPv4 UDP header of {n} bytes (lengths agree)"), f, PassL4Truncated);
    }
    let mut f = udp4(4791, 0);
    f.truncate(14 + 20 + 4);
    t.dropped("IPv4 UDP header cut by the frame (total length says 28)", f, DropBadIpHeader);
    for n in [0usize, 7] {
        let mut f = udp6(4791, 0);
        set16(&mut f, 18, n as u16);
        f.truncate(14 + 40 + n);
        t.pass(format!("IPv6 UDP header of {n} bytes (lengths agree)"), f, PassL4Truncated);
    }
    for n in [0usize, 19] {
        let mut f = build_tcp_frame(&spec4(DST4, 64).plain(40000, 4791, 0));
        set16(&mut f, 16, 20 + n as u16);
        f.truncate(14 + 20 + n);
        fix_ipv4_checksum(&mut f);
        t.pass(format!("IPv4 TCP header of {n} bytes"), f, PassL4Truncated);
    }
    t.fwd("TCP to port 4791 is not RoCE", build_tcp_frame(&spec4(DST4, 64).plain(40000, 4791, 20)), Forwarded);
    t.fwd(
        "UDP from port 4791 (to 5000) is not RoCE",
        build_udp_frame(&spec4(DST4, 64).plain(4791, 5000, 20)),
        Forwarded,
    );
    for proto in [1u8, 47, 132, 255] {
        let mut f = udp4(9, 16);
        f[23] = proto;
        fix_ipv4_checksum(&mut f);
        t.fwd(format!("IPv4 protocol {proto}: hashed with ports 0"), f, Forwarded);
    }
    for n in 0..12 {
        t.fwd(format!("UDP 4791 with a {n}-byte BTH (IPv4)"), udp4(4791, n), RoceShortBth);
    }
    for n in [0usize, 11] {
        t.fwd(format!("UDP 4791 with a {n}-byte BTH (IPv6)"), udp6(4791, n), RoceShortBth);
    }
    for n in [12usize, 15] {
        t.fwd(format!("UDP 4791: whole BTH, {n} bytes, no room for the ICRC"), udp4(4791, n), ForwardedRoce);
    }
    // UDP length field disagreeing with the IP payload: ignored; the IP
    // length decides where the packet ends.
    for udp_len in [0u16, 8, 19, 20, 89, 0xFFFF] {
        let mut f = roce4();
        set16(&mut f, 38, udp_len);
        fix_icrc(&mut f);
        t.fwd(format!("UDP length field {udp_len} (IP payload 88): ignored"), f, ForwardedRoce);
    }
    let mut f = roce6();
    set16(&mut f, 58, 8);
    t.fwd("IPv6 UDP length field 8 (IP payload 108): ignored", f, ForwardedRoce);
    let mut f = roce4();
    set16(&mut f, 40, 0x1234);
    t.fwd("IPv4 RoCE with a non-zero (wrong) UDP checksum", f, ForwardedRoce);
    let mut f = roce4();
    f[47] = 0x0F; // BTH pad count 3 + header version 15
    fix_icrc(&mut f);
    t.fwd("BTH pad count 3 and TVer 15", f, ForwardedRoce);

    // --- BTH opcodes, QPs -------------------------------------------------------
    for op in [0x1Fu8, 0xFF, 0x64, opcode::CNP, 0x13, 0xE0, 0xC0] {
        let f = build_roce_frame(&spec(SRC4.into(), DST4.into(), 64, op, 0x42, 16));
        t.fwd(format!("opcode {op:#04x}"), f, ForwardedRoce);
    }
    for qp in [0u32, 1, 0xFF_FFFF] {
        let f = build_roce_frame(&spec(SRC4.into(), DST4.into(), 64, opcode::SEND_ONLY, qp, 0));
        t.fwd(format!("DestQP {qp:#x}"), f, ForwardedRoce);
    }
    let mut f = roce4();
    f[46..54].fill(0xFF); // BTH bytes 4..12: reserved, FECN, BECN, QP, AckReq, reserved, PSN
    fix_icrc(&mut f);
    t.fwd("BTH bytes 4..12 all ones (QP 0xFFFFFF, reserved bits set)", f, ForwardedRoce);
    let f = build_roce_frame(&spec(SRC4.into(), DST4_FIVE_TUPLE.into(), 64, 0xFF, 0xAB_CDEF, 4));
    t.fwd("unknown opcode in a five-tuple group", f, ForwardedRoce);

    // --- TTL, addresses ----------------------------------------------------------
    for ttl in [0u8, 1] {
        t.pass(format!("IPv4 TTL {ttl}"), build_roce_frame(&spec4(DST4, ttl)), PassTtlExpired);
        t.pass(format!("IPv6 hop limit {ttl}"), build_roce_frame(&spec6(dst6(), ttl)), PassTtlExpired);
        t.pass(format!("IPv4 TTL {ttl}, unrouted"), build_roce_frame(&spec4(UNROUTED4, ttl)), PassNoRoute);
        t.pass(format!("IPv4 TTL {ttl}, local"), build_roce_frame(&spec4(LOCAL4, ttl)), PassLocal);
    }
    t.fwd("IPv4 TTL 2", build_roce_frame(&spec4(DST4, 2)), ForwardedRoce);
    t.fwd("IPv4 TTL 255", build_roce_frame(&spec4(DST4, 255)), ForwardedRoce);
    t.fwd("IPv6 hop limit 2", build_roce_frame(&spec6(dst6(), 2)), ForwardedRoce);
    for dst in [Ipv4Addr::new(224, 0, 0, 1), Ipv4Addr::new(239, 1, 1, 1), Ipv4Addr::BROADCAST, Ipv4Addr::UNSPECIFIED] {
        t.pass(
            format!("IPv4 destination {dst} with a unicast MAC (no route)"),
            build_roce_frame(&spec4(dst, 64)),
            PassNoRoute,
        );
    }
    t.pass(
        "IPv6 destination ff02::1 with a unicast MAC (no route)",
        build_roce_frame(&spec6("ff02::1".parse().unwrap(), 64)),
        PassNoRoute,
    );
    t.0
}

#[derive(Debug)]
struct Outcome {
    action: u32,
    output: Vec<u8>,
    deltas: Vec<(PortCounter, u64)>,
    member_deltas: [u64; 4],
    group: u32,
}

fn snapshot(dp: &Dataplane) -> Vec<u64> {
    PortCounter::ALL.iter().map(|c| dp.maps.port_counter(PORT_SLOT, *c).unwrap()).collect()
}

fn member_packets(dp: &Dataplane, group: u32) -> [u64; 4] {
    std::array::from_fn(|p| dp.maps.member_stats(group, p as u32).unwrap().packets)
}

fn group_of(frame: &[u8]) -> u32 {
    let l3 = l3_offset(frame);
    if frame.len() > l3 + 20 && frame[l3] >> 4 == 4 && frame[l3 + 16..l3 + 18] == [10, 2] {
        FIVE_TUPLE_GROUP
    } else {
        QP_GROUP
    }
}

fn run(dp: &mut Dataplane, frame: &[u8]) -> Outcome {
    let group = group_of(frame);
    let before = snapshot(dp);
    let members_before = member_packets(dp, group);
    let r = test_run(dp, frame).expect("BPF_PROG_TEST_RUN");
    let after = snapshot(dp);
    let members_after = member_packets(dp, group);
    let deltas = PortCounter::ALL
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| a != b)
        .map(|(c, (b, a))| (*c, a - b))
        .collect();
    let member_deltas = std::array::from_fn(|i| members_after[i] - members_before[i]);
    Outcome { action: r.action, output: r.output, deltas, member_deltas, group }
}

/// The exact counter movements a row's outcome implies.
fn expected_deltas(row: &Row) -> Vec<(PortCounter, u64)> {
    use PortCounter::*;
    let len = row.frame.len() as u64;
    let mut d = vec![(RxPackets, 1), (RxBytes, len)];
    match row.counter {
        Forwarded => d.extend([(Forwarded, 1), (ForwardedBytes, len)]),
        ForwardedRoce => d.extend([(Forwarded, 1), (ForwardedBytes, len), (ForwardedRoce, 1)]),
        RoceShortBth => d.extend([(Forwarded, 1), (ForwardedBytes, len), (ForwardedRoce, 1), (RoceShortBth, 1)]),
        other => d.push((other, 1)),
    }
    d.sort_by_key(|(c, _)| *c as u32);
    d
}

fn check_row(dp: &mut Dataplane, row: &Row) -> Vec<String> {
    let out = run(dp, &row.frame);
    let mut problems = Vec::new();
    if out.action == XDP_ABORTED {
        problems.push("XDP_ABORTED".to_string());
    }
    if out.action != row.action {
        problems.push(format!("action {} (want {})", action_name(out.action), action_name(row.action)));
    }
    let want = expected_deltas(row);
    if out.deltas != want {
        let show =
            |d: &[(PortCounter, u64)]| d.iter().map(|(c, n)| format!("{}+{n}", c.name())).collect::<Vec<_>>().join(" ");
        problems.push(format!("counters moved: {} (want {})", show(&out.deltas), show(&want)));
    }
    match row.kind {
        Kind::Unchanged => {
            if out.output != row.frame {
                problems.push("output differs from the input".into());
            }
            if out.member_deltas != [0; 4] {
                problems.push(format!("member counters moved: {:?}", out.member_deltas));
            }
        }
        Kind::Forwarded { roce } => {
            let member = predict_member(&row.frame);
            let mut want_members = [0u64; 4];
            want_members[member] = 1;
            if out.member_deltas != want_members {
                problems.push(format!(
                    "group {} member counters moved {:?}, want member {member}",
                    out.group, out.member_deltas
                ));
            }
            let expected = expected_forward(&row.frame, member);
            let l3 = l3_offset(&row.frame);
            let v4 = row.frame[l3] >> 4 == 4;
            let hl = usize::from(row.frame[l3] & 0x0F) * 4;
            let input_checksum_ok = !v4 || internet_checksum(&row.frame[l3..l3 + hl]) == 0;
            if input_checksum_ok {
                if out.output != expected {
                    let at = out.output.iter().zip(&expected).position(|(a, b)| a != b);
                    problems.push(format!(
                        "output differs from the expected rewrite (len {} vs {}, first at {at:?})",
                        out.output.len(),
                        expected.len()
                    ));
                }
                if v4 && internet_checksum(&out.output[l3..l3 + hl]) != 0 {
                    problems.push("IPv4 header checksum invalid after forwarding".into());
                }
            } else {
                // Everything but the checksum as expected; the error preserved.
                let mask = |f: &[u8]| {
                    let mut f = f.to_vec();
                    f[l3 + 10..l3 + 12].fill(0);
                    f
                };
                if out.output.len() != expected.len() || mask(&out.output) != mask(&expected) {
                    problems.push("output differs from the expected rewrite (checksum masked)".into());
                }
                if internet_checksum(&out.output[l3..l3 + hl]) != internet_checksum(&row.frame[l3..l3 + hl]) {
                    problems.push("the wrong IPv4 checksum's error was not preserved".into());
                }
            }
            if roce {
                if !invariant_bytes_equal(&row.frame, &out.output) {
                    problems.push("an ICRC-covered byte changed (invariant_bytes_equal)".into());
                }
                match parse_roce(&out.output) {
                    Ok(p) => {
                        if !p.icrc_ok {
                            problems.push("ICRC no longer verifies".into());
                        }
                        if input_checksum_ok && p.ipv4_checksum_ok == Some(false) {
                            problems.push("parse_roce: IPv4 checksum invalid".into());
                        }
                    }
                    Err(e) => problems.push(format!("output does not parse as RoCE: {e}")),
                }
            }
        }
    }
    problems
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn hostile_table() {
    let mut dp = seeded_dataplane(&[]);
    let rows = rows();
    let mut failures = Vec::new();
    let mut listing = String::new();
    for row in &rows {
        let problems = check_row(&mut dp, row);
        listing.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            row.name,
            row.frame.len(),
            action_name(row.action),
            row.counter.name()
        ));
        if !problems.is_empty() {
            failures.push(format!("{}: {}\n      frame {}", row.name, problems.join("; "), hex(&row.frame)));
        }
    }
    if std::env::var_os("HOSTILE_LIST").is_some() {
        println!("| row | bytes | action | counter |\n|---|---|---|---|\n{listing}");
    }
    println!("{} hostile rows", rows.len());
    assert!(failures.is_empty(), "{} of {} rows failed:\n  {}", failures.len(), rows.len(), failures.join("\n  "));
}

/// Covered rows are forwarded RoCE, so each must be a valid RoCE frame
/// (else the ICRC checks would silently not apply): a check on the table.
#[test]
fn roce_rows_really_are_roce() {
    for row in rows() {
        if row.counter == PortCounter::ForwardedRoce && row.frame.len() > 60 {
            let udp_len_broken = row.name.starts_with("UDP length field") || row.name.starts_with("IPv6 UDP length");
            let no_icrc = row.name.contains("no room for the ICRC");
            let bad_checksum = row.name.contains("checksum wrong") || row.name.contains("non-zero (wrong) UDP");
            if !(udp_len_broken || no_icrc || bad_checksum) {
                assert!(
                    matches!(row.kind, Kind::Forwarded { roce: true }),
                    "{}: not a valid RoCE frame per parse_roce: {:?}",
                    row.name,
                    parse_roce(&row.frame)
                );
            }
        }
    }
}

/// BPF_PROG_TEST_RUN refuses XDP input shorter than an Ethernet header, so
/// the program never sees such frames there (a driver would not hand them
/// to XDP either). Nothing is counted.
#[test]
fn kernel_rejects_frames_below_14_bytes() {
    let mut dp = seeded_dataplane(&[]);
    let before = snapshot(&dp);
    for len in 0..14 {
        let frame = vec![0x02u8; len];
        let r = test_run(&mut dp, &frame);
        assert!(r.is_err(), "{len}-byte frame was accepted: {r:?}");
    }
    assert_eq!(snapshot(&dp), before, "no counter may move");
}

/// With a default route, destinations a router must not unicast-forward.
/// Current behaviour: the dataplane looks only at the route table, so
/// these are forwarded like any unicast packet (see the report in issue 6).
#[test]
fn default_route_special_destinations() {
    let mut dp = seeded_dataplane(&[("0.0.0.0/0", QP_GROUP), ("::/0", QP_GROUP)]);
    let mut failures = Vec::new();
    let dsts4 = [
        Ipv4Addr::new(224, 0, 0, 1),
        Ipv4Addr::new(239, 1, 1, 1),
        Ipv4Addr::BROADCAST,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::LOCALHOST,
    ];
    let mut rows = Table::default();
    for dst in dsts4 {
        rows.fwd(
            format!("default route: IPv4 destination {dst}"),
            build_roce_frame(&spec4(dst, 64)),
            PortCounter::ForwardedRoce,
        );
    }
    for dst in ["ff02::1", "::1", "::"] {
        rows.fwd(
            format!("default route: IPv6 destination {dst}"),
            build_roce_frame(&spec6(dst.parse().unwrap(), 64)),
            PortCounter::ForwardedRoce,
        );
    }
    for row in &rows.0 {
        let problems = check_row(&mut dp, row);
        if !problems.is_empty() {
            failures.push(format!("{}: {}", row.name, problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Frames above what BPF_PROG_TEST_RUN puts in one page (4096 - 256
/// headroom - 320 skb_shared_info = 3520 bytes) become multi-buffer XDP
/// buffers: the program reads headers in the first 3520 bytes and checks
/// lengths against the whole frame (bpf_xdp_get_buff_len), so jumbo RoCE
/// frames (4096 MTU, 9000) forward intact.
#[test]
fn jumbo_frames() {
    let mut dp = seeded_dataplane(&[]);
    let mut report = Vec::new();
    for payload in [3000usize, 3520 - 58, 3520 - 57, 4000, 8958 - 4] {
        for v6 in [false, true] {
            let s = if v6 { spec6(dst6(), 64) } else { spec4(DST4, 64) };
            let frame = build_roce_frame(&RoceFrameSpec { payload_len: payload, ..s });
            let before = snapshot(&dp);
            let r = test_run(&mut dp, &frame);
            let after = snapshot(&dp);
            let moved: Vec<String> = PortCounter::ALL
                .iter()
                .zip(before.iter().zip(&after))
                .filter(|(_, (b, a))| a != b)
                .map(|(c, (b, a))| format!("{}+{}", c.name(), a - b))
                .collect();
            let what = match &r {
                Ok(r) => format!("{} out {} bytes", action_name(r.action), r.output.len()),
                Err(e) => format!("error: {e:#}"),
            };
            report.push((frame.len(), v6, what, moved.join(" "), r));
        }
    }
    for (len, v6, what, moved, _) in &report {
        println!("{len:5} bytes {}: {what}; {moved}", if *v6 { "IPv6" } else { "IPv4" });
    }
    for (len, v6, what, moved, r) in report {
        let r = r.unwrap_or_else(|e| panic!("{len} bytes: test run failed: {e:#}"));
        assert_ne!(r.action, XDP_ABORTED, "{len} bytes v6={v6}");
        assert_eq!(r.action, XDP_REDIRECT, "{len} bytes v6={v6}: {what}; {moved}");
        assert_eq!(r.output.len(), len, "the whole frame comes back");
        assert!(
            moved.contains(&format!("rx_bytes+{len}")) && moved.contains("forwarded_roce+1"),
            "{len} bytes: {moved}"
        );
        let out = rocev2_user::tools::packet::parse_roce(&r.output).unwrap();
        assert!(out.icrc_ok && out.ipv4_checksum_ok != Some(false), "{len} bytes: ICRC and checksum valid");
    }
}
