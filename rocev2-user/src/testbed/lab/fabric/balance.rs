//! How a fabric's switches spread traffic over their paths (the modes of
//! the collective scorecard), written into every switch's config.
//!
//! - `hash` (five-tuple, or `qp`: Meta's E-ECMP with the BTH DestQP);
//! - `slice`: static path pinning as Meta first deployed it. Every switch
//!   sends the traffic for host i of any rack over member (i - 1) mod n of
//!   the group it would otherwise hash over, by more specific routes (a
//!   /24 or /64 per host). A full rack spreads perfectly; a job that fills
//!   racks partially (fragmentation) piles up on the few members its hosts'
//!   indexes name.
//! - `te`: centralized traffic engineering: per-QP pins (`[[pin]]`, groups
//!   with `policy = "pinned"`) computed by `rocev2 lab te` with CSPF from a
//!   collective's traffic matrix;
//! - `flowlet`: flowlet switching with a keyed (LRU) or keyless (ASIC-like
//!   slot array) table and an idle gap;
//! - `transport-aware`: flowlets whose groups demote members the QPs on
//!   them see trouble on (NAKs, resends, CNPs; from the switches' per-QP
//!   telemetry), a new flowlet starting also when a QP's ACK says nothing
//!   of it is in flight.
//!
//! Every group with more than one member gets the mode's policy; the
//! one-member groups of the hosts stay as they are.

use std::fmt::Write as _;

use rocev2_common::{flowlet::FlowletTable, hash::HashMode};
use serde::{Deserialize, Serialize};

use crate::tools::fabric::{Fabric, Switch};

/// Per-QP telemetry table of the transport-aware mode (and of a lab of RDMA hosts).
pub const TELEMETRY_QPS: u32 = 4096;

/// One pin of the TE mode: at `switch`, QP `qp` to host `dst` leaves by `port`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TePin {
    pub switch: Switch,
    pub dst: (u32, u32),
    pub qp: u32,
    pub port: String,
}

/// A fabric's load-balancing mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum Balance {
    Hash { hash: HashMode },
    Slice,
    Te { pins: Vec<TePin> },
    Flowlet { table: FlowletTable, gap_us: u32 },
    TransportAware { gap_us: u32 },
}

impl Balance {
    /// A short name for tables: `five-tuple`, `qp`, `slice`, `te`,
    /// `flowlet keyed 2000us`, `transport-aware`.
    pub fn label(&self) -> String {
        match self {
            Balance::Hash { hash } => hash.name().to_owned(),
            Balance::Slice => "slice".into(),
            Balance::Te { .. } => "te".into(),
            Balance::Flowlet { table, gap_us } => format!("flowlet {} {}", table.name(), gap_text(*gap_us)),
            Balance::TransportAware { gap_us } => format!("transport-aware {}", gap_text(*gap_us)),
        }
    }

    /// The hash every group uses (the pins and slices fall back to `qp`).
    pub fn hash(&self) -> HashMode {
        match self {
            Balance::Hash { hash } => *hash,
            _ => HashMode::Qp,
        }
    }

    /// Lines of the `[dataplane]` table beyond the fabric's own.
    pub fn dataplane_lines(&self) -> String {
        match self {
            Balance::TransportAware { .. } => format!("telemetry_qps = {TELEMETRY_QPS}\n"),
            _ => String::new(),
        }
    }

    /// The policy lines of a group of `members` members.
    pub fn group_lines(&self, members: u32) -> String {
        if members < 2 {
            return String::new();
        }
        match self {
            Balance::Hash { .. } | Balance::Slice => String::new(),
            Balance::Te { .. } => "policy = \"pinned\"\n".into(),
            Balance::Flowlet { table, gap_us } => format!(
                "policy = \"flowlet\"\nflowlet_gap_us = {gap_us}\nflowlet_table = \"{}\"\n",
                table.name()
            ),
            Balance::TransportAware { gap_us } => format!(
                "policy = \"flowlet\"\nflowlet_gap_us = {gap_us}\n\
                 transport_aware = {{ demote_above = 20, restore_below = 2, half_life_ms = 500, cnp_weight = 1, repick = \"idle-or-acked\" }}\n"
            ),
        }
    }

    /// Groups, routes and pins of switch `s` beyond the fabric's own.
    pub fn extra(&self, f: &Fabric, s: Switch) -> String {
        match self {
            Balance::Slice => slice(f, s),
            Balance::Te { pins } => te_pins(f, s, pins),
            _ => String::new(),
        }
    }
}

/// The modes `lab mode` sets (TE comes from `lab te`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    FiveTuple,
    Qp,
    Slice,
    Flowlet,
    TransportAware,
}

/// `rocev2 lab mode`: how the fabric's switches spread traffic.
#[derive(clap::Args, Debug, Clone)]
pub struct LabModeArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// five-tuple or qp hashing, static slices (path pinning), flowlets, or
    /// transport-aware flowlets (centralized TE: `rocev2 lab te`).
    pub mode: ModeArg,
    /// flowlet: the table, keyed (LRU) or keyless (an ASIC's slot array).
    #[arg(long, value_enum, default_value = "keyed")]
    pub flowlet_table: FlowletTableArg,
    /// flowlet, transport-aware: the idle gap after which a flow may move (2ms, 500us).
    #[arg(long, value_parser = parse_gap, default_value = "2ms")]
    pub flowlet_gap: u32,
}

/// The flowlet table kinds, for the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowletTableArg {
    Keyed,
    Keyless,
}

pub use crate::control::config::parse_gap;

impl LabModeArgs {
    pub fn balance(&self) -> Balance {
        let gap_us = self.flowlet_gap;
        match self.mode {
            ModeArg::FiveTuple => Balance::Hash { hash: HashMode::FiveTuple },
            ModeArg::Qp => Balance::Hash { hash: HashMode::Qp },
            ModeArg::Slice => Balance::Slice,
            ModeArg::Flowlet => Balance::Flowlet {
                table: match self.flowlet_table {
                    FlowletTableArg::Keyed => FlowletTable::Keyed,
                    FlowletTableArg::Keyless => FlowletTable::Keyless,
                },
                gap_us,
            },
            ModeArg::TransportAware => Balance::TransportAware { gap_us },
        }
    }
}

/// `rocev2 lab mode`: rewrites every switch's config and restarts its dataplane.
pub fn mode(args: &LabModeArgs) -> anyhow::Result<()> {
    let mut record = crate::testbed::lab::LabRecord::read(&args.name)?;
    let balance = args.balance();
    let took = super::apply_balance(&mut record, &balance, true)?;
    println!(
        "Fabric {:?}: every switch now balances by {} ({} dataplanes restarted in {:.1} s)",
        args.name,
        balance.label(),
        record.switches.len(),
        took.as_secs_f64()
    );
    Ok(())
}

pub use crate::render::gap_text;

fn host_prefixes(f: &Fabric, r: u32, i: u32) -> Vec<String> {
    let mut out = Vec::new();
    if f.v4 {
        out.push(format!("10.{r}.{i}.0/24"));
    }
    if f.v6 {
        out.push(format!("fd00:{r}:{i}::/64"));
    }
    out
}

fn host_addresses(f: &Fabric, r: u32, i: u32) -> Vec<String> {
    let mut out = Vec::new();
    if f.v4 {
        out.push(format!("{}/32", Fabric::host_v4(r, i)));
    }
    if f.v6 {
        out.push(format!("{}/128", Fabric::host_v6(r, i)));
    }
    out
}

/// (group name, dev, next hop) of the member switch `s` uses for host
/// (r, i) under `slice`, or None where its choice is not a group's.
fn slice_member(f: &Fabric, s: Switch, r: u32, i: u32) -> Option<(String, String, String)> {
    let via = |v4: String, v6: String| if f.v4 { v4 } else { v6 };
    let index = |n: u32| (i - 1) % n;
    match s {
        Switch::Leaf(own) if own != r => {
            let ups = f.uplinks(own);
            let (j, k) = ups[index(ups.len() as u32) as usize];
            let ((_, s4), (_, s6)) = (Fabric::fabric_v4(own, j, k), Fabric::fabric_v6(own, j, k));
            Some((format!("slice_s{j}p{k}"), Fabric::uplink_port(j, k), via(s4, s6)))
        }
        Switch::Spine(j) if f.zone_of_spine(j) == f.zone_of_rack(r) && f.links > 1 => {
            let k = index(f.links) + 1;
            let ((l4, _), (l6, _)) = (Fabric::fabric_v4(r, j, k), Fabric::fabric_v6(r, j, k));
            Some((format!("slice_l{r}p{k}"), Fabric::downlink_port(r, k), via(l4, l6)))
        }
        Switch::Spine(j) if f.zone_of_spine(j) != f.zone_of_rack(r) && f.aggs > 1 => {
            let a = index(f.aggs) + 1;
            let (a4, a6) = (Fabric::agg_v4(j, a).1, Fabric::agg_v6(j, a).1);
            Some((format!("slice_a{a}"), Fabric::agg_port(a), via(a4, a6)))
        }
        Switch::Agg(a) if f.zone_spines() > 1 => {
            let j = *f.spines_of_zone(f.zone_of_rack(r)).start() + index(f.zone_spines());
            let (s4, s6) = (Fabric::agg_v4(j, a).0, Fabric::agg_v6(j, a).0);
            Some((format!("slice_s{j}"), Fabric::spine_port(j), via(s4, s6)))
        }
        _ => None,
    }
}

/// `slice`: a one-member group per member used and a route per host.
fn slice(f: &Fabric, s: Switch) -> String {
    let mut groups: Vec<(String, String, String)> = Vec::new();
    let mut routes = String::new();
    for r in 1..=f.racks {
        for i in 1..=f.hosts {
            let Some(member) = slice_member(f, s, r, i) else { continue };
            for prefix in host_prefixes(f, r, i) {
                let _ = write!(routes, "\n[[route]]\nprefix = \"{prefix}\"\ngroup = \"{}\"\n", member.0);
            }
            if !groups.contains(&member) {
                groups.push(member);
            }
        }
    }
    if groups.is_empty() {
        return String::new();
    }
    let mut t = String::from("\n# Static path pinning (slice): host i of every rack by member (i - 1) mod n.\n");
    for (name, dev, via) in &groups {
        let _ = write!(t, "\n[[group]]\nname = \"{name}\"\nmembers = [{{ dev = \"{dev}\", via = \"{via}\" }}]\n");
    }
    t + &routes
}

/// The name of the group switch `s` reaches host (r, i) by, for a pin.
fn pinned_group(f: &Fabric, s: Switch, r: u32) -> Option<String> {
    match s {
        Switch::Leaf(own) if own != r => Some("spines".into()),
        Switch::Spine(j) if f.zone_of_spine(j) == f.zone_of_rack(r) => Some(format!("rack{r}")),
        Switch::Spine(_) => Some("aggs".into()),
        Switch::Agg(_) => Some(format!("zone{}", f.zone_of_rack(r))),
        _ => None,
    }
}

fn te_pins(f: &Fabric, s: Switch, pins: &[TePin]) -> String {
    let mut t = String::new();
    for p in pins.iter().filter(|p| p.switch == s) {
        let Some(group) = pinned_group(f, s, p.dst.0) else { continue };
        for prefix in host_addresses(f, p.dst.0, p.dst.1) {
            let _ = write!(
                t,
                "\n[[pin]]\nprefix = \"{prefix}\"\nqp = {:#x}\ngroup = \"{group}\"\nmember = \"{}\"\n",
                p.qp, p.port
            );
        }
    }
    if t.is_empty() {
        t
    } else {
        format!("\n# Centralized TE (rocev2 lab te): per-QP paths from CSPF.\n{t}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::fabric::SeedPlan;

    fn fabric() -> Fabric {
        Fabric {
            racks: 2,
            hosts: 4,
            spines: 2,
            links: 2,
            zones: 1,
            aggs: 0,
            v4: true,
            v6: false,
            hash: HashMode::Qp,
            hash_version: rocev2_common::hash::HashVersion::V1,
            seeds: SeedPlan::Auto,
        }
    }

    #[test]
    fn balance_slice_sends_host_i_by_member_i_mod_n() {
        let f = fabric();
        let leaf = slice(&f, Switch::Leaf(1));
        // 4 uplinks (2 spines x 2 links): host i of rack 2 by uplink i.
        assert!(leaf.contains("prefix = \"10.2.3.0/24\"\ngroup = \"slice_s1p2\""), "{leaf}");
        assert!(
            leaf.contains("name = \"slice_s2p2\"\nmembers = [{ dev = \"s2p2\", via = \"172.18.18.2\" }]"),
            "{leaf}"
        );
        assert!(!leaf.contains("10.1."), "no slice routes to its own rack: {leaf}");
        let spine = slice(&f, Switch::Spine(1));
        assert!(spine.contains("prefix = \"10.2.4.0/24\"\ngroup = \"slice_l2p2\""), "{spine}");
        assert_eq!(Balance::Slice.group_lines(4), "");
    }

    #[test]
    fn balance_te_pins_name_the_group_and_member() {
        let f = fabric();
        let pins = vec![TePin { switch: Switch::Leaf(1), dst: (2, 3), qp: 0x8040, port: "s2p1".into() }];
        let t = Balance::Te { pins: pins.clone() }.extra(&f, Switch::Leaf(1));
        assert!(t.contains("prefix = \"10.2.3.1/32\"\nqp = 0x8040\ngroup = \"spines\"\nmember = \"s2p1\""), "{t}");
        assert!(Balance::Te { pins }.extra(&f, Switch::Leaf(2)).is_empty());
        assert_eq!(Balance::Te { pins: vec![] }.group_lines(4), "policy = \"pinned\"\n");
        assert_eq!(Balance::Te { pins: vec![] }.group_lines(1), "");
    }

    #[test]
    fn balance_labels() {
        assert_eq!(Balance::Hash { hash: HashMode::FiveTuple }.label(), "five-tuple");
        assert_eq!(Balance::Flowlet { table: FlowletTable::Keyless, gap_us: 2000 }.label(), "flowlet keyless 2ms");
        assert!(Balance::TransportAware { gap_us: 500 }.group_lines(2).contains("transport_aware"));
    }
}
