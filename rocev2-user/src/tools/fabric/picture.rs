//! The fabric as an SVG picture: `rocev2 lab stats --svg` with the
//! counted loads, `rocev2 entropy --racks N --svg` with the predicted
//! ones. Spines (and aggregation switches) on top, leaves in the middle,
//! hosts below; every directed link is its own line, the two directions of
//! a link and the parallel links of a switch pair drawn apart, so an idle
//! link next to busy ones stays visible.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{summarize, Fabric, LinkId, Load, Switch, Tier};

/// Horizontal room per host (or switch) in the widest row.
const GAP: f64 = 110.0;
/// Between the parallel links of one leaf-spine pair.
const PARALLEL: f64 = 14.0;
/// Between the two directions of one link.
const DIRECTION: f64 = 4.0;
/// An idle link: dashed, in a colour no loaded link has.
const IDLE_COLOUR: &str = "#4a7bd0";

/// The picture, titled `title` (what the loads are: the lab's counters, a
/// simulation), with the fabric's shape and settings below it.
pub fn svg(f: &Fabric, loads: &BTreeMap<LinkId, Load>, title: &str) -> String {
    // At least as wide as the title and the legend.
    let width = ((f.racks * f.hosts).max(f.spines).max(f.racks * 2) as f64 * GAP + 80.0).max(780.0);
    let x_of = |i: u32, n: u32| (i as f64 - 0.5) * width / n as f64;
    // A third row on top when aggregation switches join zones.
    let top = if f.aggs > 0 { 130.0 } else { 0.0 };
    let (y_agg, y_spine, y_leaf, y_host) = (90.0, 90.0 + top, 270.0 + top, 400.0 + top);
    let all = f.all_links();
    let tiers = summarize(&all, loads);
    let max_of = |t: Tier| tiers.iter().find(|s| s.tier == t).map_or(0, |s| s.max_bytes).max(1);
    let legend_y = y_host + 50.0;
    let summary_y = legend_y + 40.0;
    let height = summary_y + 18.0 * tiers.len() as f64 + 10.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n<text x=\"10\" y=\"42\">{}</text>\n",
        escape(title),
        escape(&describe(f))
    );
    let line = |s: &mut String, l: &LinkId, (x1, y1, x2, y2): (f64, f64, f64, f64)| {
        let load = loads.get(l).copied().unwrap_or_default();
        let title = format!("{l}: {} packets, {} bytes", load.packets, load.bytes);
        if load.bytes == 0 {
            let _ = writeln!(
                s,
                "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{IDLE_COLOUR}\" stroke-width=\"1.5\" stroke-dasharray=\"5 4\"><title>{title} (idle)</title></line>"
            );
        } else {
            let v = load.bytes as f64 / max_of(l.tier) as f64;
            let (r, g) = (200.0 + 55.0 * v, 200.0 * (1.0 - v));
            let _ = writeln!(
                s,
                "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"rgb({r:.0},{g:.0},{g:.0})\" stroke-width=\"{:.1}\"><title>{title}</title></line>",
                1.5 + 4.0 * v
            );
        }
    };
    for r in 1..=f.racks {
        let lx = x_of(r, f.racks);
        for (j, k) in f.uplinks(r) {
            let sx = x_of(j, f.spines);
            let off = (k as f64 - (f.links as f64 + 1.0) / 2.0) * PARALLEL;
            let up = LinkId { tier: Tier::LeafUp, switch: Switch::Leaf(r), port: Fabric::uplink_port(j, k) };
            let down = LinkId { tier: Tier::SpineDown, switch: Switch::Spine(j), port: Fabric::downlink_port(r, k) };
            line(&mut s, &up, (lx + off - DIRECTION, y_leaf, sx + off - DIRECTION, y_spine));
            line(&mut s, &down, (sx + off + DIRECTION, y_spine, lx + off + DIRECTION, y_leaf));
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
            line(&mut s, &up, (sx - DIRECTION, y_spine, ax - DIRECTION, y_agg));
            line(&mut s, &down, (ax + DIRECTION, y_agg, sx + DIRECTION, y_spine));
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
    // The legend: what colour and width mean.
    let _ = writeln!(
        s,
        "<line x1=\"10\" y1=\"{y:.0}\" x2=\"50\" y2=\"{y:.0}\" stroke=\"{IDLE_COLOUR}\" stroke-width=\"1.5\" stroke-dasharray=\"5 4\"/><text x=\"56\" y=\"{t:.0}\">idle</text>\
         <line x1=\"110\" y1=\"{y:.0}\" x2=\"150\" y2=\"{y:.0}\" stroke=\"rgb(200,200,200)\" stroke-width=\"1.5\"/><text x=\"156\" y=\"{t:.0}\">light</text>\
         <line x1=\"210\" y1=\"{y:.0}\" x2=\"250\" y2=\"{y:.0}\" stroke=\"rgb(255,0,0)\" stroke-width=\"5.5\"/><text x=\"256\" y=\"{t:.0}\">the busiest link of its tier (colour and width scale with bytes)</text>",
        y = legend_y,
        t = legend_y + 4.0
    );
    for (i, t) in tiers.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{}\">{}: busiest {:.2}x the mean, {} of {} links idle</text>",
            summary_y + 18.0 * i as f64,
            escape(t.tier.name()),
            t.max_over_mean,
            t.idle,
            t.links
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Fabric `f`'s shape and settings in a line.
pub fn describe(f: &Fabric) -> String {
    let zones = if f.zones > 1 { format!(", {} zones joined by {} aggs", f.zones, f.aggs) } else { String::new() };
    format!(
        "{} racks x {} hosts, {} spines x {} link(s){zones}; hash {}, seeds {}",
        f.racks,
        f.hosts,
        f.spines,
        f.links,
        f.hash.name(),
        super::flag(f.seeds)
    )
}

/// Text for an SVG element.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
