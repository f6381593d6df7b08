//! `rocev2 lab stats`: every switch's member counters merged into one
//! per-link table by tier (a member is a link: the switch sends on its
//! port), the busiest link over the mean per tier, and an SVG picture of
//! the fabric with each link shaded by its load.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::{bail, Context as _, Result};

use crate::{
    control::dataplane::Maps,
    control::state::RunState,
    control::stats::Snapshot,
    testbed::lab::LabRecord,
    tools::fabric::{picture, render_loads, summarize, Fabric, LinkId, Load},
};

#[derive(clap::Args, Debug, Clone)]
pub struct LabStatsArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Print JSON: every link's counters and the per-tier summary.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Print the loads of the last interval again and again (Ctrl-C stops).
    #[arg(long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 1.0, requires = "watch")]
    pub interval: f64,
    /// Also write an SVG picture of the fabric, each link shaded by its load.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

/// Counters summed over a switch's ports: forwarded, forwarded_bytes,
/// to_kernel (every pass_* reason) and dropped (every drop_* reason).
pub fn port_totals(pin_dir: &std::path::Path) -> Result<BTreeMap<&'static str, u64>> {
    let mut out = BTreeMap::new();
    for (name, v) in port_sums(pin_dir)? {
        let key = match name {
            "forwarded" | "forwarded_bytes" => name,
            n if n.starts_with("pass_") => "to_kernel",
            n if n.starts_with("drop_") => "dropped",
            _ => continue,
        };
        *out.entry(key).or_default() += v;
    }
    Ok(out)
}

/// Every port counter of a switch (`rocev2 stats`' names), summed over its ports.
pub fn port_sums(pin_dir: &std::path::Path) -> Result<BTreeMap<&'static str, u64>> {
    let state = RunState::read(pin_dir)?;
    let maps = Maps::open_pinned(pin_dir)?;
    let mut out = BTreeMap::new();
    for p in &state.ports {
        for (name, v) in maps.port_counters(p.slot)? {
            *out.entry(name).or_default() += v;
        }
    }
    Ok(out)
}

/// Every link's packets and bytes as the switches count them now.
pub fn link_loads(record: &LabRecord) -> Result<BTreeMap<LinkId, Load>> {
    let mut out = BTreeMap::new();
    for s in &record.switches {
        let state =
            RunState::read(&s.pin_dir).with_context(|| format!("the dataplane of {} is not running", s.switch))?;
        let maps = Maps::open_pinned(&s.pin_dir)?;
        for g in Snapshot::collect(&maps, &state)?.groups {
            for m in g.members {
                let id = LinkId { tier: Fabric::tier_of(s.switch, &m.dev), switch: s.switch, port: m.dev };
                let l: &mut Load = out.entry(id).or_default();
                l.packets += m.packets;
                l.bytes += m.bytes;
            }
        }
    }
    Ok(out)
}

/// Per link (a switch's egress port), frames its device refused after the
/// switch's XDP program redirected them (lost; see `rocev2 stats`), for
/// links that refused any.
pub fn link_refusals(record: &LabRecord) -> Result<BTreeMap<LinkId, u64>> {
    let mut out = BTreeMap::new();
    for s in &record.switches {
        let state =
            RunState::read(&s.pin_dir).with_context(|| format!("the dataplane of {} is not running", s.switch))?;
        let maps = Maps::open_pinned(&s.pin_dir)?;
        for r in Snapshot::collect(&maps, &state)?.egress_refused.into_iter().filter(|r| r.frames > 0) {
            let id = LinkId { tier: Fabric::tier_of(s.switch, &r.dev), switch: s.switch, port: r.dev };
            *out.entry(id).or_default() += r.frames;
        }
    }
    Ok(out)
}

/// One line (or a few) on refused redirects for `lab stats`.
fn render_refusals(refused: &BTreeMap<LinkId, u64>) -> String {
    if refused.is_empty() {
        return "Redirects refused by an egress device: none\n".to_string();
    }
    let total: u64 = refused.values().sum();
    let links: Vec<String> = refused.iter().map(|(l, n)| format!("{l} {n}")).collect();
    format!(
        "warning: {total} redirected frames were LOST, refused by the egress device after the XDP program: {}\n",
        links.join(", ")
    )
}

/// `after - before` per link.
pub fn delta(after: &BTreeMap<LinkId, Load>, before: &BTreeMap<LinkId, Load>) -> BTreeMap<LinkId, Load> {
    after
        .iter()
        .map(|(l, a)| {
            let b = before.get(l).copied().unwrap_or_default();
            (l.clone(), Load { packets: a.packets.saturating_sub(b.packets), bytes: a.bytes.saturating_sub(b.bytes) })
        })
        .filter(|(_, d)| d.packets > 0)
        .collect()
}

pub fn stats(args: &LabStatsArgs) -> Result<()> {
    let record = LabRecord::read(&args.name)?;
    let Some(fabric) = record.fabric.clone() else {
        bail!("lab {:?} is a single-rack lab; use `rocev2 stats --config` for its switch", args.name);
    };
    if args.watch {
        if !(args.interval > 0.0 && args.interval.is_finite()) {
            bail!("--interval must be a positive number of seconds, not {}", args.interval);
        }
        let _sigint = crate::sys::signals::SigintGuard::install();
        let mut before = link_loads(&record)?;
        while !crate::sys::signals::SigintGuard::interrupted() {
            std::thread::sleep(Duration::from_secs_f64(args.interval));
            let now = link_loads(&record)?;
            let d = delta(&now, &before);
            print!("\x1b[2J\x1b[H{:?}: the last {:.1} s\n{}", args.name, args.interval, render_loads(&fabric, &d));
            if let Some(path) = &args.svg {
                let title = format!("lab {:?}: link loads of the last {:.1} s", args.name, args.interval);
                write_svg(path, &picture::svg(&fabric, &d, &title))?;
            }
            before = now;
        }
        return Ok(());
    }
    let loads = link_loads(&record)?;
    let refused = link_refusals(&record)?;
    if let Some(path) = &args.svg {
        let title = format!("lab {:?}: link loads counted by the switches", args.name);
        write_svg(path, &picture::svg(&fabric, &loads, &title))?;
    }
    if args.json {
        let all = fabric.all_links();
        let links: Vec<_> = all
            .iter()
            .map(|l| {
                let x = loads.get(l).copied().unwrap_or_default();
                let refused = refused.get(l).copied().unwrap_or(0);
                serde_json::json!({ "link": l.to_string(), "tier": l.tier, "switch": l.switch.to_string(), "role": l.switch.role(), "port": l.port, "packets": x.packets, "bytes": x.bytes, "refused": refused })
            })
            .collect();
        let queues = match &record.rated {
            Some(rated) => Some(super::links::queue_stats(rated, &record.switches)?),
            None => None,
        };
        let json = serde_json::json!({ "fabric": fabric, "links": links, "tiers": summarize(&all, &loads), "rated": record.rated, "queues": queues });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}", render_loads(&fabric, &loads));
        print!("{}", render_refusals(&refused));
        if let Some(rated) = &record.rated {
            print!("{}", super::links::render_queues(rated, &super::links::queue_stats(rated, &record.switches)?));
        }
        if let Some(path) = &args.svg {
            println!("picture written to {}", path.display());
        }
    }
    Ok(())
}

fn write_svg(path: &std::path::Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
