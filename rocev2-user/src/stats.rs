//! Counter snapshots: read from the maps, rendered as a table or JSON.

use std::collections::BTreeMap;

use anyhow::Result;
use rocev2_common::counters::PortCounter;
use serde::Serialize;

use crate::{dataplane::Maps, state::RunState};

#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub ports: Vec<PortSnapshot>,
    pub groups: Vec<GroupSnapshot>,
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
    pub members: Vec<MemberSnapshot>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberSnapshot {
    pub dev: String,
    pub next_hop: String,
    pub packets: u64,
    pub bytes: u64,
}

impl Snapshot {
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
                });
            }
            groups.push(GroupSnapshot { name: group.name.clone(), hash: group.hash.clone(), members });
        }
        Ok(Self { ports, groups })
    }

    /// Human-readable tables: per port the non-zero counters, per group
    /// each member's packets and share (the hash distribution at a glance).
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("PORT              COUNTER                      VALUE\n");
        for port in &self.ports {
            let mut any = false;
            for counter in PortCounter::ALL {
                let value = port.counters.get(counter.name()).copied().unwrap_or(0);
                if value != 0 {
                    out.push_str(&format!("{:<17} {:<28} {value:>10}\n", port.name, counter.name()));
                    any = true;
                }
            }
            if !any {
                out.push_str(&format!("{:<17} {:<28} {:>10}\n", port.name, "(no traffic)", 0));
            }
        }
        for group in &self.groups {
            let total: u64 = group.members.iter().map(|m| m.packets).sum();
            out.push_str(&format!("\nGROUP {} (hash {})\n", group.name, group.hash));
            out.push_str("  MEMBER            NEXT HOP                     PACKETS        BYTES  SHARE\n");
            for m in &group.members {
                let share = if total == 0 { 0.0 } else { 100.0 * m.packets as f64 / total as f64 };
                out.push_str(&format!(
                    "  {:<17} {:<24} {:>12} {:>12} {share:>5.1}%  {}\n",
                    m.dev,
                    m.next_hop,
                    m.packets,
                    m.bytes,
                    bar(share)
                ));
            }
        }
        out
    }
}

fn bar(percent: f64) -> String {
    "#".repeat((percent / 5.0).round() as usize)
}
