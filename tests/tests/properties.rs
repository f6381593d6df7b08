//! Property test through BPF_PROG_TEST_RUN (issue 6): generated RoCEv2
//! frames (IPv4/IPv6, VLAN or not, any opcode, QP, PSN, payload 0..=2048,
//! TTL 2..=255, any DSCP/ECN) are forwarded, and every forwarded frame:
//! - keeps every ICRC-covered byte (`packet::invariant_bytes_equal`),
//! - still carries a valid ICRC and (IPv4) a valid header checksum,
//! - has TTL/hop limit exactly one lower and everything else unchanged
//!   but the MACs,
//! - went to the member userspace predicts with rocev2_common::hash.
//!
//! Frames with IPv4 options (also generated) go to the kernel untouched.
//!
//! 384 cases by default (about a second of test runs); PROPTEST_CASES
//! overrides.

use std::{
    cell::RefCell,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};
use rocev2_common::{
    bth::Bth,
    counters::PortCounter,
    hash::{FlowKey, HashMode},
};
use rocev2_tests::{
    action_name,
    fixture::{
        self, group_members, two_group_dataplane, with_ipv4_options, FIVE_TUPLE_GROUP, HOST_MAC, PORT_MAC, PORT_SLOT,
        QP_GROUP,
    },
    test_run, XDP_PASS, XDP_REDIRECT,
};
use rocev2_user::{
    control::dataplane::{Dataplane, MemberSpec},
    tools::packet::{build_roce_frame, icrc, invariant_bytes_equal, parse_roce, RoceFrameSpec},
};

const SEED: u32 = 0x5EED;
const MEMBERS: u8 = 7;

fn members() -> Vec<MemberSpec> {
    group_members(0, MEMBERS)
}

/// Seven members in a `qp` and a `five-tuple` group, two prefixes each.
fn dataplane() -> Dataplane {
    let routes = [
        ("10.1.0.0/16", QP_GROUP),
        ("10.2.0.0/16", FIVE_TUPLE_GROUP),
        ("fd01::/64", QP_GROUP),
        ("fd02::/64", FIVE_TUPLE_GROUP),
    ];
    two_group_dataplane(SEED, &members(), &routes)
}

#[derive(Clone, Debug)]
struct Case {
    spec: RoceFrameSpec,
    /// IPv4 option bytes (a multiple of 4, at most 40).
    options: Vec<u8>,
    five_tuple: bool,
}

fn arb_bth() -> impl Strategy<Value = Bth> {
    (
        any::<u8>(),
        any::<bool>(),
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        0u32..0x100_0000,
        any::<bool>(),
        0u32..0x100_0000,
    )
        .prop_map(|(opcode, solicited, pkey, fecn, becn, dest_qp, ack_req, psn)| Bth {
            opcode,
            solicited,
            pad_count: 0,
            pkey,
            fecn,
            becn,
            dest_qp,
            ack_req,
            psn,
        })
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        any::<[u8; 16]>(),
        any::<u16>(),
        any::<bool>(),
        proptest::option::of(0u16..4096),
        2u8..=255,
        0u8..64,
        0u8..4,
        any::<u16>(),
        arb_bth(),
        0usize..=2048,
        (prop_oneof![Just(0usize), 1usize..=10], any::<[u8; 40]>()),
    )
        .prop_map(
            |(v6, src, host, five_tuple, vlan, ttl, dscp, ecn, src_port, bth, payload_len, (option_words, opts))| {
                let (src_ip, dst_ip): (IpAddr, IpAddr) = if v6 {
                    let mut dst = [0u8; 16];
                    dst[0..2].copy_from_slice(&[0xfd, if five_tuple { 2 } else { 1 }]);
                    dst[14..16].copy_from_slice(&host.to_be_bytes());
                    (Ipv6Addr::from(src).into(), Ipv6Addr::from(dst).into())
                } else {
                    let h = host.to_be_bytes();
                    (
                        Ipv4Addr::new(src[0], src[1], src[2], src[3]).into(),
                        Ipv4Addr::new(10, if five_tuple { 2 } else { 1 }, h[0], h[1]).into(),
                    )
                };
                let options = if v6 { Vec::new() } else { opts[..option_words * 4].to_vec() };
                let spec = RoceFrameSpec {
                    src_mac: HOST_MAC,
                    dst_mac: PORT_MAC,
                    vlan,
                    src_ip,
                    dst_ip,
                    ttl,
                    dscp,
                    ecn,
                    src_port,
                    bth,
                    payload_len,
                };
                Case { spec, options, five_tuple }
            },
        )
}

fn ip_offset(c: &Case) -> usize {
    if c.spec.vlan.is_some() {
        18
    } else {
        14
    }
}

fn frame_of(c: &Case) -> Vec<u8> {
    let mut f = build_roce_frame(&c.spec);
    if !c.options.is_empty() {
        f = with_ipv4_options(f, &c.options);
        // The options are covered by the ICRC.
        let crc = icrc(&f).expect("RoCE frame with options");
        let n = f.len();
        f[n - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    f
}

fn predicted_member(c: &Case) -> usize {
    let key = match (c.spec.src_ip, c.spec.dst_ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => FlowKey::v4(s.octets(), d.octets(), 17, c.spec.src_port, 4791),
        (IpAddr::V6(s), IpAddr::V6(d)) => FlowKey::v6(s.octets(), d.octets(), 17, c.spec.src_port, 4791),
        _ => unreachable!(),
    }
    .with_dest_qp(c.spec.bth.dest_qp);
    let mode = if c.five_tuple { HashMode::FiveTuple } else { HashMode::Qp };
    fixture::predicted_member(&key, mode, SEED, u32::from(MEMBERS))
}

fn check(dp: &mut Dataplane, c: &Case) -> Result<(), TestCaseError> {
    let input = frame_of(c);
    let parsed_in = parse_roce(&input).map_err(|e| TestCaseError::fail(format!("generated frame: {e}")))?;
    prop_assert!(parsed_in.icrc_ok, "generated frame has a bad ICRC");
    let run = test_run(dp, &input).map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
    if !c.options.is_empty() {
        // IPv4 options are the kernel's to process: handed over untouched.
        prop_assert_eq!(run.action, XDP_PASS, "action {} for IPv4 options", action_name(run.action));
        prop_assert!(run.output == input, "a frame with IPv4 options was changed");
        return Ok(());
    }
    prop_assert_eq!(run.action, XDP_REDIRECT, "action {}", action_name(run.action));
    let out = &run.output;
    prop_assert_eq!(out.len(), input.len());
    prop_assert!(invariant_bytes_equal(&input, out), "an ICRC-covered byte changed");
    let p = parse_roce(out).map_err(|e| TestCaseError::fail(format!("output: {e}")))?;
    prop_assert!(p.icrc_ok, "ICRC does not verify");
    if c.spec.src_ip.is_ipv4() {
        prop_assert_eq!(p.ipv4_checksum_ok, Some(true), "IPv4 header checksum");
    }
    prop_assert_eq!(p.ttl_or_hop_limit, c.spec.ttl - 1);
    prop_assert_eq!((p.dscp, p.ecn), (c.spec.dscp, c.spec.ecn), "no class or ECN profile: TOS unchanged");
    prop_assert_eq!(p.vlan, c.spec.vlan);
    let member = predicted_member(c);
    let m = &members()[member];
    prop_assert_eq!(p.dst_mac, m.dst_mac, "member: want {}", member);
    prop_assert_eq!(p.src_mac, m.src_mac);
    // Byte for byte: only MACs, TTL/hop limit and the IPv4 checksum differ.
    let l3 = ip_offset(c);
    let variant: Vec<usize> = if c.spec.src_ip.is_ipv4() { vec![l3 + 8, l3 + 10, l3 + 11] } else { vec![l3 + 7] };
    for (i, (a, b)) in input.iter().zip(out).enumerate() {
        if i >= 12 && !variant.contains(&i) {
            prop_assert_eq!(a, b, "byte {} changed", i);
        }
    }
    Ok(())
}

#[test]
fn forwarded_roce_keeps_its_invariants() {
    let dp = RefCell::new(dataplane());
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(384);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let result = runner.run(&arb_case(), |c| check(&mut dp.borrow_mut(), &c));
    if let Err(e) = result {
        panic!("{e}");
    }
    // Every case was one forwarded RoCE packet or one with IPv4 options
    // passed to the kernel (shrinking may add more).
    let dp = dp.borrow();
    let counter = |c| dp.maps.port_counter(PORT_SLOT, c).unwrap();
    let (fwd, options) = (counter(PortCounter::ForwardedRoce), counter(PortCounter::PassIpv4Options));
    assert!(fwd + options >= u64::from(cases), "{fwd} forwarded and {options} with options passed for {cases} cases");
    assert!(
        fwd > u64::from(cases) / 2 && options > 0,
        "{fwd} forwarded, {options} with options passed: both kinds were generated"
    );
}

/// packet::parse_roce / icrc / invariant_bytes_equal (rocev2-user, not in
/// the cargo-fuzz build) never panic: on arbitrary bytes and on valid frames
/// with random bytes overwritten or cut off. A few thousand cases, no root.
#[test]
fn userspace_decoder_never_panics() {
    let mut runner = TestRunner::new(Config { cases: 2048, failure_persistence: None, ..Config::default() });
    let junk = proptest::collection::vec(any::<u8>(), 0..200);
    runner
        .run(&junk, |bytes| {
            let _ = parse_roce(&bytes);
            let _ = icrc(&bytes);
            let _ = invariant_bytes_equal(&bytes, &bytes);
            Ok(())
        })
        .unwrap();
    let mutated = (
        arb_case(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        any::<prop::sample::Index>(),
    );
    runner
        .run(&mutated, |(c, edits, cut)| {
            let mut f = frame_of(&c);
            for (at, v) in edits {
                let i = at.index(f.len());
                f[i] = v;
            }
            let _ = parse_roce(&f);
            let _ = invariant_bytes_equal(&f, &frame_of(&c));
            f.truncate(cut.index(f.len() + 1));
            let _ = parse_roce(&f);
            let _ = icrc(&f);
            Ok(())
        })
        .unwrap();
}
