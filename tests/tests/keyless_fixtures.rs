//! BPF_PROG_TEST_RUN tests of the keyless flowlet table (`flowlet_table =
//! "keyless"`): a hash-indexed slot array with no key compare, so flows in
//! one slot share its flowlet. A 2-slot table makes collisions certain.

use rocev2_common::{
    bth::{opcode, Bth},
    counters::PortCounter,
    ecn::ECT0,
    flowlet::FlowletChoice,
    hash::HashMode,
    maps::{FLOWLET_KEYLESS, POLICY_FLOWLET},
};
use rocev2_tests::{
    fixture::{bth, loopback_dataplane, members, roce_spec, sync_routes, DST4, PORT_SLOT, SRC4},
    test_run, XDP_REDIRECT,
};
use rocev2_user::{
    dataplane::{Dataplane, GroupPolicy},
    packet::{build_roce_frame, parse_roce, RoceFrameSpec},
};

const GROUP: u32 = 0;

/// A keyless flowlet group of the fixture's four members with `slots` slots.
fn keyless(gap_ns: u64, slots: u32) -> Dataplane {
    let policy = GroupPolicy {
        policy: POLICY_FLOWLET,
        flowlet_gap_ns: gap_ns,
        flowlet_choice: FlowletChoice::Rehash as u32,
        flowlet_flags: FLOWLET_KEYLESS,
        flowlet_slot_mask: slots - 1,
        ..GroupPolicy::hash(HashMode::Qp)
    };
    let mut dp = loopback_dataplane();
    dp.maps.publish_group_with(GROUP, &policy, &members()).unwrap();
    sync_routes(&mut dp, &[("10.1.0.0/16", GROUP)]);
    dp
}

/// The member (last MAC byte) a WRITE_ONLY of `qp` is forwarded to.
fn member_for(dp: &mut Dataplane, qp: u32, psn: u32) -> u8 {
    let bth = Bth { ack_req: false, ..bth(opcode::WRITE_ONLY, qp, psn) };
    let input = build_roce_frame(&RoceFrameSpec {
        ecn: ECT0,
        payload_len: 256,
        ..roce_spec(SRC4.into(), DST4.into(), 64, bth)
    });
    let run = test_run(dp, &input).unwrap();
    assert_eq!(run.action, XDP_REDIRECT, "forwarded");
    let out = parse_roce(&run.output).unwrap();
    assert!(out.icrc_ok);
    out.dst_mac[5]
}

fn port(dp: &Dataplane, c: PortCounter) -> u64 {
    dp.maps.port_counter(PORT_SLOT, c).unwrap()
}

#[test]
fn flows_sharing_a_slot_share_its_member_and_count_collisions() {
    // A 10 s gap: nothing goes idle during the test.
    let mut dp = keyless(10_000_000_000, 2);
    let firsts: Vec<u8> = (0..32u32).map(|qp| member_for(&mut dp, qp, 0)).collect();
    // Two slots, so at most two flowlets and two members for 32 flows.
    assert_eq!(port(&dp, PortCounter::FlowletNew), 2, "one flowlet per slot");
    let distinct: std::collections::BTreeSet<u8> = firsts.iter().copied().collect();
    assert!(distinct.len() <= 2, "32 flows in 2 slots use at most 2 members: {distinct:?}");
    // Every packet after a slot's first found it live for the previous flow.
    assert_eq!(port(&dp, PortCounter::FlowletCollisions), 30);
    assert_eq!(port(&dp, PortCounter::FlowletInserted), 0, "no map insert ever");
    assert_eq!(dp.maps.flowlet_entries(), 0, "the keyed table stays empty");
    // Within the gap every flow keeps its member.
    for (qp, first) in firsts.iter().enumerate() {
        assert_eq!(member_for(&mut dp, qp as u32, 1), *first, "qp {qp}");
    }
    assert_eq!(port(&dp, PortCounter::FlowletNew), 2);
}

#[test]
fn a_flow_alone_in_its_slot_keeps_its_member_then_moves_after_the_gap() {
    let mut dp = keyless(10_000_000_000, 4096);
    let first = member_for(&mut dp, 9, 0);
    for psn in 1..20 {
        assert_eq!(member_for(&mut dp, 9, psn), first);
    }
    assert_eq!(port(&dp, PortCounter::FlowletNew), 1);
    assert_eq!(port(&dp, PortCounter::FlowletCollisions), 0, "its own slot is no collision");

    // A 1 ns gap: every packet starts a new flowlet and re-hashes.
    let mut dp = keyless(1, 2);
    let seen: std::collections::BTreeSet<u8> = (0..64).map(|psn| member_for(&mut dp, 9, psn)).collect();
    assert_eq!(port(&dp, PortCounter::FlowletNew), 64);
    assert!(seen.len() >= 3, "re-hashed flowlets use several members: {seen:?}");
    assert!(port(&dp, PortCounter::FlowletMoved) >= 10);
    assert_eq!(port(&dp, PortCounter::FlowletCollisions), 0, "an idle slot is no collision");
}
