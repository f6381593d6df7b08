//! The flow-level completion-time model of a collective on a fabric: what
//! `rocev2 entropy --racks ... --collective` prints and what the lab's
//! scorecard is checked against.
//!
//! Every QP of every connection is a flow. Its path is what the switches
//! choose for its packets ([`Router::walk`] with the dataplane's own hash,
//! flowlet re-hash and buckets, on the flow key the lab's endpoints send,
//! [`qp_flow_key`]), or what a slice or TE pins it to (`placement`).
//! The QPs sending at a moment share every link's rate max-min fairly
//! ([`maxmin`]): an ideal transport, with no queues, loss or
//! congestion-control dynamics. Packets show only in the latency: a
//! message is delivered once its last packet was stored and forwarded by
//! every switch on its path, one full frame's time per link after the
//! sender's own (`Model::forwarding`).
//!
//! Two engines run the collective's messages (chunks), with one result
//! where both apply:
//!
//! - `events`: message by message, as the lab's endpoints post them: a
//!   QP sends its messages in order, each once its dependency arrived
//!   (ring AllReduce: the same message of the previous step, from the ring
//!   predecessor), and the rates are recomputed whenever a message ends.
//!   Waiting is real, so flowlets see the gaps a real ring leaves. Used
//!   while messages x QPs stay below [`EVENT_WORK`].
//! - `rounds`: for the paper's scale. Round r of a step is the r-th
//!   message of every QP; it lasts until its slowest message is done,
//!   which for a ring is the busiest link's bytes over its rate
//!   ([`maxmin::equal_completion`]); steps with fixed paths are computed
//!   once.
//!
//! Bus bandwidth is nccl-tests' (`busbw = algbw x 2(n-1)/n` for AllReduce,
//! `x (n-1)/n` for all-to-all, [`Op::bus_factor`]), and the score is its
//! share of an ideal non-blocking fabric with the same host links
//! ([`ideal_busbw`]).

use serde::Serialize;

use super::{
    cspf::{cspf, Demand, Graph, HopIndex, Node},
    ideal_busbw, maxmin, place, qp_flow_key, qp_number, transfer_wire_bytes, Host, Op, Placement, FRAME_OVERHEAD_V4,
    FRAME_OVERHEAD_V6, MAX_QPS, MAX_RANKS, MTU_PAYLOAD,
};
use crate::tools::fabric::{Fabric, Hop, Router};
use rocev2_common::hash::{FlowKey, HashMode};

mod events;
mod placement;
mod rounds;

/// How the fabric spreads the collective's QPs: the scorecard's rows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// ECMP on the five-tuple (`hash = "five-tuple"`): a QP's DestQP is ignored.
    FiveTuple,
    /// Enhanced ECMP (`hash = "qp"`): the five-tuple and the BTH DestQP.
    Qp,
    /// Static path pinning by destination slice: every switch sends traffic
    /// for host i of a rack through member (i-1) mod members, as `lab mode
    /// slice` configures (named `slice` on the command line and in JSON,
    /// as the lab names it).
    #[value(name = "slice")]
    #[serde(rename = "slice")]
    Pinned,
    /// Centralized TE: CSPF places every QP on the least loaded path with
    /// the rate it needs, installed as pins, as `lab te` does.
    Te,
    /// Flowlets with a keyed table: a QP idle longer than the gap before a
    /// message starts a new flowlet, re-hashed with its flowlet number; one
    /// that is not keeps its path.
    FlowletKeyed,
    /// Flowlets with a keyless table of `--flowlet-slots` slots per group: a
    /// QP whose slot is live (another QP in it sends, or sent within the
    /// gap) follows that slot's member.
    FlowletKeyless,
    /// Transport-aware flowlets (`lab mode transport-aware`): keyed
    /// flowlets whose groups demote a member while the QPs on it see
    /// congestion (it carries more QPs than a host link: it queues, marks
    /// ECN, brings CNPs), so new flowlets avoid it; a flowlet also ends
    /// when its QP waited long enough for everything to be acknowledged
    /// (`repick = "idle-or-acked"`).
    TransportAware,
}

impl Mode {
    pub const ALL: [Mode; 7] = [
        Mode::FiveTuple,
        Mode::Qp,
        Mode::Pinned,
        Mode::Te,
        Mode::FlowletKeyed,
        Mode::FlowletKeyless,
        Mode::TransportAware,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::FiveTuple => "five-tuple",
            Mode::Qp => "qp",
            Mode::Pinned => "slice",
            Mode::Te => "te",
            Mode::FlowletKeyed => "flowlet keyed",
            Mode::FlowletKeyless => "flowlet keyless",
            Mode::TransportAware => "transport-aware",
        }
    }

    /// The switches' `hash` setting (pins and flowlets fall back to `qp`).
    pub fn hash(self) -> HashMode {
        if self == Mode::FiveTuple {
            HashMode::FiveTuple
        } else {
            HashMode::Qp
        }
    }

    /// A mode whose paths change over time (re-hashed flowlets).
    pub fn flowlet(self) -> bool {
        matches!(self, Mode::FlowletKeyed | Mode::FlowletKeyless | Mode::TransportAware)
    }
}

/// The member a slice-pinned switch gives traffic for host `dst_host` of a
/// rack: the destination's slice, the same index at every tier.
pub fn slice_position(dst_host: u32, members: u32) -> u32 {
    (dst_host - 1) % members.max(1)
}

/// The QP number the model gives QP `q` of the connection `src -> dst`
/// among `n` ranks: the lab's ([`qp_number`]) up to [`MAX_RANKS`] ranks;
/// past that the ranks no longer fit its bits, and a hash of the two ranks
/// stands in for what a NIC's allocator hands out (numbers with no relation
/// to the ring).
pub fn model_qp_number(n: usize, src: usize, dst: usize, q: u32) -> u32 {
    if n <= MAX_RANKS {
        return qp_number(src, dst, q);
    }
    let mut state = ((src as u64) << 32) | dst as u64;
    (rocev2_common::rng::splitmix64(&mut state) as u32 & 0xFF_FFC0) | (q & 0x3F)
}

/// What the model needs: the fabric (shape and seeds; its `hash` is the
/// mode's), its links' rate and the collective.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Setup {
    pub fabric: Fabric,
    /// Every link's rate in bits per second of frame bytes (as the lab's
    /// `--link-rate`: Ethernet header to ICRC).
    pub link_bps: u64,
    pub v6: bool,
    pub op: Op,
    /// Bytes per rank (nccl-tests' size).
    pub size: u64,
    pub qps: u32,
    pub chunk: u64,
    pub placement: Placement,
    pub mode: Mode,
    /// Flowlet modes: the idle time that ends a flowlet (`flowlet_gap_us`).
    pub flowlet_gap_ns: u64,
    /// `FlowletKeyless`: slots of each group's table (a power of two).
    pub flowlet_slots: u32,
    /// Idle time before every message of a QP whatever the fabric does
    /// (e.g. waiting for a CTS grant); 0 for messages back to back.
    pub message_gap_ns: u64,
}

/// Largest fabrics the model takes (addresses, MACs and bucket tables
/// stay valid up to here).
pub const MAX_MODEL_RACKS: u32 = 8191;
pub const MAX_MODEL_HOSTS: u32 = 255;
pub const MAX_MODEL_SPINES: u32 = 255;
/// Messages times QPs up to which the event engine runs (a 4x4x4 lab's
/// 64 MiB AllReduce over 8 QPs is 2 million); past it, the round engine.
pub const EVENT_WORK: u64 = 30_000_000;
/// All-to-all flows the model takes (n(n-1) grows fast).
const MAX_ALLTOALL_FLOWS: usize = 2_000_000;

impl Setup {
    /// Rejects what the model cannot run, naming the option to change.
    pub fn validate(&self) -> Result<(), String> {
        let f = &self.fabric;
        let check = |flag: &str, v: u32, max: u32| -> Result<(), String> {
            if !(1..=max).contains(&v) {
                return Err(format!("{flag} must be 1..={max}, not {v}"));
            }
            Ok(())
        };
        check("--racks", f.racks, MAX_MODEL_RACKS)?;
        check("--hosts", f.hosts, MAX_MODEL_HOSTS)?;
        check("--spines", f.spines, MAX_MODEL_SPINES)?;
        check("--links-per-spine", f.links, crate::tools::fabric::MAX_LINKS)?;
        check("--zones", f.zones, f.racks)?;
        if !f.racks.is_multiple_of(f.zones) || !f.spines.is_multiple_of(f.zones) {
            return Err(format!(
                "--racks {} and --spines {} must split evenly into {} zones",
                f.racks, f.spines, f.zones
            ));
        }
        if f.zones > 1 {
            check("--aggs", f.aggs, MAX_MODEL_SPINES)?;
        }
        if f.zone_spines() * f.links >= u32::from(rocev2_common::buckets::NO_MEMBER) {
            return Err(format!(
                "{} spines x {} links per zone are more members than a group's bucket table holds (254)",
                f.zone_spines(),
                f.links
            ));
        }
        if self.link_bps == 0 {
            return Err("--link-rate 0 carries nothing; give a rate such as 200mbit".into());
        }
        if !(1..=MAX_QPS).contains(&self.qps) {
            return Err(format!("--qps must be 1..={MAX_QPS}, not {}", self.qps));
        }
        if self.size == 0 {
            return Err("--size 0 moves nothing; give a size such as 64m".into());
        }
        if self.chunk < MTU_PAYLOAD {
            return Err(format!("--chunk {} is smaller than one packet's {MTU_PAYLOAD} bytes", self.chunk));
        }
        let n = (f.racks * f.hosts) as usize;
        if n < 2 {
            return Err(format!("{} needs at least 2 hosts, the fabric has {n}", self.op.name()));
        }
        if self.op == Op::Alltoall && n * (n - 1) * self.qps as usize > MAX_ALLTOALL_FLOWS {
            return Err(format!(
                "an all-to-all over {n} ranks with {} QPs is {} flows, more than the model's {MAX_ALLTOALL_FLOWS}; use fewer hosts or QPs",
                self.qps,
                n * (n - 1) * self.qps as usize
            ));
        }
        if self.mode == Mode::FlowletKeyless && !self.flowlet_slots.is_power_of_two() {
            return Err(format!("--flowlet-slots {} must be a power of two", self.flowlet_slots));
        }
        Ok(())
    }
}

/// Which engine computed a prediction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    Events,
    Rounds,
}

/// What the model predicts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub mode: Mode,
    pub op: Op,
    pub ranks: usize,
    pub qps: u32,
    pub size: u64,
    pub engine: Engine,
    /// Completion time.
    pub seconds: f64,
    /// nccl-tests' algorithm and bus bandwidth, bytes per second.
    pub algbw: f64,
    pub busbw: f64,
    /// Bus bandwidth on an ideal non-blocking fabric with the same host links.
    pub ideal_busbw: f64,
    /// `busbw / ideal_busbw`: the scorecard's number.
    pub share_of_ideal: f64,
    pub steps: usize,
    /// Mean, shortest and longest step.
    pub step_seconds: [f64; 3],
    /// The link that carried the most for its rate, and how busy it was
    /// over the whole collective (a switch link when one ties a host link).
    pub worst_link: String,
    pub worst_link_utilization: f64,
    /// QPs (flows) of the collective.
    pub flows: usize,
    /// Flowlet modes: messages that started a new flowlet.
    pub new_flowlets: u64,
    /// Flowlet modes: new flowlets on another path than the QP's last
    /// (each may arrive out of order).
    pub moved_flowlets: u64,
    /// `FlowletKeyless`: member choices that followed a slot another QP held.
    pub slot_collisions: u64,
    /// `Te`: QPs whose path lacked the rate they needed.
    pub te_unfit: usize,
    /// `TransportAware`: demotions.
    pub demoted: usize,
    /// The round engine: rounds computed of all the collective's rounds
    /// (flowlet modes past its budget give the rest the computed mean).
    pub rounds: (u64, u64),
}

/// One QP of one connection.
struct QpFlow {
    src: Host,
    dst: Host,
    /// Its connection: the index of its transfer in a step.
    transfer: usize,
    key: FlowKey,
    /// Its messages of a step: (message index in the transfer, frame bytes).
    messages: Vec<(usize, f64)>,
    /// Payload bytes it carries over the whole collective.
    payload: u64,
}

/// The fabric and the collective's QPs, ready for an engine.
struct Model<'a> {
    s: &'a Setup,
    router: Router<'a>,
    graph: Graph,
    capacity: Vec<f64>,
    hops: HopIndex,
    /// In (source rank, destination rank, QP) order.
    qps: Vec<QpFlow>,
    n: usize,
    steps: usize,
    transfers: usize,
    messages_per_transfer: usize,
    /// Rounds of a step: messages per transfer over QPs.
    rounds: usize,
    /// Frame bytes of a full packet.
    frame: f64,
}

/// Predicts `setup`'s collective. Pure and deterministic.
pub fn predict(setup: &Setup) -> Result<Prediction, String> {
    setup.validate()?;
    let mut fabric = setup.fabric.clone();
    fabric.hash = setup.mode.hash();
    let m = Model::new(setup, &fabric);
    let mut out = Outcome::new(m.capacity.len());
    let work = (m.steps * m.transfers * m.messages_per_transfer) as u64 * m.qps.len() as u64;
    let engine = if work <= EVENT_WORK { Engine::Events } else { Engine::Rounds };
    // Paths that never change, for every mode but flowlets.
    let fixed: Vec<Vec<u32>> = match setup.mode {
        mode if mode.flowlet() => Vec::new(),
        Mode::Te => m.te_paths(&mut out),
        _ => m.qps.iter().map(|q| m.fixed_path(q)).collect(),
    };
    match engine {
        Engine::Events => events::run(&m, &fixed, &mut out),
        Engine::Rounds if setup.mode.flowlet() => rounds::run_flowlets(&m, &mut out),
        Engine::Rounds => rounds::run_fixed(&m, &fixed, &mut out),
    }
    Ok(m.prediction(out, engine))
}

impl<'a> Model<'a> {
    fn new(s: &'a Setup, fabric: &'a Fabric) -> Self {
        let graph = Graph::fabric(fabric, s.link_bps as f64 / 8.0);
        let capacity = graph.edges.iter().map(|e| e.capacity).collect();
        let ranks = place(fabric.racks, fabric.hosts, s.placement);
        let n = ranks.len();
        let transfers = s.op.step_transfers(n, s.size);
        let bytes = s.op.transfer_bytes(n, s.size);
        let count = bytes.div_ceil(s.chunk) as usize;
        let steps = s.op.steps(n);
        let mut qps = Vec::with_capacity(transfers.len() * s.qps as usize);
        for (i, t) in transfers.iter().enumerate() {
            for q in 0..s.qps {
                let messages: Vec<(usize, f64)> = (q as usize..count)
                    .step_by(s.qps as usize)
                    .map(|m| {
                        let b = (bytes - m as u64 * s.chunk).min(s.chunk);
                        (m, transfer_wire_bytes(b, s.chunk, s.v6) as f64)
                    })
                    .collect();
                let payload = messages.iter().map(|&(m, _)| (bytes - m as u64 * s.chunk).min(s.chunk)).sum::<u64>()
                    * steps as u64;
                let (src, dst) = (ranks[t.src], ranks[t.dst]);
                let key = qp_flow_key(src, dst, model_qp_number(n, t.src, t.dst, q), s.v6);
                qps.push(QpFlow { src, dst, transfer: i, key, messages, payload });
            }
        }
        Model {
            s,
            router: Router::new(fabric),
            graph,
            capacity,
            hops: HopIndex::new(fabric),
            qps,
            n,
            steps,
            transfers: transfers.len(),
            messages_per_transfer: count,
            rounds: count.div_ceil(s.qps as usize),
            frame: (MTU_PAYLOAD + if s.v6 { FRAME_OVERHEAD_V6 } else { FRAME_OVERHEAD_V4 }) as f64,
        }
    }

    /// How long a message's last packet travels after its sender sent it
    /// on a path: each switch stores and forwards it, a full frame's time
    /// on every link after the sender's own.
    fn forwarding(&self, path: &[u32]) -> f64 {
        path.iter().skip(1).map(|&l| self.frame / self.capacity[l as usize]).sum()
    }

    /// Frame bytes of every QP's message in round `r` of a step (0: none).
    fn round_bytes(&self, r: usize) -> Vec<f64> {
        let q = self.s.qps as usize;
        self.qps.iter().map(|f| f.messages.iter().find(|&&(m, _)| m / q == r).map_or(0.0, |&(_, b)| b)).collect()
    }

    /// TE: CSPF over the fabric's graph, every QP with the rate it needs.
    fn te_paths(&self, out: &mut Outcome) -> Vec<Vec<u32>> {
        let ranks = place(self.router.fabric.racks, self.router.fabric.hosts, self.s.placement);
        let transfers = self.s.op.step_transfers(self.n, self.s.size);
        let matrix = self.qps.iter().enumerate().map(|(k, q)| {
            let t = transfers[q.transfer];
            ((t.src, t.dst, k as u32 % self.s.qps), q.payload)
        });
        let demands = te_demands(&ranks, matrix, self.s.link_bps as f64 / 8.0);
        let routing = cspf(&self.graph, &demands, &[]);
        out.te_unfit = routing.fits.iter().filter(|f| !**f).count();
        routing
            .paths
            .into_iter()
            .map(|p| p.expect("a fabric connects every host").into_iter().map(|e| e as u32).collect())
            .collect()
    }

    fn prediction(&self, out: Outcome, engine: Engine) -> Prediction {
        let s = self.s;
        let seconds: f64 = out.steps.iter().sum();
        let bus_factor = s.op.bus_factor(self.n);
        let algbw = s.size as f64 / seconds;
        let ideal = ideal_busbw(s.op, self.n, s.size, s.chunk, s.link_bps, s.v6);
        // The busiest link for its rate; a switch link wins a tie with a host link.
        let host = |e: usize| matches!(self.graph.edges[e].hop, Hop::HostUp { .. } | Hop::LeafDown { .. });
        let worst = (0..self.capacity.len()).max_by(|&a, &b| {
            let (ua, ub) = (out.link_bytes[a] / self.capacity[a], out.link_bytes[b] / self.capacity[b]);
            if (ua - ub).abs() <= 1e-9 * ua.max(ub) {
                host(b).cmp(&host(a)).then(b.cmp(&a))
            } else {
                ua.total_cmp(&ub)
            }
        });
        let (worst_link, worst_util) = worst.map_or((String::new(), 0.0), |e| {
            (self.graph.edges[e].name(), out.link_bytes[e] / (self.capacity[e] * seconds))
        });
        let (min, max) = out.steps.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
        Prediction {
            mode: s.mode,
            op: s.op,
            ranks: self.n,
            qps: s.qps,
            size: s.size,
            engine,
            seconds,
            algbw,
            busbw: algbw * bus_factor,
            ideal_busbw: ideal,
            share_of_ideal: algbw * bus_factor / ideal,
            steps: self.steps,
            step_seconds: [seconds / self.steps as f64, min, max],
            worst_link,
            worst_link_utilization: worst_util,
            flows: self.qps.len(),
            new_flowlets: out.new_flowlets,
            moved_flowlets: out.moved_flowlets,
            slot_collisions: out.slot_collisions,
            te_unfit: out.te_unfit,
            demoted: out.demoted,
            rounds: out.rounds,
        }
    }
}

/// What an engine found.
struct Outcome {
    /// Each step's time.
    steps: Vec<f64>,
    /// Frame bytes each link carried.
    link_bytes: Vec<f64>,
    new_flowlets: u64,
    moved_flowlets: u64,
    slot_collisions: u64,
    te_unfit: usize,
    demoted: usize,
    rounds: (u64, u64),
}

impl Outcome {
    fn new(links: usize) -> Self {
        Self {
            steps: Vec::new(),
            link_bytes: vec![0.0; links],
            new_flowlets: 0,
            moved_flowlets: 0,
            slot_collisions: 0,
            te_unfit: 0,
            demoted: 0,
            rounds: (0, 0),
        }
    }

    fn scale_links(&mut self, by: f64) {
        for b in &mut self.link_bytes {
            *b *= by;
        }
    }
}

/// The rate each QP of a traffic matrix needs, for TE (`rocev2 lab te`
/// and the model alike): its share of its busier host link, so that every
/// host link can be full. The matrix is ((source rank, destination rank,
/// QP), payload bytes) in the order the demands come out; `host_link` is a
/// host link's capacity in the unit the graph's edges use.
pub fn te_demands(
    ranks: &[Host],
    matrix: impl Iterator<Item = ((usize, usize, u32), u64)>,
    host_link: f64,
) -> Vec<Demand> {
    let matrix: Vec<((usize, usize, u32), u64)> = matrix.collect();
    let (mut sent, mut received) = (vec![0u64; ranks.len()], vec![0u64; ranks.len()]);
    for &((s, d, _), b) in &matrix {
        sent[s] += b;
        received[d] += b;
    }
    matrix
        .into_iter()
        .map(|((s, d, _), b)| {
            let ((sr, si), (dr, di)) = (ranks[s], ranks[d]);
            let busier = sent[s].max(received[d]).max(1);
            Demand { src: Node::Host(sr, si), dst: Node::Host(dr, di), load: host_link * b as f64 / busier as f64 }
        })
        .collect()
}

/// One row of the scorecard: a mode with its QPs per connection and (for
/// flowlets) its gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    pub mode: Mode,
    pub qps: u32,
    pub flowlet_gap_ns: u64,
}

impl Row {
    /// As the lab's scorecard labels its rows: `qp`, `flowlet keyed 2ms`.
    pub fn label(&self) -> String {
        match self.mode.flowlet() {
            true => format!("{} {}", self.mode.name(), crate::render::gap_text((self.flowlet_gap_ns / 1000) as u32)),
            false => self.mode.name().to_owned(),
        }
    }
}

/// The scorecard's rows, as `rocev2 lab scorecard` runs them: five-tuple
/// ECMP with one QP per connection, E-ECMP (`qp`) with 1, 2, 4 and 8, then
/// slices, TE, keyed and keyless flowlets at every gap and transport-aware
/// flowlets at the last gap, each with one QP.
pub fn scorecard_rows(gaps_ns: &[u64]) -> Vec<Row> {
    let row = |mode, qps, flowlet_gap_ns| Row { mode, qps, flowlet_gap_ns };
    let mut rows = vec![row(Mode::FiveTuple, 1, 0)];
    rows.extend([1, 2, 4, 8].map(|q| row(Mode::Qp, q, 0)));
    rows.extend([row(Mode::Pinned, 1, 0), row(Mode::Te, 1, 0)]);
    for mode in [Mode::FlowletKeyed, Mode::FlowletKeyless] {
        rows.extend(gaps_ns.iter().map(|&g| row(mode, 1, g)));
    }
    rows.push(row(Mode::TransportAware, 1, gaps_ns.last().copied().unwrap_or(50_000_000)));
    rows
}

#[cfg(test)]
mod tests;
