//! BPF_PROG_TEST_RUN tests of the keyless flowlet table (`flowlet_table =
//! "keyless"`): a hash-indexed slot array with no key compare, so flows in
//! one slot share its flowlet. A 2-slot table makes collisions certain.

use rocev2_common::{
    bth::{opcode, Bth},
    counters::PortCounter,
    ecn::ECT0,
    features::Features,
    flowlet::FlowletChoice,
    hash::HashMode,
    maps::{DEFAULT_FLOWLET_TABLE_SIZE, FLOWLET_KEYLESS, POLICY_FLOWLET},
};
use rocev2_tests::{
    fixture::{add_loopback_port, bth, loopback_dataplane, members, roce_spec, sync_routes, DST4, PORT_SLOT, SRC4},
    require_root, test_run, XDP_REDIRECT,
};
use rocev2_user::{
    control::dataplane::{Dataplane, GroupPolicy},
    tools::packet::{build_roce_frame, parse_roce, RoceFrameSpec},
};

const GROUP: u32 = 0;

/// A keyless flowlet group of the fixture's four members with `slots` slots.
fn keyless(gap_ns: u64, slots: u32) -> Dataplane {
    with_group(loopback_dataplane(), &keyless_policy(gap_ns, slots))
}

fn keyless_policy(gap_ns: u64, slots: u32) -> GroupPolicy {
    GroupPolicy { flowlet_flags: FLOWLET_KEYLESS, flowlet_slot_mask: slots - 1, ..keyed_policy(gap_ns) }
}

fn keyed_policy(gap_ns: u64) -> GroupPolicy {
    GroupPolicy {
        policy: POLICY_FLOWLET,
        flowlet_gap_ns: gap_ns,
        flowlet_choice: FlowletChoice::Rehash as u32,
        ..GroupPolicy::hash(HashMode::Qp)
    }
}

/// `dp` with [`GROUP`] (the fixture's four members) published with `policy`
/// and routed to.
fn with_group(mut dp: Dataplane, policy: &GroupPolicy) -> Dataplane {
    dp.maps.publish_group_with(GROUP, policy, &members()).unwrap();
    sync_routes(&mut dp, &[("10.1.0.0/16", GROUP)]);
    dp
}

/// The programs loaded with only `features`, as `rocev2 run` loads them
/// for a config that uses just those.
fn loaded_with(features: Features) -> Dataplane {
    require_root();
    let mut dp = Dataplane::load_with_features(None, DEFAULT_FLOWLET_TABLE_SIZE, features).expect("load");
    add_loopback_port(&mut dp);
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

/// The members the group's plain hash gives QPs 0..32 on `dp`'s program
/// (published as a `qp` hash group for the measurement).
fn hashed_members(dp: &mut Dataplane) -> Vec<u8> {
    dp.maps.publish_group_with(GROUP, &GroupPolicy::hash(HashMode::Qp), &members()).unwrap();
    (0..32u32).map(|qp| member_for(dp, qp, 0)).collect()
}

#[test]
fn only_the_loaded_table_kind_serves_its_groups_the_other_is_hashed() {
    const GAP: u64 = 10_000_000_000;
    // Keyless only (a config whose flowlet groups are all keyless): the
    // keyless group works as with every feature loaded...
    let mut dp = with_group(loaded_with(Features::COUNTERS.with(Features::FLOWLET_KEYLESS)), &keyless_policy(GAP, 2));
    for qp in 0..32u32 {
        member_for(&mut dp, qp, 0);
    }
    assert_eq!(port(&dp, PortCounter::FlowletNew), 2, "one flowlet per slot");
    assert_eq!(port(&dp, PortCounter::FlowletCollisions), 30);
    // ...and a keyed group, which this program has no code for, is hashed:
    // the hash group's members, no flowlet, nothing in the keyed table.
    let hashed = hashed_members(&mut dp);
    dp.maps.publish_group_with(GROUP, &keyed_policy(GAP), &members()).unwrap();
    let keyed: Vec<u8> = (0..32u32).map(|qp| member_for(&mut dp, qp, 1)).collect();
    assert_eq!(keyed, hashed);
    assert_eq!(port(&dp, PortCounter::FlowletNew), 2, "no flowlet started");
    assert_eq!(dp.maps.flowlet_entries(), 0, "the keyed table stays empty");

    // Keyed only: the keyed group keeps per-flow state, a keyless group is hashed.
    let mut dp = with_group(loaded_with(Features::COUNTERS.with(Features::FLOWLET_KEYED)), &keyed_policy(GAP));
    for qp in 0..32u32 {
        member_for(&mut dp, qp, 0);
    }
    assert_eq!(port(&dp, PortCounter::FlowletInserted), 32, "one entry per flow");
    let hashed = hashed_members(&mut dp);
    dp.maps.publish_group_with(GROUP, &keyless_policy(GAP, 2), &members()).unwrap();
    let keyless: Vec<u8> = (0..32u32).map(|qp| member_for(&mut dp, qp, 1)).collect();
    assert_eq!(keyless, hashed);
    assert_eq!(port(&dp, PortCounter::FlowletNew), 32, "no keyless flowlet started");
    assert_eq!(port(&dp, PortCounter::FlowletCollisions), 0);
}
