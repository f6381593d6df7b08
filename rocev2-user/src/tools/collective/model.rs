//! The flow-level completion-time model of a collective on a fabric: what
//! `rocev2 entropy --racks ... --collective` prints and what the lab's
//! scorecard is checked against.
//!
//! Every QP of every connection is a flow. Its path is what the switches
//! would choose for its packets ([`Router::walk`] with the dataplane's own
//! hash and buckets, on the flow key the lab's endpoints send,
//! [`qp_flow_key`]), or what a pin or TE gives it. Flows that share a link
//! share its rate max-min fairly ([`maxmin`]); a flow-level model of an
//! ideal transport: no packets, queues, loss or congestion-control
//! dynamics.
//!
//! - **Ring AllReduce** runs in *rounds*: round r of a step is message
//!   r x qps + q on QP q of every connection (the messages a connection
//!   has in flight together). A message waits for the same message of the
//!   previous step, so the slowest message of the ring sets the pace:
//!   a round lasts until its last message is delivered, and the collective
//!   is the sum of its 2(n-1) steps' rounds. When the paths do not change
//!   (hash, pins, TE) every step is alike and is computed once.
//! - **All-to-all and incast** have no dependencies: every QP sends its
//!   messages back to back, and the step lasts until the last flow is done
//!   ([`maxmin::completion`]: rates are recomputed as flows finish).
//!
//! A round (or step) whose flows all carry the same bytes ends when its
//! busiest link has carried them: `bytes x flows on the link / capacity`
//! ([`maxmin::equal_completion`]); otherwise the event-driven fluid model
//! runs. Flowlet modes re-place flows between rounds (see [`Mode`]).

use std::collections::HashMap;

use rocev2_common::{
    buckets::{even_table, member_for, rebalance, BucketTable, Rebalance},
    flowlet::{rehash_position, slot_of},
    hash::{member_hash, FlowKey, HashMode},
};
use serde::Serialize;

use super::{
    cspf::{cspf, Demand, Graph, HopIndex, Node},
    ideal_busbw,
    maxmin::{self, Flows},
    place, qp_flow_key, qp_number, transfer_wire_bytes, Host, Op, Placement, MAX_QPS, MAX_RANKS, MTU_PAYLOAD,
};
use crate::tools::fabric::{Choice, Fabric, Hop, Router, Switch, Tier};

/// How the fabric spreads the collective's QPs: the scorecard's rows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// ECMP on the five-tuple (`hash = "five-tuple"`): a QP's DestQP is ignored.
    FiveTuple,
    /// Enhanced ECMP (`hash = "qp"`): the five-tuple and the BTH DestQP.
    Qp,
    /// Path pinning by destination slice: every switch sends traffic for
    /// host i of a rack through member (i-1) mod members ([`slice_position`]),
    /// what a static `[[pin]]` set per destination gives.
    Pinned,
    /// Centralized TE: CSPF ([`cspf`]) places every QP on the least loaded
    /// path with the rate it needs ([`te_demands`]), installed as pins.
    Te,
    /// Flowlets with a keyed table: a QP idle longer than the gap before a
    /// message starts a new flowlet there and is re-hashed with its flowlet
    /// number ([`rehash_position`]); one that is not keeps its path.
    FlowletKeyed,
    /// Flowlets with a keyless table of `flowlet_slots` slots per switch:
    /// QPs whose flows share a slot in a round share the first one's member.
    FlowletKeyless,
    /// `qp` hashing after one reaction of transport-aware groups: a member
    /// whose link is busier than a host link (it would queue, mark ECN and
    /// draw CNPs) is demoted, its buckets go to the others ([`rebalance`])
    /// and the flows in them move. One reaction, not the demote/restore
    /// cycles that follow over the health half-life.
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
            Mode::Pinned => "pinned",
            Mode::Te => "te",
            Mode::FlowletKeyed => "flowlet-keyed",
            Mode::FlowletKeyless => "flowlet-keyless",
            Mode::TransportAware => "transport-aware",
        }
    }

    /// The switches' `hash` setting.
    pub fn hash(self) -> HashMode {
        if self == Mode::FiveTuple {
            HashMode::FiveTuple
        } else {
            HashMode::Qp
        }
    }

    fn flowlet(self) -> bool {
        matches!(self, Mode::FlowletKeyed | Mode::FlowletKeyless)
    }
}

/// The member a pinned switch gives traffic for host `dst_host` of a rack:
/// the destination's slice, the same index at every tier.
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
    /// Flowlet modes: idle time every message starts with whatever the
    /// fabric does (e.g. waiting for a CTS grant); 0 for a sender that
    /// posts back to back.
    pub message_gap_ns: u64,
    /// `FlowletKeyless`: slots of each switch's table.
    pub flowlet_slots: u32,
}

/// Largest fabrics the model takes (addresses, MACs and bucket tables
/// stay valid up to here).
pub const MAX_MODEL_RACKS: u32 = 8191;
pub const MAX_MODEL_HOSTS: u32 = 255;
pub const MAX_MODEL_SPINES: u32 = 255;
/// Flows times rounds the model walks before it samples the rounds of a
/// flowlet mode instead of walking them all.
const WALK_BUDGET: u64 = 1_500_000;
/// All-to-all connections the model takes (n(n-1) grows fast).
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

/// What the model predicts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub mode: Mode,
    pub op: Op,
    pub ranks: usize,
    pub qps: u32,
    pub size: u64,
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
    /// QP flows per step.
    pub flows: usize,
    /// Flowlet modes: messages that started a new flowlet.
    pub new_flowlets: u64,
    /// Flowlet modes: new flowlets that took another path than the
    /// message before (each may arrive out of order).
    pub moved_flowlets: u64,
    /// `FlowletKeyless`: messages whose slot another QP held in that round.
    pub slot_collisions: u64,
    /// `Te`: QPs whose path lacked the rate they needed.
    pub te_unfit: usize,
    /// `TransportAware`: members demoted.
    pub demoted: usize,
    /// Flowlet modes past a budget of walks: rounds computed of all the
    /// collective's rounds (the rest take their mean).
    pub rounds: (u64, u64),
}

/// One QP of one connection.
struct QpFlow {
    src: Host,
    dst: Host,
    key: FlowKey,
    /// Wire bytes of its message in each round of a step (0: no message).
    round_bytes: Vec<f64>,
}

/// Predicts `setup`'s collective. Pure and deterministic.
pub fn predict(setup: &Setup) -> Result<Prediction, String> {
    setup.validate()?;
    let mut fabric = setup.fabric.clone();
    fabric.hash = setup.mode.hash();
    let model = Model::new(setup, &fabric);
    model.run()
}

struct Model<'a> {
    s: &'a Setup,
    router: Router<'a>,
    graph: Graph,
    capacity: Vec<f64>,
    hop_index: HopIndex,
    flows: Vec<QpFlow>,
    rounds: usize,
    n: usize,
}

/// Per-group bucket tables that differ from the even one (transport-aware
/// demotions), keyed by [`group_of`].
type Tables = HashMap<Group, (BucketTable, Vec<u32>)>;

/// A switch's group: the switch, the tier it chooses for and the
/// destination rack or zone the group is for ([`group_of`]).
type Group = (Switch, Tier, u32);

/// The group a switch chooses from for a packet to `dst` at tier `tier`:
/// a leaf's or spine's one group upwards, an aggregation switch's group of
/// the destination zone, a spine's parallel links to the destination rack.
fn group_of(f: &Fabric, c: &Choice, dst: Host) -> Group {
    let target = match c.tier {
        Tier::AggDown => f.zone_of_rack(dst.0),
        Tier::SpineDown => dst.0,
        _ => 0,
    };
    (c.switch, c.tier, target)
}

impl<'a> Model<'a> {
    fn new(s: &'a Setup, fabric: &'a Fabric) -> Self {
        let graph = Graph::fabric(fabric, s.link_bps as f64 / 8.0);
        let capacity = graph.edges.iter().map(|e| e.capacity).collect();
        let hop_index = HopIndex::new(fabric);
        let ranks = place(fabric.racks, fabric.hosts, s.placement);
        let n = ranks.len();
        let transfers = s.op.step_transfers(n, s.size);
        let messages = transfers.iter().map(|t| t.bytes.div_ceil(s.chunk)).max().unwrap_or(0);
        let rounds = messages.div_ceil(u64::from(s.qps)) as usize;
        let mut flows = Vec::with_capacity(transfers.len() * s.qps as usize);
        for t in &transfers {
            let count = t.bytes.div_ceil(s.chunk);
            for q in 0..s.qps {
                let round_bytes = (0..rounds as u64)
                    .map(|r| {
                        let m = r * u64::from(s.qps) + u64::from(q);
                        if m >= count {
                            return 0.0;
                        }
                        let bytes = (t.bytes - m * s.chunk).min(s.chunk);
                        transfer_wire_bytes(bytes, s.chunk, s.v6) as f64
                    })
                    .collect();
                let (src, dst) = (ranks[t.src], ranks[t.dst]);
                let key = qp_flow_key(src, dst, model_qp_number(n, t.src, t.dst, q), s.v6);
                flows.push(QpFlow { src, dst, key, round_bytes });
            }
        }
        Model { s, router: Router::new(fabric), graph, capacity, hop_index, flows, rounds, n }
    }

    /// The edges of the walk from `src` to `dst` with `choose`.
    fn path(&self, src: Host, dst: Host, choose: impl FnMut(Choice) -> u32) -> Vec<u32> {
        self.router.walk(src, dst, choose).into_iter().map(|h| self.hop_index.of(h) as u32).collect()
    }

    /// Paths that stay for the whole collective (every mode but flowlets).
    fn static_paths(&self, tables: &Tables) -> Vec<Vec<u32>> {
        let f = self.router.fabric;
        let hash = f.hash;
        self.flows
            .iter()
            .map(|q| match self.s.mode {
                Mode::Pinned => self.path(q.src, q.dst, |c| slice_position(q.dst.1, c.members)),
                _ => self.path(q.src, q.dst, |c| {
                    let table = tables.get(&group_of(f, &c, q.dst)).map_or(c.table, |(t, _)| t);
                    member_for(table, member_hash(&q.key, hash, c.seed))
                }),
            })
            .collect()
    }

    /// TE: CSPF over the fabric's graph, every QP with the rate it needs.
    fn te_paths(&self) -> (Vec<Vec<u32>>, usize) {
        let demands = te_demands(
            self.flows.iter().map(|q| (q.src, q.dst, q.round_bytes.iter().sum())),
            &self.capacity_of_host_link(),
        );
        let routing = cspf(&self.graph, &demands, &[]);
        let unfit = routing.fits.iter().filter(|f| !**f).count();
        let paths = routing
            .paths
            .into_iter()
            .map(|p| p.expect("a fabric connects every host").into_iter().map(|e| e as u32).collect())
            .collect();
        (paths, unfit)
    }

    fn capacity_of_host_link(&self) -> f64 {
        self.s.link_bps as f64 / 8.0
    }

    fn run(&self) -> Result<Prediction, String> {
        let steps = self.s.op.steps(self.n);
        let mut out = Outcome::new(self.capacity.len());
        let (mut te_unfit, mut demoted) = (0, 0);
        if self.s.mode.flowlet() {
            self.run_flowlets(steps, &mut out);
        } else {
            let paths = match self.s.mode {
                Mode::Te => {
                    let (p, unfit) = self.te_paths();
                    te_unfit = unfit;
                    p
                }
                Mode::TransportAware => {
                    let (p, d) = self.transport_aware_paths();
                    demoted = d;
                    p
                }
                _ => self.static_paths(&Tables::new()),
            };
            let mut flows = Flows::new();
            for p in &paths {
                flows.push(p.iter().copied());
            }
            let step = self.step_time(&flows, &mut out);
            out.steps = vec![step; steps];
            out.scale_links(steps as f64);
            // Every step is alike: one computed stands for all.
            out.rounds = ((self.rounds * steps) as u64, (self.rounds * steps) as u64);
        }
        Ok(self.prediction(out, steps, te_unfit, demoted))
    }

    /// One step with fixed paths: rounds for the ring, one continuous
    /// transfer per QP otherwise. Adds the step's link bytes to `out`.
    fn step_time(&self, flows: &Flows, out: &mut Outcome) -> f64 {
        if self.s.op == Op::Allreduce {
            (0..self.rounds)
                .map(|r| {
                    let bytes: Vec<f64> = self.flows.iter().map(|q| q.round_bytes[r]).collect();
                    round_time(&self.capacity, flows, &bytes, out)
                })
                .sum()
        } else {
            let bytes: Vec<f64> = self.flows.iter().map(|q| q.round_bytes.iter().sum()).collect();
            round_time(&self.capacity, flows, &bytes, out)
        }
    }

    /// Flowlet modes: rounds one after another, each QP re-placed before a
    /// message it starts after an idle time longer than the gap.
    fn run_flowlets(&self, steps: usize, out: &mut Outcome) {
        let s = self.s;
        let total_rounds = (steps * self.rounds) as u64;
        // The ring's rounds wait for each other (slack is idle time); the
        // one-step collectives' flows never wait unless every message does.
        let every_message_new = s.message_gap_ns > s.flowlet_gap_ns;
        if s.op != Op::Allreduce && !every_message_new {
            // One flowlet per QP for the whole step.
            let (paths, _) = self.flowlet_round(&vec![0; self.flows.len()], &vec![true; self.flows.len()], &mut 0);
            let mut flows = Flows::new();
            for p in &paths {
                flows.push(p.iter().copied());
            }
            let t = self.step_time(&flows, out);
            out.steps = vec![t];
            out.new_flowlets = self.flows.len() as u64;
            out.rounds = (1, 1);
            return;
        }
        let budget = (WALK_BUDGET / self.flows.len().max(1) as u64).max(4);
        let evaluated = total_rounds.min(budget);
        let mut flowlet_id = vec![0u32; self.flows.len()];
        let mut previous: Vec<Vec<u32>> = Vec::new();
        let mut idle_ns = vec![f64::INFINITY; self.flows.len()];
        let mut round_times = Vec::new();
        let mut collisions = 0;
        for g in 0..evaluated as usize {
            let r = g % self.rounds.max(1);
            let bytes: Vec<f64> = self.flows.iter().map(|q| q.round_bytes[r]).collect();
            let mut started = vec![g == 0; self.flows.len()];
            for (k, id) in flowlet_id.iter_mut().enumerate() {
                if g > 0 && bytes[k] > 0.0 && idle_ns[k] + s.message_gap_ns as f64 > s.flowlet_gap_ns as f64 {
                    *id += 1;
                    started[k] = true;
                }
            }
            let active: Vec<bool> = bytes.iter().map(|b| *b > 0.0).collect();
            let (paths, fresh) = self.flowlet_round(&flowlet_id, &active, &mut collisions);
            for (k, p) in paths.iter().enumerate() {
                if bytes[k] > 0.0 && started[k] && fresh[k] {
                    out.new_flowlets += 1;
                    // A QP that sent nothing last round has no path to move from.
                    let before = previous.get(k).filter(|b| !b.is_empty());
                    out.moved_flowlets += u64::from(before.is_some_and(|b| b != p));
                }
            }
            let mut flows = Flows::new();
            for p in &paths {
                flows.push(p.iter().copied());
            }
            let t = round_time(&self.capacity, &flows, &bytes, out);
            idle_ns = if s.op == Op::Allreduce {
                // Idle longer than this starts a new flowlet.
                let enough = (s.flowlet_gap_ns as f64 - s.message_gap_ns as f64).max(0.0) / 1e9;
                waits(&self.capacity, &flows, &bytes, t, enough).into_iter().map(|w| w * 1e9).collect()
            } else {
                vec![0.0; self.flows.len()]
            };
            round_times.push(t);
            previous = paths;
        }
        out.slot_collisions = collisions;
        // Rounds not computed take the mean of those that were.
        let mean = round_times.iter().sum::<f64>() / round_times.len().max(1) as f64;
        let scale = total_rounds as f64 / evaluated.max(1) as f64;
        out.scale_links(scale);
        out.new_flowlets = (out.new_flowlets as f64 * scale).round() as u64;
        out.moved_flowlets = (out.moved_flowlets as f64 * scale).round() as u64;
        out.slot_collisions = (out.slot_collisions as f64 * scale).round() as u64;
        out.rounds = (evaluated, total_rounds);
        let rounds = self.rounds.max(1);
        out.steps = (0..steps)
            .map(|st| (0..rounds).map(|r| round_times.get(st * rounds + r).copied().unwrap_or(mean)).sum())
            .collect();
    }

    /// Every `active` QP's path for a round with flowlet numbers `ids`, and
    /// whether each path was chosen afresh (a keyless slot's follower was not).
    fn flowlet_round(&self, ids: &[u32], active: &[bool], collisions: &mut u64) -> (Vec<Vec<u32>>, Vec<bool>) {
        let keyless = self.s.mode == Mode::FlowletKeyless;
        let mask = self.s.flowlet_slots.max(1) - 1;
        // Per (group, slot): the position the slot's first QP took this round.
        let mut slots: HashMap<(Group, u32), (u32, usize)> = HashMap::new();
        let f = self.router.fabric;
        let mut fresh = vec![true; self.flows.len()];
        let paths = self
            .flows
            .iter()
            .enumerate()
            .map(|(k, q)| {
                if !active[k] {
                    return Vec::new();
                }
                self.path(q.src, q.dst, |c| {
                    let own = rehash_position(&q.key, c.seed, ids[k], c.table);
                    if !keyless {
                        return own;
                    }
                    let slot = slot_of(&q.key, 0, mask).index;
                    let (position, owner) = *slots.entry((group_of(f, &c, q.dst), slot)).or_insert((own, k));
                    if owner != k {
                        *collisions += 1;
                        fresh[k] = false;
                    }
                    position
                })
            })
            .collect();
        (paths, fresh)
    }

    /// `qp` hashing after one reaction of transport-aware groups: every
    /// member whose link carries more than a host link is demoted (never a
    /// group's last one) and its buckets go to the others.
    fn transport_aware_paths(&self) -> (Vec<Vec<u32>>, usize) {
        let f = self.router.fabric;
        let mut tables = Tables::new();
        let mut flows = Flows::new();
        for p in self.static_paths(&tables) {
            flows.push(p);
        }
        let load = flows.counts(self.capacity.len());
        let per = |e: usize| f64::from(load[e]) / self.capacity[e];
        let host_level = (0..self.capacity.len())
            .filter(|&e| matches!(self.graph.edges[e].hop, Hop::HostUp { .. } | Hop::LeafDown { .. }))
            .map(per)
            .fold(0.0, f64::max);
        let mut demoted = 0;
        for e in 0..self.capacity.len() {
            if per(e) <= host_level * (1.0 + 1e-9) {
                continue;
            }
            let Some((group, position, members)) = member_of(f, self.graph.edges[e].hop) else { continue };
            let (table, weights) =
                tables.entry(group).or_insert_with(|| (even_table(members), vec![1; members as usize]));
            if weights[position as usize] == 0 || weights.iter().filter(|w| **w > 0).count() <= 1 {
                continue;
            }
            weights[position as usize] = 0;
            rebalance(table, weights, Rebalance::Immediate);
            demoted += 1;
        }
        (self.static_paths(&tables), demoted)
    }

    fn prediction(&self, out: Outcome, steps: usize, te_unfit: usize, demoted: usize) -> Prediction {
        let s = self.s;
        let seconds: f64 = out.steps.iter().sum();
        let bus_factor = s.op.bus_factor(self.n);
        let algbw = s.size as f64 / seconds;
        let ideal = ideal_busbw(s.op, self.n, s.size, s.chunk, s.link_bps, s.v6);
        // The busiest link for its rate; a switch link wins a tie with a host link.
        let worst = (0..self.capacity.len()).max_by(|&a, &b| {
            let host = |e: usize| matches!(self.graph.edges[e].hop, Hop::HostUp { .. } | Hop::LeafDown { .. });
            let (ua, ub) = (out.link_bytes[a] / self.capacity[a], out.link_bytes[b] / self.capacity[b]);
            let close = (ua - ub).abs() <= 1e-9 * ua.max(ub);
            if close {
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
            seconds,
            algbw,
            busbw: algbw * bus_factor,
            ideal_busbw: ideal,
            share_of_ideal: algbw * bus_factor / ideal,
            steps,
            step_seconds: [seconds / steps as f64, min, max],
            worst_link,
            worst_link_utilization: worst_util,
            flows: self.flows.len(),
            new_flowlets: out.new_flowlets,
            moved_flowlets: out.moved_flowlets,
            slot_collisions: out.slot_collisions,
            te_unfit,
            demoted,
            rounds: out.rounds,
        }
    }
}

/// The group, position and member count a link is the member of.
fn member_of(f: &Fabric, hop: Hop) -> Option<(Group, u32, u32)> {
    match hop {
        Hop::LeafUp { rack, spine, link } => {
            let ups = f.uplinks(rack);
            let p = ups.iter().position(|&u| u == (spine, link))? as u32;
            Some(((Switch::Leaf(rack), Tier::LeafUp, 0), p, ups.len() as u32))
        }
        Hop::SpineUp { spine, agg } => Some(((Switch::Spine(spine), Tier::SpineUp, 0), agg - 1, f.aggs)),
        Hop::AggDown { agg, spine } => {
            let zone = f.zone_of_spine(spine);
            let p = spine - f.spines_of_zone(zone).start();
            Some(((Switch::Agg(agg), Tier::AggDown, zone), p, f.zone_spines()))
        }
        Hop::SpineDown { spine, rack, link } => {
            Some(((Switch::Spine(spine), Tier::SpineDown, rack), link - 1, f.links))
        }
        Hop::HostUp { .. } | Hop::LeafDown { .. } => None,
    }
}

/// What the rounds add up to.
struct Outcome {
    steps: Vec<f64>,
    link_bytes: Vec<f64>,
    new_flowlets: u64,
    moved_flowlets: u64,
    slot_collisions: u64,
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
            rounds: (0, 0),
        }
    }

    fn scale_links(&mut self, by: f64) {
        for b in &mut self.link_bytes {
            *b *= by;
        }
    }
}

/// How long flows that start together take to move `bytes` (0: not in
/// this round) over their paths; adds their bytes to the links.
fn round_time(capacity: &[f64], flows: &Flows, bytes: &[f64], out: &mut Outcome) -> f64 {
    let mut active = Flows::new();
    let mut moved = Vec::new();
    for (k, &b) in bytes.iter().enumerate() {
        if b > 0.0 {
            active.push(flows.path(k).iter().copied());
            moved.push(b);
            for &l in flows.path(k) {
                out.link_bytes[l as usize] += b;
            }
        }
    }
    let Some(&first) = moved.first() else { return 0.0 };
    if moved.iter().all(|&b| b == first) {
        maxmin::equal_completion(capacity, &active, first).0
    } else {
        maxmin::completion(capacity, &active, &moved).makespan
    }
}

/// How long each flow waits after its own `bytes` for the round's last
/// (`round` seconds): the round less its time at its max-min rate; `None`
/// flows (0 bytes) wait for ever. Only whether a wait exceeds `enough`
/// matters, so the max-min rates are computed only when a bound cannot
/// tell: with equal bytes a flow's rate is at least its busiest link's
/// equal share (a link fills at a level no lower than that), so its wait
/// is at least the round less `bytes` at that share, and a flow on the
/// round's busiest link waits exactly 0.
fn waits(capacity: &[f64], flows: &Flows, bytes: &[f64], round: f64, enough: f64) -> Vec<f64> {
    let active: Vec<usize> = (0..bytes.len()).filter(|&k| bytes[k] > 0.0).collect();
    let equal = active.windows(2).all(|w| bytes[w[0]] == bytes[w[1]]);
    let mut wait = vec![f64::INFINITY; bytes.len()];
    let mut undecided = !equal;
    if equal {
        let mut counts = vec![0u32; capacity.len()];
        for &k in &active {
            for &l in flows.path(k) {
                counts[l as usize] += 1;
            }
        }
        for &k in &active {
            let share = flows.path(k).iter().map(|&l| capacity[l as usize] / f64::from(counts[l as usize]));
            let own = bytes[k] / share.fold(f64::INFINITY, f64::min);
            wait[k] = (round - own).max(0.0);
            // Neither on the busiest link nor surely idle long enough.
            undecided |= wait[k] > round * 1e-12 && wait[k] <= enough;
        }
    }
    if undecided {
        let rate = maxmin::max_min_rates(capacity, flows, &active);
        for &k in &active {
            wait[k] = (round - bytes[k] / rate[k]).max(0.0);
        }
    }
    wait
}

/// The rate each QP needs, for TE: its bytes over the time the busiest
/// host link (sending or receiving) needs on an ideal fabric, so that every
/// host link can be full. `qps` are (source, destination, bytes).
pub fn te_demands(qps: impl Iterator<Item = (Host, Host, f64)>, host_link: &f64) -> Vec<Demand> {
    let qps: Vec<(Host, Host, f64)> = qps.collect();
    let mut by_host: HashMap<(Host, bool), f64> = HashMap::new();
    for &(s, d, b) in &qps {
        *by_host.entry((s, true)).or_default() += b;
        *by_host.entry((d, false)).or_default() += b;
    }
    let busiest = by_host.values().copied().fold(0.0, f64::max);
    let seconds = busiest / host_link;
    qps.into_iter()
        .map(|(s, d, b)| Demand { src: Node::Host(s.0, s.1), dst: Node::Host(d.0, d.1), load: b / seconds })
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
    /// `qp x4`, `flowlet-keyed x4 gap 50us`.
    pub fn label(&self) -> String {
        let gap = if self.mode.flowlet() { format!(" gap {}us", self.flowlet_gap_ns / 1000) } else { String::new() };
        format!("{} x{}{gap}", self.mode.name(), self.qps)
    }
}

/// The scorecard's rows: five-tuple ECMP with one QP per connection,
/// E-ECMP (`qp`) with 1, 2, 4 and 8, then pinning, TE, keyed and keyless
/// flowlets at every gap and transport-aware `qp`, each with `qps`.
pub fn scorecard_rows(qps: u32, gaps_ns: &[u64]) -> Vec<Row> {
    let row = |mode, qps, flowlet_gap_ns| Row { mode, qps, flowlet_gap_ns };
    let mut rows = vec![row(Mode::FiveTuple, 1, 0)];
    rows.extend([1, 2, 4, 8].map(|q| row(Mode::Qp, q, 0)));
    rows.extend([row(Mode::Pinned, qps, 0), row(Mode::Te, qps, 0)]);
    for mode in [Mode::FlowletKeyed, Mode::FlowletKeyless] {
        rows.extend(gaps_ns.iter().map(|&g| row(mode, qps, g)));
    }
    rows.push(row(Mode::TransportAware, qps, 0));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{collective::DEFAULT_CHUNK, fabric::SeedPlan};

    const LINK: u64 = 200_000_000;
    /// Bytes per second of a LINK.
    const RATE: f64 = LINK as f64 / 8.0;

    fn fabric(racks: u32, hosts: u32, spines: u32) -> Fabric {
        Fabric {
            racks,
            hosts,
            spines,
            links: 1,
            zones: 1,
            aggs: 0,
            v4: true,
            v6: false,
            hash: HashMode::Qp,
            seeds: SeedPlan::Auto,
        }
    }

    fn setup(fabric: Fabric, op: Op, size: u64, qps: u32, mode: Mode) -> Setup {
        Setup {
            fabric,
            link_bps: LINK,
            v6: false,
            op,
            size,
            qps,
            chunk: DEFAULT_CHUNK,
            placement: Placement::Interleaved,
            mode,
            flowlet_gap_ns: 50_000,
            message_gap_ns: 0,
            flowlet_slots: 4096,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs()
    }

    /// Frame bytes of one full chunk.
    fn chunk_wire() -> f64 {
        transfer_wire_bytes(DEFAULT_CHUNK, DEFAULT_CHUNK, false) as f64
    }

    #[test]
    fn model_ring_on_a_nonblocking_fabric_is_ideal() {
        // Two racks of one host, one spine: each direction of every link
        // carries one connection. 1 MiB per rank: 512 KiB per step, 4
        // chunks, 2 steps, each chunk at the full link rate.
        let p = predict(&setup(fabric(2, 1, 1), Op::Allreduce, 1 << 20, 1, Mode::Qp)).unwrap();
        assert_eq!((p.ranks, p.steps, p.flows), (2, 2, 2));
        assert!(close(p.seconds, 2.0 * 4.0 * chunk_wire() / RATE), "{p:?}");
        assert!(close(p.share_of_ideal, 1.0), "{p:?}");
        // nccl-tests: algbw = size / time, busbw = algbw x 2(n-1)/n = algbw here.
        assert!(close(p.algbw, (1 << 20) as f64 / p.seconds) && close(p.busbw, p.algbw));
        assert!(close(p.worst_link_utilization, 1.0), "every link busy the whole time: {p:?}");
        assert_eq!(p.worst_link, "l1/s1p1", "a switch link wins the tie with the host links");
    }

    /// Per rack, the leaf uplink each QP of its ring connections takes.
    fn uplinks_by_rack(f: &Fabric, qps: u32, mode: HashMode) -> Vec<Vec<u32>> {
        let router = Router::new(f);
        let ranks = place(f.racks, f.hosts, Placement::Interleaved);
        let n = ranks.len();
        let mut out = vec![Vec::new(); f.racks as usize];
        for k in 0..n {
            let (src, dst) = (ranks[k], ranks[(k + 1) % n]);
            for q in 0..qps {
                let key = qp_flow_key(src, dst, qp_number(k, (k + 1) % n, q), false);
                let seed = router.seed(Switch::Leaf(src.0));
                out[src.0 as usize - 1].push(member_for(&even_table(f.spines), member_hash(&key, mode, seed)));
            }
        }
        out
    }

    /// The most QPs one uplink carries.
    fn busiest_uplink(ups: &[Vec<u32>], spines: u32) -> usize {
        ups.iter().flat_map(|rack| (0..spines).map(move |s| rack.iter().filter(|m| **m == s).count())).max().unwrap()
    }

    #[test]
    fn model_five_tuple_collides_where_qp_spreads() {
        // 2 racks x 2 hosts, 2 spines, ring across the racks: each rack
        // sends two connections to the other.
        let f = fabric(2, 2, 2);
        let ups = uplinks_by_rack(&f, 1, HashMode::FiveTuple);
        assert_eq!(
            busiest_uplink(&ups, 2),
            2,
            "five-tuple hashing puts a rack's two connections on one uplink: {ups:?}"
        );
        // The two share the uplink (and the spine's link down): every step
        // takes twice as long as on an ideal fabric.
        let size = 4 << 20;
        let five = predict(&setup(f.clone(), Op::Allreduce, size, 1, Mode::FiveTuple)).unwrap();
        let rounds = (size / 4).div_ceil(DEFAULT_CHUNK) as f64;
        assert!(close(five.seconds, 6.0 * rounds * 2.0 * chunk_wire() / RATE), "{five:?}");
        assert!(close(five.share_of_ideal, 0.5), "{five:?}");
        // qp with 4 QPs: 8 QPs per rack on 2 uplinks, each QP a quarter of
        // the chunks; a step takes as long as the busiest uplink's QPs need.
        let ups = uplinks_by_rack(&f, 4, HashMode::Qp);
        let busiest = busiest_uplink(&ups, 2) as f64;
        let qp = predict(&setup(f.clone(), Op::Allreduce, size, 4, Mode::Qp)).unwrap();
        assert!(close(qp.share_of_ideal, 4.0 / busiest), "{ups:?} {qp:?}");
        assert!(qp.share_of_ideal > five.share_of_ideal, "qp x4 beats five-tuple x1: {qp:?}");
        // Pinning by destination slice and TE place the two apart.
        for mode in [Mode::Pinned, Mode::Te] {
            let p = predict(&setup(f.clone(), Op::Allreduce, size, 1, mode)).unwrap();
            assert!(close(p.share_of_ideal, 1.0), "{mode:?}: {p:?}");
        }
    }

    #[test]
    fn model_all_to_all_and_incast_by_hand() {
        // All-to-all over 2 racks x 2 hosts and one spine: a host sends 3
        // transfers, a leaf's uplink carries 4 (2 hosts x 2 remote peers):
        // the uplink sets the time, 4 transfers against an ideal 3.
        let size = 4 << 20;
        let p = predict(&setup(fabric(2, 2, 1), Op::Alltoall, size, 1, Mode::Qp)).unwrap();
        let transfer = transfer_wire_bytes(size / 4, DEFAULT_CHUNK, false) as f64;
        assert!(close(p.seconds, 4.0 * transfer / RATE), "{p:?}");
        assert!(close(p.share_of_ideal, 0.75), "{p:?}");
        assert_eq!(p.worst_link, "l1/s1p1");
        // Incast of 3 hosts to one: the receiver's link carries 2 transfers
        // of half the size, which is what the ideal fabric allows too.
        let p = predict(&setup(fabric(1, 3, 1), Op::Incast, size, 2, Mode::Qp)).unwrap();
        let transfer = transfer_wire_bytes(size / 2, DEFAULT_CHUNK, false) as f64;
        assert!(close(p.seconds, 2.0 * transfer / RATE), "{p:?}");
        assert!(close(p.share_of_ideal, 1.0), "{p:?}");
        assert_eq!(p.worst_link, "l1/h1");
    }

    #[test]
    fn model_flowlets_move_only_after_an_idle_gap() {
        let f = fabric(2, 2, 2);
        let size = 2 << 20;
        let base = setup(f, Op::Allreduce, size, 1, Mode::FlowletKeyed);
        // 4 connections, 6 steps of 4 chunks: 96 messages.
        let messages = 4 * 6 * 4;
        // A gap longer than any wait: one flowlet per QP for the whole run.
        let long = predict(&Setup { flowlet_gap_ns: 10_000_000_000, ..base.clone() }).unwrap();
        assert_eq!((long.new_flowlets, long.moved_flowlets), (4, 0), "{long:?}");
        // Every message waits longer than the gap (e.g. for a grant): every
        // message is a new flowlet, re-hashed with its flowlet number.
        let every = predict(&Setup { message_gap_ns: 100_000, ..base.clone() }).unwrap();
        assert_eq!(every.new_flowlets, messages, "{every:?}");
        assert!(every.moved_flowlets > 0 && every.moved_flowlets < messages);
        // In between, a QP waits only when its ring neighbour is slower:
        // the slowest never waits and never moves.
        let slack = predict(&base).unwrap();
        assert!(slack.new_flowlets >= 4 && slack.new_flowlets < messages, "{slack:?}");
        assert_eq!(predict(&base).unwrap(), slack, "deterministic");
        // A keyless table of 1 slot: every QP of a round follows the first.
        let one =
            predict(&Setup { mode: Mode::FlowletKeyless, flowlet_slots: 1, message_gap_ns: 100_000, ..base }).unwrap();
        assert!(one.slot_collisions > 0 && one.share_of_ideal <= every.share_of_ideal + 1e-9, "{one:?}");
    }

    #[test]
    fn model_wait_bound_never_exceeds_the_max_min_wait() {
        // Equal bytes on a random network: the bound (enough = 0 decides
        // everything from it) is at most the max-min wait, and both say 0
        // for exactly the flows on the busiest link.
        let mut f = Flows::new();
        let caps = vec![1.0; 9];
        for k in 0..40u32 {
            f.push([k % 9, (k * 4 + 3) % 9].into_iter().collect::<std::collections::BTreeSet<u32>>());
        }
        let bytes = vec![2.0; f.len()];
        let (round, _) = maxmin::equal_completion(&caps, &f, 2.0);
        let bound = waits(&caps, &f, &bytes, round, 0.0);
        let exact = waits(&caps, &f, &bytes, round, f64::INFINITY);
        for k in 0..f.len() {
            assert!(bound[k] <= exact[k] + 1e-12, "flow {k}: {} > {}", bound[k], exact[k]);
            assert_eq!(bound[k] == 0.0, exact[k] == 0.0, "flow {k}");
        }
        assert!(bound.contains(&0.0) && exact.iter().any(|w| *w > 0.0));
    }

    #[test]
    fn model_transport_aware_demotes_busy_members() {
        let f = fabric(2, 2, 2);
        let p = predict(&setup(f, Op::Allreduce, 4 << 20, 1, Mode::TransportAware)).unwrap();
        let qp = predict(&setup(fabric(2, 2, 2), Op::Allreduce, 4 << 20, 1, Mode::Qp)).unwrap();
        // Both of rack 1's connections share an uplink under qp hashing too
        // (that uplink and the spine's link down are demoted); moving both
        // to the other spine cannot help, a group's last member stays.
        assert!(qp.share_of_ideal < 1.0 - 1e-9, "{qp:?}");
        assert!(p.demoted >= 1, "{p:?}");
        assert!(close(p.share_of_ideal, qp.share_of_ideal), "{p:?}");
    }

    #[test]
    fn model_bad_input_is_named() {
        let err = |s: Setup| predict(&s).unwrap_err();
        assert!(err(setup(fabric(1, 1, 1), Op::Allreduce, 1, 1, Mode::Qp)).contains("at least 2 hosts"));
        assert!(err(setup(fabric(2, 1, 1), Op::Allreduce, 0, 1, Mode::Qp)).contains("--size 0"));
        assert!(err(setup(fabric(2, 1, 1), Op::Allreduce, 1, 33, Mode::Qp)).contains("--qps"));
        let big = setup(fabric(100, 32, 4), Op::Alltoall, 1 << 20, 8, Mode::Qp);
        assert!(err(big).contains("more than the model's"));
        let zones = Setup {
            fabric: Fabric { zones: 2, aggs: 2, ..fabric(3, 1, 2) },
            ..setup(fabric(3, 1, 2), Op::Allreduce, 1, 1, Mode::Qp)
        };
        assert!(err(zones).contains("split evenly"));
    }

    #[test]
    fn model_scorecard_rows_cover_every_mode() {
        let rows = scorecard_rows(4, &[50_000, 1_000_000]);
        assert_eq!(rows.len(), 1 + 4 + 2 + 4 + 1);
        assert!(Mode::ALL.iter().all(|m| rows.iter().any(|r| r.mode == *m)));
        assert_eq!(rows[0].label(), "five-tuple x1");
        assert_eq!(rows[7].label(), "flowlet-keyed x4 gap 50us");
    }

    #[test]
    fn model_paper_scale_shapes_are_valid() {
        // 32,768 hosts in 8 zones: addresses and MACs stay distinct past 255 racks.
        let f = Fabric { racks: 2048, hosts: 16, spines: 128, zones: 8, aggs: 16, ..fabric(1, 1, 1) };
        setup(f.clone(), Op::Allreduce, 1 << 30, 4, Mode::Qp).validate().unwrap();
        assert_ne!(Fabric::host_v4(1, 1), Fabric::host_v4(257, 1));
        assert_ne!(f.seed(Switch::Leaf(1)), f.seed(Switch::Leaf(257)));
        assert_ne!(model_qp_number(32768, 1, 2, 0), model_qp_number(32768, 2, 3, 0));
        assert_eq!(model_qp_number(16, 1, 2, 3), qp_number(1, 2, 3), "the lab's numbers at lab scale");
    }
}
