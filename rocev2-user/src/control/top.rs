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
use serde::Serialize;

use crate::{
    control::collisions::{self, Collision, GroupMembers},
    control::config::Config,
    control::decision::read_live,
    control::qp_telemetry::{self, QpEntry, TopRow},
    control::state::RunState,
    render::{Align, Table},
};

#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// Config of the running instance (to find its pin_dir). Without
    /// --config or --pin-dir: /etc/rocev2/rocev2.toml if it exists,
    /// else the default pin directory /sys/fs/bpf/rocev2.
    #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
    pub config: Option<PathBuf>,
    /// Pin directory of the running instance.
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub pin_dir: Option<PathBuf>,
    /// Print one view and exit: rates over one --interval (it waits that
    /// long), as the live view shows them.
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
    /// The interval the rates are measured over (0: over each QP's life).
    pub interval_secs: f64,
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
    qps.sort_by(|a, b| b.trouble().cmp(&a.trouble()).then(busier(a, b)));
    let interval_secs = if before.is_empty() { 0.0 } else { secs };
    TopSnapshot { tracked: now.len(), interval_secs, qps, collisions: Vec::new() }
}

/// The busier of two QPs first: by rate over the interval, then the one
/// that sent most recently (QPs idle over the interval tie at 0).
fn busier(a: &TopRow, b: &TopRow) -> std::cmp::Ordering {
    b.bits_per_sec.total_cmp(&a.bits_per_sec).then(a.idle_secs.total_cmp(&b.idle_secs))
}

/// The groups' member devices, as the state file lists them.
pub fn group_members(state: &RunState) -> GroupMembers {
    state
        .groups
        .iter()
        .map(|g| {
            let view = collisions::GroupView {
                members: g.members.iter().map(|m| m.dev.clone()).collect(),
                hash: g.hash.clone(),
                policy: g.policy.clone(),
            };
            (g.name.clone(), view)
        })
        .collect()
}

fn rate(bits: f64) -> String {
    match bits {
        b if b >= 1e9 => format!("{:.2}G", b / 1e9),
        b if b >= 1e6 => format!("{:.2}M", b / 1e6),
        b if b >= 1e3 => format!("{:.1}k", b / 1e3),
        b => format!("{b:.0}"),
    }
}

/// A column of the QP tables: header, alignment, cell.
struct Column {
    header: &'static str,
    align: Align,
    cell: fn(&TopRow) -> String,
}

/// The columns, most important first: on a terminal too narrow for all of
/// them the last ones are left out (as `top` and `iftop` fit the screen),
/// never the identity, the rate or the trouble counters.
const COLUMNS: &[Column] = &[
    Column { header: "DST", align: Align::Left, cell: |r| r.dst.to_string() },
    Column { header: "QP", align: Align::Left, cell: |r| format!("{:#x}", r.dest_qp) },
    Column { header: "MEMBER", align: Align::Left, cell: |r| format!("{}/{}", r.group, r.member) },
    Column { header: "RATE b/s", align: Align::Right, cell: |r| rate(r.bits_per_sec) },
    Column { header: "PPS", align: Align::Right, cell: |r| format!("{:.0}", r.pps) },
    Column { header: "GAPS", align: Align::Right, cell: |r| r.stats.psn_forward_jumps.to_string() },
    Column { header: "GO-BACKS", align: Align::Right, cell: |r| r.stats.psn_backward_jumps.to_string() },
    Column { header: "SEQ NAK", align: Align::Right, cell: |r| r.stats.naks_sequence.to_string() },
    Column { header: "CNP", align: Align::Right, cell: |r| r.stats.cnps.to_string() },
    Column { header: "CE", align: Align::Right, cell: |r| r.stats.ce_marked.to_string() },
    Column { header: "RNR", align: Align::Right, cell: |r| r.stats.naks_rnr.to_string() },
    Column { header: "IDLE s", align: Align::Right, cell: |r| format!("{:.1}", r.idle_secs) },
    Column { header: "MOVES", align: Align::Right, cell: |r| r.stats.member_changes.to_string() },
    Column { header: "PACKETS", align: Align::Right, cell: |r| r.stats.packets.to_string() },
];

/// Columns that always stay, however narrow the terminal.
const ESSENTIAL_COLUMNS: usize = 8;

/// The rows as a table no wider than `width` (None: every column).
fn table(rows: &[&TopRow], width: Option<usize>) -> String {
    let render = |count: usize| {
        let columns = &COLUMNS[..count];
        let mut t = Table::new(&columns.iter().map(|c| (c.header, c.align)).collect::<Vec<_>>()).indent(1);
        for r in rows {
            t.row(columns.iter().map(|c| (c.cell)(r)));
        }
        t.render()
    };
    let mut count = COLUMNS.len();
    let mut text = render(count);
    while let Some(width) = width {
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        if widest <= width || count <= ESSENTIAL_COLUMNS {
            break;
        }
        count -= 1;
        text = render(count);
    }
    text
}

/// Where the view goes: a terminal's size fits it, anything else gets
/// every column and `--rows` rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Screen {
    pub columns: Option<usize>,
    pub lines: Option<usize>,
}

/// QPs whose replies the switch cannot tell apart: a reply (ACK, NAK,
/// CNP) names the requester's QP, not the data's, so the dataplane links
/// it to a data QP by addresses and UDP source port; QPs that share all
/// three get each other's replies, counted on the one that sent last.
/// One note per such set, when any of them had a reply.
pub fn shared_replies(qps: &[TopRow]) -> Vec<String> {
    let mut sets: std::collections::BTreeMap<(String, String, u16), Vec<&TopRow>> = Default::default();
    for r in qps {
        if let Some(src) = r.src {
            sets.entry((src.to_string(), r.dst.to_string(), r.src_port)).or_default().push(r);
        }
    }
    sets.into_iter()
        .filter(|(_, rows)| rows.len() > 1)
        .filter(|(_, rows)| {
            rows.iter().any(|r| r.stats.acks + r.stats.naks_sequence + r.stats.naks_rnr + r.stats.naks_other + r.stats.cnps > 0)
        })
        .map(|((src, dst, port), rows)| {
            let mut names: Vec<u32> = rows.iter().map(|r| r.dest_qp).collect();
            names.sort_unstable();
            let names: Vec<String> = names.iter().map(|q| format!("{q:#x}")).collect();
            format!(
                "SHARED REPLIES: QPs {} ({src} -> {dst}, UDP source port {port}) cannot be told apart in their replies: their NAKs, CNPs and ACKs are counted on whichever of them sent last\n",
                names.join(", ")
            )
        })
        .collect()
}

impl TopSnapshot {
    /// The view: the busiest QPs, the unhealthiest, the collisions; each
    /// table at most `rows` long, and on a `screen` no larger than it.
    pub fn render(&self, rows: usize, screen: Screen) -> String {
        let collisions: String = self
            .collisions
            .iter()
            .map(|c| format!("\n{}", c.render()))
            .chain(shared_replies(&self.qps).into_iter().map(|note| format!("\n{note}")))
            .collect();
        // Title, blank, two section titles with their headers, blank: 7
        // lines besides the rows; the rest is shared by the two tables.
        let rows = match screen.lines {
            Some(lines) => rows.min(lines.saturating_sub(7 + collisions.lines().count()).max(2) / 2),
            None => rows,
        };
        let mut busiest: Vec<&TopRow> = self.qps.iter().collect();
        busiest.sort_by(|a, b| busier(a, b));
        busiest.truncate(rows);
        let unhealthy: Vec<&TopRow> = self.qps.iter().filter(|r| r.trouble() > 0).take(rows).collect();
        let over = if self.interval_secs > 0.0 {
            format!("rates over the last {:.1} s", self.interval_secs)
        } else {
            "rates over each QP's life in the table".to_string()
        };
        let mut s = format!(
            "rocev2 top: {} QPs in the telemetry table, {over}\n\nBUSIEST\n{}",
            self.tracked,
            table(&busiest, screen.columns)
        );
        if unhealthy.is_empty() {
            s.push_str("\nUNHEALTHIEST: no QP with gaps, go-backs, NAKs or CNPs\n");
        } else {
            s.push_str(&format!(
                "\nUNHEALTHIEST (gaps + go-backs + NAKs + CNPs)\n{}",
                table(&unhealthy, screen.columns)
            ));
        }
        s.push_str(&collisions);
        s
    }
}

pub fn run(pin_dir: &Path, args: &TopArgs) -> Result<()> {
    if !(args.interval > 0.0 && args.interval.is_finite()) {
        bail!("--interval must be a positive number of seconds, not {}", args.interval);
    }
    let state = RunState::read_with_telemetry(pin_dir, "")?;
    let groups = group_members(&state);
    // The running config and live member lists let the collision detector
    // try other seeds through `explain`; without them it still reports.
    let config = Config::load(&state.config).ok();
    let live = config.as_ref().and_then(|c| read_live(c).ok());
    let interval = Duration::from_secs_f64(args.interval);
    // Every view shows rates over the last interval, --once too: a QP's
    // lifetime average would rank QPs idle for minutes as the busiest.
    let mut before = qp_telemetry::read_qps(pin_dir)?;
    let mut taken = Instant::now();
    loop {
        std::thread::sleep(interval);
        let now = qp_telemetry::read_qps(pin_dir)?;
        let secs = taken.elapsed().as_secs_f64();
        taken = Instant::now();
        let mut snap = snapshot(&state, &now, &before, secs, monotonic_ns());
        snap.collisions = collisions::detect(&snap.qps, &groups, config.as_ref().zip(live.as_ref()));
        if args.json {
            println!("{}", serde_json::to_string_pretty(&snap)?);
        } else if args.once {
            print!("{}", snap.render(args.rows, Screen::default()));
        } else {
            let size = crate::render::terminal_size();
            let screen = Screen { columns: size.map(|s| s.0), lines: size.map(|s| s.1.saturating_sub(2)) };
            let clock = crate::control::state::clock_time(crate::control::state::now_epoch());
            print!(
                "\x1b[2J\x1b[Hrocev2 top  {}  every {:.1} s  {clock}  Ctrl-C stops\n{}",
                pin_dir.display(),
                args.interval,
                snap.render(args.rows, screen)
            );
        }
        if args.once {
            return Ok(());
        }
        before = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(qp: u32, src_port: u16, naks: u64) -> TopRow {
        TopRow {
            src: Some("10.0.1.1".parse().unwrap()),
            src_port,
            dst: "10.1.0.1".parse().unwrap(),
            dest_qp: qp,
            group: "spines".into(),
            member: "s1".into(),
            pps: 1.0,
            bits_per_sec: 1e6,
            stats: QpStats { naks_sequence: naks, ..Default::default() },
            idle_secs: 0.0,
        }
    }

    use rocev2_common::telemetry::QpStats;

    #[test]
    fn qps_sharing_a_source_port_get_a_note_on_their_replies() {
        // Two QPs on one five-tuple, one NAK: which of them it answered the
        // switch cannot know, and says so.
        let notes = shared_replies(&[row(0x101, 0xC000, 1), row(0x100, 0xC000, 0), row(0x102, 0xC001, 0)]);
        assert_eq!(
            notes,
            ["SHARED REPLIES: QPs 0x100, 0x101 (10.0.1.1 -> 10.1.0.1, UDP source port 49152) cannot be told apart in their replies: their NAKs, CNPs and ACKs are counted on whichever of them sent last\n"]
        );
        // Without replies, or with a port each, there is nothing to say.
        assert!(shared_replies(&[row(0x100, 0xC000, 0), row(0x101, 0xC000, 0)]).is_empty());
        assert!(shared_replies(&[row(0x100, 0xC000, 1), row(0x101, 0xC001, 1)]).is_empty());
    }
}
