//! `rocev2 lab up --racks`: a 2-rack x 2-spine fabric with the real
//! dataplane on every switch. Ring traffic crosses every tier in both
//! directions with every packet checked at the sinks; one seed on every
//! switch polarizes the spine tier and per-switch seeds do not; the
//! simulator's per-link prediction equals the switches' counters; `lab down`
//! leaves no namespace, process, pin or file behind.

use std::{path::Path, process::Command};

use rocev2_tests::{require_root, rocev2_bin, LabGuard};
use rocev2_user::{
    testbed::lab::{
        self,
        fabric::{LabTrafficArgs, TrafficOutcome},
        record_path, LabRecord,
    },
    tools::fabric::{Pattern, SeedPlan, Tier},
    tools::gen::SportModel,
};

/// A lab name unique to this process and test: 1-8 of [a-z0-9].
fn lab_name(tag: char) -> String {
    format!("f{tag}{:x}", std::process::id() % 0xFFFFF)
}

fn up(name: &str, routing: &str, hash: &str, seed: SeedPlan) -> LabGuard {
    let seed = if seed == SeedPlan::Same { "same" } else { "auto" };
    #[rustfmt::skip]
    let out = Command::new(rocev2_bin())
        .args(["lab", "up", "--name", name, "--racks", "2", "--hosts", "2", "--spines", "2", "--links-per-spine", "2",
               "--routing", routing, "--hash", hash, "--seed", seed])
        .output()
        .unwrap();
    let guard = LabGuard(name.to_owned());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lab up failed:\n{text}");
    eprintln!("{text}");
    guard
}

fn ring(name: &str) -> TrafficOutcome {
    let args = LabTrafficArgs {
        name: name.into(),
        pattern: Pattern::Ring,
        qps: 8,
        messages: 4,
        sport: SportModel::Nic,
        rate: 20_000,
        json: false,
    };
    let o = lab::fabric::traffic(&args).unwrap();
    assert!(o.sent > 0 && o.clean(), "{o:#?}");
    assert!(o.prediction_mismatches.is_empty(), "simulator != counters: {:#?}", o.prediction_mismatches);
    o
}

/// Bytes on the links of `tier`.
fn tier_bytes(o: &TrafficOutcome, tier: Tier) -> Vec<u64> {
    o.loads.iter().filter(|(l, _)| l.tier == tier).map(|(_, x)| x.bytes).collect()
}

fn assert_gone(name: &str, record: &LabRecord) {
    rocev2_tests::assert_lab_namespaces_gone(name);
    for s in &record.switches {
        assert!(!s.pin_dir.exists(), "{} left pinned", s.pin_dir.display());
        let pid = s.pid.expect("a recorded pid");
        assert!(!rocev2_user::sys::process_alive(pid), "rocev2 run {pid} of {} still runs", s.switch);
    }
    for d in &record.frr_dirs {
        assert!(!d.exists(), "{} left", d.display());
    }
    assert!(!Path::new(&format!("/run/rocev2/lab-{name}")).exists());
    assert!(!record_path(name).exists());
}

#[test]
fn fabric_with_bgp_carries_ring_traffic_through_every_tier_and_comes_down_clean() {
    require_root();
    let name = lab_name('b');
    let guard = up(&name, "bgp", "five-tuple", SeedPlan::Same);
    let record = LabRecord::read(&name).unwrap();
    let status = lab::status(&name).unwrap();
    assert_eq!(status.matches("running (pid").count(), 4, "{status}");

    let o = ring(&name);
    // IPv4 and IPv6, both racks to the other: 2 families x 4 hosts x 8 QPs x 4 messages x 4 packets.
    assert_eq!(o.sent, 2 * 4 * 8 * 4 * 4);
    for h in &o.hosts {
        // Leaf, spine, leaf: three switches, one TTL each.
        assert_eq!(h.report.ttl.keys().copied().collect::<Vec<_>>(), [61], "{}: {:?}", h.host, h.report.ttl);
        assert_eq!((h.report.bad_icrc, h.report.bad_ipv4_checksum), (0, 0), "{}", h.host);
    }
    // Every tier, both directions: each leaf sent up, each spine sent down to
    // both leaves, every host link delivered.
    for leaf in ["l1/", "l2/"] {
        let up: u64 = o
            .loads
            .iter()
            .filter(|(l, _)| l.tier == Tier::LeafUp && l.to_string().starts_with(leaf))
            .map(|(_, x)| x.bytes)
            .sum();
        assert!(up > 0, "{leaf} sent nothing up");
    }
    for rack in ["l1p", "l2p"] {
        let down: u64 = o
            .loads
            .iter()
            .filter(|(l, _)| l.tier == Tier::SpineDown && l.port.starts_with(rack))
            .map(|(_, x)| x.bytes)
            .sum();
        assert!(down > 0, "nothing went down to {rack}");
    }
    assert!(tier_bytes(&o, Tier::LeafDown).iter().all(|b| *b > 0), "{:?}", o.loads);

    drop(guard);
    assert_gone(&name, &record);
}

#[test]
fn fabric_same_seed_polarizes_the_spine_tier_and_auto_seeds_do_not() {
    require_root();
    let mut spine = Vec::new();
    for (tag, seed) in [('s', SeedPlan::Same), ('a', SeedPlan::Auto)] {
        let name = lab_name(tag);
        let _guard = up(&name, "static", "qp", seed);
        let o = ring(&name);
        let summary = o.tiers.iter().find(|t| t.tier == Tier::SpineDown).unwrap().clone();
        eprintln!("{seed:?}: {summary:?}");
        spine.push(summary);
    }
    let (same, auto) = (&spine[0], &spine[1]);
    // One seed: each spine only ever uses the link the leaf's choice implies.
    assert_eq!(same.idle, 4, "{same:?}");
    assert!(auto.idle < same.idle && auto.max_over_mean < same.max_over_mean, "same {same:?} auto {auto:?}");
}

#[test]
fn fabric_zones_with_bgp_unnumbered_carry_traffic_over_the_aggregation_tier() {
    require_root();
    let name = lab_name('z');
    #[rustfmt::skip]
    let out = Command::new(rocev2_bin())
        .args(["lab", "up", "--name", &name, "--racks", "2", "--hosts", "1", "--spines", "2", "--zones", "2",
               "--aggs", "2", "--routing", "bgp", "--unnumbered"])
        .output()
        .unwrap();
    let _guard = LabGuard(name.clone());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let o = ring(&name);
    // Rack 1 (zone 1) and rack 2 (zone 2): leaf, spine, aggregation, spine,
    // leaf; IPv4 and IPv6 routes learned over IPv6 link-local sessions.
    assert_eq!(o.sent, 2 * 2 * 8 * 4 * 4);
    for h in &o.hosts {
        assert_eq!(h.report.ttl.keys().copied().collect::<Vec<_>>(), [59], "{}: {:?}", h.host, h.report.ttl);
    }
    for tier in [Tier::SpineUp, Tier::AggDown] {
        assert_eq!(tier_bytes(&o, tier).iter().sum::<u64>(), tier_bytes(&o, Tier::LeafUp).iter().sum::<u64>());
    }
}
