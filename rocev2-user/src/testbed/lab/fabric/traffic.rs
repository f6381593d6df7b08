//! `rocev2 lab traffic`: one collective step over a fabric. An arrival
//! probe on every receiving host counts what lands there and follows each
//! QP's PSNs (in XDP, before any socket: testbed::arrival); a sink checks
//! every packet it captures (ICRC, IPv4 checksum, TTL against the switches
//! on its path); a generator on every sending host sends its connections;
//! the switches' member counters before and after give each link's load,
//! which is compared with the simulator's prediction for the same frames.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use super::{host_ns, view};
use crate::{
    sys::netns::spawn_in_netns,
    testbed::arrival::ArrivalProbe,
    testbed::lab::LabRecord,
    tools::fabric::{flag, summarize, Fabric, Family, LinkId, Load, Pattern, TierSummary, TrafficSpec, SENT_TTL},
    tools::gen::{self, SportModel},
    tools::sink::{Sink, SinkArgs, SinkReport},
};

#[derive(clap::Args, Debug, Clone)]
pub struct LabTrafficArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// `ring`: host i of rack r to host i of rack r+1; `all-to-all`: every host to every other.
    #[arg(long, value_enum, default_value = "ring")]
    pub pattern: Pattern,
    /// Queue pairs per connection.
    #[arg(long, default_value_t = 8)]
    pub qps: u32,
    /// WRITE messages (4 packets each) per QP.
    #[arg(long, default_value_t = 16)]
    pub messages: u32,
    /// How each QP's UDP source port is chosen.
    #[arg(long, value_enum, default_value = "nic")]
    pub sport: SportModel,
    /// Packets per second per sending host (veth queues drop what comes faster).
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What one host's sink found wrong, beyond its report.
#[derive(Clone, Debug, Serialize)]
pub struct HostCheck {
    pub host: String,
    pub expected: u64,
    /// RoCEv2 frames that landed on its eth0 (its arrival probe).
    pub arrived: u64,
    /// What its arrival probe found of the PSN order, over every QP.
    pub missing: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub report: SinkReport,
    /// Packets whose TTL is not 64 minus the switches on their path.
    pub wrong_ttl: u64,
}

/// Everything `lab traffic` measured.
#[derive(Clone, Debug, Serialize)]
pub struct TrafficOutcome {
    pub spec: TrafficSpec,
    pub connections: usize,
    pub sent: u64,
    /// Landed on the receiving hosts (arrival probes, before any socket).
    pub arrived: u64,
    /// Captured by the sinks (they may drop under load: `observer_dropped`).
    pub received: u64,
    /// Frames the sinks' sockets dropped (their receive buffers full).
    pub observer_dropped: u64,
    pub bad_icrc: u64,
    pub bad_ipv4_checksum: u64,
    pub wrong_ttl: u64,
    /// PSN order where the frames land (arrival probes): late packets,
    /// PSNs that never arrived, duplicates.
    pub reordered: u64,
    pub missing: u64,
    pub duplicates: u64,
    pub seconds: f64,
    pub hosts: Vec<HostCheck>,
    /// Per-link packets and bytes the switches counted for this step.
    pub loads: Vec<(LinkId, Load)>,
    pub tiers: Vec<TierSummary>,
    /// Links where the simulator's prediction differs from the counters.
    pub prediction_mismatches: Vec<(LinkId, Load, Load)>,
}

impl TrafficOutcome {
    /// Every packet arrived, once, in order, intact, with the right TTL
    /// (what the sinks could not capture is the observer's loss).
    pub fn clean(&self) -> bool {
        self.arrived == self.sent
            && self.bad_icrc == 0
            && self.bad_ipv4_checksum == 0
            && self.wrong_ttl == 0
            && self.reordered == 0
            && self.missing == 0
            && self.duplicates == 0
    }
}

pub fn traffic(args: &LabTrafficArgs) -> Result<TrafficOutcome> {
    let record = LabRecord::read(&args.name)?;
    let Some(fabric) = record.fabric.clone() else {
        bail!("lab {:?} is a single-rack lab; `lab traffic` needs a fabric (`lab up --racks N`)", args.name);
    };
    if !record.guests.is_empty() {
        bail!(
            "lab {:?} has RDMA hosts (virtual machines), which `lab traffic` cannot drive: run the RDMA tools in them with `rocev2 lab exec --name {} r1h1 -- ib_write_bw ...`",
            args.name,
            args.name
        );
    }
    if !(1..=32).contains(&args.qps) {
        bail!("--qps must be 1..=32, not {}", args.qps);
    }
    if !(1..=10_000).contains(&args.messages) || args.rate == 0 {
        bail!("--messages must be 1..=10000 and --rate positive");
    }
    let spec = TrafficSpec { pattern: args.pattern, qps: args.qps, messages: args.messages, sport: args.sport };
    let outcome = run_step(&record, &fabric, &spec, args.rate)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        print!("{}", render(&fabric, &outcome));
    }
    Ok(outcome)
}

fn run_step(record: &LabRecord, fabric: &Fabric, spec: &TrafficSpec, rate: u64) -> Result<TrafficOutcome> {
    let connections = fabric.connections(spec.pattern);
    let before = view::link_loads(record)?;
    let per_connection =
        u64::from(spec.qps) * u64::from(spec.messages) * u64::from(crate::tools::fabric::MESSAGE_PACKETS);
    // Per receiving host: packets expected, by TTL.
    let mut expected: BTreeMap<(u32, u32), BTreeMap<u8, u64>> = BTreeMap::new();
    for c in &connections {
        *expected.entry(c.dst).or_default().entry(SENT_TTL - fabric.hops(c.src, c.dst)).or_default() += per_connection;
    }

    // Arrival probes first: they count what lands, whatever the sinks miss.
    let mut probes = BTreeMap::new();
    for &(r, i) in expected.keys() {
        probes.insert((r, i), ArrivalProbe::attach(&host_ns(&record.name, r, i), "eth0")?);
    }
    let started = Instant::now();
    // Sinks first; each says when its socket is open.
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut sinks = Vec::new();
    for (&(r, i), ttls) in &expected {
        let count: u64 = ttls.values().sum();
        let ready = ready_tx.clone();
        let handle = spawn_in_netns(&host_ns(&record.name, r, i), move || {
            let mut args = SinkArgs::new("eth0");
            args.count = Some(count);
            args.idle_exit = 2.0;
            args.duration = Some(120.0);
            // The host's RoCE endpoint: with nothing on UDP 4791 the kernel
            // would answer with ICMP port unreachables, extra traffic on the links.
            let _endpoint = std::net::UdpSocket::bind("[::]:4791").context("binding UDP port 4791")?;
            let sink = Sink::open(&args);
            let _ = ready.send(());
            sink?.receive()
        })?;
        sinks.push(((r, i), handle));
    }
    for _ in 0..sinks.len() {
        ready_rx.recv_timeout(Duration::from_secs(10)).context("a sink did not open its socket")?;
    }
    // One generator thread per sending host, its connections one after another.
    let mut by_source: BTreeMap<(u32, u32), Vec<gen::GenArgs>> = BTreeMap::new();
    for c in &connections {
        let mut g = fabric.gen_args(c, spec);
        g.rate = Some(rate);
        by_source.entry(c.src).or_default().push(g);
    }
    let mut gens = Vec::new();
    for ((r, i), list) in by_source {
        gens.push(spawn_in_netns(&host_ns(&record.name, r, i), move || {
            let mut sent = 0;
            for g in list.iter() {
                sent += gen::generate(g)?.packets;
            }
            Ok(sent)
        })?);
    }
    let mut sent = 0;
    for g in gens {
        sent += g.join().map_err(|_| anyhow::anyhow!("a generator thread panicked"))??;
    }
    let mut hosts = Vec::new();
    for ((r, i), handle) in sinks {
        let report = handle.join().map_err(|_| anyhow::anyhow!("a sink thread panicked"))??;
        let want = &expected[&(r, i)];
        // More packets at a TTL than the paths explain (loss shows as missing).
        let wrong_ttl =
            report.ttl.iter().map(|(t, n)| n.saturating_sub(want.get(t).copied().unwrap_or(0))).sum::<u64>();
        let probe = &probes[&(r, i)];
        let flows = probe.flows()?;
        hosts.push(HostCheck {
            host: format!("r{r}h{i}"),
            expected: want.values().sum(),
            arrived: probe.totals()?.roce,
            missing: flows.values().map(|f| f.missing).sum(),
            reordered: flows.values().map(|f| f.late).sum(),
            duplicates: flows.values().map(|f| f.duplicates).sum(),
            report,
            wrong_ttl,
        });
    }
    let seconds = started.elapsed().as_secs_f64();
    // Counters are per packet as the XDP program forwards it: read them once the sinks are done.
    let after = view::link_loads(record)?;
    let loads = view::delta(&after, &before);
    let all = fabric.all_links();
    let predicted = fabric.predict(spec)?;
    let prediction_mismatches = all
        .iter()
        .filter_map(|l| {
            let (m, p) = (loads.get(l).copied().unwrap_or_default(), predicted.get(l).copied().unwrap_or_default());
            (m != p).then(|| (l.clone(), m, p))
        })
        .collect();
    let sum = |f: fn(&SinkReport) -> u64| hosts.iter().map(|h| f(&h.report)).sum::<u64>();
    let per_host = |f: fn(&HostCheck) -> u64| hosts.iter().map(f).sum::<u64>();
    Ok(TrafficOutcome {
        spec: *spec,
        connections: connections.len(),
        sent,
        arrived: per_host(|h| h.arrived),
        received: sum(|r| r.packets),
        observer_dropped: sum(|r| r.observer_dropped),
        bad_icrc: sum(|r| r.bad_icrc),
        bad_ipv4_checksum: sum(|r| r.bad_ipv4_checksum),
        wrong_ttl: per_host(|h| h.wrong_ttl),
        reordered: per_host(|h| h.reordered),
        missing: per_host(|h| h.missing),
        duplicates: per_host(|h| h.duplicates),
        seconds,
        tiers: summarize(&all, &loads),
        loads: all.iter().map(|l| (l.clone(), loads.get(l).copied().unwrap_or_default())).collect(),
        hosts,
        prediction_mismatches,
    })
}

fn render(fabric: &Fabric, o: &TrafficOutcome) -> String {
    let mut out = format!(
        "{} step: {} connections x {} QPs x {} messages, sport {}: {} packets sent, {} arrived, {} captured by the sinks in {:.1} s\n",
        flag(o.spec.pattern),
        o.connections,
        o.spec.qps,
        o.spec.messages,
        flag(o.spec.sport),
        o.sent,
        o.arrived,
        o.received,
        o.seconds
    );
    let _ = writeln!(
        out,
        "Where the frames land (XDP on each host): {} reordered, {} missing, {} duplicate; checked at the sinks: {} bad ICRC, {} bad IPv4 checksum, {} wrong TTL (64 - switches on the path)",
        o.reordered, o.missing, o.duplicates, o.bad_icrc, o.bad_ipv4_checksum, o.wrong_ttl
    );
    if o.received < o.arrived || o.observer_dropped > 0 {
        let _ = writeln!(
            out,
            "The sinks missed {} frames that arrived (their sockets dropped {}, receive buffers full): the observer's loss, not the fabric's; the checks above cover what they captured",
            o.arrived.saturating_sub(o.received),
            o.observer_dropped
        );
    }
    let loads: BTreeMap<LinkId, Load> = o.loads.iter().cloned().collect();
    out.push_str(&crate::tools::fabric::render_loads(fabric, &loads));
    if o.prediction_mismatches.is_empty() {
        let _ = writeln!(
            out,
            "The simulator's prediction (`rocev2 entropy --racks {} --hosts {} --spines {} --links-per-spine {}{} --hash {} --seeds {} --family {} --pattern {} --qps {} --messages {} --sport {}`) equals these counters on all {} links.",
            fabric.racks,
            fabric.hosts,
            fabric.spines,
            fabric.links,
            if fabric.zones > 1 { format!(" --zones {} --aggs {}", fabric.zones, fabric.aggs) } else { String::new() },
            fabric.hash.name(),
            flag(fabric.seeds),
            flag(match (fabric.v4, fabric.v6) {
                (true, true) => Family::Both,
                (false, true) => Family::V6,
                _ => Family::V4,
            }),
            flag(o.spec.pattern),
            o.spec.qps,
            o.spec.messages,
            flag(o.spec.sport),
            loads.len()
        );
    } else {
        let _ = writeln!(
            out,
            "The simulator's prediction differs on {} links (groups filled in another order, e.g. BGP paths that came up one by one after the dataplane started), first: {} measured {} packets, predicted {}",
            o.prediction_mismatches.len(),
            o.prediction_mismatches[0].0,
            o.prediction_mismatches[0].1.packets,
            o.prediction_mismatches[0].2.packets
        );
    }
    let _ =
        writeln!(out, "{}", if o.clean() { "OK: every packet arrived intact, in order" } else { "FAILED: see above" });
    out
}
