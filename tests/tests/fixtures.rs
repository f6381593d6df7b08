//! BPF_PROG_TEST_RUN fixture table for the XDP forwarding program.
//!
//! Each row: an input frame, the expected action, the counter that must
//! record it, and the expected output bytes. Forwarded rows predict the
//! group member with rocev2-common's hash (the same code the kernel runs)
//! and build the expected frame independently: new MACs, TTL/hop limit
//! minus one and an IPv4 checksum recomputed from scratch.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rocev2_common::{
    bth::opcode,
    counters::PortCounter,
    features::Features,
    hash::{FlowKey, HashMode},
    maps::GroupEntry,
};
use rocev2_tests::{
    action_name,
    fixture::{
        bth, dst6, expected_forward, fix_ipv4_checksum, leaf_member, members, roce_spec, seeded_dataplane,
        seeded_dataplane_with, src6, with_ipv4_options, DST4, DST4_FIVE_TUPLE, HOST_MAC, LOCAL4, PORT_MAC, PORT_SLOT,
        QP_GROUP, SRC4, UNROUTED4,
    },
    test_run, XDP_DROP, XDP_PASS, XDP_REDIRECT,
};
use rocev2_user::{
    control::dataplane::Dataplane,
    tools::packet::{build_roce_frame, build_tcp_frame, build_udp_frame, PlainFrameSpec, RoceFrameSpec},
};

// The seeded leaf (tests/src/fixture.rs): routes 10.1.0.0/16 and fd01::/64
// to the `qp` group, 10.2.0.0/16 to the `five-tuple` group, 10.0.0.254 and
// fd00::fe local; four members; seed 1234.

/// WRITE_ONLY, PSN 0x1234, from the host: DSCP 26, ECT(0), UDP sport 0xC000, 64 bytes.
fn roce(src: IpAddr, dst: IpAddr, ttl: u8, dest_qp: u32) -> RoceFrameSpec {
    roce_spec(src, dst, ttl, bth(opcode::WRITE_ONLY, dest_qp, 0x00_1234))
}

fn roce_v4(dst: Ipv4Addr, ttl: u8, dest_qp: u32) -> RoceFrameSpec {
    roce(SRC4.into(), dst.into(), ttl, dest_qp)
}

fn plain_v4(dst: Ipv4Addr, src_port: u16, dst_port: u16, payload_len: usize) -> PlainFrameSpec {
    roce_v4(dst, 64, 0).plain(src_port, dst_port, payload_len)
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
        expect: Expect::Forwarded(leaf_member(&key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)),
    });
    let v6_key = FlowKey::v6(src6().octets(), dst6().octets(), 17, 0xC000, 4791).with_dest_qp(qp);
    rows.push(Row {
        name: "IPv6 RoCE WRITE_ONLY, qp group",
        frame: build_roce_frame(&roce(src6().into(), dst6().into(), 64, qp)),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(leaf_member(&v6_key, HashMode::Qp)),
    });
    let mut tagged = roce_v4(DST4, 64, qp);
    tagged.vlan = Some(100);
    rows.push(Row {
        name: "VLAN-tagged IPv4 RoCE keeps its tag",
        frame: build_roce_frame(&tagged),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(leaf_member(&key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)),
    });
    for qp in [1u32, 2, 3, 0xFF_FFFF] {
        rows.push(Row {
            name: "IPv4 RoCE in a five-tuple group ignores the QP",
            frame: build_roce_frame(&roce_v4(DST4_FIVE_TUPLE, 64, qp)),
            action: XDP_REDIRECT,
            counter: PortCounter::ForwardedRoce,
            expect: Expect::Forwarded(leaf_member(&key_v4(DST4_FIVE_TUPLE, 17, 0xC000, 4791), HashMode::FiveTuple)),
        });
    }
    rows.push(Row {
        name: "non-RoCE UDP hashes on the five-tuple",
        frame: build_udp_frame(&plain_v4(DST4, 40000, 5000, 32)),
        action: XDP_REDIRECT,
        counter: PortCounter::Forwarded,
        expect: Expect::Forwarded(leaf_member(&key_v4(DST4, 17, 40000, 5000), HashMode::Qp)),
    });
    rows.push(Row {
        name: "TCP hashes on the five-tuple",
        frame: build_tcp_frame(&plain_v4(DST4, 40001, 443, 32)),
        action: XDP_REDIRECT,
        counter: PortCounter::Forwarded,
        expect: Expect::Forwarded(leaf_member(&key_v4(DST4, 6, 40001, 443), HashMode::Qp)),
    });
    rows.push(Row {
        name: "truncated BTH: forwarded on the five-tuple, counted",
        frame: build_udp_frame(&plain_v4(DST4, 0xC000, 4791, 6)),
        action: XDP_REDIRECT,
        counter: PortCounter::RoceShortBth,
        expect: Expect::Forwarded(leaf_member(&key_v4(DST4, 17, 0xC000, 4791), HashMode::Qp)),
    });
    rows.push(Row {
        name: "TTL 2 is forwarded with TTL 1",
        frame: build_roce_frame(&roce_v4(DST4, 2, qp)),
        action: XDP_REDIRECT,
        counter: PortCounter::ForwardedRoce,
        expect: Expect::Forwarded(leaf_member(&key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)),
    });

    // --- to the kernel stack ---------------------------------------------
    let pass = |name, frame, counter| Row { name, frame, action: XDP_PASS, counter, expect: Expect::Unchanged };
    rows.push(pass(
        "TTL 1 goes to the kernel for ICMP",
        build_roce_frame(&roce_v4(DST4, 1, qp)),
        PortCounter::PassTtlExpired,
    ));
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
    rows.push(pass(
        "IPv4 with options (4 NOPs), RoCE",
        with_nop_options(build_roce_frame(&roce_v4(DST4, 64, qp))),
        PortCounter::PassIpv4Options,
    ));
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
    fix_ipv4_checksum(&mut long_total);
    rows.push(drop("IPv4 total length beyond the frame", long_total, PortCounter::DropBadIpHeader));
    let mut truncated_ip = build_roce_frame(&roce_v4(DST4, 64, qp));
    truncated_ip.truncate(14 + 12);
    rows.push(drop("IPv4 header cut short by the frame", truncated_ip, PortCounter::DropBadIpHeader));
    let mut bad_checksum = build_roce_frame(&roce_v4(DST4, 64, qp));
    bad_checksum[24] ^= 0x01;
    rows.push(drop("IPv4 header checksum off by one bit", bad_checksum, PortCounter::DropBadIpv4Checksum));
    rows
}

/// Inserts four NOP option bytes (IHL 6) and fixes lengths and checksum.
fn with_nop_options(frame: Vec<u8>) -> Vec<u8> {
    with_ipv4_options(frame, &[1, 1, 1, 1])
}

fn ipv4_fragment(frags: u16) -> Vec<u8> {
    let mut frame = build_udp_frame(&plain_v4(DST4, 0xC000, 4791, 64));
    frame[20..22].copy_from_slice(&frags.to_be_bytes());
    fix_ipv4_checksum(&mut frame);
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
    fix_ipv4_checksum(&mut frame);
    frame
}

#[test]
fn fixture_table() {
    // Every row, with every feature loaded and with the plain hashing
    // program (`rocev2 run`'s load for a config without flowlet, pinned,
    // ECN or classes): the verifier's removal of feature code changes
    // nothing for these packets.
    let mut failures = Vec::new();
    for (features, label) in [(Features::ALL, "all features"), (Features::COUNTERS, "counters only")] {
        let mut dp = seeded_dataplane_with(features);
        fixture_rows(&mut dp, label, &mut failures);
    }
    assert!(failures.is_empty(), "fixture rows failed:\n  {}", failures.join("\n  "));
}

fn fixture_rows(dp: &mut Dataplane, label: &str, failures: &mut Vec<String>) {
    for row in rows() {
        let before_rx = dp.maps.port_counter(PORT_SLOT, PortCounter::RxPackets).unwrap();
        let before = dp.maps.port_counter(PORT_SLOT, row.counter).unwrap();
        let run = test_run(dp, &row.frame).unwrap();
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
            failures.push(format!("{} ({label}): {}", row.name, problems.join("; ")));
        }
    }
}

/// Userspace predicts the member for every flow; the kernel agrees on many.
#[test]
fn kernel_and_userspace_pick_the_same_member() {
    let mut dp = seeded_dataplane(&[]);
    for qp in 0..256u32 {
        let frame = build_roce_frame(&roce_v4(DST4, 64, qp));
        let run = test_run(&mut dp, &frame).unwrap();
        assert_eq!(run.action, XDP_REDIRECT);
        let predicted = leaf_member(&key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp);
        assert_eq!(run.output[0..6], members()[predicted].dst_mac, "qp {qp}");
    }
}

/// Member counters record exactly what was forwarded, per member.
#[test]
fn member_counters_follow_the_hash() {
    let mut dp = seeded_dataplane(&[]);
    let mut expected = [0u64; 4];
    for qp in 0..64u32 {
        let frame = build_roce_frame(&roce_v4(DST4, 64, qp));
        test_run(&mut dp, &frame).unwrap();
        expected[leaf_member(&key_v4(DST4, 17, 0xC000, 4791).with_dest_qp(qp), HashMode::Qp)] += 1;
    }
    for (position, want) in expected.iter().enumerate() {
        let got = dp.maps.member_stats(QP_GROUP, position as u32).unwrap();
        assert_eq!(got.packets, *want, "member {position}");
    }
    assert!(expected.iter().all(|n| *n > 0), "64 QPs should reach all 4 members: {expected:?}");
}

/// A publish switches a group with one in-place copy of its entry, which
/// the program reads field by field: a packet in flight can see the new
/// bank with the old member count or the old bank with the new count.
/// Every such mix, for a member leaving and for one coming back, still
/// forwards to a member (none goes to the kernel as `pass_no_member`).
#[test]
fn a_half_updated_group_entry_still_forwards() {
    let four = members();
    let mut dp = seeded_dataplane(&[]);
    for (list, what) in [
        (&four[..3], "a member leaves"),
        (&four[..], "it comes back"),
        (&four[..2], "two leave"),
        (&four[..], "both come back"),
    ] {
        let old = dp.maps.group(QP_GROUP).unwrap();
        dp.maps.publish_group(QP_GROUP, HashMode::Qp, list).unwrap();
        let new = dp.maps.group(QP_GROUP).unwrap();
        assert_ne!(old.bank, new.bank, "{what}: a publish switches banks");
        for torn in [GroupEntry { member_count: old.member_count, ..new }, GroupEntry { bank: old.bank, ..new }] {
            dp.maps.set_group_entry(QP_GROUP, torn).unwrap();
            for qp in 0..256 {
                let run = test_run(&mut dp, &build_roce_frame(&roce_v4(DST4, 64, 0x100 + qp))).unwrap();
                assert_eq!(run.action, XDP_REDIRECT, "{what}: QP {qp} with {torn:?} gave {}", action_name(run.action));
            }
        }
        dp.maps.set_group_entry(QP_GROUP, new).unwrap();
    }
    assert_eq!(dp.maps.port_counter(PORT_SLOT, PortCounter::PassNoMember).unwrap(), 0);
}

/// An empty group hands traffic to the kernel instead of dropping it.
#[test]
fn empty_group_passes_to_kernel() {
    let mut dp = seeded_dataplane(&[]);
    dp.maps.publish_group(QP_GROUP, HashMode::Qp, &[]).unwrap();
    let frame = build_roce_frame(&roce_v4(DST4, 64, 5));
    let run = test_run(&mut dp, &frame).unwrap();
    assert_eq!(run.action, XDP_PASS);
    assert_eq!(run.output, frame);
    assert_eq!(dp.maps.port_counter(PORT_SLOT, PortCounter::PassNoMember).unwrap(), 1);
}

/// The per-CPU route cache never outlives a route change: a destination
/// cached as routed follows the route to `local`, to unrouted and back,
/// and two destinations that share a cache slot each get their own route.
#[test]
fn route_changes_take_effect_for_cached_destinations() {
    use rocev2_common::maps::{route_cache_slot, ROUTE_LOCAL};
    use rocev2_tests::fixture::sync_routes;
    // One CPU, so consecutive runs meet the same per-CPU cache.
    let _pin = rocev2_user::tools::gen::CpuPin::new(rocev2_user::tools::gen::allowed_cpus().unwrap()[0]).unwrap();
    let words = |a: Ipv4Addr| rocev2_common::hash::ipv4_words(a.octets());
    // A destination in 10.3.0.0/16 that lands in DST4's cache slot.
    let slot = route_cache_slot(&words(DST4));
    let twin = (0..=u16::MAX)
        .map(|i| Ipv4Addr::new(10, 3, (i >> 8) as u8, i as u8))
        .find(|a| route_cache_slot(&words(*a)) == slot)
        .expect("a colliding address in 10.3.0.0/16");
    let mut dp = seeded_dataplane(&[]);
    let send = |dp: &mut rocev2_user::control::dataplane::Dataplane, dst: Ipv4Addr| {
        test_run(dp, &build_roce_frame(&roce_v4(dst, 64, 0x11))).unwrap().action
    };
    let base: Vec<(&str, u32)> = rocev2_tests::fixture::LEAF_ROUTES.to_vec();
    assert_eq!(send(&mut dp, DST4), XDP_REDIRECT);
    let (cpus, generation) = dp.maps.route_cache(slot).unwrap();
    assert!(
        cpus.iter().any(|e| e.family == 4 && e.dst == words(DST4) && e.route_generation == generation),
        "DST4 cached on the CPU that ran it: {cpus:?}"
    );
    let with = |extra: &[(&'static str, u32)]| base.iter().chain(extra).copied().collect::<Vec<_>>();
    // The cached destination's prefix becomes local, then disappears.
    let local: Vec<_> =
        base.iter().map(|(p, g)| if *p == "10.1.0.0/16" { (*p, ROUTE_LOCAL) } else { (*p, *g) }).collect();
    sync_routes(&mut dp, &local);
    assert_eq!(send(&mut dp, DST4), XDP_PASS, "now local");
    let unrouted: Vec<_> = base.iter().filter(|(p, _)| *p != "10.1.0.0/16").copied().collect();
    sync_routes(&mut dp, &unrouted);
    assert_eq!(send(&mut dp, DST4), XDP_PASS, "now unrouted");
    assert_eq!(dp.maps.port_counter(PORT_SLOT, PortCounter::PassNoRoute).unwrap(), 1);
    assert_eq!(dp.maps.port_counter(PORT_SLOT, PortCounter::PassLocal).unwrap(), 1);
    sync_routes(&mut dp, &with(&[("10.3.0.0/16", ROUTE_LOCAL)]));
    // Alternating colliding destinations: each keeps its own route.
    for _ in 0..3 {
        assert_eq!(send(&mut dp, DST4), XDP_REDIRECT, "routed again");
        assert_eq!(send(&mut dp, twin), XDP_PASS, "{twin} is local");
    }
    assert_eq!(dp.maps.port_counter(PORT_SLOT, PortCounter::PassLocal).unwrap(), 4);
}

/// Re-adding an egress device that is already in the device map (every
/// reload does so for every member) never fails a redirect. The kernel
/// replaces a DEVMAP_HASH entry by unlinking the old node before linking
/// the new one, so when `add_egress_dev` always wrote, a packet forwarded
/// on another CPU in between was dropped (`drop_redirect_failed`; found by
/// `high_rate.rs`). Here one CPU re-adds lo as fast as it can while the
/// other forwards to it for a second.
#[test]
fn re_adding_an_egress_device_never_fails_a_redirect() {
    use rocev2_user::{
        control::dataplane::Maps,
        sys::netns::unique_name,
        tools::gen::{allowed_cpus, CpuPin},
    };
    use std::sync::atomic::{AtomicBool, Ordering};

    let cpus = allowed_cpus().unwrap();
    assert!(cpus.len() >= 2, "needs two CPUs to race a map update against forwarding, has {cpus:?}");
    let pin_dir = std::path::PathBuf::from(format!("/sys/fs/bpf/{}", unique_name("r2dm")));
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveOnDrop(pin_dir.clone());
    let mut dp = rocev2_tests::fixture::seeded_dataplane_pinned(&pin_dir);
    let frame = build_roce_frame(&roce_v4(DST4, 64, 0x11));
    let stop = AtomicBool::new(false);
    let (runs, adds) = std::thread::scope(|s| {
        let adder = s.spawn(|| {
            let _pin = CpuPin::new(cpus[1]).unwrap();
            let mut maps = Maps::open_pinned(&pin_dir).unwrap();
            let mut adds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                maps.add_egress_dev(rocev2_tests::fixture::LOOPBACK).unwrap();
                adds += 1;
            }
            adds
        });
        let _pin = CpuPin::new(cpus[0]).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut runs = 0u64;
        while std::time::Instant::now() < deadline {
            test_run(&mut dp, &frame).unwrap();
            runs += 1;
        }
        stop.store(true, Ordering::Relaxed);
        (runs, adder.join().unwrap())
    });
    let failed = dp.maps.port_counter(PORT_SLOT, PortCounter::DropRedirectFailed).unwrap();
    let forwarded = dp.maps.port_counter(PORT_SLOT, PortCounter::ForwardedRoce).unwrap();
    println!("MEASURED: {runs} packets forwarded while lo was re-added {adds} times: {failed} redirects failed");
    assert!(runs > 10_000 && adds > 10_000, "too little overlap to mean anything: {runs} runs, {adds} adds");
    assert_eq!(failed, 0, "redirects failed while an existing egress device was re-added");
    assert_eq!(forwarded, runs);
}
