//! `rocev2 lab soak`: minutes of churn on a whole fabric under load, and
//! an honest count of what it cost.
//!
//! A fabric lab with BGP (FRR on every switch, `rocev2 run` on every
//! switch, every link through the wire namespace so a link can fail as a
//! cable does) carries a steady, sequence-checked RoCEv2 stream between
//! every pair of racks, IPv4 and IPv6, while a busy loop takes a CPU and,
//! at seeded random moments, one of these happens:
//!
//! - a spine withdraws every route it advertises, and later advertises
//!   them again (an outbound deny-all route-map, as a drain does);
//! - a leaf-spine link fails as a cable cut (both ports lose carrier) and
//!   later comes back;
//! - a spine's FRR is killed (zebra and bgpd, `kill -9`) and started again;
//! - `rocev2 reload` (a changed `neighbour_refresh_ms`), `rocev2 upgrade`,
//!   or `kill -9` of `rocev2 run` and a new `run` that takes over, on a
//!   leaf or a spine.
//!
//! What arrived is counted where it lands: an arrival probe (XDP, before
//! any socket) on every receiving host follows each flow's PSNs and
//! reports every gap, late packet and duplicate with its time. Every lost
//! PSN is tied to its send time (the senders keep checkpoints) and so to
//! the event in whose window it was sent.
//!
//! Every loss gets a cause, two ways:
//!
//! - route state: every switch's kernel paths are followed change by
//!   change for the whole run (a netlink subscription applied to a
//!   [`Fib`] of the soak's own, as the route mirror reads the kernel);
//!   while a switch had no route to a rack, or routed into a link without
//!   carrier (the kernel keeps using such a next hop,
//!   `ignore_routes_with_linkdown` = 0, until the routing daemon removes
//!   it), the kernel itself forwards into nothing. A cable the soak cuts
//!   takes the carrier at the instant it is cut, not when the soak reads
//!   the kernel's message about it;
//! - drop counters (`testbed::lab::drop_counters`), read at every event: each
//!   switch kernel's no-route, discard and TTL counters and its devices'
//!   drops, the wire's devices (a cut cable) and `rocev2`'s own `drop_*`
//!   counters, refused redirects included.
//!
//! In each event's window, the kernel's share of the loss is the larger of
//! the packets sent while it had no path and the drops the kernels and
//! devices counted (up to the loss); the rest is beyond it, and what of
//! that `rocev2`'s counters do not cover either is without a cause. The
//! soak fails on any loss beyond the kernel's. The kernel's share is an
//! upper bound (the kernel hashes flows its own way, and counters count
//! every frame), stated as such.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use rocev2_common::bth::{opcode, Bth};
use serde::Serialize;

use crate::{
    control::{
        config::Prefix,
        routing::{
            fib::{Fib, Hop, Target},
            kernel::{self, Change, WaitingEventSocket},
        },
    },
    render::{Align, Table},
    sys::{netlink::RT_TABLE_MAIN, netns::spawn_in_netns, rawsock::PacketSocket, signal_process},
    testbed::{
        arrival::{monotonic_ns, ArrivalProbe, Flow, SeqEvent, SeqKind},
        frr::Frr,
        lab::{
            self,
            drop_counters::{self, DropCounts},
            fabric::{host_ns, switch_ns, te, SPINE_ASN},
            LabFamily, LabRecord, LabRouting, LabUpArgs,
        },
    },
    tools::{
        fabric::{Fabric, SeedPlan, Switch},
        packet::{build_roce_frame, RoceFrameSpec},
    },
};

/// `rocev2 lab soak`.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// Name of the lab the soak builds (and removes when it ends).
    #[arg(long, default_value = "soak")]
    pub name: String,
    /// How long the traffic runs, in minutes.
    #[arg(long, default_value_t = 3.0)]
    pub minutes: f64,
    /// Seed of the event schedule (default: from the clock; printed, so a
    /// run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Racks of the soak's fabric (one host each).
    #[arg(long, default_value_t = 3)]
    pub racks: u32,
    /// Spines of the soak's fabric.
    #[arg(long, default_value_t = 2)]
    pub spines: u32,
    /// QPs per rack pair and address family.
    #[arg(long, default_value_t = 2)]
    pub qps: u32,
    /// Packets per second of each QP.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Shortest pause between two events, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub min_gap: f64,
    /// Longest pause between two events, in seconds.
    #[arg(long, default_value_t = 9.0)]
    pub max_gap: f64,
    /// Which kinds of episode happen (comma-separated; default all): a
    /// withdraw is followed by its advertise, a link cut by its repair.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Episode::ALL)]
    pub events: Vec<Episode>,
    /// No busy loop beside the fabric.
    #[arg(long)]
    pub no_hog: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Leave the lab up when the soak ends, for a look (`rocev2 lab down
    /// --name NAME` removes it).
    #[arg(long)]
    pub keep: bool,
}

/// What happens at one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    Withdraw,
    Advertise,
    LinkDown,
    LinkUp,
    FrrRestart,
    Reload,
    Upgrade,
    KillRestart,
}

impl EventKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Withdraw => "spine withdraws",
            Self::Advertise => "spine advertises",
            Self::LinkDown => "link cut",
            Self::LinkUp => "link back",
            Self::FrrRestart => "FRR kill -9 + start",
            Self::Reload => "rocev2 reload",
            Self::Upgrade => "rocev2 upgrade",
            Self::KillRestart => "run kill -9 + start",
        }
    }
}

/// A kind of episode the schedule draws from (`--events`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Episode {
    /// A spine withdraws its routes, then advertises them again.
    Withdraw,
    /// A leaf-spine link is cut, then repaired.
    Link,
    /// A spine's FRR is killed (-9) and started again.
    Frr,
    /// `rocev2 reload` on a leaf or a spine.
    Reload,
    /// `rocev2 upgrade` on a leaf or a spine.
    Upgrade,
    /// `kill -9` of `rocev2 run` and a new run, on a leaf or a spine.
    Kill,
}

impl Episode {
    pub const ALL: [Episode; 6] = [Self::Withdraw, Self::Link, Self::Frr, Self::Reload, Self::Upgrade, Self::Kill];

    /// The event kinds it is made of.
    fn kinds(self) -> &'static [EventKind] {
        match self {
            Self::Withdraw => &[EventKind::Withdraw, EventKind::Advertise],
            Self::Link => &[EventKind::LinkDown, EventKind::LinkUp],
            Self::Frr => &[EventKind::FrrRestart],
            Self::Reload => &[EventKind::Reload],
            Self::Upgrade => &[EventKind::Upgrade],
            Self::Kill => &[EventKind::KillRestart],
        }
    }
}

/// One planned event.
#[derive(Clone, Debug)]
struct Planned {
    at: Duration,
    kind: EventKind,
    /// The switch it acts on (a link: its leaf end).
    switch: Switch,
    /// A link event's leaf port (`s1p1`).
    port: Option<String>,
}

impl Planned {
    fn target(&self) -> String {
        match &self.port {
            Some(p) => format!("{}/{p}", self.switch),
            None => self.switch.to_string(),
        }
    }
}

/// An event as it happened.
struct Done {
    planned: Planned,
    /// When it started (monotonic ns).
    at_ns: u64,
    /// What the action did, or why it failed.
    outcome: Result<Acted>,
    /// The lab's drop counters just before it.
    drops_before: DropCounts,
}

/// What an event's action did.
struct Acted {
    /// How long it took.
    took: Duration,
    note: String,
    /// A link cut: the instant the soak began to cut the cable (monotonic ns).
    cut_ns: Option<u64>,
}

/// What the soak read once the traffic was over.
struct Finish {
    t0: u64,
    /// When the traffic stopped (monotonic ns).
    t_end: u64,
    /// Every switch's kernel paths through the run ([`watch_paths`]).
    paths: Vec<Vec<PathState>>,
    seconds: f64,
    probe_events_lost: u64,
    /// The drop counters when the traffic started and when it was over.
    drops_at_start: DropCounts,
    drops_at_end: DropCounts,
}

/// One row of the per-event table.
#[derive(Clone, Debug, Serialize)]
pub struct EventRow {
    pub index: usize,
    /// Seconds after the traffic started.
    pub at_s: f64,
    /// `steady` for the time before the first event.
    pub kind: Option<EventKind>,
    pub target: String,
    /// Packets sent in this event's window that never arrived.
    pub lost: u64,
    /// Of them, those the kernel itself would have lost: as many as were
    /// sent while a switch's kernel had no route to their rack or routed
    /// them into a failed link (`sent_without_path`), or as many as the kernels and
    /// devices counted dropped in the window, whichever is more (up to
    /// `lost`).
    pub kernel_would_lose: u64,
    pub beyond_kernel: u64,
    /// Lost packets sent while a switch's kernel had no path to their
    /// rack (followed change by change).
    pub sent_without_path: u64,
    /// Frames the lab's drop counters counted in the window (any frames,
    /// not only the soak's).
    pub counted: u64,
    /// Lost beyond the kernel's share and more than `rocev2`'s own drop
    /// counters counted: lost without a cause (part of `beyond_kernel`).
    pub unexplained: u64,
    /// Late packets and duplicates that arrived in the window.
    pub reordered: u64,
    pub duplicated: u64,
    /// From the event to the last change of a switch's kernel paths, the
    /// action's end (a run ready, FRR up) or the last anomaly of the
    /// traffic, whichever is last.
    pub converged_ms: Option<u64>,
    /// How long, in the event's window, a switch's kernel had no path or a
    /// dead next hop.
    pub kernel_degraded_ms: u64,
    pub note: String,
}

/// One place and cause of drops, and how many it counted in the run.
#[derive(Clone, Debug, Serialize)]
pub struct CauseRow {
    pub place: String,
    pub cause: String,
    pub frames: u64,
}

/// One flow's loss.
#[derive(Clone, Debug, Serialize)]
pub struct FlowLoss {
    pub flow: String,
    pub sent: u64,
    pub lost: u64,
    pub first_psn: u32,
    pub last_psn: u32,
}

/// Everything a soak measured.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    pub seed: u64,
    pub seconds: f64,
    pub fabric: String,
    pub flows: usize,
    pub rate_per_flow: u64,
    pub sent: u64,
    pub arrived: u64,
    pub lost: u64,
    pub kernel_would_lose: u64,
    pub beyond_kernel: u64,
    /// Lost packets sent while a kernel had no path.
    pub sent_without_path: u64,
    /// Drops the lab's counters counted (any frames).
    pub counted: u64,
    /// Lost with no cause: neither the kernel's (no path, or counted by a
    /// kernel or device) nor counted by `rocev2`.
    pub unexplained: u64,
    /// The drop counters that grew during the run, by place and cause.
    pub drops: Vec<CauseRow>,
    pub reordered: u64,
    pub duplicated: u64,
    /// Frames the senders' own egress refused (ENOBUFS): never sent, not counted.
    pub not_sent: u64,
    /// Anomaly reports the probes' rings had no room for (then the per-event
    /// attribution is incomplete; the totals are not).
    pub probe_events_lost: u64,
    pub events: Vec<EventRow>,
    /// The flows that lost packets: how many, and the first and last PSN lost.
    pub flows_with_loss: Vec<FlowLoss>,
    pub kinds_exercised: Vec<EventKind>,
    /// The kinds `--events` asked for.
    pub kinds_expected: Vec<EventKind>,
    pub every_kind_exercised: bool,
    /// CPU hog: a busy loop beside the fabric for the whole run.
    pub cpu_hog: bool,
}

impl SoakReport {
    /// No loss beyond what the kernel would have lost, every event kind
    /// exercised, and the accounting complete.
    pub fn passed(&self) -> bool {
        self.beyond_kernel == 0
            && self.unexplained == 0
            && self.every_kind_exercised
            && self.probe_events_lost == 0
            && self.sent > 0
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "soak: seed {} (repeat with --seed {}), {:.0} s on {}, {} flows at {} pps each{}\n",
            self.seed,
            self.seed,
            self.seconds,
            self.fabric,
            self.flows,
            self.rate_per_flow,
            if self.cpu_hog { ", a busy loop beside it" } else { "" }
        );
        let mut table = Table::new(&[
            ("#", Align::Right),
            ("AT", Align::Right),
            ("EVENT", Align::Left),
            ("TARGET", Align::Left),
            ("LOST", Align::Right),
            ("KERNEL'S", Align::Right),
            ("COUNTED", Align::Right),
            ("REORDERED", Align::Right),
            ("DUPLICATED", Align::Right),
            ("CONVERGED", Align::Right),
            ("NO PATH", Align::Right),
        ]);
        for e in &self.events {
            table.row([
                e.index.to_string(),
                format!("{:.1}s", e.at_s),
                e.kind.map_or("steady", EventKind::name).to_string(),
                e.target.clone(),
                e.lost.to_string(),
                e.kernel_would_lose.to_string(),
                e.counted.to_string(),
                e.reordered.to_string(),
                e.duplicated.to_string(),
                e.converged_ms.map_or("-".into(), |m| format!("{m} ms")),
                if e.kernel_degraded_ms > 0 { format!("{} ms", e.kernel_degraded_ms) } else { "-".into() },
            ]);
        }
        out.push_str(&table.render());
        out.push_str(
            "\nLoss by cause (a frame can show under two causes; counters count any frame, not only the soak's):\n",
        );
        let mut causes = Table::new(&[("WHERE", Align::Left), ("CAUSE", Align::Left), ("FRAMES", Align::Right)]);
        causes.row(["hosts".to_string(), "sent".into(), self.sent.to_string()]);
        causes.row(["hosts".to_string(), "arrived (XDP probe on the receiving host)".into(), self.arrived.to_string()]);
        causes.row(["hosts".to_string(), "lost (never arrived)".into(), self.lost.to_string()]);
        causes.row([
            "routes".to_string(),
            "lost, sent while a kernel had no path to their rack".into(),
            self.sent_without_path.to_string(),
        ]);
        for d in &self.drops {
            causes.row([d.place.clone(), d.cause.clone(), d.frames.to_string()]);
        }
        causes.row([
            "-".to_string(),
            "unexplained (lost, no path missing, no counter)".into(),
            self.unexplained.to_string(),
        ]);
        out.push_str(&causes.render());
        let _ = writeln!(
            out,
            "\nsent {}, arrived {}, lost {}: {} the kernel itself would have lost (no path, or counted dropped by a kernel or device), {} beyond, of them {} without a cause; {} reordered, {} duplicated; {} not sent (the senders' own egress refused them)",
            self.sent,
            self.arrived,
            self.lost,
            self.kernel_would_lose,
            self.beyond_kernel,
            self.unexplained,
            self.reordered,
            self.duplicated,
            self.not_sent
        );
        if !self.flows_with_loss.is_empty() {
            out.push_str("flows that lost packets:\n");
        }
        for l in self.flows_with_loss.iter().take(12) {
            let _ = writeln!(out, "  {}: lost {} of {} (PSN {}..={})", l.flow, l.lost, l.sent, l.first_psn, l.last_psn);
        }
        if self.flows_with_loss.len() > 12 {
            let _ = writeln!(
                out,
                "  ... and {} more flows with loss (--json lists them all)",
                self.flows_with_loss.len() - 12
            );
        }
        let kinds: Vec<&str> = self.kinds_exercised.iter().map(|k| k.name()).collect();
        let _ = writeln!(
            out,
            "event kinds exercised: {} of {} ({})",
            self.kinds_exercised.len(),
            self.kinds_expected.len(),
            kinds.join(", ")
        );
        if self.probe_events_lost > 0 {
            let _ = writeln!(out, "warning: the probes' rings dropped {} anomaly reports", self.probe_events_lost);
        }
        let _ = writeln!(
            out,
            "{}",
            if self.passed() {
                "PASSED: no packet lost beyond those the kernel would have lost, and every loss counted where it happened"
            } else {
                "FAILED: see above"
            }
        );
        out
    }
}

/// A deterministic generator for the schedule (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        rocev2_common::rng::splitmix64(&mut self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// The schedule: rounds of the six kinds of episode in a seeded order (a
/// withdraw is followed by its advertise, a cut by its repair), one event
/// every `min_gap..max_gap` seconds, none in the first or last 5 s.
fn plan(args: &SoakArgs, f: &Fabric, seed: u64) -> Vec<Planned> {
    let mut rng = Rng(seed);
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let mut at = Duration::from_secs(5);
    let mut out = Vec::new();
    let mut process_events = 0u64;
    while at + Duration::from_secs(5) < total {
        let mut episodes: Vec<EventKind> = args.events.iter().map(|e| e.kinds()[0]).collect();
        rng.shuffle(&mut episodes);
        for kind in episodes {
            let spine = Switch::Spine(1 + rng.below(u64::from(f.spines)) as u32);
            let events: Vec<(EventKind, Switch, Option<String>)> = match kind {
                EventKind::Withdraw => vec![(EventKind::Withdraw, spine, None), (EventKind::Advertise, spine, None)],
                EventKind::LinkDown => {
                    let r = 1 + rng.below(u64::from(f.racks)) as u32;
                    let (j, k) = f.uplinks(r)[rng.below(f.uplinks(r).len() as u64) as usize];
                    let port = Some(Fabric::uplink_port(j, k));
                    vec![
                        (EventKind::LinkDown, Switch::Leaf(r), port.clone()),
                        (EventKind::LinkUp, Switch::Leaf(r), port),
                    ]
                }
                EventKind::FrrRestart => vec![(kind, spine, None)],
                _ => {
                    // Leaves and spines in turn.
                    process_events += 1;
                    let switch = if process_events % 2 == 1 {
                        Switch::Leaf(1 + rng.below(u64::from(f.racks)) as u32)
                    } else {
                        spine
                    };
                    vec![(kind, switch, None)]
                }
            };
            for (kind, switch, port) in events {
                if at + Duration::from_secs(5) >= total {
                    return out;
                }
                out.push(Planned { at, kind, switch, port });
                at += Duration::from_secs_f64(rng.between(args.min_gap, args.max_gap));
            }
        }
    }
    out
}

/// One sequence-checked stream: a QP from one rack's host to another's.
#[derive(Clone, Debug)]
struct FlowSpec {
    src_rack: u32,
    qp: u32,
    sport: u16,
    flow: Flow,
}

fn flows(f: &Fabric, qps: u32) -> Vec<FlowSpec> {
    let mut out = Vec::new();
    for src in 1..=f.racks {
        for dst in (1..=f.racks).filter(|d| *d != src) {
            for v6 in [false, true] {
                for q in 0..qps {
                    let n = out.len() as u32;
                    let (s, d) = if v6 {
                        (Fabric::host_v6(src, 1).into(), Fabric::host_v6(dst, 1).into())
                    } else {
                        (Fabric::host_v4(src, 1).into(), Fabric::host_v4(dst, 1).into())
                    };
                    let qp = 0x100 + n * 16 + q;
                    out.push(FlowSpec {
                        src_rack: src,
                        qp,
                        sport: 0xC000 | (n as u16 * 7 + q as u16) & 0x3FFF,
                        flow: Flow { src: s, dst: d, dest_qp: qp },
                    });
                }
            }
        }
    }
    out
}

/// The most a frame's send time may differ from the one [`send_time`]
/// gives it from the checkpoint before it: a frame sent earlier or later
/// (after a stall, or in the burst that catches up) is a checkpoint itself.
/// Above the sender's own jitter (it wakes every millisecond), so paced
/// frames need none.
const SLIP_NS: u64 = 2_000_000;

/// When PSN `p` was sent, from its flow's checkpoints (sorted by PSN): the
/// last checkpoint at or before it plus one pacing interval a frame, or
/// `t0` before the first. The senders keep a checkpoint wherever this
/// would be more than [`SLIP_NS`] off, so it is that close.
fn send_time(checkpoints: &[(u32, u64)], p: u32, rate: u64, t0: u64) -> u64 {
    match checkpoints.partition_point(|(q, _)| *q <= p) {
        0 => t0,
        k => {
            let (q0, t) = checkpoints[k - 1];
            let per = 1e9 / rate as f64;
            t + ((p - q0) as f64 * per) as u64
        }
    }
}

/// Records PSN `p`, sent at `now`, as a checkpoint when it is every
/// CHECKPOINT-th or [`send_time`] would put it more than [`SLIP_NS`] off.
fn checkpoint(checkpoints: &mut Vec<(u32, u64)>, p: u32, rate: u64, now: u64) {
    if p.is_multiple_of(CHECKPOINT) || send_time(checkpoints, p, rate, now).abs_diff(now) > SLIP_NS {
        checkpoints.push((p, now));
    }
}

/// What a sender recorded of each of its flows: PSN checkpoints (every
/// CHECKPOINT frames, and every frame sent more than [`SLIP_NS`] away from
/// the time [`send_time`] gives it: the PSN and when it was sent).
#[derive(Default)]
struct Sent {
    /// Per flow index: (psn, monotonic ns).
    checkpoints: Vec<Vec<(u32, u64)>>,
    /// Per flow index: frames sent (the next PSN).
    sent: Vec<u64>,
    not_sent: u64,
}

const CHECKPOINT: u32 = 8;
/// The most frames of one flow sent back to back after a stall (the rest
/// of the backlog is given up, not sent: no PSN is skipped for it).
const MAX_BURST: u64 = 8;

/// Sends the flows of one source host, paced, until `stop`.
fn sender(
    netns: &str,
    specs: Vec<(usize, FlowSpec)>,
    rate: u64,
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Sent>>,
) -> Result<thread::JoinHandle<Result<()>>> {
    spawn_in_netns(netns, move || {
        let socket = PacketSocket::open("eth0")?;
        let start = Instant::now();
        let mut psn = vec![0u64; specs.len()];
        let mut skipped = vec![0u64; specs.len()];
        let mut not_sent = 0u64;
        let mut checkpoints: Vec<Vec<(u32, u64)>> = vec![Vec::new(); specs.len()];
        while !stop.load(Ordering::Relaxed) {
            let due_total = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            for (i, (_, s)) in specs.iter().enumerate() {
                let mut due = due_total.saturating_sub(skipped[i]);
                if due > psn[i] + MAX_BURST {
                    skipped[i] += due - psn[i] - MAX_BURST;
                    due = psn[i] + MAX_BURST;
                }
                while psn[i] < due {
                    let p = psn[i] as u32 & rocev2_common::bth::PSN_MASK;
                    let frame = build_roce_frame(&RoceFrameSpec {
                        src_mac: Fabric::host_mac(s.src_rack, 1),
                        dst_mac: Fabric::leaf_host_mac(s.src_rack, 1),
                        vlan: None,
                        src_ip: s.flow.src,
                        dst_ip: s.flow.dst,
                        ttl: 64,
                        dscp: 26,
                        ecn: 2,
                        src_port: s.sport,
                        bth: Bth::new(opcode::WRITE_MIDDLE, s.qp, p),
                        payload_len: 256,
                    });
                    match socket.send(&frame) {
                        Ok(()) => {
                            checkpoint(&mut checkpoints[i], p, rate, monotonic_ns());
                            psn[i] += 1;
                        }
                        // The host's own egress refused it: not sent (the
                        // PSN goes to the next frame).
                        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                            not_sent += 1;
                            break;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            thread::sleep(Duration::from_millis(1));
        }
        let mut shared = sent.lock().expect("sender state");
        for (i, (index, _)) in specs.iter().enumerate() {
            shared.checkpoints[*index] = std::mem::take(&mut checkpoints[i]);
            shared.sent[*index] = psn[i];
        }
        shared.not_sent += not_sent;
        Ok(())
    })
}

/// A busy loop on one CPU for as long as the soak runs: a thread of the
/// soak's own process, so it ends with it on every path.
struct CpuHog {
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
}

impl CpuHog {
    fn start() -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::Builder::new()
            .name("soak-cpu-hog".into())
            .spawn(move || {
                let mut x = 0u64;
                while !flag.load(Ordering::Relaxed) {
                    for i in 0..10_000u64 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
                    }
                    std::hint::black_box(x);
                }
            })
            .context("cannot start the busy loop")?;
        Ok(Self { stop, handle: Some(handle) })
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Takes the soak's lab down when the soak ends, however it ends (unless
/// asked to keep it).
struct LabGuard(String, bool);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if !self.1 && lab::record_path(&self.0).exists() {
            if let Err(e) = lab::down(&self.0) {
                eprintln!("rocev2: warning: lab down {}: {e:#}", self.0);
            }
        }
    }
}

/// A switch's kernel paths to the racks, as far as the soak cares: for each
/// rack prefix, the devices its best route's next hops leave through and
/// whether each has carrier (`None`: no route, or one the kernel answers
/// itself, such as a blackhole).
type PathView = BTreeMap<Prefix, Option<BTreeSet<(String, bool)>>>;

/// The paths to `prefixes` in `fib`, read as the route mirror reads them.
fn path_view(fib: &Fib, prefixes: &[Prefix]) -> PathView {
    let view = |hops: &[Hop]| -> BTreeSet<(String, bool)> {
        hops.iter()
            .map(|h| {
                let link = fib.links.get(&h.oif);
                (link.map_or_else(|| format!("if{}", h.oif), |l| l.name.clone()), link.is_some_and(|l| l.up))
            })
            .collect()
    };
    prefixes
        .iter()
        .map(|p| {
            let devs = match fib.target(p) {
                Some(Target::Hops(hops)) => Some(view(&hops)),
                _ => None,
            };
            (*p, devs)
        })
        .collect()
}

/// The racks to which a switch's kernel forwards (partly) into nothing:
/// no route, or a next hop through a port without carrier (the kernel
/// keeps using such a next hop, `ignore_routes_with_linkdown` = 0, until
/// the routing daemon removes it).
fn no_path(view: &PathView) -> BTreeSet<Prefix> {
    view.iter()
        .filter(|(_, devs)| match devs {
            None => true,
            Some(d) => d.is_empty() || d.iter().any(|(_, carrier)| !carrier),
        })
        .map(|(p, _)| *p)
        .collect()
}

/// A switch's kernel paths from one change to the next.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PathState {
    /// When the soak read the change (monotonic ns).
    ns: u64,
    /// The racks it had no path to ([`no_path`]).
    no_path: BTreeSet<Prefix>,
    /// The change came with a port losing its carrier (a cut cable).
    carrier_lost: bool,
}

/// Follows one switch's kernel paths to `prefixes` until `stop`, change by
/// change: a netlink subscription applied to a [`Fib`] of its own (the
/// route mirror's reading of the kernel's table), a state whenever the
/// paths change. Returns the states, the first one as they were at the
/// start.
fn watch_paths(
    ns: &str,
    prefixes: Vec<Prefix>,
    stop: Arc<AtomicBool>,
) -> Result<thread::JoinHandle<Result<Vec<PathState>>>> {
    spawn_in_netns(ns, move || {
        // Subscribed before the dump, so no change between them is missed.
        let mut socket = WaitingEventSocket::open(Duration::from_millis(100))?;
        let mut fib = Fib::default();
        kernel::dump_all(&mut fib, RT_TABLE_MAIN)?;
        let mut view = path_view(&fib, &prefixes);
        let mut states = vec![PathState { ns: monotonic_ns(), no_path: no_path(&view), carrier_lost: false }];
        while !stop.load(Ordering::Relaxed) {
            let datagrams = match socket.receive() {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    kernel::dump_all(&mut fib, RT_TABLE_MAIN)?;
                    Vec::new()
                }
                Err(e) => return Err(e).context("cannot read the kernel's route events"),
            };
            let at = monotonic_ns();
            let mut carrier_lost = false;
            for datagram in &datagrams {
                for (message_type, message) in kernel::messages(datagram) {
                    if let Change::Link { ifindex, .. } = kernel::apply(&mut fib, RT_TABLE_MAIN, message_type, message)
                    {
                        carrier_lost |= !fib.links.get(&ifindex).is_some_and(|l| l.up);
                    }
                }
            }
            let now = path_view(&fib, &prefixes);
            if now != view {
                states.push(PathState { ns: at, no_path: no_path(&now), carrier_lost });
                view = now;
            }
        }
        Ok(states)
    })
}

/// For each rack prefix, the intervals in which some switch's kernel had
/// no path to it, from every switch's path states, up to `end`. A change
/// read with a carrier loss right after a cable cut (the first change
/// since the cut) starts at the cut (`cuts`): the kernel's paths died with
/// the carrier, not when the soak read the message.
fn no_path_intervals(paths: &[Vec<PathState>], cuts: &[u64], end: u64) -> BTreeMap<Prefix, Vec<(u64, u64)>> {
    let mut changes: Vec<(u64, usize, &BTreeSet<Prefix>)> = Vec::new();
    for (switch, states) in paths.iter().enumerate() {
        let mut previous = 0;
        for s in states {
            let mut at = s.ns;
            if s.carrier_lost && !s.no_path.is_empty() {
                if let Some(cut) = cuts.iter().copied().filter(|c| (previous..=s.ns).contains(c)).max() {
                    at = cut;
                }
            }
            changes.push((at, switch, &s.no_path));
            previous = s.ns;
        }
    }
    // A switch's back-dated change stays after its previous one (the cut
    // came after it), so a stable sort by time keeps each switch in order.
    changes.sort_by_key(|c| c.0);
    let prefixes: BTreeSet<Prefix> = changes.iter().flat_map(|c| c.2.iter().copied()).collect();
    let mut out = BTreeMap::new();
    for prefix in prefixes {
        let mut without: BTreeSet<usize> = BTreeSet::new();
        let mut intervals = Vec::new();
        let mut since = None;
        for &(at, switch, no_path) in changes.iter().take_while(|c| c.0 < end) {
            if no_path.contains(&prefix) {
                without.insert(switch);
            } else {
                without.remove(&switch);
            }
            match (since, without.is_empty()) {
                (None, false) => since = Some(at),
                (Some(from), true) => {
                    intervals.push((from, at));
                    since = None;
                }
                _ => {}
            }
        }
        if let Some(from) = since {
            intervals.push((from, end));
        }
        if !intervals.is_empty() {
            out.insert(prefix, intervals);
        }
    }
    out
}

/// The union of intervals: when any of them held.
fn union(intervals: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = intervals.into_iter().collect();
    all.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in all {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Counts "rocev2: ready" lines in a log: a run that became ready since.
fn ready_lines(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.trim() == crate::control::run::READY_LINE)
        .count()
}

/// Waits until the log has more than `before` ready lines.
fn wait_ready(log: &Path, before: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while ready_lines(log) <= before {
        if Instant::now() > deadline {
            bail!("no new `rocev2: ready` in {} within {timeout:?}", log.display());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Starts `rocev2` with `args` in its own process group, output appended
/// to `log`; returns its pid.
fn spawn_rocev2(args: &[&str], log: &Path) -> Result<u32> {
    let exe = std::env::current_exe().context("cannot find the rocev2 binary")?;
    let file = std::fs::OpenOptions::new().append(true).create(true).open(log)?;
    let mut cmd = Command::new(exe);
    cmd.args(args).stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().with_context(|| format!("cannot start rocev2 {}", args.join(" ")))?;
    Ok(child.id())
}

/// Carries out one event.
fn act(name: &str, f: &Fabric, e: &Planned) -> Result<Acted> {
    let started = Instant::now();
    let mut cut_ns = None;
    let mut record = LabRecord::read(name)?;
    let index = record.switches.iter().position(|s| s.switch == e.switch).context("no such switch")?;
    let sw = record.switches[index].clone();
    let frr_dir = record.frr_dirs.iter().find(|d| d.ends_with(format!("frr-{}", sw.netns))).cloned();
    let frr = || -> Result<Frr> {
        let dir = frr_dir.as_ref().with_context(|| format!("{} runs no FRR", sw.switch))?;
        Ok(Frr::running_in(&sw.netns, dir))
    };
    let note = match e.kind {
        EventKind::Withdraw | EventKind::Advertise => {
            let Switch::Spine(j) = e.switch else { bail!("{} is not a spine", e.switch) };
            let asn = SPINE_ASN + f.zone_of_spine(j) - 1;
            let no = if e.kind == EventKind::Advertise { "no " } else { "" };
            let mut cmds =
                vec!["configure terminal".to_string(), "route-map SOAK-WITHDRAW deny 10".into(), "exit".into()];
            cmds.push(format!("router bgp {asn}"));
            for (family, v6) in [("ipv4", false), ("ipv6", true)] {
                cmds.push(format!("address-family {family} unicast"));
                for r in f.racks_of_zone(f.zone_of_spine(j)) {
                    for k in 1..=f.links {
                        let peer = if v6 { Fabric::fabric_v6(r, j, k).0 } else { Fabric::fabric_v4(r, j, k).0 };
                        cmds.push(format!("{no}neighbor {peer} route-map SOAK-WITHDRAW out"));
                    }
                }
                cmds.push("exit-address-family".into());
            }
            cmds.push("end".into());
            cmds.push("clear bgp ipv4 unicast * soft out".into());
            cmds.push("clear bgp ipv6 unicast * soft out".into());
            let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
            frr()?.vtysh(&cmds)?;
            String::new()
        }
        EventKind::LinkDown | EventKind::LinkUp => {
            let port = e.port.as_deref().context("a link event names its port")?;
            let link = te::parse_link(f, &format!("{}/{port}", e.switch))?;
            if e.kind == EventKind::LinkDown {
                cut_ns = Some(monotonic_ns());
            }
            te::set_link(&record, &link, e.kind == EventKind::LinkUp)?;
            String::new()
        }
        EventKind::FrrRestart => {
            frr()?.restart_after(Duration::from_secs(1))?;
            "zebra and bgpd killed, started 1 s later".into()
        }
        EventKind::Reload => {
            let text = std::fs::read_to_string(&sw.config)?;
            let changed = if text.contains("neighbour_refresh_ms = 1000") {
                text.replace("neighbour_refresh_ms = 1000", "neighbour_refresh_ms = 900")
            } else {
                text.replace("neighbour_refresh_ms = 900", "neighbour_refresh_ms = 1000")
            };
            std::fs::write(&sw.config, changed)?;
            let exe = std::env::current_exe()?;
            let out = Command::new(exe).args(["reload", "--config"]).arg(&sw.config).output()?;
            if !out.status.success() {
                bail!("rocev2 reload on {}: {}", sw.switch, String::from_utf8_lossy(&out.stderr));
            }
            "neighbour_refresh_ms changed".into()
        }
        EventKind::Upgrade | EventKind::KillRestart => {
            let before = ready_lines(&sw.log);
            let pin = sw.pin_dir.display().to_string();
            let pid = if e.kind == EventKind::Upgrade {
                spawn_rocev2(&["upgrade", "--pin-dir", &pin], &sw.log)?
            } else {
                if let Some(old) = sw.pid {
                    let _ = signal_process(old, nix::sys::signal::Signal::SIGKILL);
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while crate::sys::process_alive(old) && Instant::now() < deadline {
                        thread::sleep(Duration::from_millis(10));
                    }
                }
                let config = sw.config.display().to_string();
                spawn_rocev2(&["--netns", &sw.netns, "run", "--config", &config], &sw.log)?
            };
            wait_ready(&sw.log, before, Duration::from_secs(90))?;
            record.switches[index].pid = Some(pid);
            record.write()?;
            format!("new run pid {pid}")
        }
    };
    Ok(Acted { took: started.elapsed(), note, cut_ns })
}

/// Runs a soak; the lab is built first and removed at the end.
pub fn run(args: &SoakArgs) -> Result<SoakReport> {
    if args.minutes.is_nan()
        || args.minutes <= 0.0
        || args.min_gap.is_nan()
        || args.min_gap <= 0.0
        || args.max_gap < args.min_gap
    {
        bail!("--minutes must be positive and 0 < --min-gap <= --max-gap");
    }
    if args.spines < 2 || args.racks < 2 {
        bail!("a soak needs at least 2 racks and 2 spines (a spine or link may be down at any time)");
    }
    let seed = args.seed.unwrap_or_else(|| monotonic_ns() ^ u64::from(std::process::id()) << 32);
    eprintln!("soak: seed {seed} (repeat with --seed {seed})");
    let up = LabUpArgs {
        name: args.name.clone(),
        hosts: 1,
        spines: args.spines,
        links_per_spine: 1,
        family: LabFamily::Both,
        hash: rocev2_common::hash::HashMode::Qp,
        hash_version: Default::default(),
        config_out: None,
        routing: LabRouting::Bgp,
        racks: Some(args.racks),
        seed: SeedPlan::Auto,
        unnumbered: false,
        zones: 1,
        aggs: None,
        links: lab::fabric::links::LinkArgs { wires: true, ..Default::default() },
        host_bridge: false,
        uplinks: 4,
        rdma: Default::default(),
        telemetry: false,
    };
    let built = lab::up(&up)?;
    let _lab = LabGuard(args.name.clone(), args.keep);
    eprintln!("{}", built.lines().next().unwrap_or_default());
    let record = LabRecord::read(&args.name)?;
    let f = record.fabric.clone().context("the soak's lab is not a fabric")?;
    let schedule = plan(args, &f, seed);
    let every_switch: Vec<Switch> = (1..=f.racks).map(Switch::Leaf).chain((1..=f.spines).map(Switch::Spine)).collect();
    let specs = flows(&f, args.qps);

    // Receivers first: every host's eth0 counts what lands.
    let mut probes = Vec::new();
    for r in 1..=f.racks {
        probes.push(ArrivalProbe::attach_dropping(&host_ns(&args.name, r, 1), "eth0")?);
    }
    let _hog = if args.no_hog { None } else { Some(CpuHog::start()?) };
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Sent {
        checkpoints: vec![Vec::new(); specs.len()],
        sent: vec![0; specs.len()],
        not_sent: 0,
    }));
    // Every switch's kernel paths, change by change, for the whole run.
    let mut watchers = Vec::new();
    for s in &every_switch {
        let own = match s {
            Switch::Leaf(r) => Some(*r),
            _ => None,
        };
        let prefixes = (1..=f.racks)
            .filter(|r| Some(*r) != own)
            .flat_map(|r| [Fabric::rack_prefix_v4(r), Fabric::rack_prefix_v6(r)])
            .map(|p| p.parse::<Prefix>().map_err(|e| anyhow::anyhow!("rack prefix {p}: {e}")))
            .collect::<Result<Vec<_>>>()?;
        watchers.push(watch_paths(&switch_ns(&args.name, *s), prefixes, stop.clone())?);
    }
    let drops_at_start = drop_counters::read(&record);
    let mut senders = Vec::new();
    for r in 1..=f.racks {
        let mine: Vec<(usize, FlowSpec)> =
            specs.iter().enumerate().filter(|(_, s)| s.src_rack == r).map(|(i, s)| (i, s.clone())).collect();
        senders.push(sender(&host_ns(&args.name, r, 1), mine, args.rate, stop.clone(), sent.clone())?);
    }
    let t0 = monotonic_ns();
    let started = Instant::now();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let mut seq_events: Vec<SeqEvent> = Vec::new();
    let mut done: Vec<Done> = Vec::new();
    let mut next = 0;
    let interrupted = crate::sys::signals::SigintGuard::install();
    while started.elapsed() < total && !crate::sys::signals::SigintGuard::interrupted() {
        for p in &mut probes {
            seq_events.extend(p.drain_events()?);
        }
        if let Some(e) = schedule.get(next).filter(|e| started.elapsed() >= e.at) {
            next += 1;
            let e = e.clone();
            let drops_before = drop_counters::read(&record);
            let at = monotonic_ns();
            eprintln!("soak: {:>6.1} s  {} {}", started.elapsed().as_secs_f64(), e.kind.name(), e.target());
            let (name, fabric, planned) = (args.name.clone(), f.clone(), e.clone());
            let action = thread::spawn(move || act(&name, &fabric, &planned));
            // Keep draining the probes while the action runs.
            while !action.is_finished() {
                for p in &mut probes {
                    seq_events.extend(p.drain_events()?);
                }
                thread::sleep(Duration::from_millis(50));
            }
            let result = action.join().map_err(|_| anyhow::anyhow!("an event's thread panicked"))?;
            if let Err(err) = &result {
                eprintln!("soak: the event failed: {err:#}");
            }
            done.push(Done { planned: e, at_ns: at, outcome: result, drops_before });
        }
        thread::sleep(Duration::from_millis(50));
    }
    drop(interrupted);
    stop.store(true, Ordering::Relaxed);
    let t_end = monotonic_ns();
    for s in senders {
        s.join().map_err(|_| anyhow::anyhow!("a sender panicked"))??;
    }
    let mut paths = Vec::new();
    for w in watchers {
        paths.push(w.join().map_err(|_| anyhow::anyhow!("a path watcher panicked"))??);
    }
    // In flight: let the last frames land, then read everything.
    thread::sleep(Duration::from_secs(2));
    for p in &mut probes {
        seq_events.extend(p.drain_events()?);
    }
    let seconds = started.elapsed().as_secs_f64();
    let sent = Arc::try_unwrap(sent).map_err(|_| anyhow::anyhow!("senders still hold their state"))?.into_inner()?;
    let mut flows_arrived = BTreeMap::new();
    let mut probe_events_lost = 0;
    for p in &probes {
        flows_arrived.extend(p.flows()?);
        probe_events_lost += p.totals()?.events_lost;
    }
    for d in &done {
        if let Err(err) = &d.outcome {
            bail!("event {} {} failed: {err:#}", d.planned.kind.name(), d.planned.target());
        }
    }
    let finish = Finish {
        t0,
        t_end,
        paths,
        seconds,
        probe_events_lost,
        drops_at_start,
        drops_at_end: drop_counters::read(&record),
    };
    Ok(account(args, seed, &f, &specs, &sent, &flows_arrived, &seq_events, &done, &finish))
}

/// From the senders' counts and checkpoints, the probes' per-flow state and
/// anomaly reports, the events and every switch's kernel paths: the report.
#[allow(clippy::too_many_arguments, reason = "everything the soak measured, in one place")]
fn account(
    args: &SoakArgs,
    seed: u64,
    f: &Fabric,
    specs: &[FlowSpec],
    sent: &Sent,
    arrived: &BTreeMap<Flow, rocev2_common::arrival::FlowArrival>,
    seq: &[SeqEvent],
    done: &[Done],
    finish: &Finish,
) -> SoakReport {
    let t0 = finish.t0;
    // Event windows: [start_i, start_{i+1}); row 0 is the steady time before the first.
    let starts: Vec<u64> = std::iter::once(t0).chain(done.iter().map(|d| d.at_ns)).collect();
    let ends: Vec<u64> = starts.iter().skip(1).copied().chain([finish.t_end]).collect();
    let window_of = |ns: u64| starts.iter().rposition(|s| *s <= ns).unwrap_or(0);
    let cuts: Vec<u64> = done.iter().filter_map(|d| d.outcome.as_ref().ok()?.cut_ns).collect();
    let no_path = no_path_intervals(&finish.paths, &cuts, finish.t_end);
    let degraded = union(no_path.values().flatten().copied());
    // A lost packet is the kernel's when it was sent while some switch's
    // kernel had no path to its destination's rack.
    let without_path = |flow: &Flow, ns: u64| {
        no_path.iter().any(|(p, spans)| p.contains(flow.dst) && spans.iter().any(|(a, b)| (*a..*b).contains(&ns)))
    };
    let mut rows: Vec<EventRow> = starts
        .iter()
        .enumerate()
        .map(|(i, s)| EventRow {
            index: i,
            at_s: s.saturating_sub(t0) as f64 / 1e9,
            kind: (i > 0).then(|| done[i - 1].planned.kind),
            target: if i == 0 { "-".into() } else { done[i - 1].planned.target() },
            lost: 0,
            kernel_would_lose: 0,
            beyond_kernel: 0,
            sent_without_path: 0,
            counted: 0,
            unexplained: 0,
            reordered: 0,
            duplicated: 0,
            converged_ms: None,
            kernel_degraded_ms: 0,
            note: if i == 0 {
                String::new()
            } else {
                done[i - 1].outcome.as_ref().map(|r| r.note.clone()).unwrap_or_default()
            },
        })
        .collect();
    // Lost PSNs per flow: gaps less late arrivals, and the tail that never came.
    let by_flow: BTreeMap<Flow, usize> = specs.iter().enumerate().map(|(i, s)| (s.flow, i)).collect();
    let mut missing: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); specs.len()];
    let mut last_anomaly = vec![0u64; rows.len()];
    for e in seq {
        let Some(&i) = by_flow.get(&e.flow) else { continue };
        let w = window_of(e.time_ns);
        last_anomaly[w] = last_anomaly[w].max(e.time_ns);
        match e.kind {
            SeqKind::Gap => {
                missing[i].extend(e.psn.wrapping_sub(e.count)..e.psn);
            }
            SeqKind::Late => {
                missing[i].remove(&e.psn);
                rows[w].reordered += 1;
            }
            SeqKind::Duplicate => rows[w].duplicated += 1,
        }
    }
    let mut total_arrived = 0;
    for (i, s) in specs.iter().enumerate() {
        let n = sent.sent[i] as u32;
        let a = arrived.get(&s.flow).copied().unwrap_or_default();
        total_arrived += a.packets - a.duplicates;
        // Frames after the last that arrived never opened a gap.
        let first_unseen = if a.started == 0 { 0 } else { a.next_psn };
        missing[i].extend(first_unseen..n);
        missing[i].retain(|p| *p < n);
    }
    // Each lost PSN at its send time.
    let mut flows_with_loss = Vec::new();
    for (i, lost) in missing.iter().enumerate() {
        if let (Some(first), Some(last)) = (lost.first(), lost.last()) {
            flows_with_loss.push(FlowLoss {
                flow: specs[i].flow.to_string(),
                sent: sent.sent[i],
                lost: lost.len() as u64,
                first_psn: *first,
                last_psn: *last,
            });
        }
        let cps = &sent.checkpoints[i];
        for &p in lost {
            let at = send_time(cps, p, args.rate, t0);
            let w = window_of(at);
            rows[w].lost += 1;
            if without_path(&specs[i].flow, at) {
                rows[w].sent_without_path += 1;
            }
        }
    }
    // What the counters counted in each window (between the readings at
    // its start and the next one's), and the loss they leave unexplained.
    let readings: Vec<&DropCounts> = std::iter::once(&finish.drops_at_start)
        .chain(done.iter().map(|d| &d.drops_before))
        .chain([&finish.drops_at_end])
        .collect();
    let mut by_cause = DropCounts::new();
    for (row, pair) in rows.iter_mut().zip(readings.windows(2)) {
        let grown = drop_counters::growth(pair[0], pair[1]);
        row.counted = grown.values().sum();
        let kernels: u64 = grown.iter().filter(|(k, _)| drop_counters::is_kernels(&k.cause)).map(|(_, n)| n).sum();
        let kernels_share = row.sent_without_path.max(kernels);
        row.kernel_would_lose = row.lost.min(kernels_share);
        row.beyond_kernel = row.lost - row.kernel_would_lose;
        row.unexplained = row.lost.saturating_sub(kernels_share + (row.counted - kernels));
        for (k, n) in grown {
            *by_cause.entry(k).or_default() += n;
        }
    }
    for (i, row) in rows.iter_mut().enumerate() {
        let (start, end) = (starts[i], ends[i]);
        row.kernel_degraded_ms =
            degraded.iter().map(|(a, b)| (*b).min(end).saturating_sub((*a).max(start))).sum::<u64>() / 1_000_000;
        let Some(d) = i.checked_sub(1).map(|k| &done[k]) else { continue };
        let action_end = d.outcome.as_ref().map(|r| r.took.as_nanos() as u64).unwrap_or(0);
        let last_route_change = finish
            .paths
            .iter()
            .flatten()
            .filter(|p| (start..end).contains(&p.ns))
            .map(|p| p.ns - start)
            .max()
            .unwrap_or(0);
        let anomaly = last_anomaly[i].saturating_sub(start);
        row.converged_ms = Some(action_end.max(last_route_change).max(anomaly) / 1_000_000);
    }
    let kinds: BTreeSet<EventKind> = done.iter().filter(|d| d.outcome.is_ok()).map(|d| d.planned.kind).collect();
    let expected: BTreeSet<EventKind> = args.events.iter().flat_map(|e| e.kinds()).copied().collect();
    let sum = |g: fn(&EventRow) -> u64| rows.iter().map(g).sum::<u64>();
    SoakReport {
        seed,
        seconds: finish.seconds,
        fabric: format!(
            "{} racks x 1 host, {} spines, BGP (FRR), every link through the wire namespace",
            f.racks, f.spines
        ),
        flows: specs.len(),
        rate_per_flow: args.rate,
        sent: sent.sent.iter().sum(),
        arrived: total_arrived,
        lost: sum(|r| r.lost),
        kernel_would_lose: sum(|r| r.kernel_would_lose),
        beyond_kernel: sum(|r| r.beyond_kernel),
        sent_without_path: sum(|r| r.sent_without_path),
        counted: sum(|r| r.counted),
        unexplained: sum(|r| r.unexplained),
        drops: by_cause.into_iter().map(|(k, frames)| CauseRow { place: k.place, cause: k.cause, frames }).collect(),
        reordered: sum(|r| r.reordered),
        duplicated: sum(|r| r.duplicated),
        not_sent: sent.not_sent,
        probe_events_lost: finish.probe_events_lost,
        every_kind_exercised: expected.is_subset(&kinds),
        kinds_expected: expected.into_iter().collect(),
        kinds_exercised: kinds.into_iter().collect(),
        events: rows,
        flows_with_loss,
        cpu_hog: !args.no_hog,
    }
}

/// `rocev2 lab soak`: runs, prints the per-event table (or JSON), and
/// fails unless it passed.
pub fn soak(args: &SoakArgs) -> Result<SoakReport> {
    let report = run(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    if !report.passed() {
        bail!(
            "the soak failed: {} packets lost beyond what the kernel would have lost ({} without any cause), {} of {} event kinds exercised{}",
            report.beyond_kernel,
            report.unexplained,
            report.kinds_exercised.len(),
            report.kinds_expected.len(),
            if report.probe_events_lost > 0 { ", the probes' reports incomplete" } else { "" }
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::fabric::SeedPlan;

    fn fabric() -> Fabric {
        Fabric {
            racks: 3,
            hosts: 1,
            spines: 2,
            links: 1,
            zones: 1,
            aggs: 0,
            v4: true,
            v6: true,
            hash: rocev2_common::hash::HashMode::Qp,
            hash_version: Default::default(),
            seeds: SeedPlan::Auto,
        }
    }

    fn args(minutes: f64) -> SoakArgs {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            soak: SoakArgs,
        }
        let mut args = Cli::parse_from(["soak"]).soak;
        args.minutes = minutes;
        args
    }

    #[test]
    fn two_minutes_plan_every_kind_of_event_and_pair_each_withdraw_and_cut_with_its_repair() {
        let f = fabric();
        for seed in 0..50 {
            let schedule = plan(&args(2.0), &f, seed);
            let kinds: BTreeSet<EventKind> = schedule.iter().map(|e| e.kind).collect();
            assert_eq!(kinds.len(), 8, "seed {seed}: {schedule:?}");
            assert!(schedule.iter().all(|e| e.at >= Duration::from_secs(5) && e.at < Duration::from_secs(115)));
            for pair in schedule.windows(2) {
                if matches!(pair[0].kind, EventKind::Withdraw | EventKind::LinkDown) {
                    assert_eq!(pair[1].target(), pair[0].target(), "seed {seed}: the repair follows on the same place");
                    assert!(matches!(pair[1].kind, EventKind::Advertise | EventKind::LinkUp));
                }
            }
        }
        assert_eq!(plan(&args(2.0), &f, 7).len(), plan(&args(2.0), &f, 7).len(), "a seed repeats its schedule");
    }

    #[test]
    fn every_frame_s_send_time_is_known_within_two_milliseconds_across_a_stall() {
        // 200 pps (5 ms a frame); the sender stalls 33 ms after PSN 16 and
        // then sends the 7 frames it owes back to back, 0.1 ms apart.
        let rate = 200;
        let mut sent_at = Vec::new();
        let mut t = 1_000_000_000u64;
        for p in 0..64u32 {
            t += match p {
                0 => 0,
                17 => 33_000_000,
                18..=23 => 100_000,
                24 => 5_000_000 - 600_000,
                _ => 5_000_000,
            };
            sent_at.push(t);
        }
        let mut cps = Vec::new();
        for (p, at) in sent_at.iter().enumerate() {
            checkpoint(&mut cps, p as u32, rate, *at);
        }
        for (p, at) in sent_at.iter().enumerate() {
            let estimate = send_time(&cps, p as u32, rate, 0);
            assert!(estimate.abs_diff(*at) <= SLIP_NS, "PSN {p}: sent at {at}, estimated {estimate}");
        }
        assert!(cps.len() < sent_at.len() / 2, "paced frames need no checkpoint of their own: {cps:?}");
    }

    #[test]
    fn lost_packets_are_the_kernels_only_while_its_routes_had_no_path() {
        let f = fabric();
        let mut a = args(1.0);
        a.rate = 1000;
        let specs = flows(&f, 1)[..1].to_vec();
        let flow = specs[0].flow;
        let ms = |m: u64| 1_000_000_000 + m * 1_000_000;
        // 1000 packets, one a millisecond from t0; checkpoints every 8.
        let sent = Sent {
            checkpoints: vec![(0..1000).step_by(CHECKPOINT as usize).map(|p| (p, ms(u64::from(p)))).collect()],
            sent: vec![1000],
            not_sent: 0,
        };
        // A withdraw at 300 ms; the kernel had no path from 400 to 450 ms.
        let withdraw =
            Planned { at: Duration::from_millis(300), kind: EventKind::Withdraw, switch: Switch::Spine(1), port: None };
        let done = vec![Done {
            planned: withdraw,
            at_ns: ms(300),
            outcome: Ok(Acted { took: Duration::from_millis(20), note: String::new(), cut_ns: None }),
            drops_before: DropCounts::new(),
        }];
        let seq = [
            // 410..420 lost while the kernel had no path.
            SeqEvent { flow, kind: SeqKind::Gap, psn: 420, count: 10, time_ns: ms(421) },
            // 595..600 skipped, 597 came late: 4 lost with a path.
            SeqEvent { flow, kind: SeqKind::Gap, psn: 600, count: 5, time_ns: ms(601) },
            SeqEvent { flow, kind: SeqKind::Late, psn: 597, count: 1, time_ns: ms(602) },
        ];
        // The last 5 never arrived (no gap opened for them).
        let arrival =
            rocev2_common::arrival::FlowArrival { packets: 981, next_psn: 995, started: 1, ..Default::default() };
        let arrived = BTreeMap::from([(flow, arrival)]);
        let cause = |place: &str, cause: &str| drop_counters::DropCause { place: place.into(), cause: cause.into() };
        // The destination's rack, and another.
        let (rack2, rack3): (Prefix, Prefix) = ("10.2.0.0/16".parse().unwrap(), "10.3.0.0/16".parse().unwrap());
        let state = |at: u64, no_path: &[Prefix]| PathState {
            ns: ms(at),
            no_path: no_path.iter().copied().collect(),
            carrier_lost: false,
        };
        let mut finish = Finish {
            t0: ms(0),
            t_end: ms(1000),
            paths: vec![
                vec![state(0, &[]), state(400, &[rack2]), state(450, &[])],
                // Another switch without a path to another rack: not these packets' loss.
                vec![state(0, &[]), state(590, &[rack3]), state(610, &[])],
            ],
            seconds: 1.0,
            probe_events_lost: 0,
            drops_at_start: DropCounts::new(),
            drops_at_end: DropCounts::new(),
        };
        let report = account(&a, 1, &f, &specs, &sent, &arrived, &seq, &done, &finish);
        assert_eq!((report.sent, report.arrived, report.lost), (1000, 981, 19));
        assert_eq!((report.kernel_would_lose, report.beyond_kernel, report.reordered), (10, 9, 1));
        assert_eq!((report.counted, report.unexplained), (0, 9), "no counter counted any");
        let row = &report.events[1];
        assert_eq!((row.lost, row.kernel_would_lose, row.kernel_degraded_ms), (19, 10, 70));
        assert_eq!(report.events[0].lost, 0, "nothing before the withdraw");
        assert_eq!(report.flows_with_loss[0].first_psn, 410);
        assert!(!report.passed(), "9 lost beyond the kernel");
        assert!(report.render().contains("FAILED"));

        // A kernel counted 12 dropped (more than the sampled 10: the
        // kernel's share), the dataplane 3 (rocev2's): 4 counted nowhere.
        finish.drops_at_end =
            DropCounts::from([(cause("s1", "kernel: no route"), 12), (cause("l1", "rocev2 drop_runt"), 3)]);
        let report = account(&a, 1, &f, &specs, &sent, &arrived, &seq, &done, &finish);
        assert_eq!((report.kernel_would_lose, report.beyond_kernel), (12, 7));
        assert_eq!((report.counted, report.unexplained), (15, 4), "19 - 12 - 3");
        assert_eq!(report.events[0].counted, 0, "counted after the withdraw began");
        let text = report.render();
        assert!(text.contains("kernel: no route"), "{text}");
        assert!(text.contains("rocev2 drop_runt"), "{text}");
    }

    fn link(name: &str, index: u8) -> crate::control::routing::fib::Link {
        crate::control::routing::fib::Link { name: name.into(), mac: Some([2, 0, 0, 0, 0, index]), up: true }
    }

    /// The soak's first 30-minute run charged the switch with up to 94
    /// packets of a cable cut: its 100 ms samples (slower under load) saw
    /// the dead next hop only a sample after the cut. Now the paths follow
    /// every kernel change, and a cut's carrier loss starts at the cut.
    #[test]
    fn a_cut_cable_kills_the_kernels_paths_at_the_cut_not_when_its_message_is_read() {
        use crate::control::routing::fib::{Hops, KernelRoute, Path, RouteKind};
        let prefix: Prefix = "10.2.0.0/16".parse().unwrap();
        let via = |oif: u32, gw: &str| Path { oif, gateway: Some(gw.parse().unwrap()), weight: 1, encap: false };
        let mut fib = Fib::default();
        fib.links.insert(1, link("s1p1", 1));
        fib.links.insert(2, link("s2p1", 2));
        let route = |paths| KernelRoute { prefix, metric: 20, kind: RouteKind::Unicast, hops: Hops::Paths(paths) };
        fib.add_route(route(vec![via(1, "10.0.1.2"), via(2, "10.0.2.2")]));
        let without = |fib: &Fib| no_path(&path_view(fib, &[prefix]));
        assert!(without(&fib).is_empty());
        fib.links.get_mut(&1).unwrap().up = false;
        assert_eq!(without(&fib), BTreeSet::from([prefix]), "the kernel keeps routing into the port without carrier");
        fib.add_route(route(vec![via(2, "10.0.2.2")]));
        assert!(without(&fib).is_empty(), "zebra took the dead next hop out");
        fib.remove_route(&route(vec![via(2, "10.0.2.2")]));
        assert_eq!(without(&fib), BTreeSet::from([prefix]), "no route");

        // Cut at 300 ms; the leaf's carrier loss read at 420 ms, zebra
        // fixes its route at 900 ms; the spine has no route 450..2000 ms.
        let ms = |m: u64| 1_000_000_000 + m * 1_000_000;
        let rack1: Prefix = "10.1.0.0/16".parse().unwrap();
        let state = |at: u64, no_path: &[Prefix], carrier_lost: bool| PathState {
            ns: ms(at),
            no_path: no_path.iter().copied().collect(),
            carrier_lost,
        };
        let leaf = vec![state(0, &[], false), state(420, &[prefix], true), state(900, &[], false)];
        let spine = vec![state(0, &[], false), state(450, &[rack1], false), state(2000, &[], false)];
        let both = [leaf.clone(), spine];
        let intervals = |spans: &[(u64, u64)]| spans.iter().map(|(a, b)| (ms(*a), ms(*b))).collect::<Vec<_>>();
        assert_eq!(
            no_path_intervals(&both, &[ms(300)], ms(5000)),
            BTreeMap::from([(prefix, intervals(&[(300, 900)])), (rack1, intervals(&[(450, 2000)]))])
        );
        assert_eq!(
            no_path_intervals(&both, &[], ms(5000))[&prefix],
            intervals(&[(420, 900)]),
            "no cut: from the message"
        );
        assert_eq!(
            union(no_path_intervals(&both, &[ms(300)], ms(5000)).into_values().flatten()),
            intervals(&[(300, 2000)]),
            "NO PATH: some switch without a path to some rack"
        );
        assert_eq!(
            no_path_intervals(&[leaf], &[ms(300)], ms(600))[&prefix],
            intervals(&[(300, 600)]),
            "still without a path when the traffic stopped"
        );
        let late = [vec![state(0, &[], false), state(100, &[rack1], false), state(420, &[prefix], true)]];
        assert_eq!(
            no_path_intervals(&late, &[ms(50)], ms(5000))[&prefix],
            intervals(&[(420, 5000)]),
            "a cut before the switch's previous change is not this carrier loss's"
        );
    }
}
