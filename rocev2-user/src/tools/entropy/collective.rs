//! `rocev2 entropy --racks N --collective allreduce|alltoall|incast`: the
//! flow-level completion-time model ([`crate::tools::collective::model`])
//! for one mode (`--mode`) or every row of the scorecard, as a table or
//! `--json`.

use anyhow::{bail, Result};

use super::EntropyArgs;
use crate::{
    render::{rate_text, size_text, Align, Table},
    tools::collective::{
        model::{predict, scorecard_rows, Prediction, Row, Setup},
        Op,
    },
    tools::fabric::{aggs_for, flag, Fabric},
};

/// The fabric `--racks ...` describe (the model's own limits, wider than a lab's).
fn fabric(args: &EntropyArgs, racks: u32) -> Result<Fabric> {
    Ok(Fabric {
        racks,
        hosts: args.hosts,
        spines: args.spines,
        links: args.links_per_spine,
        zones: args.zones,
        aggs: aggs_for(args.zones, args.aggs)?,
        v4: args.family.v4(),
        v6: args.family.v6(),
        hash: rocev2_common::hash::HashMode::Qp,
        hash_version: args.hash_version,
        seeds: args.seeds,
    })
}

pub fn run(args: &EntropyArgs, racks: u32, op: Op) -> Result<()> {
    if args.family == crate::tools::fabric::Family::Both {
        bail!("--collective runs on one address family: use --family v4 or v6");
    }
    let gaps: Vec<u64> = args.gaps.iter().map(|&us| u64::from(us) * 1000).collect();
    if gaps.is_empty() {
        bail!("--gaps: give one or more flowlet gaps, e.g. 2ms,50ms");
    }
    let rows = match args.mode {
        Some(mode) => vec![Row { mode, qps: args.qps, flowlet_gap_ns: gaps[0] }],
        None => scorecard_rows(&gaps),
    };
    let base = Setup {
        fabric: fabric(args, racks)?,
        link_bps: args.link_rate,
        v6: args.family.v6(),
        op,
        size: args.size,
        qps: args.qps,
        chunk: args.chunk,
        placement: args.placement,
        mode: rows[0].mode,
        flowlet_gap_ns: gaps[0],
        flowlet_slots: args.flowlet_slots.unwrap_or(4096).next_power_of_two(),
        message_gap_ns: args.message_gap.map_or(0, |us| u64::from(us) * 1000),
    };
    base.validate().map_err(anyhow::Error::msg)?;
    let mut results = Vec::new();
    for row in &rows {
        let setup = Setup { mode: row.mode, qps: row.qps, flowlet_gap_ns: row.flowlet_gap_ns, ..base.clone() };
        results.push((*row, predict(&setup).map_err(anyhow::Error::msg)?));
    }
    if args.json {
        let rows: Vec<_> =
            results.iter().map(|(row, p)| serde_json::json!({ "row": row.label(), "prediction": p })).collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "setup": base, "rows": rows }))?);
        return Ok(());
    }
    print!("{}", render(&base, &results));
    Ok(())
}

/// The table: one row per mode.
pub fn render(base: &Setup, results: &[(Row, Prediction)]) -> String {
    let f = &base.fabric;
    let first = &results[0].1;
    let mut out = format!(
        "Predicted {} of {} per rank over {} ranks ({} placement), {} racks x {} hosts, {} spines{}, links {}, chunks of {}:\n\
         bus bandwidth as a share of an ideal non-blocking fabric with the same host links ({:.1} MB/s),\n\
         from max-min fair shares of every link among the QPs each mode places there.\n",
        op_name(base.op),
        size_text(base.size),
        first.ranks,
        flag(base.placement),
        f.racks,
        f.hosts,
        f.spines,
        if f.zones > 1 { format!(" in {} zones with {} aggregation switches", f.zones, f.aggs) } else { String::new() },
        rate_text(base.link_bps),
        size_text(base.chunk),
        first.ideal_busbw / 1e6,
    );
    let mut table = Table::new(&[
        ("MODE", Align::Left),
        ("QPS", Align::Right),
        ("OF IDEAL", Align::Right),
        ("BUSBW MB/s", Align::Right),
        ("TIME", Align::Right),
        ("WORST LINK", Align::Left),
        ("BUSY", Align::Right),
        ("NOTES", Align::Left),
    ]);
    for (row, p) in results {
        let mut notes = Vec::new();
        if p.new_flowlets > 0 {
            notes.push(format!("{} flowlets, {} moved", p.new_flowlets, p.moved_flowlets));
        }
        if p.slot_collisions > 0 {
            notes.push(format!("{} slot collisions", p.slot_collisions));
        }
        if p.te_unfit > 0 {
            notes.push(format!("{} QPs without room", p.te_unfit));
        }
        if p.demoted > 0 {
            notes.push(format!("{} members demoted", p.demoted));
        }
        if p.rounds.0 < p.rounds.1 {
            notes.push(format!("{} of {} rounds computed", p.rounds.0, p.rounds.1));
        }
        table.row([
            row.label(),
            row.qps.to_string(),
            format!("{:.0}%", p.share_of_ideal * 100.0),
            format!("{:.2}", p.busbw / 1e6),
            seconds_text(p.seconds),
            p.worst_link.clone(),
            format!("{:.0}%", p.worst_link_utilization * 100.0),
            notes.join(", "),
        ]);
    }
    out.push_str(&table.render());
    out
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Allreduce => "ring AllReduce",
        Op::Alltoall => "all-to-all",
        Op::Incast => "incast",
    }
}

fn seconds_text(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}
