//! `rocev2 lab collective`: a collective ([`crate::tools::collective`])
//! run with real packets over a fabric with rated links.
//!
//! Every host runs an RC [`Endpoint`] (its NIC and the collective library
//! in one): it posts each message of its plan once the message's
//! dependency has arrived (ring AllReduce: the same chunk of the previous
//! step), sends go-back-N within its window under the chosen transport,
//! and checks everything it receives (ICRC, PSN order per QP). When every
//! rank has received all it expects and had all it sent acknowledged, the
//! run reports the completion time, the algorithm and bus bandwidth
//! (nccl-tests' formulas) against the ideal non-blocking fabric with the
//! same host links, per-step times, the busiest link's utilization, ECN
//! marks, drops, retransmissions and reordering, and accounts for every
//! frame: each one sent was received or dropped by a queue.

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    io::IsTerminal as _,
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Barrier,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use super::{host_ns, links, te};
use crate::{
    control::config::parse_size_arg,
    render::{Align, Table},
    sys::{netns::spawn_in_netns, signals::SigintGuard},
    testbed::lab::LabRecord,
    tools::collective::{self, qp_number, split_qp_number, Message, Op, Placement, Plan},
    tools::fabric::{flag, Fabric},
    tools::rc::{dcqcn::DcqcnParams, Endpoint, EndpointConfig, EndpointReport, Event, Transport},
};

/// Data socket send buffer: the NIC queue (a few dozen full frames).
const NIC_QUEUE_BYTES: usize = 64 << 10;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// Above this share of the machine's CPU time used by other processes
/// during a run, the report warns that the machine may have set the pace.
/// Every frame crosses the kernel's stack once per link, so a fabric with
/// every host at its link rate needs the CPUs to itself: the 4x4x4
/// scorecard's slices reached 88-97% of the ideal on an idle machine and
/// 68-83% while niced compilers used 20-36% of it (2026-11-29). Even a
/// niced program slows it: the forwarding is softirq work, which nice
/// does not put first.
pub const BUSY_ELSEWHERE: f64 = 0.05;

#[derive(clap::Args, Debug, Clone)]
pub struct LabCollectiveArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// The collective.
    #[arg(long, value_enum, default_value = "allreduce")]
    pub op: Op,
    /// Bytes per rank (nccl-tests' size): 64m, 4m, 512k.
    #[arg(long, value_parser = parse_size_arg, default_value = "4m")]
    pub size: u64,
    /// QPs per connection (1..=32).
    #[arg(long, default_value_t = 1)]
    pub qps: u32,
    /// Message (chunk) size: the unit of a WRITE, a dependency and a grant.
    #[arg(long, value_parser = parse_size_arg, default_value = "128k")]
    pub chunk: u64,
    /// How every host's RC endpoint reacts to congestion.
    #[arg(long, value_enum, default_value = "none")]
    pub transport: Transport,
    /// How ranks sit on the hosts (the ring follows rank order).
    #[arg(long, value_enum, default_value = "interleaved")]
    pub placement: Placement,
    /// Unacknowledged packets per connection, shared evenly by its QPs (64:
    /// about 70 KB in flight, several times what a lab path holds at its
    /// rate; the same for every --qps, as a collective library's buffer).
    #[arg(long, default_value_t = 64)]
    pub window: u32,
    /// --transport cts: bytes a receiver grants ahead (default: a chunk and an eighth).
    #[arg(long, value_parser = parse_size_arg)]
    pub cts_window: Option<u64>,
    /// Give up after this many seconds (default: 20 times the ideal time, at least 60).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Fail this link (both directions, named as `lab stats` names a
    /// direction: l1/s1p1) --fail-after seconds into the run; a fabric in
    /// TE mode recomputes its pins without it. The link comes back up at
    /// the end.
    #[arg(long, value_name = "LINK")]
    pub fail: Option<String>,
    /// With --fail: seconds into the run when the link fails.
    #[arg(long, default_value_t = 1.0, requires = "fail")]
    pub fail_after: f64,
    /// Run on a lab without rated links anyway (its times then say how fast
    /// this box forwards, not what the fabric does).
    #[arg(long)]
    pub allow_unrated: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl LabCollectiveArgs {
    /// The defaults of the command line, for library users and tests.
    pub fn new(name: &str, op: Op, size: u64) -> Self {
        Self {
            name: name.to_owned(),
            op,
            size,
            qps: 1,
            chunk: collective::DEFAULT_CHUNK,
            transport: Transport::None,
            placement: Placement::Interleaved,
            window: 64,
            cts_window: None,
            timeout: None,
            fail: None,
            fail_after: 1.0,
            allow_unrated: false,
            json: false,
        }
    }
}

/// When each step ended, over all ranks.
#[derive(Clone, Debug, Serialize)]
pub struct StepTime {
    pub step: usize,
    /// From the start to the last rank's last message of the step.
    pub end_secs: f64,
    /// Since the previous step's end.
    pub secs: f64,
}

/// The busiest link and how busy.
#[derive(Clone, Debug, Serialize)]
pub struct LinkUse {
    pub link: String,
    pub bytes: u64,
    /// Its bytes over what the link carries at its rate in the completion time.
    pub utilization: f64,
}

/// A link failed during the run, and what the fabric did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FailureReport {
    pub link: String,
    pub at_secs: f64,
    /// TE mode: the controller's recomputation and the pins' installation.
    pub te_compute_ms: Option<f64>,
    pub te_install_ms: Option<f64>,
    /// Frames sent that neither arrived nor were dropped by a queue.
    pub lost_frames: u64,
    /// Of those, what the link's own counters show: frames its ports
    /// handed to it that it never passed on (in its queues or rings when
    /// it was cut), and frames its ports refused while it was down (XDP
    /// redirects and the kernel's sends before the switches moved off it).
    /// Both directions; a switch's own frames (ARP) count too.
    pub in_link_frames: u64,
    pub refused_frames: u64,
    /// Frames a switch at either end passed to its kernel meanwhile, which
    /// dropped them as unreachable (its ICMP unreachables, sent or
    /// rate-limited).
    pub kernel_frames: u64,
}

impl FailureReport {
    /// The frames the link's and the switches' counters explain.
    pub fn explained(&self) -> u64 {
        self.in_link_frames + self.refused_frames + self.kernel_frames
    }
}

/// Everything `lab collective` measured.
#[derive(Clone, Debug, Serialize)]
pub struct CollectiveReport {
    pub op: Op,
    pub size: u64,
    pub ranks: usize,
    pub hosts: Vec<String>,
    pub qps: u32,
    pub chunk: u64,
    pub transport: Transport,
    pub placement: Placement,
    /// How the switches spread traffic (`qp`, `five-tuple`, `te`, ...).
    pub balance: String,
    pub link_rate_bps: Option<u64>,
    pub complete: bool,
    pub seconds: f64,
    /// Bytes per second.
    pub algbw: f64,
    pub busbw: f64,
    /// On an ideal non-blocking fabric with the same host links (None without rated links).
    pub ideal_busbw: Option<f64>,
    pub ideal_seconds: Option<f64>,
    pub share_of_ideal: Option<f64>,
    pub steps: Vec<StepTime>,
    /// Data packets of the plan, data frames sent (retransmissions included).
    pub planned_packets: u64,
    pub data_frames: u64,
    pub control_frames: u64,
    pub retransmitted: u64,
    pub sequence_naks: u64,
    pub timeouts: u64,
    /// Frames received, with a bad ICRC, late (below a PSN seen) from the
    /// network's reordering, duplicates (go-back-N's resends of what had arrived).
    pub received_frames: u64,
    pub bad_icrc: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub ecn_marked: u64,
    pub cnps: u64,
    pub rate_cuts: u64,
    pub cts_sent: u64,
    pub drops: u64,
    /// Every frame sent was received or dropped by a queue (with a
    /// failure: or lost in the cut link or refused by its ports, as its
    /// counters show).
    pub accounted: bool,
    pub failure: Option<FailureReport>,
    /// Why the numbers may mean less than they seem (unrated links, a box near its limit).
    pub warnings: Vec<String>,
    /// The share of this machine's CPU time that processes other than
    /// this run and the lab's dataplanes used while it ran (0 to 1; see
    /// [`BUSY_ELSEWHERE`]).
    pub busy_elsewhere: f64,
    pub worst_link: Option<LinkUse>,
    /// Per host: what its endpoint counted.
    pub endpoints: Vec<EndpointReport>,
}

/// What the ranks share while they run.
struct Shared {
    plan: Plan,
    v6: bool,
    transport: Transport,
    window: u32,
    cts_window: u64,
    ack_timeout: Duration,
    dcqcn: Option<DcqcnParams>,
    /// Every endpoint opened: the run starts at once for all.
    ready: Barrier,
    start: std::sync::Mutex<Option<Instant>>,
    delivered_bytes: AtomicU64,
    finished: AtomicUsize,
    stop: AtomicBool,
    deadline: Duration,
    /// How long ranks keep answering after the last one finished, then only listen.
    drain: Duration,
}

/// One rank's outcome.
struct RankResult {
    endpoint: EndpointReport,
    /// When its endpoint started (to put its times on one clock with the others').
    started: Instant,
    /// Per step: when its last incoming message of the step arrived.
    step_ends: Vec<Option<Instant>>,
    finished: Option<Instant>,
}

/// `rocev2 lab collective`: runs it and prints the report.
pub fn collective(args: &LabCollectiveArgs) -> Result<CollectiveReport> {
    let report = run(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for w in &report.warnings {
            eprintln!("rocev2: {w}");
        }
        print!("{}", render(&report));
    }
    Ok(report)
}

/// Runs the collective `args` describe (with a progress line on a
/// terminal) and returns what it measured.
pub fn run(args: &LabCollectiveArgs) -> Result<CollectiveReport> {
    let record = LabRecord::read(&args.name)?;
    let Some(fabric) = record.fabric.clone() else {
        bail!("lab {:?} is a single-rack lab; `lab collective` needs a fabric (`lab up --racks N`)", args.name);
    };
    let rated = record.rated.clone();
    let mut warnings = Vec::new();
    match &rated {
        None if !args.allow_unrated => bail!(
            "lab {:?} has no rated links: every link is as fast as the CPU and nothing queues, so a completion time would say how fast this box forwards, not what the fabric does; bring the lab up with --link-rate (e.g. `rocev2 lab up --racks {} --link-rate 20mbit`), or pass --allow-unrated",
            args.name,
            fabric.racks
        ),
        None => warnings.push("warning: the links are not rated: times say how fast this box forwards".to_string()),
        Some(_) => {}
    }
    if args.transport == Transport::Dcqcn && rated.is_none() {
        bail!("--transport dcqcn needs rated links: DCQCN's line rate is the link rate");
    }
    if args.window == 0 {
        bail!("--window must be at least 1");
    }
    let fail = match &args.fail {
        Some(text) => {
            if !(args.fail_after.is_finite() && args.fail_after >= 0.0) {
                bail!("--fail-after must be a number of seconds, not {}", args.fail_after);
            }
            Some(te::parse_link(&fabric, text)?)
        }
        None => None,
    };
    let ranks = collective::place(fabric.racks, fabric.hosts, args.placement);
    let plan = Plan::new(args.op, args.size, ranks, args.qps, args.chunk).map_err(anyhow::Error::msg)?;
    let v6 = !fabric.v4;
    let rate = rated.as_ref().map(|r| r.settings.rate_bps);
    if let (Some(r), Some(fps)) = (&rated, rated.as_ref().and_then(|r| r.measured_path_fps)) {
        let needed = links::needed_fps(&r.settings, plan.n() as u32);
        if needed > fps / 2.0 {
            warnings.push(format!(
                "warning: {} hosts at {} need {needed:.0} frames/s, more than half of the {fps:.0} one path carried when the lab came up: a busy machine may be what limits this run",
                plan.n(),
                links::rate_text(r.settings.rate_bps)
            ));
        }
    }
    let ideal = rate.map(|r| plan.ideal_seconds(r, v6));
    let deadline =
        Duration::from_secs_f64(args.timeout.unwrap_or_else(|| ideal.map_or(60.0, |i| (20.0 * i).max(60.0))));
    let frame =
        collective::MTU_PAYLOAD + if v6 { collective::FRAME_OVERHEAD_V6 } else { collective::FRAME_OVERHEAD_V4 };
    // The longest a frame can wait in the queues of its path: what their
    // buffers hold, and never more than every host's window in flight.
    let path_delay = rated.as_ref().map_or(Duration::from_millis(10), |r| {
        let s = r.settings;
        let buffers = 2 * s.leaf_buffer + s.spine_buffer * if fabric.aggs > 0 { 3 } else { 1 };
        let in_flight = plan.n() as u64 * u64::from(args.window) * frame;
        Duration::from_secs_f64(buffers.min(in_flight) as f64 * 8.0 / s.rate_bps as f64)
    });
    let shared = Arc::new(Shared {
        v6,
        transport: args.transport,
        window: args.window.div_ceil(args.qps.max(1)),
        cts_window: args.cts_window.unwrap_or(args.chunk + args.chunk / 8),
        // Go-back-N's timer: twice the worst queueing a path can see.
        ack_timeout: (path_delay * 2).max(Duration::from_millis(50)),
        dcqcn: rate.map(|r| DcqcnParams::for_link(r, frame)),
        ready: Barrier::new(plan.n() + 1),
        start: std::sync::Mutex::new(None),
        delivered_bytes: AtomicU64::new(0),
        finished: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        deadline,
        drain: (path_delay * 2).clamp(Duration::from_millis(100), Duration::from_secs(2)),
        plan,
    });
    let before = match &rated {
        Some(r) => Some(links::queue_stats(r, &record.switches)?),
        None => None,
    };
    let link_before = match &fail {
        Some(link) => Some(te::link_counters(&record, link)?),
        None => None,
    };
    let _sigint = SigintGuard::install();
    // The lab's own processes: this one and the switches' dataplanes.
    let ours: Vec<u32> =
        std::iter::once(std::process::id()).chain(record.switches.iter().filter_map(|s| s.pid)).collect();
    let cpu_before = crate::sys::cpu::CpuSnapshot::take().context("reading /proc for the machine's CPU time")?;
    let mut handles = Vec::new();
    for rank in 0..shared.plan.n() {
        let (r, i) = shared.plan.ranks[rank];
        let s = shared.clone();
        handles.push(spawn_in_netns(&host_ns(&record.name, r, i), move || run_rank(rank, &s))?);
    }
    // Every endpoint is open: go.
    shared.ready.wait();
    let start = Instant::now();
    *shared.start.lock().unwrap_or_else(|e| e.into_inner()) = Some(start);
    let total: u64 = shared.plan.steps.iter().flat_map(|s| &s.transfers).map(|t| t.bytes).sum();
    let tty = std::io::stderr().is_terminal() && !args.json;
    let mut last_line = Instant::now();
    let mut failure: Option<FailureReport> = None;
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        if let Some(link) = fail.as_ref().filter(|_| failure.is_none()) {
            if start.elapsed().as_secs_f64() >= args.fail_after {
                failure = Some(fail_link(&record, &shared.plan, link, start)?);
            }
        }
        if SigintGuard::interrupted() {
            shared.stop.store(true, Ordering::Relaxed);
        }
        if tty && last_line.elapsed() >= PROGRESS_EVERY {
            last_line = Instant::now();
            let got = shared.delivered_bytes.load(Ordering::Relaxed);
            eprint!(
                "\r{} {} over {} hosts, {} QPs, transport {}: {:.0}% ({:.1} of {:.1} MiB delivered), {} of {} ranks done, {:.1} s   ",
                args.op.name(),
                links::size_text(args.size),
                shared.plan.n(),
                args.qps,
                args.transport.name(),
                100.0 * got as f64 / total.max(1) as f64,
                got as f64 / 1048576.0,
                total as f64 / 1048576.0,
                shared.finished.load(Ordering::Relaxed),
                shared.plan.n(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    if tty {
        eprintln!();
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(h.join().map_err(|_| anyhow::anyhow!("a rank's thread panicked"))??);
    }
    let busy_elsewhere = crate::sys::cpu::CpuSnapshot::take()
        .context("reading /proc for the machine's CPU time")?
        .others_share(&cpu_before, &ours);
    if busy_elsewhere > BUSY_ELSEWHERE {
        warnings.push(format!(
            "warning: other processes used {:.0}% of this machine's CPU time during the run: every frame crosses the kernel once per link, so a fabric at its link rate needs the CPUs to itself, and modes that keep every host at its rate (slice, te) slow down first",
            busy_elsewhere * 100.0
        ));
    }
    let link_after = match &fail {
        Some(link) => Some(te::link_counters(&record, link)?),
        None => None,
    };
    if let Some(link) = &fail {
        te::set_link(&record, link, true)?;
    }
    let after = match &rated {
        Some(r) => Some(links::queue_stats(r, &record.switches)?),
        None => None,
    };
    let balance = LabRecord::read(&args.name)?.balance.map_or_else(|| fabric.hash.name().to_owned(), |b| b.label());
    let observed = Observed { balance, rate, ideal, start, before, after };
    let mut report = summarize(&shared, args, &observed, results);
    if let Some(mut f) = failure {
        let sent = report.data_frames + report.control_frames;
        f.lost_frames = sent.saturating_sub(report.received_frames + report.drops);
        if let (Some(b), Some(a)) = (&link_before, &link_after) {
            for (b, a) in b.iter().zip(a) {
                // What the queue of this direction dropped is in `drops` already.
                let queue_drops = match (&observed.before, &observed.after) {
                    (Some(qb), Some(qa)) => qa
                        .iter()
                        .zip(qb)
                        .find(|(q, _)| q.link == a.direction)
                        .map_or(0, |(qa, qb)| qa.drops.saturating_sub(qb.drops)),
                    _ => 0,
                };
                if let (Some(wb), Some(wa)) = (b.wire_tx, a.wire_tx) {
                    let handed = a.port_tx.saturating_sub(b.port_tx);
                    f.in_link_frames += handed.saturating_sub(wa.saturating_sub(wb) + queue_drops);
                }
                f.refused_frames += a.port_tx_dropped.saturating_sub(b.port_tx_dropped);
                f.kernel_frames += a.kernel_unreachable.saturating_sub(b.kernel_unreachable);
            }
        }
        // Accounted only if the counters explain every frame lost. They
        // may explain a few more: the switches' own frames (ARP, ICMP)
        // cross the same ports and are not in `sent`.
        report.accounted = report.accounted
            || (observed.after.is_some() && sent <= report.received_frames + report.drops + f.explained());
        report.failure = Some(f);
    }
    report.warnings = warnings;
    report.busy_elsewhere = busy_elsewhere;
    Ok(report)
}

/// Takes `link` down; a fabric in TE mode recomputes and installs its
/// pins without it, as its controller would.
fn fail_link(
    record: &LabRecord,
    plan: &Plan,
    link: &crate::tools::fabric::LinkId,
    start: Instant,
) -> Result<FailureReport> {
    let at_secs = start.elapsed().as_secs_f64();
    te::set_link(record, link, false)?;
    // What was lost is counted after the run, from the link's counters.
    let mut report = FailureReport { link: link.to_string(), at_secs, ..Default::default() };
    let mut current = LabRecord::read(&record.name)?;
    if matches!(current.balance, Some(super::balance::Balance::Te { .. })) {
        let o = te::engineer(&mut current, plan, std::slice::from_ref(link))?;
        report.te_compute_ms = Some(o.compute_ms);
        report.te_install_ms = Some(o.install_ms);
    }
    Ok(report)
}

/// One rank: opens its endpoint, then posts, sends, receives until every
/// rank is done.
fn run_rank(rank: usize, s: &Shared) -> Result<RankResult> {
    let plan = &s.plan;
    let (r, i) = plan.ranks[rank];
    let ip = |k: usize| Fabric::host_addr(plan.ranks[k].0, plan.ranks[k].1, s.v6);
    // The host's RoCE endpoint: with nothing on UDP 4791 the kernel would
    // answer every frame with an ICMP port unreachable.
    let _udp = std::net::UdpSocket::bind("[::]:4791").context("binding UDP port 4791")?;
    let opened = Endpoint::open(EndpointConfig {
        dev: "eth0".into(),
        local_ip: ip(rank),
        mac: Fabric::host_mac(r, i),
        next_hop_mac: Fabric::leaf_host_mac(r, i),
        transport: s.transport,
        window: s.window,
        ack_timeout: s.ack_timeout,
        ack_every: 8,
        mtu: collective::MTU_PAYLOAD as u32,
        first_psn: 0,
        dcqcn: s.dcqcn,
        cts_window: s.cts_window,
        nic_queue_bytes: NIC_QUEUE_BYTES,
        data_dscp: links::DATA_DSCP,
        data_ecn: 2,
    });
    // Release the others even when this rank cannot run.
    s.ready.wait();
    let mut ep = opened?;
    // Outgoing: per (peer, QP) the messages in PSN order, not yet posted.
    let mut outgoing: Vec<(usize, u32, std::collections::VecDeque<Message>)> = Vec::new();
    // Incoming: per (source rank, QP) the messages in arrival order, and how many came.
    let mut incoming: HashMap<(usize, u32), (Vec<Message>, usize)> = HashMap::new();
    let mut expected = 0usize;
    for (src, dst) in plan.connections() {
        for q in 0..plan.qps {
            if src == rank {
                ep.add_qp(ip(dst), qp_number(src, dst, q), collective::qp_source_port(qp_number(src, dst, q)));
                outgoing.push((dst, q, plan.qp_sequence(src, dst, q).into()));
            }
            if dst == rank {
                let seq = plan.qp_sequence(src, dst, q);
                expected += seq.len();
                incoming.insert((src, q), (seq, 0));
            }
        }
    }
    let rank_of: HashMap<IpAddr, usize> = (0..plan.n()).map(|k| (ip(k), k)).collect();
    let mut arrived: HashSet<(usize, usize, usize)> = HashSet::new();
    let mut step_left: Vec<usize> = vec![0; plan.steps.len()];
    for (seq, _) in incoming.values() {
        for m in seq {
            step_left[m.step] += 1;
        }
    }
    let mut step_ends: Vec<Option<Instant>> = vec![None; plan.steps.len()];
    let mut got = 0usize;
    let mut finished: Option<Instant> = None;
    let mut all_done_at: Option<Instant> = None;
    loop {
        // Post every message whose dependency has arrived, in each QP's order.
        for (dst, q, pending) in outgoing.iter_mut() {
            while let Some(m) = pending.front() {
                if let Some((from, dep)) = plan.depends_on(rank, m) {
                    if !arrived.contains(&(from, dep.step, dep.index)) {
                        break;
                    }
                }
                let m = pending.pop_front().expect("peeked");
                ep.post(ip(*dst), qp_number(rank, *dst, *q), m.bytes)?;
            }
        }
        let listening = all_done_at.is_some_and(|t| t.elapsed() >= s.drain / 2);
        for e in ep.poll(Duration::from_millis(2))? {
            let Event::Delivered(d) = e else { continue };
            let Some(&src) = rank_of.get(&d.src) else { continue };
            let (_, _, q) = split_qp_number(d.dest_qp);
            let Some((seq, count)) = incoming.get_mut(&(src, q)) else { continue };
            let Some(m) = seq.get(*count).copied() else { continue };
            *count += 1;
            got += 1;
            arrived.insert((src, m.step, m.index));
            s.delivered_bytes.fetch_add(m.bytes, Ordering::Relaxed);
            step_left[m.step] -= 1;
            if step_left[m.step] == 0 {
                step_ends[m.step] = Some(Instant::now());
            }
        }
        if listening {
            ep.stop_answering();
        }
        if finished.is_none() && got == expected && outgoing.iter().all(|o| o.2.is_empty()) && ep.sent_everything() {
            finished = Some(Instant::now());
            s.finished.fetch_add(1, Ordering::Relaxed);
        }
        if all_done_at.is_none() && s.finished.load(Ordering::Relaxed) == plan.n() {
            all_done_at = Some(Instant::now());
        }
        if all_done_at.is_some_and(|t| t.elapsed() >= s.drain) || s.stop.load(Ordering::Relaxed) {
            break;
        }
        let started = s.start.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(Instant::now);
        if started.elapsed() > s.deadline {
            s.stop.store(true, Ordering::Relaxed);
            break;
        }
    }
    let started = ep.started();
    Ok(RankResult { endpoint: ep.finish(), started, step_ends, finished })
}

/// What the run observed around the ranks: the mode, the link rate and
/// ideal time, when it started, every queue before and after.
struct Observed {
    balance: String,
    rate: Option<u64>,
    ideal: Option<f64>,
    start: Instant,
    before: Option<Vec<links::QueueStats>>,
    after: Option<Vec<links::QueueStats>>,
}

fn summarize(s: &Shared, args: &LabCollectiveArgs, o: &Observed, results: Vec<RankResult>) -> CollectiveReport {
    let plan = &s.plan;
    let (rate, ideal, start, before, after) = (o.rate, o.ideal, o.start, &o.before, &o.after);
    let complete = results.iter().all(|r| r.finished.is_some());
    // The collective ends when the last rank has all it expects.
    let end = results.iter().flat_map(|r| r.step_ends.iter().flatten()).max().copied().unwrap_or(start);
    let seconds = end.duration_since(start).as_secs_f64().max(1e-9);
    let mut steps = Vec::new();
    let mut prev = 0.0;
    for step in 0..plan.steps.len() {
        let e = results.iter().filter_map(|r| r.step_ends[step]).max();
        let end_secs = e.map_or(f64::NAN, |e| e.duration_since(start).as_secs_f64());
        steps.push(StepTime { step, end_secs, secs: end_secs - prev });
        prev = end_secs;
    }
    // Late packets the network reordered: those no go-back-N resend of
    // their PSN had sent before they arrived.
    /// Per (sender, QP): the PSN ranges it sent again, and when.
    type Resends = HashMap<(IpAddr, u32), Vec<(u32, u32, Instant)>>;
    let mut resends = Resends::new();
    for r in &results {
        for q in &r.endpoint.requesters {
            for x in &q.retransmissions {
                let src = source_of(plan, q.dest_qp, s.v6);
                resends.entry((src, q.dest_qp)).or_default().push((x.from_psn, x.to_psn, r.started + x.at));
            }
        }
    }
    let mut reordered = 0u64;
    for r in &results {
        for &(src, qp, psn, at) in &r.endpoint.late {
            let arrived = r.started + at;
            let resent = resends
                .get(&(src, qp))
                .is_some_and(|v| v.iter().any(|&(a, b, t)| t <= arrived && a <= psn && psn <= b));
            reordered += u64::from(!resent);
        }
    }
    let sum = |f: &dyn Fn(&EndpointReport) -> u64| results.iter().map(|r| f(&r.endpoint)).sum::<u64>();
    let data_frames = sum(&|e| e.data_frames);
    let control_frames = sum(&|e| e.control_frames);
    let received_frames = sum(&|e| e.received.packets);
    let delta = |f: &dyn Fn(&links::QueueStats) -> u64| match (before, after) {
        (Some(b), Some(a)) => a.iter().zip(b).map(|(a, b)| f(a).saturating_sub(f(b))).sum::<u64>(),
        _ => 0,
    };
    let drops = delta(&|q| q.drops);
    let worst_link = match (before, after, rate) {
        (Some(b), Some(a), Some(rate)) => a
            .iter()
            .zip(b)
            .map(|(a, b)| {
                let bytes = a.bytes.saturating_sub(b.bytes);
                LinkUse { link: a.link.clone(), bytes, utilization: bytes as f64 * 8.0 / (rate as f64 * seconds) }
            })
            .max_by(|x, y| x.utilization.total_cmp(&y.utilization)),
        _ => None,
    };
    let algbw = plan.algbw(seconds);
    let busbw = plan.busbw(seconds);
    let ideal_busbw = rate.map(|r| plan.ideal_busbw(r, s.v6));
    CollectiveReport {
        op: plan.op,
        size: plan.size,
        ranks: plan.n(),
        hosts: plan.ranks.iter().map(|(r, i)| format!("r{r}h{i}")).collect(),
        qps: plan.qps,
        chunk: plan.chunk,
        transport: args.transport,
        placement: args.placement,
        balance: o.balance.clone(),
        link_rate_bps: rate,
        complete,
        seconds,
        algbw,
        busbw,
        ideal_busbw,
        ideal_seconds: ideal,
        share_of_ideal: ideal_busbw.map(|i| busbw / i),
        steps,
        planned_packets: plan.packets(),
        data_frames,
        control_frames,
        retransmitted: results.iter().flat_map(|r| &r.endpoint.requesters).map(|q| q.retransmitted).sum(),
        sequence_naks: results.iter().flat_map(|r| &r.endpoint.requesters).map(|q| q.sequence_naks).sum(),
        timeouts: results.iter().flat_map(|r| &r.endpoint.requesters).map(|q| q.timeouts).sum(),
        received_frames,
        bad_icrc: sum(&|e| e.received.bad_icrc),
        reordered,
        duplicates: results.iter().flat_map(|r| &r.endpoint.responders).map(|q| q.duplicates).sum(),
        ecn_marked: delta(&|q| q.ecn_marked),
        cnps: results.iter().flat_map(|r| &r.endpoint.responders).map(|q| q.cnps_sent).sum(),
        rate_cuts: results.iter().flat_map(|r| &r.endpoint.requesters).map(|q| q.rate_cuts).sum(),
        cts_sent: sum(&|e| e.cts_sent),
        drops,
        accounted: after.is_none() || data_frames + control_frames == received_frames + drops,
        failure: None,
        warnings: Vec::new(),
        busy_elsewhere: 0.0,
        worst_link,
        endpoints: results.into_iter().map(|r| r.endpoint).collect(),
    }
}

/// The sending host of QP `qp` (by the plan's numbering).
fn source_of(plan: &Plan, qp: u32, v6: bool) -> IpAddr {
    let (src, _, _) = split_qp_number(qp);
    let (r, i) = plan.ranks[src.min(plan.n() - 1)];
    Fabric::host_addr(r, i, v6)
}

/// "12.3 Mbit/s" from bytes per second.
fn mbit(bytes_per_sec: f64) -> String {
    format!("{:.2} Mbit/s", bytes_per_sec * 8.0 / 1e6)
}

pub fn render(o: &CollectiveReport) -> String {
    let what = match o.op {
        Op::Incast => format!(
            "incast of {} into {} from the {} other hosts",
            links::size_text(o.size),
            o.hosts.first().map_or("-", String::as_str),
            o.ranks - 1
        ),
        op => format!(
            "{} of {} per rank over {} hosts ({} placement)",
            op.name(),
            links::size_text(o.size),
            o.ranks,
            flag(o.placement)
        ),
    };
    let mut out = format!(
        "{what}, {} QP(s) per connection, {} chunks, transport {}, balancing {}{}: {}\n",
        o.qps,
        links::size_text(o.chunk),
        o.transport.name(),
        o.balance,
        o.link_rate_bps.map_or(String::new(), |r| format!(", links {}", links::rate_text(r))),
        if o.complete { "complete" } else { "NOT COMPLETE (gave up or interrupted)" }
    );
    let _ = writeln!(
        out,
        "  time {:.3} s; algorithm bandwidth {}, bus bandwidth {}{}",
        o.seconds,
        mbit(o.algbw),
        mbit(o.busbw),
        match (o.ideal_busbw, o.share_of_ideal, o.ideal_seconds) {
            (Some(i), Some(share), Some(t)) =>
                format!(" = {:.1}% of the ideal non-blocking fabric's {} ({:.3} s)", share * 100.0, mbit(i), t),
            _ => String::new(),
        }
    );
    if let Some(w) = &o.worst_link {
        let _ = writeln!(
            out,
            "  busiest link {}: {} bytes, {:.1}% of its rate over the run",
            w.link,
            w.bytes,
            w.utilization * 100.0
        );
    }
    let _ = writeln!(
        out,
        "  {} data frames for {} planned ({} retransmitted after {} NAKs and {} timeouts), {} control frames",
        o.data_frames, o.planned_packets, o.retransmitted, o.sequence_naks, o.timeouts, o.control_frames
    );
    let _ = writeln!(
        out,
        "  queues: {} ECN-marked, {} dropped; {} CNPs{}{}",
        o.ecn_marked,
        o.drops,
        o.cnps,
        if o.transport == Transport::Dcqcn { format!(", {} rate cuts", o.rate_cuts) } else { String::new() },
        if o.transport == Transport::Cts { format!(", {} grants (CTS)", o.cts_sent) } else { String::new() }
    );
    let _ = writeln!(
        out,
        "  checked at the receivers: {} frames, {} bad ICRC, {} reordered by the network, {} duplicates (resent after a loss)",
        o.received_frames, o.bad_icrc, o.reordered, o.duplicates
    );
    if let Some(f) = &o.failure {
        let _ = writeln!(
            out,
            "  link {} failed at {:.2} s{}; {} frames lost: {} in the cut link, {} refused by its ports while down, {} dropped by a switch's kernel as unreachable{}",
            f.link,
            f.at_secs,
            match (f.te_compute_ms, f.te_install_ms) {
                (Some(c), Some(i)) => format!(", TE recomputed in {c:.1} ms and installed new pins in {i:.0} ms"),
                _ => String::new(),
            },
            f.lost_frames,
            f.in_link_frames,
            f.refused_frames,
            f.kernel_frames,
            match f.lost_frames.checked_sub(f.explained()) {
                Some(0) => String::new(),
                Some(n) => format!("; {n} NOT SEEN by these counters"),
                None => format!(" (of these, {} were the switches' own frames: ARP, ICMP)", f.explained() - f.lost_frames),
            }
        );
    }
    let _ = writeln!(
        out,
        "  {}",
        if o.accounted && o.failure.is_some() {
            format!(
                "every frame accounted for: {} sent = {} received + {} dropped by queues + {} lost at the failed link (counted there)",
                o.data_frames + o.control_frames,
                o.received_frames,
                o.drops,
                o.failure.as_ref().map_or(0, |f| f.lost_frames)
            )
        } else if o.accounted {
            format!(
                "every frame accounted for: {} sent = {} received + {} dropped",
                o.data_frames + o.control_frames,
                o.received_frames,
                o.drops
            )
        } else {
            format!(
                "FRAMES UNACCOUNTED: {} sent, {} received, {} dropped",
                o.data_frames + o.control_frames,
                o.received_frames,
                o.drops
            )
        }
    );
    let mut table =
        Table::new(&[("STEP", Align::Right), ("ENDED (s)", Align::Right), ("TOOK (s)", Align::Right)]).indent(2);
    for s in &o.steps {
        table.row([s.step.to_string(), format!("{:.3}", s.end_secs), format!("{:.3}", s.secs)]);
    }
    out.push_str(&table.render());
    out
}
