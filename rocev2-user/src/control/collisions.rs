//! The QP-collision detector: two or more heavy QPs hashed onto one member
//! of a group while another member of the same group sits idle. That is
//! the failure hash ECMP is known for with few, large RDMA flows (an
//! all-reduce's handful of QPs): the busy member's QPs run at a fraction of
//! line rate while capacity next to them goes unused.
//!
//! The remedies, and how the detector judges them:
//! - in a `five-tuple` group, `hash = "qp"`: QPs of one connection share
//!   the five-tuple, and only the BTH DestQP tells them apart (the fix
//!   this project exists for);
//! - a hash seed under which the heavy QPs spread out: found by repeating
//!   the dataplane's member choice with `explain` for candidate seeds;
//! - pinning one of the colliding QPs to the idle member (`[[pin]]` in a
//!   `policy = "pinned"` group);
//! - more QPs per connection (more hash inputs, the same total traffic),
//!   which helps only a `qp` group;
//! - flowlets, which re-pick a member at message gaps.

use std::{collections::BTreeMap, net::IpAddr};

use serde::Serialize;

use crate::{
    control::config::{Config, HashSeed},
    control::decision::{explain, Live, PacketFields, Verdict},
    control::qp_telemetry::TopRow,
};

/// A QP is heavy when it carries at least this share of its group's fair
/// per-member rate (the group's rate divided by its members): four such
/// QPs on one member already load it as much as the fair share.
pub const HEAVY_SHARE: f64 = 0.25;
/// A member is idle when it carries less than this share of the fair rate.
pub const IDLE_SHARE: f64 = 0.1;
/// Ignore groups moving less than this (bits per second): no load, no collision.
pub const MIN_GROUP_BPS: f64 = 1e5;
/// Seeds tried when looking for one that spreads the heavy QPs.
const SEEDS_TRIED: u32 = 256;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Collision {
    pub group: String,
    /// The member carrying two or more heavy QPs.
    pub member: String,
    /// Those QPs, as "destination/0xQP".
    pub qps: Vec<String>,
    /// Members of the group that carry (almost) nothing.
    pub idle_members: Vec<String>,
    /// Concrete ways out, most specific first.
    pub suggestions: Vec<String>,
}

impl Collision {
    pub fn render(&self) -> String {
        let mut s = format!(
            "QP COLLISION in group {}: {} heavy QPs share member {} ({}) while {} idle\n",
            self.group,
            self.qps.len(),
            self.member,
            self.qps.join(", "),
            self.idle_members.join(", ")
        );
        for tip in &self.suggestions {
            s.push_str(&format!("  - {tip}\n"));
        }
        s
    }
}

/// A group as the state file describes it.
#[derive(Clone, Debug, Default)]
pub struct GroupView {
    /// Member devices in position order.
    pub members: Vec<String>,
    /// "qp" or "five-tuple".
    pub hash: String,
    /// "hash", "flowlet" or "pinned".
    pub policy: String,
}

/// The groups by name.
pub type GroupMembers = BTreeMap<String, GroupView>;

/// Finds collisions among `rows` (one refresh of `top`). `live` and
/// `config`, when available, let it try other seeds through `explain`.
pub fn detect(rows: &[TopRow], groups: &GroupMembers, config: Option<(&Config, &Live)>) -> Vec<Collision> {
    let mut found = Vec::new();
    for (group, view) in groups {
        let members = &view.members;
        if members.len() < 2 {
            continue;
        }
        let mine: Vec<&TopRow> = rows.iter().filter(|r| &r.group == group).collect();
        let total: f64 = mine.iter().map(|r| r.bits_per_sec).sum();
        if total < MIN_GROUP_BPS {
            continue;
        }
        let fair = total / members.len() as f64;
        let load = |m: &str| mine.iter().filter(|r| r.member == m).map(|r| r.bits_per_sec).sum::<f64>();
        let idle: Vec<String> = members.iter().filter(|m| load(m) < IDLE_SHARE * fair).cloned().collect();
        if idle.is_empty() {
            continue;
        }
        for member in members {
            let mut heavy: Vec<&TopRow> =
                mine.iter().copied().filter(|r| &r.member == member && r.bits_per_sec >= HEAVY_SHARE * fair).collect();
            if heavy.len() < 2 {
                continue;
            }
            heavy.sort_by(|a, b| b.bits_per_sec.total_cmp(&a.bits_per_sec));
            let all_heavy: Vec<&TopRow> =
                mine.iter().copied().filter(|r| r.bits_per_sec >= HEAVY_SHARE * fair).collect();
            found.push(Collision {
                group: group.clone(),
                member: member.clone(),
                qps: heavy.iter().map(|r| format!("{}/{:#x}", r.dst, r.dest_qp)).collect(),
                idle_members: idle.clone(),
                suggestions: suggestions(group, view, &heavy, &all_heavy, &idle, config),
            });
        }
    }
    found
}

fn suggestions(
    group: &str,
    view: &GroupView,
    heavy: &[&TopRow],
    all_heavy: &[&TopRow],
    idle: &[String],
    config: Option<(&Config, &Live)>,
) -> Vec<String> {
    let members = &view.members;
    let mut tips = Vec::new();
    let five_tuple = view.hash == "five-tuple";
    // QPs of one connection: same addresses and UDP source port.
    let one_five_tuple =
        heavy.iter().all(|r| (r.src, r.dst, r.src_port) == (heavy[0].src, heavy[0].dst, heavy[0].src_port));
    if five_tuple {
        let why = if one_five_tuple {
            "these QPs share one five-tuple, which five-tuple hashing cannot tell apart"
        } else {
            "the BTH DestQP gives the hash an input per QP"
        };
        tips.push(format!(
            "hash = \"qp\" in [[group]] {group}: {why}; with the DestQP in the hash they spread (applied by `rocev2 reload`)"
        ));
    }
    if let Some((config, live)) = config {
        match spreading_seed(config, live, all_heavy, members.len()) {
            Some(seed) => tips.push(format!(
                "hash_seed = {seed} in [dataplane] spreads the group's {} heavy QPs over distinct members (as `rocev2 explain` computes it; every flow of the box moves once)",
                all_heavy.len()
            )),
            None => tips.push(format!("no hash_seed of the first {SEEDS_TRIED} separates these QPs")),
        }
    }
    let moved = heavy[1];
    let pinned = if view.policy == "pinned" {
        String::new()
    } else {
        format!(" with `policy = \"pinned\"` in [[group]] {group} (a pin acts only in a pinned group)")
    };
    tips.push(format!(
        "pin {}/{:#x} to {}: `[[pin]] prefix = \"{}/{}\", qp = {:#x}, group = \"{group}\", member = \"{}\"`{pinned}",
        moved.dst,
        moved.dest_qp,
        idle[0],
        moved.dst,
        if moved.dst.is_ipv4() { 32 } else { 128 },
        moved.dest_qp,
        idle[0]
    ));
    if !five_tuple {
        tips.push(
            "use more QPs per connection (e.g. NCCL_IB_QPS_PER_CONNECTION=4): more DestQPs give the qp hash more inputs"
                .into(),
        );
    }
    tips.push(format!(
        "or `policy = \"flowlet\"` on group {group}: a flow re-picks its member after an idle gap (at message boundaries with flowlet_boundary)"
    ));
    tips
}

/// The first seed under which `explain` puts every heavy QP on its own
/// member (or as evenly as the member count allows).
fn spreading_seed(config: &Config, live: &Live, heavy: &[&TopRow], members: usize) -> Option<u32> {
    let best = heavy.len().div_ceil(members.max(1));
    let packets: Vec<PacketFields> =
        heavy.iter().filter_map(|r| Some(packet(r.src?, r.dst, r.src_port, r.dest_qp))).collect();
    if packets.len() != heavy.len() {
        return None;
    }
    (1..=SEEDS_TRIED).filter(|&s| s != live.seed).find(|&seed| {
        let mut config = config.clone();
        config.dataplane.hash_seed = HashSeed::Fixed(seed);
        let mut live = live.clone();
        live.seed = seed;
        let mut per_member: BTreeMap<u32, usize> = BTreeMap::new();
        for p in &packets {
            let Verdict::Forward(f) = explain(&config, Some(&live), p).verdict else { return false };
            *per_member.entry(f.position).or_default() += 1;
        }
        per_member.values().all(|&n| n <= best)
    })
}

fn packet(src: IpAddr, dst: IpAddr, src_port: u16, dest_qp: u32) -> PacketFields {
    PacketFields {
        src,
        dst,
        protocol: 17,
        src_port,
        dst_port: rocev2_common::bth::ROCEV2_UDP_PORT,
        dest_qp: Some(dest_qp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(qp: u32, member: &str, bps: f64) -> TopRow {
        TopRow {
            src: Some("10.0.0.1".parse().unwrap()),
            src_port: 0xC000,
            dst: "10.1.0.1".parse().unwrap(),
            dest_qp: qp,
            group: "spines".into(),
            member: member.into(),
            pps: 1.0,
            bits_per_sec: bps,
            stats: Default::default(),
            idle_secs: 0.0,
        }
    }

    fn groups_hashed(hash: &str, policy: &str) -> GroupMembers {
        let view = GroupView { members: vec!["u1".into(), "u2".into()], hash: hash.into(), policy: policy.into() };
        [("spines".to_string(), view)].into()
    }

    fn groups() -> GroupMembers {
        groups_hashed("qp", "hash")
    }

    #[test]
    fn fires_on_two_heavy_qps_sharing_a_member_next_to_an_idle_one() {
        let rows = [row(1, "u1", 1e9), row(2, "u1", 1e9), row(3, "u1", 1e3)];
        let c = detect(&rows, &groups(), None);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].member.as_str(), c[0].idle_members.as_slice()), ("u1", &["u2".to_string()][..]));
        assert_eq!(c[0].qps, ["10.1.0.1/0x1", "10.1.0.1/0x2"]);
        assert!(c[0].suggestions.iter().any(|s| s.contains("[[pin]]") && s.contains("u2")), "{c:?}");
        // A pin needs a pinned group: both are named, not one or the other.
        assert!(c[0].suggestions.iter().any(|s| s.contains("[[pin]]") && s.contains("with `policy = \"pinned\"`")));
        assert!(c[0].suggestions.iter().any(|s| s.contains("more QPs per connection")), "{c:?}");
    }

    #[test]
    fn a_five_tuple_group_is_told_to_hash_the_qp_first() {
        let rows = [row(1, "u1", 1e9), row(2, "u1", 1e9)];
        let c = detect(&rows, &groups_hashed("five-tuple", "pinned"), None);
        let tips = &c[0].suggestions;
        assert!(tips[0].starts_with("hash = \"qp\" in [[group]] spines: these QPs share one five-tuple"), "{tips:?}");
        // More QPs on one five-tuple cannot help a five-tuple group.
        assert!(!tips.iter().any(|s| s.contains("more QPs per connection")), "{tips:?}");
        // Already pinned: the pin alone.
        assert!(tips.iter().any(|s| s.contains("[[pin]]") && !s.contains("policy = \"pinned\"")), "{tips:?}");
    }

    #[test]
    fn quiet_on_balanced_or_light_load() {
        // Two heavy QPs on u1, but u2 is busy too.
        assert!(detect(&[row(1, "u1", 1e9), row(2, "u1", 1e9), row(3, "u2", 1e9)], &groups(), None).is_empty());
        // One heavy QP per member.
        assert!(detect(&[row(1, "u1", 1e9), row(2, "u2", 1e9)], &groups(), None).is_empty());
        // Next to no traffic.
        assert!(detect(&[row(1, "u1", 10.0), row(2, "u1", 10.0)], &groups(), None).is_empty());
    }
}
