//! BPF_PROG_TEST_RUN fixture table for the XDP forwarding program.
//!
//! Each row: an input frame, the expected action, the counter that must
//! record it, and the expected output bytes. Forwarded rows predict the
//! group member with rocev2-common's hash (the same code the kernel runs)
//! and build the expected frame independently: new MACs, TTL/hop limit
//! minus one and an IPv4 checksum recomputed from scratch.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rocev2_common::{
    bth::{opcode, Bth},
    checksum::internet_checksum,
    counters::PortCounter,
    hash::{member_hash, pick_member, FlowKey, HashMode},
    maps::ROUTE_LOCAL,
};
use rocev2_tests::{action_name, require_root, test_run, XDP_DROP, XDP_PASS, XDP_REDIRECT};
use rocev2_user::{
    config::Prefix,
    dataplane::{Dataplane, MemberSpec},
    packet::{build_roce_frame, build_tcp_frame, build_udp_frame, PlainFrameSpec, RoceFrameSpec},
};

const LOOPBACK: u32 = 1;
const PORT_SLOT: u32 = 1;
const SEED: u32 = 1234;
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const PORT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xFE];
const QP_GROUP: u32 = 0;
const FIVE_TUPLE_GROUP: u32 = 1;
const SRC4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const DST4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const DST4_FIVE_TUPLE: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
const LOCAL4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const UNROUTED4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

fn src6() -> Ipv6Addr {
    "fd00::1".parse().unwrap()
}
fn dst6() -> Ipv6Addr {
    "fd01::1".parse().unwrap()
}

fn members() -> Vec<MemberSpec> {
    (0..4u8)
        .map(|i| MemberSpec {
            ifindex: LOOPBACK,
            src_mac: [0x02, 0xAA, 0, 0, 0, i],
            dst_mac: [0x02, 0xBB, 0, 0, 0, i],
        })
        .collect()
}

/// A dataplane seeded like a small leaf: one port, a `qp` group and a
/// `five-tuple` group of four members each, routes, and local addresses.
fn seeded_dataplane() -> Dataplane {
    require_root();
    let mut dp = Dataplane::load(None).expect("load the eBPF object");
    dp.maps.set_hash_seed(SEED).unwrap();
    dp.maps.set_port(LOOPBACK, PORT_SLOT).unwrap();
    dp.maps.add_egress_dev(LOOPBACK).unwrap();
    dp.maps.publish_group(QP_GROUP, HashMode::Qp, &members()).unwrap();
    dp.maps.publish_group(FIVE_TUPLE_GROUP, HashMode::FiveTuple, &members()).unwrap();
    let routes = [
        ("10.1.0.0/16", QP_GROUP),
        ("10.2.0.0/16", FIVE_TUPLE_GROUP),
        ("fd01::/64", QP_GROUP),
        ("10.0.0.254/32", ROUTE_LOCAL),
        ("fd00::fe/128", ROUTE_LOCAL),
    ];
    let wanted = routes.iter().map(|(p, g)| (parse_prefix(p), *g)).collect();
    dp.sync_routes(&wanted).unwrap();
    dp
}

fn parse_prefix(text: &str) -> Prefix {
    let (addr, len) = text.split_once('/').unwrap();
    let len: u8 = len.parse().unwrap();
    match addr.parse::<IpAddr>().unwrap() {
        IpAddr::V4(addr) => Prefix::V4 { addr, len },
        IpAddr::V6(addr) => Prefix::V6 { addr, len },
    }
}

fn bth(dest_qp: u32) -> Bth {
    Bth {
        opcode: opcode::WRITE_ONLY,
        solicited: false,
        pad_count: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: true,
        psn: 0x00_1234,
    }
}

fn roce(src: IpAddr, dst: IpAddr, ttl: u8, dest_qp: u32) -> RoceFrameSpec {
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
        bth: bth(dest_qp),
        payload_len: 64,
    }
}

fn roce_v4(dst: Ipv4Addr, ttl: u8, dest_qp: u32) -> RoceFrameSpec {
    roce(SRC4.into(), dst.into(), ttl, dest_qp)
}

fn plain_v4(dst: Ipv4Addr, src_port: u16, dst_port: u16, payload_len: usize) -> PlainFrameSpec {
    roce_v4(dst, 64, 0).plain(src_port, dst_port, payload_len)
}

/// Offset of the IP header (after Ethernet and an optional VLAN tag).
fn l3_offset(frame: &[u8]) -> usize {
    if frame[12..14] == [0x81, 0x00] {
        18
    } else {
        14
    }
}

fn set_ipv4_checksum(frame: &mut [u8]) {
    let l3 = l3_offset(frame);
    let header_len = usize::from(frame[l3] & 0x0F) * 4;
    frame[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let check = internet_checksum(&frame[l3..l3 + header_len]);
    frame[l3 + 10..l3 + 12].copy_from_slice(&check.to_be_bytes());
}

/// The frame the dataplane should emit for `input` sent to `member`.
fn expected_forward(input: &[u8], member: usize) -> Vec<u8> {
    let m = &members()[member];
    let mut out = input.to_vec();
    out[0..6].copy_from_slice(&m.dst_mac);
    out[6..12].copy_from_slice(&m.src_mac);
    let l3 = l3_offset(&out);
    if out[l3] >> 4 == 4 {
        out[l3 + 8] -= 1;
        set_ipv4_checksum(&mut out);
    } else {
        out[l3 + 7] -= 1;
    }
    out
}

fn predicted_member(key: FlowKey, mode: HashMode) -> usize {
    pick_member(member_hash(&key, mode, SEED), 4) as usize
}

fn key_v4(dst: Ipv4Addr, protocol: u8, sport: u16, dport: u16) -> FlowKey {
    FlowKey::v4(SRC4.octets(), dst.octets(), protocol, sport, dport)
}

enum Expect {
    /// Redirected to this member with the rewrite applied.
    Forwarded(usize),
    /// Left exactly as it came.
    Unchanged,
}

struct Row {
    name: &'static str,
    frame: Vec<u8>,
    action: u32,
    counter: PortCounter,
    expect: Expect,
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();

    // --- forwarded -------------------------------------------------------
    let qp = 0x00_0123;
    rows.push(Row {
        name: "IPv4 RoCE WRITE_ONLY, qp group",
        frame: build_roce_frame(&roce_v4(DST4, 64, qp)),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(predicted_member(key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)),
    });
    let v6_key = FlowKey::v6(src6().octets(), dst6().octets(), 17, 0xC000, 4791).with_dest_qp(qp);
    rows.push(Row {
        name: "IPv6 RoCE WRITE_ONLY, qp group",
        frame: build_roce_frame(&roce(src6().into(), dst6().into(), 64, qp)),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(predicted_member(v6_key, HashMode::Qp)),
    });
    let mut tagged = roce_v4(DST4, 64, qp);
    tagged.vlan = Some(100);
    rows.push(Row {
        name: "VLAN-tagged IPv4 RoCE keeps its tag",
        frame: build_roce_frame(&tagged),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(predicted_member(key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)),
    });
    for qp in [1u32, 2, 3, 0xFF_FFFF] {
        rows.push(Row {
            name: "IPv4 RoCE in a five-tuple group ignores the QP",
            frame: build_roce_frame(&roce_v4(DST4_FIVE_TUPLE, 64, qp)),
            action: XDP_REDIRECT,
            counter: PortCounter::ForwardedRoce,
            expect: Expect::Forwarded(predicted_member(key_v4(DST4_FIVE_TUPLE, 17, 0xC000, 4791), HashMode::FiveTuple)),
        });
    }
    rows.push(Row {
        name: "non-RoCE UDP hashes on the five-tuple",
        frame: build_udp_frame(&plain_v4(DST4, 40000, 5000, 32)),
        action: XDP_REDIRECT,
        counter: PortCounter::Forwarded,
        expect: Expect::Forwarded(predicted_member(key_v4(DST4, 17, 40000, 5000), HashMode::Qp)),
    });
    rows.push(Row {
        name: "TCP hashes on the five-tuple",
        frame: build_tcp_frame(&plain_v4(DST4, 40001, 443, 32)),
        action: XDP_REDIRECT,
        counter: PortCounter::Forwarded,
        expect: Expect::Forwarded(predicted_member(key_v4(DST4, 6, 40001, 443), HashMode::Qp)),
    });
    rows.push(Row {
        name: "truncated BTH: forwarded on the five-tuple, counted",
        frame: build_udp_frame(&plain_v4(DST4, 0xC000, 4791, 6)),
        action: XDP_REDIRECT,
        counter: PortCounter::RoceShortBth,
        expect: Expect::Forwarded(predicted_member(key_v4(DST4, 17, 0xC000, 4791), HashMode::Qp)),
    });
    rows.push(Row {
        name: "IPv4 with options, RoCE",
        frame: with_ipv4_options(build_roce_frame(&roce_v4(DST4, 64, qp))),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(predicted_member(key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)),
    });
    rows.push(Row {
        name: "TTL 2 is forwarded with TTL 1",
        frame: build_roce_frame(&roce_v4(DST4, 2, qp)),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(predicted_member(key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)),
    });

    // --- to the kernel stack ---------------------------------------------
    let pass = |name, frame, counter| Row { name, frame, action: XDP_PASS, counter, expect: Expect::Unchanged };
    rows.push(pass("TTL 1 goes to the kernel for ICMP", build_roce_frame(&roce_v4(DST4, 1, qp)), PortCounter::PassTtlExpired));
    rows.push(pass("TTL 0", build_roce_frame(&roce_v4(DST4, 0, qp)), PortCounter::PassTtlExpired));
    rows.push(pass(
        "IPv6 hop limit 1",
        build_roce_frame(&roce(src6().into(), dst6().into(), 1, qp)),
        PortCounter::PassTtlExpired,
    ));
    rows.push(pass("unrouted destination", build_roce_frame(&roce_v4(UNROUTED4, 64, qp)), PortCounter::PassNoRoute));
    rows.push(pass("packet to a local address", build_roce_frame(&roce_v4(LOCAL4, 64, qp)), PortCounter::PassLocal));
    rows.push(pass(
        "IPv6 packet to a local address",
        build_roce_frame(&roce(src6().into(), "fd00::fe".parse::<Ipv6Addr>().unwrap().into(), 64, qp)),
        PortCounter::PassLocal,
    ));
    rows.push(pass("first fragment (MF set)", ipv4_fragment(0x2000), PortCounter::PassFragment));
    rows.push(pass("later fragment (offset set)", ipv4_fragment(0x00B9), PortCounter::PassFragment));
    rows.push(pass("IPv6 with a hop-by-hop extension header", ipv6_with_hop_by_hop(), PortCounter::PassIpv6ExtHeader));
    rows.push(pass("ARP", arp_request(), PortCounter::PassNotIp));
    let mut multicast = build_roce_frame(&roce_v4(DST4, 64, qp));
    multicast[0..6].copy_from_slice(&[0x01, 0x00, 0x5E, 0x01, 0x00, 0x01]);
    rows.push(pass("multicast destination MAC", multicast, PortCounter::PassL2Multicast));
    rows.push(pass("two VLAN tags", stacked_vlan(), PortCounter::PassStackedVlan));
    rows.push(pass("UDP header cut short by the IP length", udp_cut_short(), PortCounter::PassL4Truncated));

    // --- dropped -----------------------------------------------------------
    let drop = |name, frame, counter| Row { name, frame, action: XDP_DROP, counter, expect: Expect::Unchanged };
    let mut runt = vec![0u8; 15];
    runt[0..6].copy_from_slice(&PORT_MAC);
    runt[12..14].copy_from_slice(&[0x81, 0x00]);
    rows.push(drop("VLAN tag cut short", runt, PortCounter::DropRunt));
    let mut short_ihl = build_roce_frame(&roce_v4(DST4, 64, qp));
    short_ihl[14] = 0x44;
    rows.push(drop("IPv4 header length below 5 words", short_ihl, PortCounter::DropBadIpHeader));
    let mut long_total = build_roce_frame(&roce_v4(DST4, 64, qp));
    long_total[16..18].copy_from_slice(&2000u16.to_be_bytes());
    set_ipv4_checksum(&mut long_total);
    rows.push(drop("IPv4 total length beyond the frame", long_total, PortCounter::DropBadIpHeader));
    let mut truncated_ip = build_roce_frame(&roce_v4(DST4, 64, qp));
    truncated_ip.truncate(14 + 12);
    rows.push(drop("IPv4 header cut short by the frame", truncated_ip, PortCounter::DropBadIpHeader));
    rows
}

/// Inserts four NOP option bytes (IHL 6) and fixes lengths and checksum.
fn with_ipv4_options(mut frame: Vec<u8>) -> Vec<u8> {
    frame.splice(34..34, [1u8, 1, 1, 1]);
    frame[14] = 0x46;
    let total = u16::from_be_bytes([frame[16], frame[17]]) + 4;
    frame[16..18].copy_from_slice(&total.to_be_bytes());
    set_ipv4_checksum(&mut frame);
    frame
}

fn ipv4_fragment(frags: u16) -> Vec<u8> {
    let mut frame = build_udp_frame(&plain_v4(DST4, 0xC000, 4791, 64));
    frame[20..22].copy_from_slice(&frags.to_be_bytes());
    set_ipv4_checksum(&mut frame);
    frame
}

fn ipv6_with_hop_by_hop() -> Vec<u8> {
    let spec = roce(src6().into(), dst6().into(), 64, 7).plain(0xC000, 4791, 32);
    let mut frame = build_udp_frame(&spec);
    // Hop-by-hop header: next header UDP, length 0 (8 bytes), PadN option.
    frame.splice(54..54, [17u8, 0, 1, 4, 0, 0, 0, 0]);
    frame[20] = 0; // next header: hop-by-hop
    let payload = u16::from_be_bytes([frame[18], frame[19]]) + 8;
    frame[18..20].copy_from_slice(&payload.to_be_bytes());
    frame
}

fn arp_request() -> Vec<u8> {
    let mut frame = vec![0xFF; 6];
    frame.extend_from_slice(&HOST_MAC);
    frame.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    frame.extend_from_slice(&HOST_MAC);
    frame.extend_from_slice(&SRC4.octets());
    frame.extend_from_slice(&[0; 6]);
    frame.extend_from_slice(&LOCAL4.octets());
    // The broadcast MAC would already send it to the kernel; make the
    // destination unicast so the ether type decides.
    frame[0..6].copy_from_slice(&PORT_MAC);
    frame
}

fn stacked_vlan() -> Vec<u8> {
    let mut spec = roce_v4(DST4, 64, 9);
    spec.vlan = Some(10);
    let mut frame = build_roce_frame(&spec);
    // After the outer tag's TCI: a second TPID and TCI, then the original ether type.
    frame.splice(16..16, [0x81u8, 0x00, 0x00, 0x14]);
    frame
}

fn udp_cut_short() -> Vec<u8> {
    let mut frame = build_udp_frame(&plain_v4(DST4, 1000, 2000, 16));
    // IP total length covers only 4 bytes of the UDP header.
    frame[16..18].copy_from_slice(&24u16.to_be_bytes());
    set_ipv4_checksum(&mut frame);
    frame
}

#[test]
fn fixture_table() {
    let mut dp = seeded_dataplane();
    let mut failures = Vec::new();
    for row in rows() {
        let before_rx = dp.maps.port_counter(PORT_SLOT, PortCounter::RxPackets).unwrap();
        let before = dp.maps.port_counter(PORT_SLOT, row.counter).unwrap();
        let run = test_run(&mut dp, &row.frame).unwrap();
        let after_rx = dp.maps.port_counter(PORT_SLOT, PortCounter::RxPackets).unwrap();
        let after = dp.maps.port_counter(PORT_SLOT, row.counter).unwrap();
        let expected = match row.expect {
            Expect::Forwarded(member) => expected_forward(&row.frame, member),
            Expect::Unchanged => row.frame.clone(),
        };
        let mut problems = Vec::new();
        if run.action != row.action {
            problems.push(format!("action {} (want {})", action_name(run.action), action_name(row.action)));
        }
        if after - before != 1 {
            problems.push(format!("counter {} moved by {} (want 1)", row.counter.name(), after - before));
        }
        if after_rx - before_rx != 1 {
            problems.push(format!("rx_packets moved by {}", after_rx - before_rx));
        }
        if run.output != expected {
            let first = run.output.iter().zip(&expected).position(|(a, b)| a != b);
            problems.push(format!(
                "output differs (len {} vs {}, first differing byte {first:?})",
                run.output.len(),
                expected.len()
            ));
        }
        if !problems.is_empty() {
            failures.push(format!("{}: {}", row.name, problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "fixture rows failed:\n  {}", failures.join("\n  "));
}

/// Userspace predicts the member for every flow; the kernel agrees on many.
#[test]
fn kernel_and_userspace_pick_the_same_member() {
    let mut dp = seeded_dataplane();
    for qp in 0..256u32 {
        let frame = build_roce_frame(&roce_v4(DST4, 64, qp));
        let run = test_run(&mut dp, &frame).unwrap();
        assert_eq!(run.action, XDP_REDIRECT);
        let predicted = predicted_member(key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp);
        assert_eq!(run.output[0..6], members()[predicted].dst_mac, "qp {qp}");
    }
}

/// Member counters record exactly what was forwarded, per member.
#[test]
fn member_counters_follow_the_hash() {
    let mut dp = seeded_dataplane();
    let mut expected = [0u64; 4];
    for qp in 0..64u32 {
        let frame = build_roce_frame(&roce_v4(DST4, 64, qp));
        test_run(&mut dp, &frame).unwrap();
        expected[predicted_member(key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)] += 1;
    }
    for (position, want) in expected.iter().enumerate() {
        let got = dp.maps.member_stats(QP_GROUP, position as u32).unwrap();
        assert_eq!(got.packets, *want, "member {position}");
    }
    assert!(expected.iter().all(|n| *n > 0), "64 QPs should reach all 4 members: {expected:?}");
}

/// An empty group hands traffic to the kernel instead of dropping it.
#[test]
fn empty_group_passes_to_kernel() {
    let mut dp = seeded_dataplane();
    dp.maps.publish_group(QP_GROUP, HashMode::Qp, &[]).unwrap();
    let frame = build_roce_frame(&roce_v4(DST4, 64, 5));
    let run = test_run(&mut dp, &frame).unwrap();
    assert_eq!(run.action, XDP_PASS);
    assert_eq!(run.output, frame);
    assert_eq!(dp.maps.port_counter(PORT_SLOT, PortCounter::PassNoMember).unwrap(), 1);
}
