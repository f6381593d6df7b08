//! `rocev2 top`: the busiest and the unhealthiest QPs of a running
//! dataplane, live, from its per-QP telemetry table (`telemetry_qps` in
//! `[dataplane]`): rate, the member carrying the QP, PSN gaps,
//! retransmissions (backward PSN jumps), NAKs by syndrome, CNPs and CE
//! marks, and QP collisions (see `collisions`).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use comfy_table::{presets::NOTHING, Table};
use serde::Serialize;

use crate::{
    control::collisions::{self, Collision, GroupMembers},
    control::config::Config,
    control::decision::read_live,
    control::qp_telemetry::{self, QpEntry, TopRow},
    control::state::RunState,
};

#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// Config of the running instance (to find its pin_dir).
    #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
    pub config: Option<PathBuf>,
    /// Pin directory of the running instance.
    #[arg(long, value_name = "DIR")]
    pub pin_dir: Option<PathBuf>,
    /// Print one snapshot and exit (rates are averages over each QP's
    /// lifetime in the table).
    #[arg(long)]
    pub once: bool,
    /// Machine-readable output (one snapshot per refresh).
    #[arg(long)]
    pub json: bool,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// QPs listed per section.
    #[arg(long, default_value_t = 15)]
    pub rows: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopSnapshot {
    /// QPs in the table (at most `telemetry_qps`).
    pub tracked: usize,
    /// Every QP, the unhealthiest first, then the busiest.
    pub qps: Vec<TopRow>,
    /// Heavy QPs sharing a member while another member idles.
    pub collisions: Vec<Collision>,
}

/// The kernel's coarse monotonic clock, the one the telemetry's
/// `bpf_ktime_get_coarse_ns` reads.
pub fn monotonic_ns() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE)
        .map_or(0, |ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
}

/// Names of a group slot and one of its member positions.
pub fn member_name(state: &RunState, group: u32, position: u32) -> (String, String) {
    if group == rocev2_common::maps::BRIDGE_PORT_GROUP {
        // Bridge mode: to the one port the FDB names, no group.
        return ("fdb".to_string(), "(its port)".to_string());
    }
    match state.groups.iter().find(|g| g.index == group) {
        Some(g) => {
            (g.name.clone(), g.members.get(position as usize).map_or_else(|| format!("#{position}"), |m| m.dev.clone()))
        }
        None => (format!("group {group}"), format!("#{position}")),
    }
}

/// Builds the rows from two reads `secs` apart (`before` empty: lifetime
/// averages).
pub fn snapshot(state: &RunState, now: &[QpEntry], before: &[QpEntry], secs: f64, now_ns: u64) -> TopSnapshot {
    let mut qps: Vec<TopRow> = now
        .iter()
        .map(|e| {
            let s = &e.stats;
            let prev = before.iter().find(|b| b.dst == e.dst && b.dest_qp == e.dest_qp);
            let (packets, bytes, span) = match prev {
                Some(p) => (s.packets - p.stats.packets.min(s.packets), s.bytes - p.stats.bytes.min(s.bytes), secs),
                None if before.is_empty() => {
                    (s.packets, s.bytes, (s.last_seen_ns.saturating_sub(s.first_seen_ns)) as f64 / 1e9)
                }
                None => (s.packets, s.bytes, secs),
            };
            let span = span.max(1e-3);
            let (group, member) = member_name(state, s.group, s.position);
            TopRow {
                src: Some(e.src),
                src_port: e.src_port,
                dst: e.dst,
                dest_qp: e.dest_qp,
                group,
                member,
                pps: packets as f64 / span,
                bits_per_sec: bytes as f64 * 8.0 / span,
                stats: *s,
                idle_secs: now_ns.saturating_sub(s.last_seen_ns) as f64 / 1e9,
            }
        })
        .collect();
    qps.sort_by(|a, b| b.trouble().cmp(&a.trouble()).then(b.bits_per_sec.total_cmp(&a.bits_per_sec)));
    TopSnapshot { tracked: now.len(), qps, collisions: Vec::new() }
}

/// The groups' member devices, as the state file lists them.
pub fn group_members(state: &RunState) -> GroupMembers {
    state.groups.iter().map(|g| (g.name.clone(), g.members.iter().map(|m| m.dev.clone()).collect())).collect()
}

fn rate(bits: f64) -> String {
    match bits {
        b if b >= 1e9 => format!("{:.2}G", b / 1e9),
        b if b >= 1e6 => format!("{:.2}M", b / 1e6),
        b if b >= 1e3 => format!("{:.1}k", b / 1e3),
        b => format!("{b:.0}"),
    }
}

fn table(rows: &[&TopRow]) -> String {
    let mut t = Table::new();
    t.load_style(NOTHING).set_header([
        "DST", "QP", "MEMBER", "RATE b/s", "PPS", "PACKETS", "GAPS", "RETX", "SEQ NAK", "RNR", "CNP", "CE", "MOVES",
        "IDLE s",
    ]);
    for r in rows {
        t.add_row([
            r.dst.to_string(),
            format!("{:#x}", r.dest_qp),
            format!("{}/{}", r.group, r.member),
            rate(r.bits_per_sec),
            format!("{:.0}", r.pps),
            r.stats.packets.to_string(),
            r.stats.psn_forward_jumps.to_string(),
            r.stats.psn_backward_jumps.to_string(),
            r.stats.naks_sequence.to_string(),
            r.stats.naks_rnr.to_string(),
            r.stats.cnps.to_string(),
            r.stats.ce_marked.to_string(),
            r.stats.member_changes.to_string(),
            format!("{:.1}", r.idle_secs),
        ]);
    }
    t.to_string()
}

impl TopSnapshot {
    pub fn render(&self, rows: usize) -> String {
        let mut busiest: Vec<&TopRow> = self.qps.iter().collect();
        busiest.sort_by(|a, b| b.bits_per_sec.total_cmp(&a.bits_per_sec));
        busiest.truncate(rows);
        let unhealthy: Vec<&TopRow> = self.qps.iter().filter(|r| r.trouble() > 0).take(rows).collect();
        let mut s =
            format!("rocev2 top: {} QPs in the telemetry table\n\nBUSIEST\n{}\n", self.tracked, table(&busiest));
        if unhealthy.is_empty() {
            s.push_str("\nUNHEALTHIEST: no QP with gaps, retransmissions, NAKs or CNPs\n");
        } else {
            s.push_str(&format!("\nUNHEALTHIEST (gaps + retransmits + NAKs + CNPs)\n{}\n", table(&unhealthy)));
        }
        for c in &self.collisions {
            s.push('\n');
            s.push_str(&c.render());
        }
        s
    }
}

pub fn run(pin_dir: &Path, args: &TopArgs) -> Result<()> {
    if !(args.interval > 0.0 && args.interval.is_finite()) {
        bail!("--interval must be a positive number of seconds, not {}", args.interval);
    }
    if !qp_telemetry::is_on(pin_dir) {
        bail!(
            "the dataplane under {} runs without telemetry: set telemetry_qps (e.g. 4096) in [dataplane] and restart `rocev2 run`",
            pin_dir.display()
        );
    }
    let state = RunState::read(pin_dir)?;
    let groups = group_members(&state);
    // The running config and live member lists let the collision detector
    // try other seeds through `explain`; without them it still reports.
    let config = Config::load(&state.config).ok();
    let live = config.as_ref().and_then(|c| read_live(c).ok());
    let mut before: Vec<QpEntry> = Vec::new();
    let mut taken = Instant::now();
    loop {
        let now = qp_telemetry::read_qps(pin_dir)?;
        let secs = taken.elapsed().as_secs_f64();
        taken = Instant::now();
        let mut snap = snapshot(&state, &now, &before, secs, monotonic_ns());
        snap.collisions = collisions::detect(&snap.qps, &groups, config.as_ref().zip(live.as_ref()));
        if args.json {
            println!("{}", serde_json::to_string_pretty(&snap)?);
        } else {
            if !args.once {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", snap.render(args.rows));
        }
        if args.once {
            return Ok(());
        }
        before = now;
        std::thread::sleep(Duration::from_secs_f64(args.interval));
    }
}
