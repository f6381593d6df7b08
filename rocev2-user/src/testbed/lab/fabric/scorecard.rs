//! `rocev2 lab scorecard`: the same collective under every load-balancing
//! mode of the paper, in one run on one fabric, and the transports on an
//! incast; one table, an SVG chart, and the JSON the table is rendered
//! from (the book's table is that rendering, checked by a test).
//!
//! Rows: ECMP on the five-tuple; E-ECMP (`qp`) with 1, 2, 4 and 8 QPs per
//! connection; path pinning by static slices; centralized TE (CSPF); keyed
//! and keyless flowlets with two gaps; transport-aware flowlets. Each row
//! is a ring AllReduce of `--size` per rank with no congestion control
//! (the fabric is meant to be deep enough not to drop: what differs is
//! where the traffic goes). Then, under `qp`, an incast of
//! `--incast-size` with each transport: none, DCQCN, receiver-driven
//! admission (CTS).

use std::{fmt::Write as _, path::PathBuf, time::Instant};

use anyhow::{bail, Context as _, Result};
use rocev2_common::{flowlet::FlowletTable, hash::HashMode};
use serde::{Deserialize, Serialize};

use super::{
    apply_balance,
    balance::{parse_gap, Balance},
    collective::{self, CollectiveReport, LabCollectiveArgs},
    links, te,
};
use crate::{
    control::config::parse_size_arg,
    render::{Align, Table},
    testbed::lab::LabRecord,
    tools::collective::{
        model::{self, Mode, Setup},
        Op, Placement,
    },
    tools::rc::Transport,
};

#[derive(clap::Args, Debug, Clone)]
pub struct LabScorecardArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// AllReduce bytes per rank of every mode's run.
    #[arg(long, value_parser = parse_size_arg, default_value = "4m")]
    pub size: u64,
    /// Message (chunk) size: small enough that every QP of 8 gets messages
    /// in every step (a step is --size / hosts bytes per rank).
    #[arg(long, value_parser = parse_size_arg, default_value = "32k")]
    pub chunk: u64,
    /// Incast bytes (into the receiver) of every transport's run.
    #[arg(long, value_parser = parse_size_arg, default_value = "4m")]
    pub incast_size: u64,
    /// The two flowlet gaps, short and long (2ms,50ms).
    #[arg(long, value_delimiter = ',', value_parser = parse_gap, default_value = "2ms,50ms")]
    pub gaps: Vec<u32>,
    /// Write the chart here.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Print the JSON (the table is rendered from it: `--from FILE` does).
    #[arg(long)]
    pub json: bool,
    /// Render a saved scorecard's JSON instead of running one.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
}

/// One mode's run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModeRow {
    pub mode: String,
    pub qps: u32,
    pub complete: bool,
    pub seconds: f64,
    /// Bytes per second.
    pub busbw: f64,
    pub share_of_ideal: f64,
    /// The flow-level model's share of the ideal for the same fabric,
    /// seeds, mode and collective ([`predict`]); absent from a scorecard
    /// saved before the scorecard asked the model.
    #[serde(default)]
    pub model_share: Option<f64>,
    /// Whether `model_share` predicts this row: false for flowlet and
    /// transport-aware rows, where the lab moves a QP on packet gaps (its
    /// ACK-clocked bursts, go-back-N resends, stalls of the machine) that
    /// a flow-level model has not; its figure is then for QPs that send
    /// each message back to back, shown in parentheses.
    #[serde(default = "predicts")]
    pub model_predicts: bool,
    pub worst_link: String,
    pub worst_utilization: f64,
    pub ecn_marked: u64,
    pub drops: u64,
    pub reordered: u64,
    pub retransmitted: u64,
    /// Go-back-N timeouts (absent from older saved scorecards).
    #[serde(default)]
    pub timeouts: u64,
    /// The share of the machine's CPU time other processes used during
    /// the row ([`collective::BUSY_ELSEWHERE`]; absent from older saved
    /// scorecards).
    #[serde(default)]
    pub busy_elsewhere: Option<f64>,
}

fn predicts() -> bool {
    true
}

impl ModeRow {
    /// The lab's share of the ideal over the model's (1.0: they agree).
    pub fn lab_over_model(&self) -> Option<f64> {
        self.model_share.filter(|m| *m > 0.0).map(|m| self.share_of_ideal / m)
    }
}

/// One transport's incast.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TransportRow {
    pub transport: Transport,
    pub complete: bool,
    pub seconds: f64,
    pub share_of_ideal: f64,
    pub ecn_marked: u64,
    pub drops: u64,
    pub retransmitted: u64,
    pub timeouts: u64,
    pub cnps: u64,
    /// As [`ModeRow::busy_elsewhere`].
    #[serde(default)]
    pub busy_elsewhere: Option<f64>,
}

/// A whole scorecard.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Scorecard {
    /// `4 racks x 4 hosts, 4 spines, links 10mbit, leaf buffer 512k, spine buffer 1m`.
    pub fabric: String,
    pub ranks: usize,
    pub size: u64,
    pub chunk: u64,
    pub incast_size: u64,
    pub ideal_busbw: f64,
    pub ideal_seconds: f64,
    pub modes: Vec<ModeRow>,
    pub transports: Vec<TransportRow>,
    /// Wall time of the whole run.
    pub wall_secs: f64,
}

/// The modes' runs, in table order: (balance, QPs per connection).
pub fn mode_runs(gaps: &[u32]) -> Vec<(Balance, u32)> {
    let mut rows = vec![(Balance::Hash { hash: HashMode::FiveTuple }, 1)];
    rows.extend([1, 2, 4, 8].map(|q| (Balance::Hash { hash: HashMode::Qp }, q)));
    rows.push((Balance::Slice, 1));
    rows.push((Balance::Te { pins: Vec::new() }, 1));
    for table in FlowletTable::ALL {
        for &gap_us in gaps {
            rows.push((Balance::Flowlet { table, gap_us }, 1));
        }
    }
    rows.push((Balance::TransportAware { gap_us: gaps.last().copied().unwrap_or(50_000) }, 1));
    rows
}

/// The simulator's mode for a lab balance, with its flowlet gap in ns.
pub fn model_mode(balance: &Balance) -> (Mode, u64) {
    match balance {
        Balance::Hash { hash: HashMode::FiveTuple } => (Mode::FiveTuple, 0),
        Balance::Hash { hash: HashMode::Qp } => (Mode::Qp, 0),
        Balance::Slice => (Mode::Pinned, 0),
        Balance::Te { .. } => (Mode::Te, 0),
        Balance::Flowlet { table: FlowletTable::Keyed, gap_us } => (Mode::FlowletKeyed, u64::from(*gap_us) * 1000),
        Balance::Flowlet { table: FlowletTable::Keyless, gap_us } => (Mode::FlowletKeyless, u64::from(*gap_us) * 1000),
        Balance::TransportAware { gap_us } => (Mode::TransportAware, u64::from(*gap_us) * 1000),
    }
}

/// What the flow-level model ([`model::predict`]) says a collective on lab
/// `record` under `balance` does: the same fabric (its seeds), link rate,
/// placement, QPs and chunks as `lab collective` runs with transport
/// `none` (messages back to back).
pub fn predict(
    record: &LabRecord,
    balance: &Balance,
    op: Op,
    size: u64,
    chunk: u64,
    qps: u32,
) -> Result<model::Prediction> {
    let fabric = record.fabric.clone().context("not a fabric")?;
    let rated = record.rated.as_ref().context("the model needs the lab's link rate (lab up --link-rate)")?;
    let (mode, flowlet_gap_ns) = model_mode(balance);
    let setup = Setup {
        v6: !fabric.v4,
        fabric,
        link_bps: rated.settings.rate_bps,
        op,
        size,
        qps,
        chunk,
        placement: Placement::Interleaved,
        mode,
        flowlet_gap_ns,
        message_gap_ns: 0,
        flowlet_slots: rocev2_common::maps::DEFAULT_FLOWLET_SLOTS,
    };
    model::predict(&setup).map_err(|e| anyhow::anyhow!("the model: {e}"))
}

fn run_args(name: &str, op: Op, size: u64, chunk: u64, qps: u32, transport: Transport) -> LabCollectiveArgs {
    let mut a = LabCollectiveArgs::new(name, op, size);
    a.chunk = chunk;
    a.qps = qps;
    a.transport = transport;
    a.placement = Placement::Interleaved;
    a
}

fn mode_row(label: String, qps: u32, r: &CollectiveReport, model: Option<(f64, bool)>) -> ModeRow {
    ModeRow {
        mode: label,
        qps,
        complete: r.complete,
        seconds: r.seconds,
        busbw: r.busbw,
        share_of_ideal: r.share_of_ideal.unwrap_or(0.0),
        model_share: model.map(|m| m.0),
        model_predicts: model.is_none_or(|m| m.1),
        worst_link: r.worst_link.as_ref().map_or("-".into(), |w| w.link.clone()),
        worst_utilization: r.worst_link.as_ref().map_or(0.0, |w| w.utilization),
        ecn_marked: r.ecn_marked,
        drops: r.drops,
        reordered: r.reordered,
        retransmitted: r.retransmitted,
        timeouts: r.timeouts,
        busy_elsewhere: Some(r.busy_elsewhere),
    }
}

/// One row: puts `balance` on lab `args.name` (unless `current`, what
/// the previous row left, is it already; TE places its pins for this
/// collective every time), runs a ring AllReduce of `args.size` with
/// `qps` QPs per connection and transport `none`, and asks the model
/// about the same run.
fn run_mode(
    args: &LabScorecardArgs,
    balance: &Balance,
    qps: u32,
    current: &mut Option<Balance>,
) -> Result<(ModeRow, CollectiveReport)> {
    let mut record = LabRecord::read(&args.name)?;
    match balance {
        Balance::Te { .. } => {
            let plan = te::plan_of(&record, Op::Allreduce, args.size, qps, args.chunk, Placement::Interleaved)?;
            te::engineer(&mut record, &plan, &[])?;
        }
        b if current.as_ref() != Some(b) => {
            apply_balance(&mut record, b, true)?;
        }
        _ => {}
    }
    *current = Some(balance.clone());
    let model = predict(&record, balance, Op::Allreduce, args.size, args.chunk, qps)?;
    let r = collective::run(&run_args(&args.name, Op::Allreduce, args.size, args.chunk, qps, Transport::None))?;
    let predicts = !model_mode(balance).0.flowlet();
    Ok((mode_row(balance.label(), qps, &r, Some((model.share_of_ideal, predicts))), r))
}

/// Runs every row on lab `name` (rated links, static routing).
pub fn run(args: &LabScorecardArgs) -> Result<Scorecard> {
    let started = Instant::now();
    let record = LabRecord::read(&args.name)?;
    let Some(rated) = record.rated.clone() else {
        bail!("lab {:?} has no rated links; the scorecard compares times, which mean nothing on links as fast as the CPU (lab up --link-rate)", args.name);
    };
    let f = record.fabric.clone().context("not a fabric")?;
    if args.gaps.len() != 2 {
        bail!("--gaps takes two gaps, short and long (e.g. 2ms,50ms), not {}", args.gaps.len());
    }
    let s = rated.settings;
    let fabric = format!(
        "{} racks x {} hosts, {} spines, links {}, leaf buffer {}, spine buffer {}",
        f.racks,
        f.hosts,
        f.spines,
        links::rate_text(s.rate_bps),
        links::size_text(s.leaf_buffer),
        links::size_text(s.spine_buffer)
    );
    let mut modes = Vec::new();
    let mut current: Option<Balance> = None;
    let mut ideal = (0.0, 0.0);
    for (balance, qps) in mode_runs(&args.gaps) {
        eprintln!("scorecard: {}, {qps} QP(s) per connection ...", balance.label());
        let (row, r) = run_mode(args, &balance, qps, &mut current)?;
        ideal = (r.ideal_busbw.unwrap_or(0.0), r.ideal_seconds.unwrap_or(0.0));
        modes.push(row);
    }
    let mut record = LabRecord::read(&args.name)?;
    apply_balance(&mut record, &Balance::Hash { hash: HashMode::Qp }, true)?;
    let mut transports = Vec::new();
    for t in [Transport::None, Transport::Dcqcn, Transport::Cts] {
        eprintln!("scorecard: incast, transport {} ...", t.name());
        let r = collective::run(&run_args(&args.name, Op::Incast, args.incast_size, args.chunk, 1, t))?;
        transports.push(TransportRow {
            transport: t,
            complete: r.complete,
            seconds: r.seconds,
            share_of_ideal: r.share_of_ideal.unwrap_or(0.0),
            ecn_marked: r.ecn_marked,
            drops: r.drops,
            retransmitted: r.retransmitted,
            timeouts: r.timeouts,
            cnps: r.cnps,
            busy_elsewhere: Some(r.busy_elsewhere),
        });
    }
    Ok(Scorecard {
        fabric,
        ranks: (f.racks * f.hosts) as usize,
        size: args.size,
        chunk: args.chunk,
        incast_size: args.incast_size,
        ideal_busbw: ideal.0,
        ideal_seconds: ideal.1,
        modes,
        transports,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}

/// `rocev2 lab scorecard`.
pub fn scorecard(args: &LabScorecardArgs) -> Result<Scorecard> {
    let card = match &args.from {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not a scorecard's JSON", path.display()))?
        }
        None => run(args)?,
    };
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&card)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&card)?);
    } else {
        print!("{}", render(&card));
    }
    Ok(card)
}

fn mbit(bytes_per_sec: f64) -> String {
    format!("{:.2}", bytes_per_sec * 8.0 / 1e6)
}

/// The two tables.
pub fn render(c: &Scorecard) -> String {
    let mut out = format!(
        "Ring AllReduce of {} per rank in {} chunks over {} hosts ({}); ideal non-blocking fabric: {} Mbit/s bus bandwidth, {:.3} s\n",
        links::size_text(c.size),
        links::size_text(c.chunk),
        c.ranks,
        c.fabric,
        mbit(c.ideal_busbw),
        c.ideal_seconds
    );
    let mut t = Table::new(&[
        ("MODE", Align::Left),
        ("QPS", Align::Right),
        ("BUS BW Mbit/s", Align::Right),
        ("OF IDEAL", Align::Right),
        ("MODEL", Align::Right),
        ("TIME s", Align::Right),
        ("BUSIEST LINK", Align::Left),
        ("ECN MARKS", Align::Right),
        ("DROPS", Align::Right),
        ("OUT OF ORDER", Align::Right),
        ("RESENT", Align::Right),
        ("CPU ELSEWHERE", Align::Right),
    ]);
    let cpu = |share: Option<f64>| share.map_or("-".into(), |s| format!("{:.0}%", s * 100.0));
    for r in &c.modes {
        t.row([
            if r.complete { r.mode.clone() } else { format!("{} (incomplete)", r.mode) },
            r.qps.to_string(),
            mbit(r.busbw),
            format!("{:.1}%", r.share_of_ideal * 100.0),
            match (r.model_share, r.model_predicts) {
                (None, _) => "-".into(),
                (Some(m), true) => format!("{:.1}%", m * 100.0),
                (Some(m), false) => format!("({:.1}%)", m * 100.0),
            },
            format!("{:.3}", r.seconds),
            format!("{} {:.0}%", r.worst_link, r.worst_utilization * 100.0),
            r.ecn_marked.to_string(),
            r.drops.to_string(),
            r.reordered.to_string(),
            r.retransmitted.to_string(),
            cpu(r.busy_elsewhere),
        ]);
    }
    out.push_str(&t.render());
    if c.modes.iter().any(|r| r.model_share.is_some()) {
        out.push_str(
            "MODEL: what the flow-level model (rocev2 entropy --collective) predicts for the same fabric, seeds and mode: max-min fair shares of the link rates, no queues, ACKs or resends\n",
        );
    }
    if c.modes.iter().any(|r| r.model_share.is_some() && !r.model_predicts) {
        out.push_str(
            "(MODEL): not a prediction: flowlets move a QP on packet gaps (ACK-clocked bursts, resends, stalls) a flow-level model has not; the figure is for QPs that send each message back to back\n",
        );
    }
    out.push_str(
        "CPU ELSEWHERE: the machine's CPU time other processes used during the row; a fabric at its link rate needs the CPUs to itself\n",
    );
    let _ = writeln!(
        out,
        "\nIncast of {} into one host from the {} others (hash qp, 1 QP per connection):",
        links::size_text(c.incast_size),
        c.ranks - 1
    );
    let mut t = Table::new(&[
        ("TRANSPORT", Align::Left),
        ("TIME s", Align::Right),
        ("OF IDEAL", Align::Right),
        ("ECN MARKS", Align::Right),
        ("CNPS", Align::Right),
        ("DROPS", Align::Right),
        ("RESENT", Align::Right),
        ("TIMEOUTS", Align::Right),
        ("CPU ELSEWHERE", Align::Right),
    ]);
    for r in &c.transports {
        t.row([
            if r.complete { r.transport.name().to_owned() } else { format!("{} (incomplete)", r.transport.name()) },
            format!("{:.3}", r.seconds),
            format!("{:.1}%", r.share_of_ideal * 100.0),
            r.ecn_marked.to_string(),
            r.cnps.to_string(),
            r.drops.to_string(),
            r.retransmitted.to_string(),
            r.timeouts.to_string(),
            cpu(r.busy_elsewhere),
        ]);
    }
    out.push_str(&t.render());
    let _ = writeln!(out, "(one run, {:.0} s of wall time)", c.wall_secs);
    out
}

/// A horizontal bar per mode (bus bandwidth as a share of the ideal) and
/// per transport (drops beside the share).
pub fn svg(c: &Scorecard) -> String {
    let (left, bar_w, row_h) = (230.0, 420.0, 22.0);
    let rows = c.modes.len() + c.transports.len() + 3 + usize::from(c.modes.iter().any(|r| r.model_share.is_some()));
    let height = 60.0 + rows as f64 * row_h;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0}\" height=\"{height:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"14\">Ring AllReduce {} per rank, {} hosts: bus bandwidth as a share of the ideal fabric</text>\n<text x=\"10\" y=\"38\" fill=\"#555\">{}</text>\n",
        left + bar_w + 120.0,
        links::size_text(c.size),
        c.ranks,
        c.fabric
    );
    let mut y = 56.0;
    let bar = |s: &mut String, y: f64, label: &str, share: f64, note: &str, color: &str| {
        let w = (share.clamp(0.0, 1.2) * bar_w).max(1.0);
        let _ = writeln!(
            s,
            "<text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text><rect x=\"{left:.0}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.0}\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\">{:.0}%{note}</text>",
            left - 8.0,
            y + 14.0,
            y + 2.0,
            row_h - 6.0,
            left + w + 6.0,
            y + 14.0,
            share * 100.0
        );
    };
    for r in &c.modes {
        let label = if r.qps > 1 || r.mode == "qp" { format!("{} x{}", r.mode, r.qps) } else { r.mode.clone() };
        let note = if r.reordered > 0 { format!(", {} out of order", r.reordered) } else { String::new() };
        bar(&mut s, y, &label, r.share_of_ideal, &note, "#3a6ea5");
        if let Some(m) = r.model_share {
            let x = left + m.clamp(0.0, 1.2) * bar_w;
            let stroke = if r.model_predicts { "black" } else { "#999\" stroke-dasharray=\"3 2" };
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{stroke}\" stroke-width=\"2\"/>",
                y,
                y + row_h
            );
        }
        y += row_h;
    }
    if c.modes.iter().any(|r| r.model_share.is_some()) {
        let _ = writeln!(
            s,
            "<text x=\"{left:.0}\" y=\"{:.1}\" fill=\"#555\">black tick: the flow-level model's prediction; grey dashes: its figure where it cannot predict</text>",
            y + 14.0
        );
        y += row_h;
    }
    let _ = writeln!(
        s,
        "<line x1=\"{left:.0}\" y1=\"52\" x2=\"{left:.0}\" y2=\"{:.0}\" stroke=\"#999\"/><line x1=\"{:.0}\" y1=\"52\" x2=\"{:.0}\" y2=\"{:.0}\" stroke=\"#ccc\" stroke-dasharray=\"4 3\"/>",
        y,
        left + bar_w,
        left + bar_w,
        y
    );
    y += row_h;
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"{:.0}\" font-size=\"14\">Incast of {} into one host: by transport</text>",
        y + 10.0,
        links::size_text(c.incast_size)
    );
    y += row_h;
    for r in &c.transports {
        bar(&mut s, y, r.transport.name(), r.share_of_ideal, &format!(", {} dropped", r.drops), "#a55a3a");
        y += row_h;
    }
    s.push_str("</svg>\n");
    s
}
