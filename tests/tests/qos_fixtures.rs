//! BPF_PROG_TEST_RUN tests for issue 3's decisions: priority classes, ECN
//! marking against a seeded virtual queue, flowlets and pinned paths.
//! Outputs are checked with an independent decoder (packet::parse_roce:
//! IPv4 checksum, ICRC) and byte-for-byte outside the rewritten fields.

use std::net::{IpAddr, Ipv4Addr};

use rocev2_common::{
    bth::{opcode, Bth},
    class::{add_opcode, ClassEntry, CLASS_ECN_EXEMPT, CLASS_MATCH_OPCODE, CLASS_MATCH_PAYLOAD, CLASS_SET_DSCP},
    counters::{EgressCounter, PortCounter},
    ecn::{EcnProfile, VirtualQueue, CE, ECT0, NOT_ECT, NO_PROFILE, PROFILE_DROP_NOT_ECT},
    flowlet::FlowletChoice,
    hash::HashMode,
    maps::{PinEntry, FLOWLET_AT_BOUNDARY, PIN_MEMBER_DOWN, POLICY_FLOWLET, POLICY_PINNED},
};
use rocev2_tests::{
    fixture::{
        add_loopback_port, bth, dst6, loopback_dataplane, members, roce_spec, src6, sync_routes, DST4, LOOPBACK,
        PORT_SLOT, SRC4,
    },
    require_root, test_run, XDP_DROP, XDP_REDIRECT,
};
use rocev2_user::{
    control::config::Prefix,
    control::dataplane::{Dataplane, GroupPolicy},
    tools::packet::{build_roce_frame, invariant_bytes_equal, parse_roce, RoceFrameSpec},
};

const EGRESS_SLOT: u32 = 0;
const GROUP: u32 = 0;
const KMIN: u64 = 10_000;
const KMAX: u64 = 20_000;

/// One port, one group of the fixture's four members over lo, a route for
/// 10.1.0.0/16 and fd01::/64; no hash seed.
fn dataplane(policy: GroupPolicy) -> Dataplane {
    let mut dp = loopback_dataplane();
    dp.maps.publish_group_with(GROUP, &policy, &members()).unwrap();
    sync_routes(&mut dp, &[("10.1.0.0/16", GROUP), ("fd01::/64", GROUP)]);
    dp
}

/// A marking profile on lo's egress: 10 kB / 20 kB / 100 %.
fn with_ecn(dp: &mut Dataplane, flags: u32) {
    let profile = EcnProfile { kmin_bytes: KMIN, kmax_bytes: KMAX, pmax_scaled: u32::MAX, flags };
    dp.maps.set_ecn_profile(0, profile).unwrap();
    // 1 byte per second: the queue does not drain during a test.
    dp.maps.set_egress(LOOPBACK, EGRESS_SLOT, 1, 0).unwrap();
}

fn seed_queue(dp: &mut Dataplane, depth: u64) {
    let now = monotonic_ns();
    dp.maps
        .set_virtual_queue(
            EGRESS_SLOT,
            VirtualQueue { depth_bytes: depth, last_update_ns: now, high_water_bytes: depth },
        )
        .unwrap();
}

/// CLOCK_MONOTONIC, the clock bpf_ktime_get_ns reads.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// From 10.0.0.1 to 10.1.0.1 (or fd00::1 to fd01::1), TTL 64, DSCP 26,
/// UDP sport 0xC000, AckReq clear.
fn frame(op: u8, qp: u32, psn: u32, ecn: u8, payload_len: usize, v6: bool) -> Vec<u8> {
    let (src, dst): (IpAddr, IpAddr) = if v6 { (src6().into(), dst6().into()) } else { (SRC4.into(), DST4.into()) };
    let bth = Bth { ack_req: false, ..bth(op, qp, psn) };
    build_roce_frame(&RoceFrameSpec { ecn, payload_len, ..roce_spec(src, dst, 64, bth) })
}

fn write(qp: u32, ecn: u8) -> Vec<u8> {
    frame(opcode::WRITE_ONLY, qp, 1, ecn, 1024, false)
}

/// Forwards `input` and checks the output is a valid RoCEv2 frame whose
/// ICRC-covered bytes are untouched; returns the decoded output.
fn forward(dp: &mut Dataplane, input: &[u8]) -> rocev2_user::tools::packet::ParsedRoce {
    let run = test_run(dp, input).unwrap();
    assert_eq!(
        run.action,
        XDP_REDIRECT,
        "forwarded ({}); pass counters: {:?}",
        rocev2_tests::action_name(run.action),
        dp.maps.port_counters(PORT_SLOT).unwrap().into_iter().filter(|(_, v)| *v > 0).collect::<Vec<_>>()
    );
    assert!(invariant_bytes_equal(input, &run.output), "ICRC-covered bytes unchanged");
    let out = parse_roce(&run.output).unwrap();
    assert!(out.icrc_ok, "ICRC still valid");
    assert_ne!(out.ipv4_checksum_ok, Some(false), "IPv4 checksum valid");
    out
}

fn egress(dp: &Dataplane, c: EgressCounter) -> u64 {
    dp.maps.egress_counter(EGRESS_SLOT, c).unwrap()
}

fn port(dp: &Dataplane, c: PortCounter) -> u64 {
    dp.maps.port_counter(PORT_SLOT, c).unwrap()
}

#[test]
fn below_kmin_nothing_is_marked() {
    let mut dp = dataplane(GroupPolicy::hash(HashMode::Qp));
    with_ecn(&mut dp, 0);
    seed_queue(&mut dp, 0);
    let out = forward(&mut dp, &write(1, ECT0));
    assert_eq!(out.ecn, ECT0);
    assert_eq!(egress(&dp, EgressCounter::EctSeen), 1);
    assert_eq!(egress(&dp, EgressCounter::Marked), 0);
}

#[test]
fn above_kmax_ect_is_marked_ce_with_valid_checksum() {
    for v6 in [false, true] {
        let mut dp = dataplane(GroupPolicy::hash(HashMode::Qp));
        with_ecn(&mut dp, 0);
        seed_queue(&mut dp, KMAX + 1);
        let out = forward(&mut dp, &frame(opcode::WRITE_ONLY, 1, 1, ECT0, 1024, v6));
        assert_eq!(out.ecn, CE, "v6={v6}");
        assert_eq!(out.dscp, 26, "DSCP kept");
        assert_eq!(egress(&dp, EgressCounter::Marked), 1);
        let q = dp.maps.virtual_queue(EGRESS_SLOT).unwrap();
        assert!(q.depth_bytes > KMAX && q.high_water_bytes >= q.depth_bytes, "queue grew: {q:?}");
    }
}

#[test]
fn between_kmin_and_kmax_marking_follows_the_probability() {
    let mut dp = dataplane(GroupPolicy::hash(HashMode::Qp));
    // pmax 100 % halfway: about half of the packets are marked.
    with_ecn(&mut dp, 0);
    let mut marked = 0;
    for _ in 0..400 {
        seed_queue(&mut dp, (KMIN + KMAX) / 2);
        if forward(&mut dp, &write(1, ECT0)).ecn == CE {
            marked += 1;
        }
    }
    // The packet's own ~1 kB pushes the depth to ~60 % of the span.
    assert!((160..=320).contains(&marked), "{marked} of 400 marked");
}

#[test]
fn not_ect_is_counted_not_marked_or_dropped_by_policy() {
    let mut dp = dataplane(GroupPolicy::hash(HashMode::Qp));
    with_ecn(&mut dp, 0);
    seed_queue(&mut dp, KMAX + 1);
    let out = forward(&mut dp, &write(1, NOT_ECT));
    assert_eq!(out.ecn, NOT_ECT);
    assert_eq!(egress(&dp, EgressCounter::NotEctOverThreshold), 1);

    let mut dp = dataplane(GroupPolicy::hash(HashMode::Qp));
    with_ecn(&mut dp, PROFILE_DROP_NOT_ECT);
    seed_queue(&mut dp, KMAX + 1);
    let run = test_run(&mut dp, &write(1, NOT_ECT)).unwrap();
    assert_eq!(run.action, XDP_DROP);
    assert_eq!(port(&dp, PortCounter::DropNotEct), 1);
}

fn control_class(set_dscp: u32) -> ClassEntry {
    let mut c =
        ClassEntry { flags: CLASS_MATCH_OPCODE | CLASS_SET_DSCP | CLASS_ECN_EXEMPT, set_dscp, ..Default::default() };
    add_opcode(&mut c.opcodes, opcode::ACK);
    add_opcode(&mut c.opcodes, opcode::CNP);
    c
}

fn cts_class(set_dscp: u32) -> ClassEntry {
    let mut c = ClassEntry {
        flags: CLASS_MATCH_OPCODE | CLASS_MATCH_PAYLOAD | CLASS_SET_DSCP,
        set_dscp,
        max_payload: 64,
        ..Default::default()
    };
    add_opcode(&mut c.opcodes, opcode::WRITE_ONLY_IMM);
    c
}

#[test]
fn classes_rewrite_dscp_and_exempt_control_from_marking() {
    let mut dp = dataplane(GroupPolicy::hash(HashMode::Qp));
    with_ecn(&mut dp, 0);
    dp.maps.set_classes(&[control_class(48), cts_class(46)]).unwrap();
    seed_queue(&mut dp, KMAX + 1);
    // ACK and CNP: DSCP 48, never marked even above kmax.
    for op in [opcode::ACK, opcode::CNP] {
        let out = forward(&mut dp, &frame(op, 7, 1, ECT0, 16, false));
        assert_eq!((out.dscp, out.ecn), (48, ECT0), "opcode {op:#x}");
    }
    assert_eq!(egress(&dp, EgressCounter::Exempt), 2);
    assert_eq!(dp.maps.class_stats(0).unwrap().packets, 2);
    // A CTS-like zero-length WRITE with immediate (RETH 16 + imm 4 bytes).
    let out = forward(&mut dp, &frame(opcode::WRITE_ONLY_IMM, 7, 2, ECT0, 20, false));
    assert_eq!(out.dscp, 46);
    assert_eq!(out.ecn, CE, "the CTS class is not exempt");
    // The same opcode with a big payload is data, not CTS.
    let out = forward(&mut dp, &frame(opcode::WRITE_ONLY_IMM, 7, 3, ECT0, 2048, false));
    assert_eq!(out.dscp, 26);
    assert_eq!(dp.maps.class_stats(1).unwrap().packets, 1);
    // IPv6 traffic class rewrite.
    let out = forward(&mut dp, &frame(opcode::ACK, 7, 4, ECT0, 16, true));
    assert_eq!((out.dscp, out.ecn), (48, ECT0));
}

#[test]
fn no_egress_config_means_no_marking() {
    let mut dp = dataplane(GroupPolicy::hash(HashMode::Qp));
    dp.maps.set_egress(LOOPBACK, EGRESS_SLOT, 1, NO_PROFILE).unwrap();
    seed_queue(&mut dp, KMAX * 10);
    assert_eq!(forward(&mut dp, &write(1, ECT0)).ecn, ECT0);
    assert_eq!(egress(&dp, EgressCounter::TxPackets), 1);
}

fn flowlet(gap_ns: u64, flags: u32) -> GroupPolicy {
    GroupPolicy {
        policy: POLICY_FLOWLET,
        flowlet_gap_ns: gap_ns,
        flowlet_choice: FlowletChoice::Rehash as u32,
        flowlet_flags: flags,
        ..GroupPolicy::hash(HashMode::Qp)
    }
}

fn member_of(out: &rocev2_user::tools::packet::ParsedRoce) -> u8 {
    out.dst_mac[5]
}

#[test]
fn flowlet_keeps_a_flow_within_the_gap() {
    let mut dp = dataplane(flowlet(10_000_000_000, 0));
    let first = member_of(&forward(&mut dp, &write(9, ECT0)));
    for psn in 0..50 {
        assert_eq!(member_of(&forward(&mut dp, &frame(opcode::WRITE_MIDDLE, 9, psn, ECT0, 512, false))), first);
    }
    assert_eq!(port(&dp, PortCounter::FlowletNew), 1);
    assert_eq!(port(&dp, PortCounter::FlowletInserted), 1);
    assert_eq!(dp.maps.flowlet_entries(), 1);
}

#[test]
fn flowlet_moves_after_an_idle_gap() {
    // A 1 ns gap: every packet starts a new flowlet and re-hashes.
    let mut dp = dataplane(flowlet(1, 0));
    let mut seen = std::collections::BTreeSet::new();
    for psn in 0..64 {
        seen.insert(member_of(&forward(&mut dp, &frame(opcode::WRITE_ONLY, 9, psn, ECT0, 64, false))));
    }
    assert_eq!(port(&dp, PortCounter::FlowletNew), 64);
    assert!(seen.len() >= 3, "re-hashed flowlets use several members: {seen:?}");
    assert!(port(&dp, PortCounter::FlowletMoved) >= 10);
}

#[test]
fn flowlet_boundary_rule_never_splits_a_message() {
    let mut dp = dataplane(flowlet(1, FLOWLET_AT_BOUNDARY));
    for message in 0..16u32 {
        let ops = [opcode::WRITE_FIRST, opcode::WRITE_MIDDLE, opcode::WRITE_MIDDLE, opcode::WRITE_LAST];
        let members: Vec<u8> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| member_of(&forward(&mut dp, &frame(*op, 9, message * 4 + i as u32, ECT0, 256, false))))
            .collect();
        assert!(members.iter().all(|m| *m == members[0]), "message {message} split: {members:?}");
    }
    assert_eq!(port(&dp, PortCounter::FlowletNew), 16, "one new flowlet per message");
}

#[test]
fn pins_win_and_fall_back_when_the_member_is_down() {
    let policy = GroupPolicy { policy: POLICY_PINNED, ..GroupPolicy::hash(HashMode::Qp) };
    let mut dp = dataplane(policy);
    let generation = dp.maps.group(GROUP).unwrap().generation;
    let prefix = Prefix::V4 { addr: Ipv4Addr::new(10, 1, 0, 1), len: 32 };
    dp.maps.set_pin(&prefix, 0x42, PinEntry { group: GROUP, position: 3, generation, _reserved: 0 }).unwrap();
    for psn in 0..8 {
        assert_eq!(member_of(&forward(&mut dp, &frame(opcode::WRITE_ONLY, 0x42, psn, ECT0, 64, false))), 3);
    }
    assert_eq!(port(&dp, PortCounter::PinHit), 8);
    forward(&mut dp, &write(0x43, ECT0));
    assert_eq!(port(&dp, PortCounter::PinFallback), 1, "unpinned QP hashes");
    dp.maps
        .set_pin(&prefix, 0x42, PinEntry { group: GROUP, position: PIN_MEMBER_DOWN, generation, _reserved: 0 })
        .unwrap();
    forward(&mut dp, &write(0x42, ECT0));
    assert_eq!(port(&dp, PortCounter::PinFallback), 2, "pinned member down: hash instead");
}

#[test]
fn a_full_flowlet_table_evicts_the_stalest_flows_and_keeps_forwarding() {
    require_root();
    // A 16-flow table and 200 flows: LRU eviction, never a refused packet.
    let mut dp = Dataplane::load_with(None, 16).expect("load");
    add_loopback_port(&mut dp);
    dp.maps.publish_group_with(GROUP, &flowlet(10_000_000_000, 0), &members()).unwrap();
    sync_routes(&mut dp, &[("10.1.0.0/16", GROUP)]);
    for qp in 0..200u32 {
        forward(&mut dp, &write(qp, ECT0));
    }
    assert_eq!(port(&dp, PortCounter::Forwarded), 200, "every packet forwarded");
    assert_eq!(port(&dp, PortCounter::FlowletInserted), 200);
    let live = dp.maps.flowlet_entries() as u64;
    assert!(live <= 32, "the table holds about its size, not {live}");
    // What `rocev2 stats` reports as evictions: inserted - present.
    assert!(200 - live >= 168, "evictions are visible: {}", 200 - live);
}

/// Ports and egress queues are found by array index for ifindexes below
/// MAX_DIRECT_IFINDEX and through the PORTS / EGRESS hash maps above it.
/// Both paths, in a namespace with veths at chosen ifindexes:
/// the ingress port's counters land in its slot and the egress port's
/// queue marks CE.
#[test]
fn large_and_small_ifindexes_find_their_port_and_egress_queue() {
    use aya::{programs::TestRun as _, TestRunOptions};
    use rocev2_common::maps::MAX_DIRECT_IFINDEX;
    use rocev2_user::{
        control::dataplane::{MemberSpec, XDP_PROGRAM},
        sys::netns::{in_netns_scoped, unique_name, Netns},
    };
    require_root();
    let ns = Netns::create(&unique_name("ifx")).unwrap();
    let big = MAX_DIRECT_IFINDEX + 3_616; // 20,000
                                          // Each device is one end of a veth whose other end gets index + 100.
    for (name, index) in [("in_big", big), ("out_big", big + 1), ("in_small", 7), ("out_small", 8)] {
        let (index, peer) = (index.to_string(), (index + 100).to_string());
        ns.exec(&[
            "ip",
            "link",
            "add",
            name,
            "index",
            &index,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{name}_p"),
            "index",
            &peer,
        ])
        .unwrap();
        ns.exec(&["ip", "link", "set", name, "up"]).unwrap();
    }
    for (ingress, egress, port_slot, egress_slot) in [(big, big + 1, 5, 3), (7, 8, 6, 4)] {
        let mut dp = Dataplane::load(None).unwrap();
        dp.maps.set_port(ingress, port_slot).unwrap();
        let members = [MemberSpec { ifindex: egress, src_mac: [2, 0, 0, 0, 0, 1], dst_mac: [2, 0, 0, 0, 0, 2] }];
        dp.maps.publish_group_with(GROUP, &GroupPolicy::hash(HashMode::Qp), &members).unwrap();
        sync_routes(&mut dp, &[("10.1.0.0/16", GROUP)]);
        dp.maps
            .set_ecn_profile(0, EcnProfile { kmin_bytes: KMIN, kmax_bytes: KMAX, pmax_scaled: u32::MAX, flags: 0 })
            .unwrap();
        dp.maps.set_egress(egress, egress_slot, 1, 0).unwrap();
        let now = monotonic_ns();
        dp.maps
            .set_virtual_queue(
                egress_slot,
                VirtualQueue { depth_bytes: KMAX + 1, last_update_ns: now, high_water_bytes: KMAX + 1 },
            )
            .unwrap();
        let input = write(1, ECT0);
        let output = in_netns_scoped(ns.name(), || {
            // Device-map entries and the test run's ingress device resolve
            // ifindexes in the caller's namespace.
            dp.maps.add_egress_dev(egress)?;
            // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
            let ctx: Vec<u8> = [0, input.len() as u32, 0, ingress, 0, 0].iter().flat_map(|w| w.to_ne_bytes()).collect();
            let mut out = vec![0u8; input.len() + 256];
            let r = dp.xdp_program(XDP_PROGRAM)?.test_run(TestRunOptions {
                data_in: Some(&input),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                ..Default::default()
            })?;
            assert_eq!(r.return_value, XDP_REDIRECT, "ifindex {ingress} -> {egress}");
            out.truncate(r.data_size_out as usize);
            Ok(out)
        })
        .unwrap();
        assert_eq!(
            dp.maps.port_counter(port_slot, PortCounter::RxPackets).unwrap(),
            1,
            "ingress {ingress} counted in slot {port_slot}"
        );
        assert_eq!(dp.maps.port_counter(0, PortCounter::RxPackets).unwrap(), 0, "nothing in the unregistered slot");
        assert_eq!(parse_roce(&output).unwrap().ecn, CE, "egress {egress} queue found and marking");
        assert_eq!(dp.maps.egress_counter(egress_slot, EgressCounter::Marked).unwrap(), 1);
        dp.maps.remove_egress(egress);
        dp.maps.remove_port(ingress);
    }
}
