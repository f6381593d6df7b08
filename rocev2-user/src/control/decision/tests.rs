//! The decision model's unit tests: its predictions against the shared
//! member choice, for each policy, and explain's messages about them.

use super::*;

const CONFIG: &str = r#"[dataplane]
hash = "qp"
hash_seed = 1234

[[port]]
name = "eth1"

[[group]]
name = "spines"
members = [
  { dev = "u1", via = "10.0.1.2" },
  { dev = "u2", via = "10.0.2.2" },
  { dev = "u3", via = "fd00:3::2" },
  { dev = "u4", mac = "02:00:00:00:00:04" },
]

[[group]]
name = "legacy"
hash = "five-tuple"
members = [
  { dev = "l1", via = "10.0.9.1" },
  { dev = "l2", via = "10.0.9.2" },
  { dev = "l3", via = "10.0.9.3" },
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

fn config() -> Config {
    match Config::parse(CONFIG, Path::new("leaf.toml")) {
        Ok(c) => c,
        Err(e) => panic!("test config: {e}"),
    }
}

fn roce(src: &str, dst: &str, qp: u32) -> PacketFields {
    PacketFields {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        protocol: 17,
        src_port: 0xC000,
        dst_port: 4791,
        dest_qp: Some(qp),
    }
}

fn forwarding(e: &Explanation) -> &Forwarding {
    match &e.verdict {
        Verdict::Forward(f) => f,
        other => panic!("expected forwarding, got {other:?}"),
    }
}

/// The member the kernel would pick, computed independently of explain().
fn expected(p: &PacketFields, mode: HashMode, count: u32) -> (u32, u32) {
    let key = p.flow_key().unwrap();
    let hash = member_hash(&key, mode, 1234, HashVersion::V1);
    (hash, member_for(&rocev2_common::buckets::even_table(count), hash))
}

#[test]
fn longest_prefix_wins() {
    let c = config();
    let p = roce("10.0.0.1", "10.1.0.1", 0x123);
    let e = explain(&c, None, &p);
    let f = forwarding(&e);
    assert_eq!(f.route.to_string(), "10.1.0.0/16");
    assert_eq!(f.also_matched.iter().map(|p| p.to_string()).collect::<Vec<_>>(), ["10.0.0.0/8"]);
    assert_eq!(
        (f.group.as_str(), f.group_index, f.mode, f.seed, f.hash_version),
        ("spines", 0, HashMode::Qp, 1234, HashVersion::V1)
    );
    assert_eq!(f.dest_qp_hashed, Some(0x123));
    let (hash, position) = expected(&p, HashMode::Qp, 4);
    assert_eq!((f.hash, f.position, f.member_count), (hash, position, 4));
    assert_eq!(f.source, MemberSource::Configured);
    let names = ["dev u1 via 10.0.1.2", "dev u2 via 10.0.2.2", "dev u3 via fd00:3::2", "dev u4 mac 02:00:00:00:00:04"];
    assert_eq!(f.member, names[position as usize]);

    // Outside 10.1/16 the /8 route to the five-tuple group applies.
    let e = explain(&c, None, &roce("10.0.0.1", "10.2.0.1", 0x123));
    let f = forwarding(&e);
    assert_eq!((f.route.to_string().as_str(), f.group.as_str(), f.mode), ("10.0.0.0/8", "legacy", HashMode::FiveTuple));
    assert!(f.also_matched.is_empty());
    assert_eq!(f.dest_qp_hashed, None);
}

#[test]
fn keyless_flowlet_group_names_its_slot() {
    let text = CONFIG.replace(
        "name = \"legacy\"\n",
        "name = \"legacy\"\npolicy = \"flowlet\"\nflowlet_table = \"keyless\"\nflowlet_table_size = 64\n",
    );
    let c = Config::parse(&text, Path::new("leaf.toml")).unwrap();
    let p = roce("10.0.0.1", "10.2.0.1", 0x123);
    let slot = rocev2_common::flowlet::slot_of(&p.flow_key().unwrap(), 1, 63).index;
    let text = explain(&c, None, &p).to_string();
    assert!(text.contains(&format!("keyless flowlet table: this flow uses slot {slot} of 64")), "{text}");
}

#[test]
fn pinned_example() {
    // Concrete numbers, so a change of hash, key layout or seed handling shows.
    let e = explain(&config(), None, &roce("10.0.0.1", "10.1.0.1", 0x123));
    let f = forwarding(&e);
    assert_eq!(
        f.hash,
        member_hash(
            &FlowKey::v4([10, 0, 0, 1], [10, 1, 0, 1], 17, 0xC000, 4791).with_dest_qp(0x123),
            HashMode::Qp,
            1234,
            HashVersion::V1
        )
    );
    assert_eq!(f.position, member_for(&rocev2_common::buckets::even_table(4), f.hash));
    let text = e.to_string();
    assert!(
        text.contains("10.1.0.1 matches route 10.1.0.0/16 (longest prefix; also matches 10.0.0.0/8) -> group spines"),
        "{text}"
    );
    assert!(text.contains("qp hashing: five-tuple + DestQP 0x000123, seed 1234"), "{text}");
    assert!(text.contains(&format!("member {} of 4 (0-based)", f.position)), "{text}");
    assert!(text.contains("assuming all configured members are up"), "{text}");
}

#[test]
fn ipv6_routes() {
    let c = config();
    let p = roce("fd00::1", "fd01::1", 7);
    let f = forwarding(&explain(&c, None, &p)).clone();
    assert_eq!((f.route.to_string().as_str(), f.group.as_str()), ("fd01::/64", "spines"));
    assert_eq!((f.hash, f.position), expected(&p, HashMode::Qp, 4));
    // Outside the /64: no route.
    assert_eq!(explain(&c, None, &roce("fd00::1", "fd01:0:0:1::1", 7)).verdict, Verdict::NoRoute);
}

#[test]
fn qp_mode_uses_the_dest_qp_and_five_tuple_does_not() {
    let c = config();
    let qp_positions: std::collections::BTreeSet<u32> =
        (0..64).map(|qp| forwarding(&explain(&c, None, &roce("10.0.0.1", "10.1.0.1", qp))).position).collect();
    assert_eq!(qp_positions.len(), 4, "64 QPs should reach all 4 spines");
    let legacy: std::collections::BTreeSet<u32> =
        (0..64).map(|qp| forwarding(&explain(&c, None, &roce("10.0.0.1", "10.2.0.1", qp))).position).collect();
    assert_eq!(legacy.len(), 1, "five-tuple ignores the DestQP");
    let p = roce("10.0.0.1", "10.2.0.1", 5);
    assert_eq!(forwarding(&explain(&c, None, &p)).position, expected(&p, HashMode::FiveTuple, 3).1);
}

#[test]
fn dest_qp_only_for_roce() {
    let c = config();
    // UDP to another port: the --qp is ignored, exactly like the XDP program.
    let mut p = roce("10.0.0.1", "10.1.0.1", 0x55);
    p.dst_port = 4792;
    let e = explain(&c, None, &p);
    let f = forwarding(&e);
    assert_eq!(f.dest_qp_hashed, None);
    assert_eq!(f.key.dest_qp, 0);
    assert_eq!(
        f.hash,
        member_hash(&FlowKey::v4([10, 0, 0, 1], [10, 1, 0, 1], 17, 0xC000, 4792), HashMode::Qp, 1234, HashVersion::V1)
    );
    assert!(e.notes.iter().any(|n| n.contains("--qp ignored")));
    // Other protocols hash with ports 0.
    let icmp = PacketFields { protocol: 1, ..p };
    let f = forwarding(&explain(&c, None, &icmp)).clone();
    assert_eq!((f.key.src_port, f.key.dst_port, f.key.dest_qp), (0, 0, 0));
}

#[test]
fn explain_hashes_with_the_configured_version() {
    let p = roce("10.0.0.1", "10.1.0.1", 0x123);
    let key = p.flow_key().unwrap();
    let mut c = config();
    c.dataplane.hash_version = HashVersion::V2;
    let e = explain(&c, None, &p);
    let f = forwarding(&e);
    assert_eq!((f.hash_version, f.hash), (HashVersion::V2, member_hash(&key, HashMode::Qp, 1234, HashVersion::V2)));
    assert_ne!(f.hash, member_hash(&key, HashMode::Qp, 1234, HashVersion::V1));
    assert!(e.to_string().contains("seed 1234, hash_version 2 -> hash"), "{e}");
    // Version 1 prints as it always has.
    let e = explain(&config(), None, &p);
    assert!(e.to_string().contains("seed 1234 -> hash"), "{e}");
}

#[test]
fn unrouted_goes_to_the_kernel() {
    let e = explain(&config(), None, &roce("10.0.0.1", "192.168.1.1", 1));
    assert_eq!(e.verdict, Verdict::NoRoute);
    assert!(e.to_string().contains("XDP_PASS to the kernel stack"));
    let mixed = roce("10.0.0.1", "fd01::1", 1);
    assert!(matches!(explain(&config(), None, &mixed).verdict, Verdict::Invalid(_)));
}

#[test]
fn live_members_replace_the_configured_ones() {
    // u2 is down: the kernel picks among three, and positions shift.
    let live = Live {
        pin_dir: "/sys/fs/bpf/rocev2".into(),
        pid: 42,
        seed: 1234,
        hash_version: HashVersion::V1,
        groups: vec![LiveGroup {
            name: "spines".into(),
            index: 0,
            hash: HashMode::Qp,
            member_count: 3,
            members: vec![
                "dev u1 via 10.0.1.2".into(),
                "dev u3 via fd00:3::2".into(),
                "dev u4 mac 02:00:00:00:00:04".into(),
            ],
            buckets: rocev2_common::buckets::even_table(3),
            generation: 1,
            flowlet: None,
            keyless_slot: None,
            demoted: vec!["u3 (score 12.5)".into()],
        }],
        learned_target: None,
    };
    let p = roce("10.0.0.1", "10.1.0.1", 0x321);
    let e = explain(&config(), Some(&live), &p);
    let f = forwarding(&e);
    let (hash, position) = expected(&p, HashMode::Qp, 3);
    assert_eq!((f.hash, f.position, f.member_count, f.source), (hash, position, 3, MemberSource::Live));
    assert_eq!(f.member, live.groups[0].members[position as usize]);
    assert!(e.notes.iter().any(|n| n.contains("3 of 4 configured member(s) up")), "{:?}", e.notes);
    assert!(e.notes.iter().any(|n| n.contains("u3 (score 12.5) is demoted")), "{:?}", e.notes);
    // No usable member: the kernel.
    let mut empty = live.clone();
    empty.groups[0].member_count = 0;
    empty.groups[0].members.clear();
    assert!(matches!(explain(&config(), Some(&empty), &p).verdict, Verdict::NoMember { .. }));
}

#[test]
fn prefix_contains_edges() {
    let any4 = Prefix::V4 { addr: "0.0.0.0".parse().unwrap(), len: 0 };
    assert!(any4.contains("203.0.113.9".parse().unwrap()));
    assert!(!any4.contains("::1".parse().unwrap()));
    let host = Prefix::host("fd00::1".parse().unwrap());
    assert!(host.contains("fd00::1".parse().unwrap()));
    assert!(!host.contains("fd00::2".parse().unwrap()));
}
