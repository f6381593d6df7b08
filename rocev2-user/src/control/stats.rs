//! Counter snapshots: read from the maps, rendered as a table or JSON.

use std::{collections::BTreeMap, path::Path};

use anyhow::Result;
use rocev2_common::counters::PortCounter;
use serde::Serialize;

use crate::{
    control::dataplane::Maps,
    control::qp_telemetry,
    control::state::RunState,
    render::{share_bar, Align, Table},
};

/// `Default` is the snapshot of a dataplane with nothing configured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Snapshot {
    pub ports: Vec<PortSnapshot>,
    pub groups: Vec<GroupSnapshot>,
    #[serde(default)]
    pub egress: Vec<EgressSnapshot>,
    #[serde(default)]
    pub classes: Vec<ClassSnapshot>,
    /// Flows in the flowlet table now.
    #[serde(default)]
    pub flowlet_entries: u64,
    /// The hash seed in use; `seed_auto` when derived (`hash_seed = "auto"`).
    pub seed: u32,
    pub seed_auto: bool,
    /// With `[routing] source = "kernel"`: learned routes and groups.
    pub learned: Option<crate::control::state::LearnedStats>,
    /// With `[bridge]`: the bridge mirror.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge: Option<crate::control::state::BridgeStats>,
    /// With `telemetry_qps`: QPs in the telemetry table now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub telemetry_qps: Option<u64>,
    /// Per egress device, frames it refused after a redirect (its ring
    /// full, down, a veth peer without NAPI): lost, and not in `forwarded`.
    /// Every device redirects go to, and any other that refused frames.
    pub egress_refused: Vec<RefusedSnapshot>,
    /// Why refused redirects are not counted, if they are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_refused_uncounted: Option<String>,
    /// Set when no live `rocev2 run` manages the dataplane (it handed over
    /// and none took over, or it died): what that means and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<String>,
}

/// Frames one egress device refused after the XDP program redirected them.
#[derive(Clone, Debug, Serialize)]
pub struct RefusedSnapshot {
    /// The device's name, `ifindex N` if `run` did not name it, or `CPU
    /// map` for a `cpu_spread` hand-over.
    pub dev: String,
    pub ifindex: u32,
    pub frames: u64,
}

/// An egress port's marking counters and virtual queue.
#[derive(Clone, Debug, Serialize)]
pub struct EgressSnapshot {
    pub name: String,
    pub rate_bytes_per_sec: u64,
    pub counters: BTreeMap<&'static str, u64>,
    /// Depth at the last packet (not drained to now).
    pub queue_bytes: u64,
    pub queue_high_water_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClassSnapshot {
    pub name: String,
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PortSnapshot {
    pub name: String,
    pub ifindex: u32,
    pub counters: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct GroupSnapshot {
    pub name: String,
    pub hash: String,
    /// "hash", "flowlet" or "pinned".
    pub policy: String,
    /// A flowlet group's knobs (gap, choice, boundary, table size).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flowlet: Option<crate::control::state::FlowletKnobs>,
    /// A `transport_aware` group's knobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_aware: Option<crate::control::state::TransportAwareKnobs>,
    pub members: Vec<MemberSnapshot>,
}

impl Snapshot {
    /// `stats --group NAME`: keeps the groups whose name is or contains
    /// one of `names` (a learned group's name lists its next hops, e.g.
    /// `nh:s1l1+s1l2`); fails, listing the groups, when one matches none.
    pub fn keep_groups(&mut self, names: &[String]) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let matches = |group: &str, name: &str| group == name || group.contains(name);
        if let Some(unmatched) = names.iter().find(|n| !self.groups.iter().any(|g| matches(&g.name, n))) {
            let all: Vec<&str> = self.groups.iter().map(|g| g.name.as_str()).collect();
            anyhow::bail!(
                "--group {unmatched}: no group's name contains {unmatched:?}; the groups: {}",
                all.join(", ")
            );
        }
        self.groups.retain(|g| names.iter().any(|n| matches(&g.name, n)));
        Ok(())
    }
}

impl GroupSnapshot {
    /// `hash qp, flowlet gap 500us`: the policy and its knobs.
    pub fn describe(&self) -> String {
        let policy = crate::control::state::describe_policy(&self.hash, &self.policy, self.flowlet.as_ref());
        match &self.transport_aware {
            Some(t) => format!("{policy}, {}", t.describe()),
            None => policy,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberSnapshot {
    pub dev: String,
    pub next_hop: String,
    pub packets: u64,
    pub bytes: u64,
    /// The transport signals of the QPs this member carries (with
    /// `telemetry_qps` on; see [`Snapshot::add_transport`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<MemberTransportView>,
    /// In a `transport_aware` group: the health score, whether the member
    /// is demoted, its demotions and restores (see crate::control::health).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::control::health::MemberHealth>,
}

/// Per member: what the QPs it carries went through.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct MemberTransportView {
    /// Data PSNs ahead of the expected one (loss before this switch).
    pub psn_gaps: u64,
    /// Data PSNs going back (go-back-N resends, reordering).
    pub retransmits: u64,
    pub naks_sequence: u64,
    /// RNR and other NAKs.
    pub naks_other: u64,
    pub cnps: u64,
    /// Data packets leaving CE-marked.
    pub ce_marked: u64,
    /// Flowlets of its QPs ended by an ACK of all they sent
    /// (`repick = "idle-or-acked"`).
    pub acked_repicks: u64,
}

impl Snapshot {
    /// Adds the per-member transport sums when the dataplane under
    /// `pin_dir` runs with telemetry (bounded: per member, never per QP).
    pub fn add_transport(&mut self, pin_dir: &Path, state: &RunState) -> Result<()> {
        if !qp_telemetry::is_on(pin_dir) {
            return Ok(());
        }
        for (g, snapshot) in state.groups.iter().zip(&mut self.groups) {
            let sums = qp_telemetry::read_members(pin_dir, g.index, snapshot.members.len() as u32)?;
            for (m, t) in snapshot.members.iter_mut().zip(sums) {
                m.transport = Some(MemberTransportView {
                    psn_gaps: t.psn_forward_jumps,
                    retransmits: t.psn_backward_jumps,
                    naks_sequence: t.naks_sequence,
                    naks_other: t.naks_other,
                    cnps: t.cnps,
                    ce_marked: t.ce_marked,
                    acked_repicks: t.acked_repicks,
                });
            }
        }
        self.telemetry_qps = Some(qp_telemetry::count_qps(pin_dir)? as u64);
        Ok(())
    }

    pub fn collect(maps: &Maps, state: &RunState) -> Result<Self> {
        let mut ports = Vec::new();
        for port in &state.ports {
            ports.push(PortSnapshot {
                name: port.name.clone(),
                ifindex: port.ifindex,
                counters: maps.port_counters(port.slot)?,
            });
        }
        let mut groups = Vec::new();
        for group in &state.groups {
            let mut members = Vec::new();
            for (position, m) in group.members.iter().enumerate() {
                let s = maps.member_stats(group.index, position as u32)?;
                members.push(MemberSnapshot {
                    dev: m.dev.clone(),
                    next_hop: m.next_hop.clone(),
                    packets: s.packets,
                    bytes: s.bytes,
                    transport: None,
                    health: m.health,
                });
            }
            groups.push(GroupSnapshot {
                name: group.name.clone(),
                hash: group.hash.clone(),
                policy: if group.policy.is_empty() { "hash".into() } else { group.policy.clone() },
                flowlet: group.flowlet.clone(),
                transport_aware: group.transport_aware.clone(),
                members,
            });
        }
        let mut egress = Vec::new();
        for e in &state.egress {
            let q = maps.virtual_queue(e.slot)?;
            egress.push(EgressSnapshot {
                name: e.name.clone(),
                rate_bytes_per_sec: e.rate_bytes_per_sec,
                counters: maps.egress_counters(e.slot)?,
                queue_bytes: q.depth_bytes,
                queue_high_water_bytes: q.high_water_bytes,
            });
        }
        let mut classes = Vec::new();
        for (i, name) in state.classes.iter().enumerate() {
            let s = maps.class_stats(i as u32)?;
            classes.push(ClassSnapshot { name: name.clone(), packets: s.packets, bytes: s.bytes });
        }
        let flowlet_entries = maps.flowlet_entries() as u64;
        // Every device redirects go to (0 when it refused none), and any
        // other that refused frames.
        let mut refused = maps.egress_refused()?;
        let mut egress_refused: Vec<RefusedSnapshot> = state
            .egress_devices
            .iter()
            .map(|(ifindex, name)| RefusedSnapshot {
                dev: name.clone(),
                ifindex: *ifindex,
                frames: refused.remove(ifindex).unwrap_or(0),
            })
            .collect();
        egress_refused.extend(refused.into_iter().map(|(ifindex, frames)| RefusedSnapshot {
            dev: if ifindex == 0 { "CPU map".to_string() } else { format!("ifindex {ifindex}") },
            ifindex,
            frames,
        }));
        Ok(Self {
            ports,
            groups,
            egress,
            classes,
            flowlet_entries,
            seed: state.seed,
            seed_auto: state.seed_auto,
            learned: state.learned.clone(),
            bridge: state.bridge.clone(),
            telemetry_qps: None,
            egress_refused,
            egress_refused_uncounted: (!state.refusals_uncounted.is_empty()).then(|| state.refusals_uncounted.clone()),
            unmanaged: state.manager().warning(&state.pin_dir),
        })
    }

    /// Frames the egress devices refused after a redirect, in total.
    pub fn refused_total(&self) -> u64 {
        self.egress_refused.iter().map(|r| r.frames).sum()
    }

    /// The warning `stats` prints when an egress device refused frames,
    /// or when they cannot be counted.
    pub fn refusal_warning(&self) -> Option<String> {
        if let Some(why) = &self.egress_refused_uncounted {
            return Some(format!(
                "warning: frames an egress device refuses after a redirect are not counted here (they would show as forwarded): {why}"
            ));
        }
        if self.refused_total() == 0 {
            return None;
        }
        let per_dev: Vec<String> =
            self.egress_refused.iter().filter(|r| r.frames > 0).map(|r| format!("{} {}", r.dev, r.frames)).collect();
        Some(format!(
            "warning: {} redirected frames were LOST: the egress device refused them after the XDP program ({}); its ring was full, it was down, or it is a veth whose peer has no XDP program or GRO (no NAPI). They are counted in drop_egress_refused, not in forwarded.",
            self.refused_total(),
            per_dev.join(", ")
        ))
    }

    /// Flows that left the flowlet table to make room (LRU evictions): flows
    /// ever inserted minus flows present now.
    pub fn flowlet_evictions(&self) -> u64 {
        let inserted: u64 = self.ports.iter().map(|p| p.counters.get("flowlet_inserted").copied().unwrap_or(0)).sum();
        inserted.saturating_sub(self.flowlet_entries)
    }

    /// Human-readable tables: per port the non-zero counters, per group
    /// each member's packets and share (the hash distribution at a glance),
    /// then egress queues, classes and the flowlet table.
    pub fn render(&self) -> String {
        let mut out = self.unmanaged.as_ref().map(|w| format!("WARNING: {w}\n")).unwrap_or_default();
        out.push_str(&self.render_ports_and_groups());
        if !self.egress.is_empty() {
            let mut table = Table::new(&[
                ("EGRESS", Align::Left),
                ("RATE", Align::Right),
                ("QUEUE BYTES", Align::Right),
                ("HIGH-WATER BYTES", Align::Right),
                ("COUNTERS", Align::Left),
            ]);
            for e in &self.egress {
                let counters: Vec<String> =
                    e.counters.iter().filter(|(_, v)| **v != 0).map(|(k, v)| format!("{k}={v}")).collect();
                table.row([
                    e.name.clone(),
                    crate::render::rate_text(e.rate_bytes_per_sec * 8),
                    e.queue_bytes.to_string(),
                    e.queue_high_water_bytes.to_string(),
                    if counters.is_empty() { "(no traffic)".to_string() } else { counters.join(" ") },
                ]);
            }
            out.push('\n');
            out.push_str(&table.render());
        }
        if !self.classes.is_empty() {
            let mut table = Table::new(&[("CLASS", Align::Left), ("PACKETS", Align::Right), ("BYTES", Align::Right)]);
            for c in &self.classes {
                table.row([c.name.clone(), c.packets.to_string(), c.bytes.to_string()]);
            }
            out.push('\n');
            out.push_str(&table.render());
        }
        if self.refused_total() > 0 {
            let mut table = Table::new(&[("EGRESS DEVICE", Align::Left), ("REFUSED FRAMES", Align::Right)]);
            for r in self.egress_refused.iter().filter(|r| r.frames > 0) {
                table.row([r.dev.clone(), r.frames.to_string()]);
            }
            out.push('\n');
            out.push_str(&table.render());
        }
        let inserted: u64 = self.ports.iter().map(|p| p.counters.get("flowlet_inserted").copied().unwrap_or(0)).sum();
        if inserted > 0 || self.flowlet_entries > 0 {
            out.push_str(&format!(
                "\nflowlet table: {} flows, {} evicted (LRU)\n",
                self.flowlet_entries,
                self.flowlet_evictions()
            ));
        }
        out.push_str(&format!(
            "\nhash seed: {}{}\n",
            self.seed,
            if self.seed_auto { " (auto: from the port MACs)" } else { "" }
        ));
        if let Some(l) = &self.learned {
            out.push_str(&l.describe());
            out.push('\n');
        }
        if let Some(b) = &self.bridge {
            out.push_str(&b.describe());
            out.push('\n');
        }
        if let Some(warning) = self.refusal_warning() {
            out.push('\n');
            out.push_str(&warning);
            out.push('\n');
        }
        out
    }

    fn render_ports_and_groups(&self) -> String {
        let mut ports = Table::new(&[("PORT", Align::Left), ("COUNTER", Align::Left), ("VALUE", Align::Right)]);
        for port in &self.ports {
            let mut any = false;
            for counter in PortCounter::ALL {
                let value = port.counters.get(counter.name()).copied().unwrap_or(0);
                if value != 0 {
                    ports.row([port.name.clone(), counter.name().to_string(), value.to_string()]);
                    any = true;
                }
            }
            if !any {
                ports.row([port.name.as_str(), "(no traffic)", "0"]);
            }
        }
        let mut out = ports.render();
        for group in &self.groups {
            let total: u64 = group.members.iter().map(|m| m.packets).sum();
            out.push_str(&format!("\nGROUP {} ({})\n", group.name, group.describe()));
            let mut members = Table::new(&[
                ("MEMBER", Align::Left),
                ("NEXT HOP", Align::Left),
                ("PACKETS", Align::Right),
                ("BYTES", Align::Right),
                ("SHARE", Align::Right),
                ("", Align::Left),
            ]);
            for m in &group.members {
                let share = if total == 0 { 0.0 } else { m.packets as f64 / total as f64 };
                members.row([
                    m.dev.clone(),
                    m.next_hop.clone(),
                    m.packets.to_string(),
                    m.bytes.to_string(),
                    format!("{:.1}%", 100.0 * share),
                    share_bar(share),
                ]);
            }
            out.push_str(&members.indent(2).render());
            let aware = group.members.iter().any(|m| m.health.is_some());
            if group.members.iter().any(|m| m.transport.is_some()) {
                let mut columns = vec![
                    ("MEMBER", Align::Left),
                    ("PSN GAPS", Align::Right),
                    ("GO-BACKS", Align::Right),
                    ("SEQ NAKS", Align::Right),
                    ("OTHER NAKS", Align::Right),
                    ("CNPS", Align::Right),
                    ("CE", Align::Right),
                ];
                if aware {
                    columns.extend([
                        ("HEALTH", Align::Right),
                        ("STATE", Align::Left),
                        ("DEMOTIONS", Align::Right),
                        ("RESTORES", Align::Right),
                        ("ACKED RE-PICKS", Align::Right),
                    ]);
                }
                let mut transport = Table::new(&columns);
                for m in &group.members {
                    let t = m.transport.unwrap_or_default();
                    let mut row = vec![
                        m.dev.clone(),
                        t.psn_gaps.to_string(),
                        t.retransmits.to_string(),
                        t.naks_sequence.to_string(),
                        t.naks_other.to_string(),
                        t.cnps.to_string(),
                        t.ce_marked.to_string(),
                    ];
                    if aware {
                        let h = m.health.unwrap_or_default();
                        row.extend([
                            format!("{:.2}", h.score),
                            if h.demoted { "demoted" } else { "in service" }.to_string(),
                            h.demotions.to_string(),
                            h.restores.to_string(),
                            t.acked_repicks.to_string(),
                        ]);
                    }
                    transport.row(row);
                }
                out.push_str("  transport (QPs on each member, from telemetry):\n");
                out.push_str(&transport.indent(2).render());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(groups: &[&str]) -> Snapshot {
        Snapshot {
            ports: Vec::new(),
            groups: groups
                .iter()
                .map(|name| GroupSnapshot {
                    name: name.to_string(),
                    hash: "qp".into(),
                    policy: "hash".into(),
                    flowlet: None,
                    transport_aware: None,
                    members: Vec::new(),
                })
                .collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn group_filter_keeps_what_names_contain_and_lists_the_groups_otherwise() {
        let names = ["nh:h2/10.0.2.1", "nh:s1l1+s1l2+s2l1+s2l2", "nh:s2l1+s2l2"];
        let mut s = snapshot(&names);
        s.keep_groups(&["s2l1".into()]).unwrap();
        let kept: Vec<&str> = s.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(kept, ["nh:s1l1+s1l2+s2l1+s2l2", "nh:s2l1+s2l2"]);
        let mut s = snapshot(&names);
        s.keep_groups(&["nh:h2/10.0.2.1".into()]).unwrap();
        assert_eq!(s.groups.len(), 1);
        let err = snapshot(&["spines"]).keep_groups(&["spine".into(), "leaves".into()]).unwrap_err();
        assert_eq!(err.to_string(), "--group leaves: no group's name contains \"leaves\"; the groups: spines");
    }
}
