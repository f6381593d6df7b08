//! `rocev2 entropy`: an offline simulator that shows why hash entropy
//! matters for RDMA (AI training) traffic.
//!
//! One rack of `hosts` talks to another: host i sends to peer i (one step
//! of a ring collective), each connection over `qps` queue pairs that carry
//! the same number of bytes. A leaf spreads that traffic over `uplinks` with
//! the dataplane's own hash (`rocev2_common::hash` and, for flowlets,
//! `rocev2_common::flowlet::rehash_position`), so what the simulator shows
//! is what `rocev2 run` would do with the same seed.
//!
//! The lesson: NICs give a QP one UDP source port for its whole life (old
//! NICs one per host pair), so a five-tuple hash sees few flows and piles
//! them up; hashing the DestQP multiplies the flows by the QP count, and
//! flowlets re-hash every message.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use rocev2_common::{
    bth::ROCEV2_UDP_PORT,
    buckets::{even_table, member_for},
    flowlet::rehash_position,
    hash::{member_hash, FlowKey, HashMode, HashVersion},
};
use serde::Serialize;

use crate::render::{share_bar, Align, Table};

/// Bytes each connection moves (only shares matter; a round number reads well in JSON).
const CONNECTION_BYTES: f64 = (1u64 << 30) as f64;
/// Limits that keep a run instant and the addressing scheme valid.
const MAX_HOSTS: u32 = 65_534;
const MAX_QPS: u32 = 4096;
const MAX_UPLINKS: u32 = 1024;
const MAX_MESSAGES: u32 = 100_000;
const MAX_WORK: u64 = 50_000_000;
const IPPROTO_UDP: u8 = 17;

/// How the NIC picks the RoCEv2 UDP source port.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SportModel {
    /// One port per host pair, whatever the QP (older NICs).
    Fixed,
    /// Per QP, from the flow label of the QP pair (Linux/ConnectX formula).
    Nic,
    /// A seeded pseudo-random port per QP (deterministic).
    Random,
}

/// How the leaf picks the uplink.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimHash {
    /// Plain ECMP: addresses, protocol, ports.
    FiveTuple,
    /// Enhanced ECMP: five-tuple + BTH DestQP.
    Qp,
    /// Every message is a flowlet, re-hashed with its flowlet number.
    Flowlet,
}

impl SimHash {
    pub const ALL: [SimHash; 3] = [SimHash::FiveTuple, SimHash::Qp, SimHash::Flowlet];

    pub fn name(self) -> &'static str {
        match self {
            SimHash::FiveTuple => "five-tuple",
            SimHash::Qp => "qp",
            SimHash::Flowlet => "flowlet",
        }
    }
}

impl SportModel {
    pub fn name(self) -> &'static str {
        match self {
            SportModel::Fixed => "fixed",
            SportModel::Nic => "nic",
            SportModel::Random => "random",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct EntropyArgs {
    /// Hosts in the source rack; host i talks to peer i in another rack
    /// (one step of a ring collective).
    #[arg(long, default_value_t = 16)]
    pub hosts: u32,
    /// Queue pairs per connection.
    #[arg(long, default_value_t = 1)]
    pub qps: u32,
    /// How NICs choose the UDP source port.
    #[arg(long, value_enum, default_value = "nic")]
    pub sport: SportModel,
    /// Uplinks (ECMP group members) of the leaf.
    #[arg(long, default_value_t = 8)]
    pub uplinks: u32,
    /// How the leaf hashes. The default is what a plain ECMP switch does
    /// (the problem rocev2 solves), not the dataplane's default (`qp`).
    #[arg(long, value_enum, default_value = "five-tuple")]
    pub hash: SimHash,
    /// Hash seed (also seeds `--sport random`).
    #[arg(long, default_value_t = 0)]
    pub seed: u32,
    /// The switches' `hash_version`: 1 (a config without the key) or 2.
    #[arg(long, default_value_t = HashVersion::V1)]
    pub hash_version: HashVersion,
    /// Messages per QP; in flowlet mode each one is a new flowlet.
    #[arg(long, default_value_t = 16)]
    pub messages: u32,
    /// With `--hash flowlet`: model a keyless flowlet table of this many
    /// slots (rounded up to a power of two), as switch ASICs keep: QPs whose
    /// messages share a slot share a member (collisions are counted).
    #[arg(long)]
    pub flowlet_slots: Option<u32>,
    /// Comma-separated QP counts, e.g. "1,2,4,8,16,32": one table row each,
    /// every hash mode side by side (`--hash` and `--qps` are ignored).
    #[arg(long)]
    pub sweep: Option<String>,
    /// Write an SVG chart: uplink loads (single run) or max/mean vs QPs (sweep).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Fabric mode: this many racks of `--hosts` hosts behind leaves, `--spines`
    /// spines, every link's load predicted as `rocev2 lab up --racks` would count it.
    #[arg(long)]
    pub racks: Option<u32>,
    /// Fabric mode: spine switches.
    #[arg(long, default_value_t = 4, requires = "racks")]
    pub spines: u32,
    /// Fabric mode: parallel links per leaf-spine pair.
    #[arg(long, default_value_t = 1, requires = "racks")]
    pub links_per_spine: u32,
    /// Fabric mode: one seed on every switch (`same`) or each switch's own (`auto`).
    #[arg(long, value_enum, default_value = "auto", requires = "racks")]
    pub seeds: crate::tools::fabric::SeedPlan,
    /// Fabric mode: the address families the hosts send (each connection once per family).
    #[arg(long, value_enum, default_value = "v4", requires = "racks")]
    pub family: crate::tools::fabric::Family,
    /// Fabric mode: zones the racks and spines are split into, joined by `--aggs` aggregation switches.
    #[arg(long, default_value_t = 1, requires = "racks")]
    pub zones: u32,
    /// Aggregation switches joining the zones, each linked to every spine
    /// (default 2 with `--zones` 2 or more).
    #[arg(long, requires = "zones")]
    pub aggs: Option<u32>,
    /// Fabric mode: the collective's traffic pattern.
    #[arg(long, value_enum, default_value = "ring", requires = "racks")]
    pub pattern: crate::tools::fabric::Pattern,
    /// Fabric mode: predict this collective's completion time and bus
    /// bandwidth (the flow-level model: max-min fair shares of link rates).
    #[arg(long, value_enum, requires = "racks")]
    pub collective: Option<crate::tools::collective::Op>,
    /// --collective: bytes per rank (nccl-tests' size): 64m, 1g.
    #[arg(long, default_value = "64m", value_parser = crate::control::config::parse_size_arg, requires = "collective")]
    pub size: u64,
    /// --collective: message (chunk) size, NCCL-like.
    #[arg(long, default_value = "128k", value_parser = crate::control::config::parse_size_arg, requires = "collective")]
    pub chunk: u64,
    /// --collective: every link's rate (frame bits per second, as `lab up --link-rate`).
    #[arg(long, default_value = "200mbit", value_parser = crate::control::config::parse_rate_arg, requires = "collective")]
    pub link_rate: u64,
    /// --collective: one load-balancing mode (with --qps); without it, the scorecard's rows.
    #[arg(long, value_enum, requires = "collective")]
    pub mode: Option<crate::tools::collective::model::Mode>,
    /// --collective: how ranks sit on hosts (the ring follows rank order).
    #[arg(long, value_enum, default_value = "interleaved", requires = "collective")]
    pub placement: crate::tools::collective::Placement,
    /// --collective: the flowlet gaps (the scorecard has a row per gap, transport-aware the last; --mode uses the first).
    #[arg(long, value_delimiter = ',', value_parser = crate::control::config::parse_gap, default_value = "2ms,50ms", requires = "collective")]
    pub gaps: Vec<u32>,
    /// --collective: idle time before every message whatever the fabric
    /// does (e.g. waiting for a CTS grant), e.g. 100us; none by default.
    #[arg(long, value_parser = crate::control::config::parse_gap, requires = "collective")]
    pub message_gap: Option<u32>,
}

mod collective;
mod keyless;
mod racks;

/// One simulated traffic pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Scenario {
    pub hosts: u32,
    pub qps: u32,
    pub sport: SportModel,
    pub uplinks: u32,
    pub hash: SimHash,
    pub seed: u32,
    pub hash_version: HashVersion,
    pub messages: u32,
    /// Flowlet mode: a keyless table of this many slots instead of a keyed one.
    pub flowlet_slots: Option<u32>,
}

impl Scenario {
    fn from_args(args: &EntropyArgs) -> Self {
        Scenario {
            hosts: args.hosts,
            qps: args.qps,
            sport: args.sport,
            uplinks: args.uplinks,
            hash: args.hash,
            seed: args.seed,
            hash_version: args.hash_version,
            messages: args.messages,
            flowlet_slots: args.flowlet_slots,
        }
    }

    /// Rejects values the simulator cannot (or should not) run.
    pub fn validate(&self) -> Result<()> {
        let check = |name: &str, value: u32, max: u32| -> Result<()> {
            if value == 0 || value > max {
                bail!("--{name} {value} is out of range: use 1..={max}");
            }
            Ok(())
        };
        check("hosts", self.hosts, MAX_HOSTS)?;
        check("qps", self.qps, MAX_QPS)?;
        check("uplinks", self.uplinks, MAX_UPLINKS)?;
        check("messages", self.messages, MAX_MESSAGES)?;
        if let Some(slots) = self.flowlet_slots {
            check("flowlet-slots", slots, rocev2_common::maps::MAX_FLOWLET_SLOTS)?;
        }
        let work = u64::from(self.hosts) * u64::from(self.qps) * u64::from(self.messages);
        if self.hash == SimHash::Flowlet && work > MAX_WORK {
            bail!("hosts x qps x messages = {work} flowlets is more than {MAX_WORK}; lower one of them");
        }
        Ok(())
    }
}

/// What one run produced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimResult {
    /// Bytes per uplink.
    pub per_uplink: Vec<f64>,
    /// Flows per uplink: QPs (five-tuple, qp) or flowlets (flowlet).
    pub flows_per_uplink: Vec<u32>,
    /// Busiest uplink over the mean of all uplinks; 1.0 is perfect.
    pub max_over_mean: f64,
    /// Uplinks that carried nothing.
    pub idle_uplinks: u32,
    /// Jain's fairness index: 1.0 is perfect, 1/n is everything on one uplink.
    pub jain: f64,
    /// `--flowlet-slots`: messages whose slot was live for another QP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collisions: Option<u64>,
}

/// IPv4 addresses: host i is 10.0.0.(i+1), its peer 10.1.0.(i+1) (carrying
/// into the third octet beyond 254 hosts).
pub fn host_addrs(host: u32) -> ([u8; 4], [u8; 4]) {
    let n = host + 1;
    ([10, 0, (n >> 8) as u8, n as u8], [10, 1, (n >> 8) as u8, n as u8])
}

/// QPNs of QP `q` of host `host`'s connection: 24-bit numbers like a
/// ConnectX hands out (a per-host base in the upper bits, small
/// sequential numbers below), different on both ends.
pub fn qpns(host: u32, q: u32) -> (u32, u32) {
    let local = (0x00_0100 + (host << 13) + q) & 0xFF_FFFF;
    let remote = (0x00_1100 + (host << 13) + q * 3) & 0xFF_FFFF;
    (local, remote)
}

pub use rocev2_common::bth::{flow_label, nic_sport};

/// SplitMix64 of one value (the shared generator's next output from `x`).
fn splitmix64(x: u64) -> u64 {
    rocev2_common::rng::splitmix64(&mut { x })
}

/// The UDP source port of QP `q` of host `host`.
pub fn source_port(model: SportModel, seed: u32, host: u32, q: u32) -> u16 {
    match model {
        // One port per host pair: QPs add no entropy at all.
        SportModel::Fixed => 0xC000 | (host & 0x3FFF) as u16,
        SportModel::Nic => {
            let (l, r) = qpns(host, q);
            nic_sport(flow_label(l, r))
        }
        SportModel::Random => {
            let r = splitmix64((u64::from(seed) << 32) ^ (u64::from(host) << 16) ^ u64::from(q));
            0xC000 | (r & 0x3FFF) as u16
        }
    }
}

/// The flow key the XDP program builds for QP `q` of host `host`.
pub fn qp_flow_key(s: &Scenario, host: u32, q: u32) -> FlowKey {
    let (src, dst) = host_addrs(host);
    let (_, remote_qpn) = qpns(host, q);
    let sport = source_port(s.sport, s.seed, host, q);
    FlowKey::v4(src, dst, IPPROTO_UDP, sport, ROCEV2_UDP_PORT).with_dest_qp(remote_qpn)
}

/// Runs one scenario. Pure and deterministic. `s` should pass
/// [`Scenario::validate`]; zero counts give an empty result.
pub fn simulate(s: &Scenario) -> SimResult {
    let uplinks = s.uplinks as usize;
    let mut bytes = vec![0.0f64; uplinks];
    let mut flows = vec![0u32; uplinks];
    let mut collisions = None;
    if let (SimHash::Flowlet, Some(slots), true) = (s.hash, s.flowlet_slots, s.uplinks > 0) {
        let per_message = CONNECTION_BYTES / f64::from(s.qps.max(1)) / f64::from(s.messages.max(1));
        collisions = Some(keyless::spread(s, slots, &even_table(s.uplinks), per_message, &mut bytes, &mut flows));
    } else if s.uplinks > 0 && s.qps > 0 && s.messages > 0 {
        // The dataplane's own bucket table for a group of `uplinks` members.
        let table = even_table(s.uplinks);
        let per_qp = CONNECTION_BYTES / f64::from(s.qps);
        let per_message = per_qp / f64::from(s.messages);
        for host in 0..s.hosts {
            for q in 0..s.qps {
                let key = qp_flow_key(s, host, q);
                match s.hash {
                    SimHash::FiveTuple | SimHash::Qp => {
                        let mode = if s.hash == SimHash::Qp { HashMode::Qp } else { HashMode::FiveTuple };
                        // A QP is one flow for its whole life: all its bytes share a path.
                        let m = member_for(&table, member_hash(&key, mode, s.seed, s.hash_version)) as usize;
                        bytes[m] += per_qp;
                        flows[m] += 1;
                    }
                    SimHash::Flowlet => {
                        // Each message follows an idle gap, so it is flowlet `message`.
                        for message in 0..s.messages {
                            let m = rehash_position(&key, s.seed, message, &table) as usize;
                            bytes[m] += per_message;
                            flows[m] += 1;
                        }
                    }
                }
            }
        }
    }
    SimResult {
        max_over_mean: max_over_mean(&bytes),
        idle_uplinks: bytes.iter().filter(|b| **b == 0.0).count() as u32,
        jain: jain_index(&bytes),
        per_uplink: bytes,
        flows_per_uplink: flows,
        collisions,
    }
}

/// Jain's fairness index, (Σx)² / (n·Σx²). An empty or all-zero vector is
/// treated as perfectly fair (nothing is unevenly spread).
pub fn jain_index(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sum_sq: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || sum_sq == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * sum_sq)
}

/// Busiest over mean (1.0 for an empty or all-zero vector).
pub fn max_over_mean(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    if x.is_empty() || sum == 0.0 {
        return 1.0;
    }
    let max = x.iter().cloned().fold(0.0, f64::max);
    max / (sum / x.len() as f64)
}

/// Parses `--sweep`, e.g. "1,2,4,8".
pub fn parse_sweep(text: &str) -> Result<Vec<u32>> {
    let qps: Vec<u32> = text
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_QPS).contains(n))
                .with_context(|| format!("--sweep: {t:?} is not a QP count in 1..={MAX_QPS}"))
        })
        .collect::<Result<_>>()?;
    if qps.is_empty() {
        bail!("--sweep: give comma-separated QP counts, e.g. \"1,2,4,8,16,32\"");
    }
    Ok(qps)
}

/// One sweep row: one QP count, every hash mode.
#[derive(Clone, Debug, Serialize)]
pub struct SweepRow {
    pub qps: u32,
    pub five_tuple: SimResult,
    pub qp: SimResult,
    pub flowlet: SimResult,
}

impl SweepRow {
    fn get(&self, hash: SimHash) -> &SimResult {
        match hash {
            SimHash::FiveTuple => &self.five_tuple,
            SimHash::Qp => &self.qp,
            SimHash::Flowlet => &self.flowlet,
        }
    }
}

pub fn sweep(base: &Scenario, qps: &[u32]) -> Result<Vec<SweepRow>> {
    qps.iter()
        .map(|&n| {
            let run = |hash| -> Result<SimResult> {
                let s = Scenario { qps: n, hash, ..*base };
                s.validate()?;
                Ok(simulate(&s))
            };
            Ok(SweepRow {
                qps: n,
                five_tuple: run(SimHash::FiveTuple)?,
                qp: run(SimHash::Qp)?,
                flowlet: run(SimHash::Flowlet)?,
            })
        })
        .collect()
}

pub fn run(args: &EntropyArgs) -> Result<()> {
    if let (Some(rack_count), Some(op)) = (args.racks, args.collective) {
        return collective::run(args, rack_count, op);
    }
    if let Some(rack_count) = args.racks {
        return racks::run(args, rack_count);
    }
    let base = Scenario::from_args(args);
    if let Some(text) = &args.sweep {
        let qps = parse_sweep(text)?;
        let rows = sweep(&base, &qps)?;
        if let Some(path) = &args.svg {
            write_svg(path, &sweep_svg(&base, &rows))?;
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "scenario": base, "sweep": rows }))?);
        } else {
            print!("{}", sweep_table(&base, &rows));
        }
    } else {
        base.validate()?;
        let result = simulate(&base);
        if let Some(path) = &args.svg {
            write_svg(path, &single_svg(&base, &result))?;
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "scenario": base, "result": result }))?);
        } else {
            print!("{}", single_table(&base, &result));
        }
    }
    if let (Some(path), false) = (&args.svg, args.json) {
        println!("chart written to {}", path.display());
    }
    Ok(())
}

fn write_svg(path: &std::path::Path, svg: &str) -> Result<()> {
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))
}

fn describe(s: &Scenario) -> String {
    format!(
        "{} hosts -> {} peers, {} QP{} each, sport {}, {} uplinks, seed {}",
        s.hosts,
        s.hosts,
        s.qps,
        if s.qps == 1 { "" } else { "s" },
        s.sport.name(),
        s.uplinks,
        s.seed
    )
}

/// The single-run table: one row per uplink with a bar, then the summary.
pub fn single_table(s: &Scenario, r: &SimResult) -> String {
    let total: f64 = r.per_uplink.iter().sum();
    let max = r.per_uplink.iter().cloned().fold(0.0, f64::max);
    let unit = if s.hash == SimHash::Flowlet { "FLOWLETS" } else { "QPs" };
    let mut out = String::new();
    let _ = writeln!(out, "{}, hash {}", describe(s), s.hash.name());
    let mut table =
        Table::new(&[("UPLINK", Align::Right), ("SHARE", Align::Right), (unit, Align::Right), ("LOAD", Align::Left)]);
    for (i, (b, f)) in r.per_uplink.iter().zip(&r.flows_per_uplink).enumerate() {
        let share = if total > 0.0 { b / total } else { 0.0 };
        // The bar is relative to the busiest uplink, so the imbalance shows.
        let load = if max > 0.0 { b / max } else { 0.0 };
        table.row([i.to_string(), format!("{:.1}%", 100.0 * share), f.to_string(), share_bar(load)]);
    }
    out.push_str(&table.indent(2).render());
    let _ = writeln!(
        out,
        "max/mean {:.2} (fair share is {:.1}%), idle uplinks {} of {}, Jain's index {:.3}",
        r.max_over_mean,
        100.0 / f64::from(s.uplinks.max(1)),
        r.idle_uplinks,
        s.uplinks,
        r.jain
    );
    if let (Some(collisions), Some(slots)) = (r.collisions, s.flowlet_slots) {
        let messages = u64::from(s.hosts) * u64::from(s.qps) * u64::from(s.messages);
        let _ = writeln!(
            out,
            "keyless flowlet table of {} slots: {collisions} of {messages} flowlets collided (followed another QP's member)",
            slots.next_power_of_two()
        );
    }
    out
}

/// The sweep table: one row per QP count, every hash mode side by side.
pub fn sweep_table(s: &Scenario, rows: &[SweepRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} hosts -> {} peers, sport {}, {} uplinks, seed {}, {} messages per QP",
        s.hosts,
        s.hosts,
        s.sport.name(),
        s.uplinks,
        s.seed,
        s.messages
    );
    let _ = writeln!(out, "max/mean (1.00 = perfect), Jain's index (1.000 = perfect), idle uplinks");
    let mut columns = vec![("QPs", Align::Right)];
    for hash in SimHash::ALL {
        let name = match hash {
            SimHash::FiveTuple => "five-tuple max/mean",
            SimHash::Qp => "qp max/mean",
            SimHash::Flowlet => "flowlet max/mean",
        };
        columns.extend([(name, Align::Right), ("Jain", Align::Right), ("idle", Align::Right)]);
    }
    let mut table = Table::new(&columns);
    for row in rows {
        let mut cells = vec![row.qps.to_string()];
        for hash in SimHash::ALL {
            let r = row.get(hash);
            cells.extend([format!("{:.2}", r.max_over_mean), format!("{:.3}", r.jain), r.idle_uplinks.to_string()]);
        }
        table.row(cells);
    }
    out.push_str(&table.indent(2).render());
    out
}

// ---------------------------------------------------------------------------
// SVG, hand-written: a fixed plot area inside a 720x420 canvas.
// ---------------------------------------------------------------------------

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Canvas, title, axes and axis labels.
fn svg_frame(title: &str, x_label: &str, y_label: &str) -> String {
    let (x0, y0, x1) = (LEFT, H - BOTTOM, W - RIGHT);
    let mut s = String::new();
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<title>{}</title>"#, esc(title));
    let _ = writeln!(s, r#"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    let _ = writeln!(s, r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>"#);
    let _ = writeln!(s, r#"<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{y0}" stroke="black"/>"#);
    let _ =
        writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, (x0 + x1) / 2.0, H - 18.0, esc(x_label));
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#,
        (TOP + y0) / 2.0,
        (TOP + y0) / 2.0,
        esc(y_label)
    );
    s
}

/// Y-axis ticks for 0..=max (or min..=max).
fn svg_y_ticks(s: &mut String, min: f64, max: f64, fmt: impl Fn(f64) -> String) {
    for i in 0..=5 {
        let v = min + (max - min) * f64::from(i) / 5.0;
        let y = y_of(v, min, max);
        let _ = writeln!(s, r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##, LEFT, W - RIGHT);
        let _ = writeln!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, y + 4.0, fmt(v));
    }
}

fn y_of(v: f64, min: f64, max: f64) -> f64 {
    let h = H - BOTTOM - TOP;
    H - BOTTOM - (v - min) / (max - min) * h
}

/// Per-uplink share of bytes as bars, with the fair share dashed.
pub fn single_svg(sc: &Scenario, r: &SimResult) -> String {
    let title =
        format!("{} hashing: {} hosts, {} QP(s) each, {} uplinks", sc.hash.name(), sc.hosts, sc.qps, sc.uplinks);
    let mut s = svg_frame(&title, "uplink", "share of bytes (%)");
    let total: f64 = r.per_uplink.iter().sum();
    let shares: Vec<f64> = r.per_uplink.iter().map(|b| if total > 0.0 { 100.0 * b / total } else { 0.0 }).collect();
    let fair = 100.0 / f64::from(sc.uplinks.max(1));
    // Round the axis up to a multiple of 5 % above the busiest uplink.
    let top = (shares.iter().cloned().fold(fair, f64::max) / 5.0).ceil().max(1.0) * 5.0;
    svg_y_ticks(&mut s, 0.0, top, |v| format!("{v:.0}"));
    let n = shares.len().max(1) as f64;
    let slot = (W - RIGHT - LEFT) / n;
    for (i, share) in shares.iter().enumerate() {
        let x = LEFT + slot * i as f64;
        let y = y_of(*share, 0.0, top);
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#4878d0"><title>uplink {i}: {share:.1}%</title></rect>"##,
            x + slot * 0.15,
            slot * 0.7,
            H - BOTTOM - y
        );
        // Label every uplink when they fit, else every tenth.
        if n <= 32.0 || i % 10 == 0 {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{i}</text>"#,
                x + slot / 2.0,
                H - BOTTOM + 16.0
            );
        }
    }
    let fy = y_of(fair, 0.0, top);
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{fy:.1}" x2="{}" y2="{fy:.1}" stroke="#d62728" stroke-dasharray="6 4"/>"##,
        W - RIGHT
    );
    let lx = W - RIGHT + 10.0;
    let _ = writeln!(s, r##"<text x="{lx}" y="{:.1}" fill="#d62728">fair share {fair:.1}%</text>"##, fy + 4.0);
    let _ = writeln!(s, r#"<text x="{lx}" y="{}">max/mean {:.2}</text>"#, TOP + 10.0, r.max_over_mean);
    let _ = writeln!(s, r#"<text x="{lx}" y="{}">Jain {:.3}</text>"#, TOP + 28.0, r.jain);
    let _ = writeln!(s, r#"<text x="{lx}" y="{}">idle {} of {}</text>"#, TOP + 46.0, r.idle_uplinks, sc.uplinks);
    s.push_str("</svg>\n");
    s
}

/// Max/mean against QPs per connection, one line per hash mode.
pub fn sweep_svg(sc: &Scenario, rows: &[SweepRow]) -> String {
    let title = format!(
        "Uplink imbalance vs QPs per connection ({} hosts, {} uplinks, sport {})",
        sc.hosts,
        sc.uplinks,
        sc.sport.name()
    );
    let mut s = svg_frame(&title, "QPs per connection", "busiest uplink / mean (max/mean)");
    let worst = rows.iter().flat_map(|r| SimHash::ALL.map(|h| r.get(h).max_over_mean)).fold(1.0, f64::max);
    let top = (worst * 2.0).ceil() / 2.0 + 0.5;
    svg_y_ticks(&mut s, 1.0, top, |v| format!("{v:.2}"));
    // QP counts are usually powers of two: space them evenly, label each.
    let n = rows.len().max(1) as f64;
    let slot = (W - RIGHT - LEFT) / n;
    let x_of = |i: usize| LEFT + slot * (i as f64 + 0.5);
    for (i, row) in rows.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x_of(i),
            H - BOTTOM + 16.0,
            row.qps
        );
    }
    let colours = ["#d62728", "#4878d0", "#2ca02c"];
    for (k, hash) in SimHash::ALL.into_iter().enumerate() {
        let points: Vec<String> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{:.1},{:.1}", x_of(i), y_of(r.get(hash).max_over_mean, 1.0, top)))
            .collect();
        let c = colours[k];
        let _ = writeln!(s, r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#, points.join(" "));
        for (i, r) in rows.iter().enumerate() {
            let v = r.get(hash).max_over_mean;
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"><title>{} with {} QPs: max/mean {v:.2}</title></circle>"#,
                x_of(i),
                y_of(v, 1.0, top),
                hash.name(),
                r.qps
            );
        }
        let ly = TOP + 10.0 + 20.0 * k as f64;
        let lx = W - RIGHT + 10.0;
        let _ =
            writeln!(s, r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"/>"#, lx + 20.0);
        let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, lx + 26.0, ly + 4.0, hash.name());
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(hosts: u32, qps: u32, sport: SportModel, uplinks: u32, hash: SimHash) -> Scenario {
        Scenario {
            hosts,
            qps,
            sport,
            uplinks,
            hash,
            seed: 0,
            hash_version: HashVersion::V1,
            messages: 16,
            flowlet_slots: None,
        }
    }

    #[test]
    fn simulate_is_deterministic() {
        for hash in SimHash::ALL {
            for sport in [SportModel::Fixed, SportModel::Nic, SportModel::Random] {
                let s = scenario(16, 4, sport, 8, hash);
                assert_eq!(simulate(&s), simulate(&s), "{hash:?} {sport:?}");
            }
        }
    }

    #[test]
    fn every_byte_lands_somewhere() {
        for hash in SimHash::ALL {
            let r = simulate(&scenario(16, 8, SportModel::Nic, 8, hash));
            let total: f64 = r.per_uplink.iter().sum();
            assert!((total - 16.0 * CONNECTION_BYTES).abs() < 1.0, "{hash:?}: {total}");
            let flows: u32 = r.flows_per_uplink.iter().sum();
            assert_eq!(flows, if hash == SimHash::Flowlet { 16 * 8 * 16 } else { 16 * 8 });
        }
    }

    #[test]
    fn fixed_port_five_tuple_puts_each_connection_on_one_uplink() {
        for qps in 1..=64 {
            let s = scenario(4, qps, SportModel::Fixed, 8, SimHash::FiveTuple);
            for host in 0..s.hosts {
                let uplinks: std::collections::BTreeSet<u32> = (0..qps)
                    .map(|q| {
                        member_for(
                            &even_table(8),
                            member_hash(&qp_flow_key(&s, host, q), HashMode::FiveTuple, s.seed, s.hash_version),
                        )
                    })
                    .collect();
                assert_eq!(uplinks.len(), 1, "host {host} with {qps} QPs");
            }
            // 4 connections on 8 uplinks: at least 4 are idle, whatever the QP count.
            let r = simulate(&s);
            assert!(r.idle_uplinks >= 4, "qps {qps}: {r:?}");
            assert_eq!(r.flows_per_uplink.iter().filter(|f| **f > 0).count() as u32, 8 - r.idle_uplinks);
        }
    }

    #[test]
    fn fixed_port_results_do_not_change_with_qps() {
        let one = simulate(&scenario(16, 1, SportModel::Fixed, 8, SimHash::FiveTuple));
        let many = simulate(&scenario(16, 64, SportModel::Fixed, 8, SimHash::FiveTuple));
        assert_eq!(one.idle_uplinks, many.idle_uplinks);
        assert!((one.jain - many.jain).abs() < 1e-9);
    }

    #[test]
    fn qp_hashing_with_many_qps_is_fair() {
        for qps in [16, 32, 64] {
            for sport in [SportModel::Fixed, SportModel::Nic] {
                let r = simulate(&scenario(16, qps, sport, 8, SimHash::Qp));
                assert!(r.jain > 0.9, "{qps} QPs {sport:?}: {r:?}");
                assert_eq!(r.idle_uplinks, 0);
            }
        }
    }

    #[test]
    fn a_smaller_keyless_table_collides_more_and_spreads_worse() {
        let base = scenario(16, 8, SportModel::Nic, 8, SimHash::Flowlet);
        let run = |slots| simulate(&Scenario { flowlet_slots: Some(slots), ..base });
        let (tiny, big) = (run(4), run(1 << 16));
        // 128 QPs per round in 4 slots: at most 4 choices, 124 followers.
        assert_eq!(tiny.collisions, Some(124 * 16));
        assert!(tiny.flows_per_uplink.iter().filter(|n| **n > 0).count() <= 8);
        assert!(big.collisions.unwrap() < 16 * 4, "{:?}", big.collisions);
        assert!(tiny.max_over_mean > big.max_over_mean, "{} vs {}", tiny.max_over_mean, big.max_over_mean);
        assert_eq!(simulate(&base).collisions, None, "a keyed table never collides");
    }

    #[test]
    fn flowlets_are_at_least_as_even_as_qp() {
        for qps in [1, 2, 4, 8, 16] {
            let qp = simulate(&scenario(16, qps, SportModel::Nic, 8, SimHash::Qp));
            let fl = simulate(&scenario(16, qps, SportModel::Nic, 8, SimHash::Flowlet));
            assert!(fl.jain >= qp.jain, "{qps} QPs: flowlet {} qp {}", fl.jain, qp.jain);
            assert!(fl.jain > 0.95, "{qps} QPs: flowlet {}", fl.jain);
        }
    }

    #[test]
    fn one_qp_five_tuple_with_few_hosts_collides() {
        // 16 single-QP connections on 8 uplinks: the numbers this seed gives,
        // pinned so a change of hash, addressing or port model is visible.
        let r = simulate(&scenario(16, 1, SportModel::Nic, 8, SimHash::FiveTuple));
        assert_eq!(r.flows_per_uplink, [2, 2, 2, 4, 4, 1, 0, 1]);
        assert!((r.max_over_mean - 2.0).abs() < 1e-9, "{r:?}");
        // Jain = 16^2 / (8 * (3*4 + 2*16 + 2*1)) = 256 / 368.
        assert!((r.jain - 256.0 / 368.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.idle_uplinks, 1);
    }

    #[test]
    fn jain_index_on_known_vectors() {
        assert!((jain_index(&[1.0, 1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain_index(&[2.0, 1.0]) - 0.9).abs() < 1e-12);
        assert_eq!(jain_index(&[]), 1.0);
        assert!((max_over_mean(&[3.0, 1.0, 0.0, 0.0]) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn nic_source_port_matches_roce_notes() {
        // fl = 20-bit fold of lqpn*rqpn; sport = ((fl & 0x3FFF) ^ (fl >> 14)) | 0xC000.
        // Worked by hand (and with Python) for a product wider than 20 bits.
        let (l, r) = (0x01_2345u32, 0x0A_BCDEu32);
        let v = u64::from(l) * u64::from(r);
        assert_eq!(v, 0xC_3795_41D6);
        assert_eq!(flow_label(l, r), 0x5_82AF); // v ^ v>>20 ^ v>>40, low 20 bits
        assert_eq!(nic_sport(0x5_82AF), 0xC2B9); // (0x02AF ^ 0x16) | 0xC000
        assert_eq!(nic_sport(0), 0xC000);
        assert_eq!(nic_sport(0xF_FFFF), 0xC000 | (0x3FFF ^ 0x3F));
        for host in 0..64 {
            for q in 0..64 {
                for model in [SportModel::Fixed, SportModel::Nic, SportModel::Random] {
                    let p = source_port(model, 7, host, q);
                    assert!((0xC000..=0xFFFF).contains(&p), "{model:?} {p:#x}");
                }
            }
        }
    }

    #[test]
    fn qpns_are_24_bit_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for host in 0..256 {
            for q in 0..64 {
                let (l, r) = qpns(host, q);
                assert!(l <= 0xFF_FFFF && r <= 0xFF_FFFF);
                assert!(seen.insert(r), "remote QPN {r:#x} repeats");
            }
        }
    }

    #[test]
    fn sweep_parses_and_rejects() {
        assert_eq!(parse_sweep("1, 2,4,8").unwrap(), vec![1, 2, 4, 8]);
        assert!(parse_sweep("").is_err());
        assert!(parse_sweep("1,x").unwrap_err().to_string().contains("\"x\""));
        assert!(parse_sweep("0").is_err());
        assert!(Scenario { hosts: 0, ..scenario(1, 1, SportModel::Nic, 8, SimHash::Qp) }.validate().is_err());
    }

    #[test]
    fn qp_scaling_helps_qp_hashing_only() {
        let base = scenario(16, 1, SportModel::Fixed, 8, SimHash::Qp);
        let rows = sweep(&base, &[1, 64]).unwrap();
        assert!((rows[0].five_tuple.jain - rows[1].five_tuple.jain).abs() < 1e-9);
        assert!(rows[1].qp.jain > rows[0].qp.jain);
        assert!(rows[1].qp.max_over_mean < rows[1].five_tuple.max_over_mean);
    }

    /// A small well-formedness check: every tag closes in order, attributes
    /// are quoted, and only the XML declaration precedes the root.

    #[test]
    fn svgs_are_well_formed() {
        let s = scenario(16, 4, SportModel::Nic, 8, SimHash::Qp);
        let single = single_svg(&s, &simulate(&s));
        assert!(single.contains(r#"<svg xmlns="http://www.w3.org/2000/svg""#));
        assert!(single.contains("<title>") && single.contains("share of bytes (%)") && single.contains(">uplink<"));
        assert_eq!(single.matches("<rect ").count(), 1 + 8, "background + one bar per uplink");
        crate::render::assert_well_formed(&single);
        let rows = sweep(&s, &[1, 2, 4, 8]).unwrap();
        let chart = sweep_svg(&s, &rows);
        assert!(chart.contains("QPs per connection") && chart.contains("max/mean"));
        assert_eq!(chart.matches("<polyline").count(), 3);
        crate::render::assert_well_formed(&chart);
    }

    #[test]
    fn svg_check_catches_broken_xml() {
        let bad = std::panic::catch_unwind(|| crate::render::assert_well_formed("<svg><g></svg></g>"));
        assert!(bad.is_err());
    }
}
