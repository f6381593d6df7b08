//! `rocev2 explain` against the kernel: for a few hundred QPs, the member
//! explain() names is the one the XDP program redirects to
//! (BPF_PROG_TEST_RUN), for a `qp` group, a `five-tuple` group, IPv4 and IPv6.

use std::net::IpAddr;
use std::path::Path;

use rocev2_common::{bth::opcode, hash::HashMode};
use rocev2_tests::{
    fixture::{bth, group_members, loopback_dataplane, roce_spec},
    test_run, XDP_PASS, XDP_REDIRECT,
};
use rocev2_user::{
    control::config::Config,
    control::dataplane::Dataplane,
    tools::explain::{explain, PacketFields, Verdict},
    tools::packet::{build_roce_frame, RoceFrameSpec},
};

const SEED: u32 = 4321;

/// Group 0 ("spines", qp, 4 members) and group 1 ("legacy", five-tuple, 3
/// members), in the order `Config::groups` indexes them; member i of a
/// group has next-hop MAC 02:bb:00:00:0g:0i.
const CONFIG: &str = r#"[dataplane]
hash = "qp"
hash_seed = 4321
pin_dir = "/sys/fs/bpf/rocev2-explain-test-unused"

[[port]]
name = "lo"

[[group]]
name = "spines"
members = [
  { dev = "lo", mac = "02:bb:00:00:00:00" },
  { dev = "lo", mac = "02:bb:00:00:00:01" },
  { dev = "lo", mac = "02:bb:00:00:00:02" },
  { dev = "lo", mac = "02:bb:00:00:00:03" },
]

[[group]]
name = "legacy"
hash = "five-tuple"
members = [
  { dev = "lo", mac = "02:bb:00:00:01:00" },
  { dev = "lo", mac = "02:bb:00:00:01:01" },
  { dev = "lo", mac = "02:bb:00:00:01:02" },
]

[[route]]
prefix = "10.0.0.0/8"
group = "legacy"

[[route]]
prefix = "10.1.0.0/16"
group = "spines"

[[route]]
prefix = "fd01::/64"
group = "spines"
"#;

/// The dataplane programmed from the same config explain() reads.
fn dataplane(config: &Config) -> Dataplane {
    let mut dp = loopback_dataplane();
    dp.maps.set_hash_seed(SEED).unwrap();
    for (index, group) in config.groups.iter().enumerate() {
        let specs = group_members(index as u8, group.members.len() as u8);
        dp.maps.publish_group(index as u32, group.hash, &specs).unwrap();
    }
    let routes = config.routes.iter().map(|r| (r.prefix, r.group_index)).collect();
    dp.sync_routes(&routes).unwrap();
    dp
}

/// SEND_ONLY, PSN 1, TTL 64, from UDP port `sport`; otherwise the fixture's
/// host frame (DSCP 26, ECT(0), 64 payload bytes).
fn frame(src: IpAddr, dst: IpAddr, sport: u16, dest_qp: u32) -> Vec<u8> {
    build_roce_frame(&RoceFrameSpec { src_port: sport, ..roce_spec(src, dst, 64, bth(opcode::SEND_ONLY, dest_qp, 1)) })
}

#[test]
fn explain_names_the_member_the_kernel_picks() {
    let config = Config::parse(CONFIG, Path::new("explain-test.toml")).expect("test config");
    assert_eq!(config.groups[0].hash, HashMode::Qp);
    let mut dp = dataplane(&config);
    let cases: [(&str, &str, u8); 3] =
        [("10.0.0.1", "10.1.0.9", 0), ("10.0.0.1", "10.7.0.9", 1), ("fd00::1", "fd01::9", 0)];
    for (src, dst, group) in cases {
        let (src, dst): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..300u32 {
            let (sport, qp) = (0xC000 | (i % 31) as u16, 0x00_0100 + i * 37);
            let packet = PacketFields { src, dst, protocol: 17, src_port: sport, dst_port: 4791, dest_qp: Some(qp) };
            let e = explain(&config, None, &packet);
            let Verdict::Forward(f) = &e.verdict else { panic!("{dst} qp {qp}: {e}") };
            let run = test_run(&mut dp, &frame(src, dst, sport, qp)).unwrap();
            assert_eq!(run.action, XDP_REDIRECT, "{dst} qp {qp}");
            let expected_mac = [0x02, 0xBB, 0, 0, group, f.position as u8];
            assert_eq!(run.output[0..6], expected_mac, "{dst} qp {qp}: explain said {e}");
            assert!(f.member.ends_with(&format!("02:bb:00:00:{group:02x}:{:02x}", f.position)), "{}", f.member);
            seen.insert(f.position);
        }
        // qp groups spread over every member; the five-tuple group only by sport (31 ports).
        assert_eq!(seen.len(), config.groups[group as usize].members.len(), "{dst}: {seen:?}");
    }
}

#[test]
fn explain_and_kernel_agree_on_unrouted() {
    let config = Config::parse(CONFIG, Path::new("explain-test.toml")).expect("test config");
    let mut dp = dataplane(&config);
    let (src, dst): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "192.168.0.1".parse().unwrap());
    let packet = PacketFields { src, dst, protocol: 17, src_port: 0xC000, dst_port: 4791, dest_qp: Some(1) };
    assert_eq!(explain(&config, None, &packet).verdict, Verdict::NoRoute);
    assert_eq!(test_run(&mut dp, &frame(src, dst, 0xC000, 1)).unwrap().action, XDP_PASS);
}

/// A flowlet group (five-tuple hash, so the kernel's re-hash with the
/// DestQP differs from the group's hash) and a pinned group with one pin.
const POLICIES: &str = r#"[dataplane]
hash = "qp"
hash_seed = 4321
pin_dir = "/sys/fs/bpf/rocev2-explain-test-unused"

[[port]]
name = "lo"

[[group]]
name = "flow"
hash = "five-tuple"
policy = "flowlet"
flowlet_gap_us = 1000000
members = [
  { dev = "lo", mac = "02:bb:00:00:00:00" },
  { dev = "lo", mac = "02:bb:00:00:00:01" },
  { dev = "lo", mac = "02:bb:00:00:00:02" },
  { dev = "lo", mac = "02:bb:00:00:00:03" },
]

[[group]]
name = "pin"
policy = "pinned"
members = [
  { dev = "lo", mac = "02:bb:00:00:01:00" },
  { dev = "lo", mac = "02:bb:00:00:01:01" },
  { dev = "lo", mac = "02:bb:00:00:01:02" },
]

[[route]]
prefix = "10.1.0.0/16"
group = "flow"

[[route]]
prefix = "10.2.0.0/16"
group = "pin"

[[pin]]
prefix = "10.2.0.0/16"
qp = 0x105
group = "pin"
member = "lo"
"#;

/// `explain` agrees with the kernel for flowlet and pinned groups: a new
/// flow's first flowlet, and a pin (the first member on "lo") or, without
/// one, `qp` hashing.
#[test]
fn explain_agrees_with_the_kernel_for_flowlet_and_pinned_groups() {
    use rocev2_common::maps::PinEntry;
    use rocev2_user::control::run::group_policy;
    let config = Config::parse(POLICIES, Path::new("explain-policies.toml")).expect("test config");
    let mut dp = loopback_dataplane();
    dp.maps.set_hash_seed(SEED).unwrap();
    for (index, group) in config.groups.iter().enumerate() {
        let specs = group_members(index as u8, group.members.len() as u8);
        let generation = dp.maps.publish_group_with(index as u32, &group_policy(group), &specs).unwrap();
        for pin in config.pins.iter().filter(|p| p.group_index == index as u32) {
            let entry = PinEntry { group: index as u32, position: pin.member_index as u32, generation, _reserved: 0 };
            dp.maps.set_pin(&pin.prefix, pin.qp, entry).unwrap();
        }
    }
    let routes = config.routes.iter().map(|r| (r.prefix, r.group_index)).collect();
    dp.sync_routes(&routes).unwrap();
    let src: IpAddr = "10.0.0.1".parse().unwrap();
    for (dst, group) in [("10.1.0.9", 0u8), ("10.2.0.9", 1u8)] {
        let dst: IpAddr = dst.parse().unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for qp in 0x100..0x180u32 {
            let packet = PacketFields { src, dst, protocol: 17, src_port: 0xC000, dst_port: 4791, dest_qp: Some(qp) };
            let e = explain(&config, None, &packet);
            let Verdict::Forward(f) = &e.verdict else { panic!("{dst} qp {qp}: {e}") };
            assert!(f.policy_step.is_some(), "{e}");
            // Each QP is a new flow: the kernel's first packet of it.
            let run = test_run(&mut dp, &frame(src, dst, 0xC000, qp)).unwrap();
            assert_eq!(run.action, XDP_REDIRECT, "{dst} qp {qp}");
            assert_eq!(
                run.output[0..6],
                [0x02, 0xBB, 0, 0, group, f.position as u8],
                "{dst} qp {qp:#x}: explain said {e}"
            );
            if group == 1 && qp == 0x105 {
                assert_eq!(f.position, 0, "the pin: {e}");
                assert!(e.to_string().contains("is pinned to dev lo"), "{e}");
            }
            seen.insert(f.position);
        }
        // One source port: the flowlet re-hash (with DestQP) still spreads.
        assert!(seen.len() > 1, "{dst}: {seen:?}");
    }
}
