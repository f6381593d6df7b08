//! `rocev2 lab te`: centralized traffic engineering on a fabric lab, as
//! Meta ran it for its smaller clusters. A controller takes a collective's
//! traffic matrix (every QP with the share of its busier host link it
//! needs: [`te_demands`], as the model computes it), computes a path per
//! QP with CSPF ([`crate::tools::collective::cspf`]) over the lab's links, and installs the result as `[[pin]]`s on every
//! switch (groups with `policy = "pinned"`): the existing pin mechanism,
//! written into each switch's config and applied by a reload.
//!
//! When a link fails, the controller recomputes on the fabric without it
//! and installs the new pins; meanwhile the pins that name the dead link's
//! member fall back to hashing (`pin_fallback`), and what the link held
//! (its queue, what was in flight to it) is lost.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use super::{
    apply_balance,
    balance::{Balance, TePin},
    switch_ns,
};
use crate::{
    control::config::parse_size_arg,
    sys::{
        netns::{in_netns_scoped, ip},
        snmp,
    },
    testbed::lab::LabRecord,
    tools::collective::{self, cspf, cspf::Graph, model::te_demands, qp_number, Op, Placement, Plan},
    tools::fabric::{Fabric, LinkId, Switch, Tier},
};

#[derive(clap::Args, Debug, Clone)]
pub struct LabTeArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// The collective whose traffic matrix to engineer (as `lab collective` runs it).
    #[arg(long, value_enum, default_value = "allreduce")]
    pub op: Op,
    /// Bytes per rank, as `lab collective --size`.
    #[arg(long, value_parser = parse_size_arg, default_value = "4m")]
    pub size: u64,
    /// QPs per connection, as `lab collective --qps`.
    #[arg(long, default_value_t = 1)]
    pub qps: u32,
    /// Message (chunk) size, as `lab collective --chunk`.
    #[arg(long, value_parser = parse_size_arg, default_value = "128k")]
    pub chunk: u64,
    /// How ranks sit on the hosts, as `lab collective --placement`.
    #[arg(long, value_enum, default_value = "interleaved")]
    pub placement: Placement,
    /// After installing, fail this link (both directions; named as `lab
    /// stats` names a direction, e.g. l1/s1p1) and recompute without it.
    #[arg(long, value_name = "LINK")]
    pub fail: Option<String>,
    /// Print the plan (and the re-plan after --fail) as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What the controller computed and how long it took.
#[derive(Clone, Debug, Serialize)]
pub struct TeOutcome {
    pub flows: usize,
    /// Flows whose path had the capacity they need.
    pub fitting: usize,
    /// The busiest link's load over its capacity, as placed.
    pub max_utilization: f64,
    /// Pins installed: every QP's data and RTSs on its path, its ACKs,
    /// NAKs, CNPs and CTSs back over the same links.
    pub pins: usize,
    pub compute_ms: f64,
    /// Writing the configs and restarting or reloading every dataplane.
    pub install_ms: f64,
    /// Per flow: `r1h1 -> r2h1 qp 0x8040: l1/s2p1 s2/l2p1`.
    pub paths: Vec<String>,
}

/// `lab te`'s report.
#[derive(Clone, Debug, Serialize)]
pub struct TeReport {
    pub installed: TeOutcome,
    /// With --fail: the link, and the recomputation without it.
    pub failed_link: Option<String>,
    pub after_failure: Option<TeOutcome>,
}

/// The plan a TE request names.
pub fn plan_of(record: &LabRecord, op: Op, size: u64, qps: u32, chunk: u64, placement: Placement) -> Result<Plan> {
    let Some(f) = &record.fabric else {
        bail!("lab {:?} is a single-rack lab; TE needs a fabric (`lab up --racks N --routing static`)", record.name)
    };
    Plan::new(op, size, collective::place(f.racks, f.hosts, placement), qps, chunk).map_err(anyhow::Error::msg)
}

/// Computes per-QP paths for `plan` on the fabric without the edges in
/// `down` and installs them; `restart` for a fabric not in TE mode yet.
pub fn engineer(record: &mut LabRecord, plan: &Plan, down: &[LinkId]) -> Result<TeOutcome> {
    let f = record.fabric.clone().context("not a fabric")?;
    let started = Instant::now();
    let capacity = record.rated.as_ref().map_or(1.0, |r| r.settings.rate_bps as f64);
    let g = Graph::fabric(&f, capacity);
    let down_edges: Vec<usize> = down
        .iter()
        .flat_map(|l| {
            let (a, b) = link_ends(&f, l);
            [g.edge_of(a.0, &a.1), b.and_then(|b| g.edge_of(b.0, &b.1))]
        })
        .flatten()
        .collect();
    // Every QP needs its share of its busier host link (the model's TE
    // demands, one function for both).
    let matrix = plan.traffic_matrix();
    let flows: Vec<(usize, usize, u32)> = matrix.keys().copied().collect();
    let demands = te_demands(&plan.ranks, matrix.into_iter(), capacity);
    let routing = cspf::cspf(&g, &demands, &down_edges);
    let mut pins = Vec::new();
    let mut paths = Vec::new();
    for (i, &(src, dst, q)) in flows.iter().enumerate() {
        let qp = qp_number(src, dst, q);
        let dst_host = plan.ranks[dst];
        let (sr, si) = plan.ranks[src];
        let Some(path) = &routing.paths[i] else {
            paths.push(format!("r{sr}h{si} -> r{}h{} qp {qp:#x}: no path", dst_host.0, dst_host.1));
            continue;
        };
        let mut hops = Vec::new();
        let control = crate::tools::rc::admission::control_qp(qp);
        for &e in path {
            let Some(link) = &g.edges[e].link else { continue };
            hops.push(link.to_string());
            // The QP's data and RTSs this way; its ACKs, NAKs, CNPs and
            // CTSs back over the same links. A switch pins only where it
            // has a choice.
            if choices(&f, link.switch, dst_host.0) > 1 {
                for q in [qp, control] {
                    pins.push(TePin { switch: link.switch, dst: dst_host, qp: q, port: link.port.clone() });
                }
            }
            if let (_, Some((back, port))) = link_ends(&f, link) {
                if choices(&f, back, sr) > 1 {
                    for q in [qp, control] {
                        pins.push(TePin { switch: back, dst: (sr, si), qp: q, port: port.clone() });
                    }
                }
            }
        }
        paths.push(format!("r{sr}h{si} -> r{}h{} qp {qp:#x}: {}", dst_host.0, dst_host.1, hops.join(" ")));
    }
    pins.sort();
    let compute = started.elapsed();
    let restart = !matches!(record.balance, Some(Balance::Te { .. }));
    let pin_count = pins.len();
    let install = apply_balance(record, &Balance::Te { pins }, restart)?;
    Ok(TeOutcome {
        flows: flows.len(),
        fitting: routing.fits.iter().filter(|f| **f).count(),
        max_utilization: routing.max_utilization(&g),
        pins: pin_count,
        compute_ms: compute.as_secs_f64() * 1e3,
        install_ms: install.as_secs_f64() * 1e3,
        paths,
    })
}

/// How many members the group `switch` reaches rack `r` by has.
fn choices(f: &Fabric, switch: Switch, r: u32) -> u32 {
    match switch {
        Switch::Leaf(own) if own == r => 1,
        Switch::Leaf(_) => f.zone_spines() * f.links,
        Switch::Spine(j) if f.zone_of_spine(j) == f.zone_of_rack(r) => f.links,
        Switch::Spine(_) => f.aggs,
        Switch::Agg(_) => f.zone_spines(),
    }
}

/// The two ends of the link `l` names: its sender (switch, port) and
/// the far switch's (switch, port), or `None` when the far end is a host.
pub fn link_ends(f: &Fabric, l: &LinkId) -> ((Switch, String), Option<(Switch, String)>) {
    let here = (l.switch, l.port.clone());
    let far = match l.switch {
        Switch::Leaf(r) => f
            .uplinks(r)
            .into_iter()
            .find(|&(j, k)| Fabric::uplink_port(j, k) == l.port)
            .map(|(j, k)| (Switch::Spine(j), Fabric::downlink_port(r, k))),
        Switch::Spine(j) => (1..=f.aggs)
            .find(|&a| Fabric::agg_port(a) == l.port)
            .map(|a| (Switch::Agg(a), Fabric::spine_port(j)))
            .or_else(|| {
                f.racks_of_zone(f.zone_of_spine(j)).find_map(|r| {
                    (1..=f.links)
                        .find(|&k| Fabric::downlink_port(r, k) == l.port)
                        .map(|k| (Switch::Leaf(r), Fabric::uplink_port(j, k)))
                })
            }),
        Switch::Agg(a) => {
            (1..=f.spines).find(|&j| Fabric::spine_port(j) == l.port).map(|j| (Switch::Spine(j), Fabric::agg_port(a)))
        }
    };
    (here, far)
}

/// "l1/s1p1" as a link of the fabric.
pub fn parse_link(f: &Fabric, text: &str) -> Result<LinkId> {
    let (switch, port) = text
        .split_once('/')
        .with_context(|| format!("{text:?} is not a link; write it as lab stats does, e.g. l1/s1p1"))?;
    let all = f.all_links();
    let Some(link) = all.iter().find(|l| l.switch.to_string() == switch && l.port == port).cloned() else {
        // Name real links of this fabric: pointing at `lab stats` would need
        // the lab's name, which the user may have left out.
        let links: Vec<String> =
            all.iter().filter(|l| l.tier != Tier::LeafDown).map(|l| format!("{}/{}", l.switch, l.port)).collect();
        let shown = links.iter().take(6).cloned().collect::<Vec<_>>().join(", ");
        let more = if links.len() > 6 { format!(", ... ({} in all)", links.len()) } else { String::new() };
        bail!("{text:?} is not a link of this fabric; its links are {shown}{more}");
    };
    if link.tier == Tier::LeafDown {
        bail!("{text} leads to a host, which has only that link: fail a leaf-spine or spine-aggregation link");
    }
    Ok(link)
}

/// Takes the link down (`up` false) or brings it back, as a cable cut
/// would: on a wired fabric (`--wires`, `--link-rate`) its two wire
/// devices go down, so both switches' ports lose carrier and stay
/// administratively up; otherwise both switches' ports go down.
pub fn set_link(record: &LabRecord, link: &LinkId, up: bool) -> Result<()> {
    let f = record.fabric.as_ref().context("not a fabric")?;
    let (a, b) = link_ends(f, link);
    let state = if up { "up" } else { "down" };
    let wires = super::links::wire_ns(&record.name);
    let wired = crate::testbed::topology::netns_exists(&wires);
    for (s, port) in [Some(a), b].into_iter().flatten() {
        let (ns, dev) =
            if wired { (wires.clone(), format!("{s}-{port}")) } else { (switch_ns(&record.name, s), port.clone()) };
        ip(&["-n", &ns, "link", "set", &dev, state]).with_context(|| format!("setting {s}/{port} {state}"))?;
    }
    Ok(())
}

/// `rocev2 lab link`: fail a link or bring it back.
#[derive(clap::Args, Debug, Clone)]
pub struct LabLinkArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// The link, as `lab stats` names one of its directions (l1/s1p1).
    pub link: String,
    /// `down` fails both directions of the link, `up` brings them back.
    #[arg(value_enum)]
    pub state: LinkState,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    Up,
    Down,
}

pub fn link(args: &LabLinkArgs) -> Result<()> {
    let record = LabRecord::read(&args.name)?;
    let f = record.fabric.clone().with_context(|| {
        format!("lab {:?} is not a fabric; `lab link` fails a fabric's links (`lab up --racks N`)", args.name)
    })?;
    let l = parse_link(&f, &args.link)?;
    set_link(&record, &l, args.state == LinkState::Up)?;
    let (a, b) = link_ends(&f, &l);
    println!(
        "Link {}/{} - {} is {}",
        a.0,
        a.1,
        b.map_or("host".to_string(), |b| format!("{}/{}", b.0, b.1)),
        if args.state == LinkState::Up { "up" } else { "down" }
    );
    Ok(())
}

/// `rocev2 lab te`.
pub fn te(args: &LabTeArgs) -> Result<TeReport> {
    let mut record = LabRecord::read(&args.name)?;
    let plan = plan_of(&record, args.op, args.size, args.qps, args.chunk, args.placement)?;
    let installed = engineer(&mut record, &plan, &[])?;
    let mut report = TeReport { installed, failed_link: None, after_failure: None };
    if let Some(text) = &args.fail {
        let f = record.fabric.clone().context("not a fabric")?;
        let link = parse_link(&f, text)?;
        set_link(&record, &link, false)?;
        report.failed_link = Some(link.to_string());
        report.after_failure = Some(engineer(&mut record, &plan, &[link])?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&args.name, &report));
    }
    Ok(report)
}

fn outcome_lines(out: &mut String, o: &TeOutcome) {
    let _ = writeln!(
        out,
        "  {} flows (QPs) placed, {} with the capacity they need; busiest link at {:.0}% of its rate as placed; {} pins; CSPF {:.1} ms, installed in {:.0} ms",
        o.flows,
        o.fitting,
        o.max_utilization * 100.0,
        o.pins,
        o.compute_ms,
        o.install_ms
    );
    for p in o.paths.iter().take(16) {
        let _ = writeln!(out, "    {p}");
    }
    if o.paths.len() > 16 {
        let _ = writeln!(out, "    ... {} more (--json)", o.paths.len() - 16);
    }
}

pub fn render(name: &str, r: &TeReport) -> String {
    let mut out = format!("Fabric {name:?} is in TE mode: per-QP paths from CSPF, pinned on every switch\n");
    outcome_lines(&mut out, &r.installed);
    if let (Some(link), Some(after)) = (&r.failed_link, &r.after_failure) {
        let _ = writeln!(out, "Link {link} failed (both directions down); recomputed without it:");
        outcome_lines(&mut out, after);
        let _ = writeln!(
            out,
            "  until the new pins were in ({:.0} ms after the failure), QPs pinned to it were hashed instead (pin_fallback); bring it back with `rocev2 lab link --name {name} {link} up`",
            after.compute_ms + after.install_ms
        );
    }
    out
}

/// How long a reaction took, for the collective's failure report.
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Packet counters of one end of a link: the switch's port, and on a
/// wired fabric the wire device that carries what the switch sends on it.
#[derive(Clone, Debug, Default)]
pub struct EndCounters {
    /// `l1/s1p1`: the direction, as `lab stats` names it.
    pub direction: String,
    /// Frames the port handed to the link, and those it refused (the
    /// link was down: XDP redirects and the kernel's sends alike).
    pub port_tx: u64,
    pub port_tx_dropped: u64,
    /// Frames the wire passed on to the far switch (None: not wired).
    pub wire_tx: Option<u64>,
    /// Packets the switch's kernel forwarded toward no usable way out
    /// and dropped with an ICMP unreachable (sent or rate-limited): what
    /// its dataplane passed to it while the link was down.
    pub kernel_unreachable: u64,
}

/// Both ends' counters of `link`, read now.
pub fn link_counters(record: &LabRecord, link: &LinkId) -> Result<Vec<EndCounters>> {
    let f = record.fabric.as_ref().context("not a fabric")?;
    let (a, b) = link_ends(f, link);
    let wires = super::links::wire_ns(&record.name);
    let wired = crate::testbed::topology::netns_exists(&wires);
    let stats = |ns: &str, dev: &str| -> Result<(u64, u64)> {
        let tx = crate::sys::netns::device_counts(ns, dev)?.tx;
        Ok((tx.packets, tx.dropped))
    };
    let mut out = Vec::new();
    for (s, port) in [Some(a), b].into_iter().flatten() {
        let ns = switch_ns(&record.name, s);
        let (port_tx, port_tx_dropped) = stats(&ns, &port)?;
        // The wire device named after this direction transmits it.
        let wire_tx = if wired { Some(stats(&wires, &format!("{s}-{port}"))?.0) } else { None };
        let kernel_unreachable = in_netns_scoped(&ns, snmp::icmp_unreachables)
            .with_context(|| format!("reading the ICMP counters of {ns}"))?;
        out.push(EndCounters {
            direction: format!("{s}/{port}"),
            port_tx,
            port_tx_dropped,
            wire_tx,
            kernel_unreachable,
        });
    }
    Ok(out)
}
