//! `rocev2 lab stats`: every switch's member counters merged into one
//! per-link table by tier (a member is a link: the switch sends on its
//! port), the busiest link over the mean per tier, and an SVG picture of
//! the fabric with each link shaded by its load.

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf, time::Duration};

use anyhow::{bail, Context as _, Result};

use crate::{
    control::dataplane::Maps,
    control::state::RunState,
    control::stats::Snapshot,
    testbed::lab::LabRecord,
    tools::fabric::{render_loads, summarize, Fabric, LinkId, Load, Switch, Tier},
};

#[derive(clap::Args, Debug, Clone)]
pub struct LabStatsArgs {
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Print JSON: every link's counters and the per-tier summary.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Print the loads of the last interval again and again (Ctrl-C stops).
    #[arg(long)]
    pub watch: bool,
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
                write_svg(path, &svg(&fabric, &d))?;
            }
            before = now;
        }
        return Ok(());
    }
    let loads = link_loads(&record)?;
    let refused = link_refusals(&record)?;
    if let Some(path) = &args.svg {
        write_svg(path, &svg(&fabric, &loads))?;
    }
    if args.json {
        let all = fabric.all_links();
        let links: Vec<_> = all
            .iter()
            .map(|l| {
                let x = loads.get(l).copied().unwrap_or_default();
                let refused = refused.get(l).copied().unwrap_or(0);
                serde_json::json!({ "link": l.to_string(), "tier": l.tier, "switch": l.switch, "port": l.port, "packets": x.packets, "bytes": x.bytes, "refused": refused })
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

/// Spines on top, leaves in the middle, hosts below; every directed link is
/// a line shaded from light grey (idle) to red (the busiest link of its
/// tier), its two directions drawn side by side.
pub fn svg(f: &Fabric, loads: &BTreeMap<LinkId, Load>) -> String {
    let gap = 90.0;
    let width = (f.racks * f.hosts).max(f.spines).max(f.racks * 2) as f64 * gap + 80.0;
    let x_of = |i: u32, n: u32| (i as f64 - 0.5) * width / n as f64;
    // A third row on top when aggregation switches join zones.
    let top = if f.aggs > 0 { 130.0 } else { 0.0 };
    let (y_agg, y_spine, y_leaf, y_host) = (50.0, 50.0 + top, 230.0 + top, 360.0 + top);
    let all = f.all_links();
    let tiers = summarize(&all, loads);
    let max_of = |t: Tier| tiers.iter().find(|s| s.tier == t).map_or(0, |s| s.max_bytes).max(1);
    let shade = |l: &LinkId| {
        let b = loads.get(l).map_or(0, |x| x.bytes);
        let v = b as f64 / max_of(l.tier) as f64;
        let (r, g) = (200.0 + 55.0 * v, 200.0 * (1.0 - v));
        (format!("rgb({:.0},{:.0},{:.0})", r, g, g), if b == 0 { 1.0 } else { 1.5 + 4.0 * v })
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        520.0 + top
    );
    let line = |s: &mut String, l: &LinkId, (x1, y1, x2, y2): (f64, f64, f64, f64)| {
        let (color, w) = shade(l);
        let bytes = loads.get(l).map_or(0, |x| x.bytes);
        let _ = writeln!(
            s,
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{color}\" stroke-width=\"{w:.1}\"><title>{l}: {bytes} bytes</title></line>"
        );
    };
    for r in 1..=f.racks {
        let lx = x_of(r, f.racks);
        for (j, k) in f.uplinks(r) {
            let sx = x_of(j, f.spines);
            let off = (k as f64 - (f.links as f64 + 1.0) / 2.0) * 6.0;
            let up = LinkId { tier: Tier::LeafUp, switch: Switch::Leaf(r), port: Fabric::uplink_port(j, k) };
            let down = LinkId { tier: Tier::SpineDown, switch: Switch::Spine(j), port: Fabric::downlink_port(r, k) };
            line(&mut s, &up, (lx + off - 2.0, y_leaf, sx + off - 2.0, y_spine));
            line(&mut s, &down, (sx + off + 2.0, y_spine, lx + off + 2.0, y_leaf));
        }
        for i in 1..=f.hosts {
            let hx = x_of((r - 1) * f.hosts + i, f.racks * f.hosts);
            let down = LinkId { tier: Tier::LeafDown, switch: Switch::Leaf(r), port: Fabric::host_port(i) };
            line(&mut s, &down, (lx, y_leaf, hx, y_host));
            let _ = writeln!(s, "<circle cx=\"{hx:.1}\" cy=\"{y_host}\" r=\"8\" fill=\"#446\"/><text x=\"{hx:.1}\" y=\"{:.0}\" text-anchor=\"middle\">r{r}h{i}</text>", y_host + 24.0);
        }
    }
    for j in 1..=f.spines {
        for a in 1..=f.aggs {
            let (sx, ax) = (x_of(j, f.spines), x_of(a, f.aggs));
            let up = LinkId { tier: Tier::SpineUp, switch: Switch::Spine(j), port: Fabric::agg_port(a) };
            let down = LinkId { tier: Tier::AggDown, switch: Switch::Agg(a), port: Fabric::spine_port(j) };
            line(&mut s, &up, (sx - 2.0, y_spine, ax - 2.0, y_agg));
            line(&mut s, &down, (ax + 2.0, y_agg, sx + 2.0, y_spine));
        }
    }
    for (label, n, y) in [("a", f.aggs, y_agg), ("s", f.spines, y_spine), ("l", f.racks, y_leaf)] {
        for i in 1..=n {
            let x = x_of(i, n);
            let _ = writeln!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"50\" height=\"24\" rx=\"4\" fill=\"#235\"/><text x=\"{x:.1}\" y=\"{:.1}\" fill=\"white\" text-anchor=\"middle\">{label}{i}</text>",
                x - 25.0,
                y - 12.0,
                y + 4.0
            );
        }
    }
    for (i, t) in tiers.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{}\">{}: busiest {:.2}x the mean, {} of {} links idle</text>",
            410.0 + top + 18.0 * i as f64,
            t.tier.name(),
            t.max_over_mean,
            t.idle,
            t.links
        );
    }
    s.push_str("</svg>\n");
    s
}
