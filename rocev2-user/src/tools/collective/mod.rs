//! Collectives as data: who sends how many bytes to whom, in which
//! dependent steps, split into which messages on which QPs; and the
//! nccl-tests formulas that turn a completion time into algorithm and bus
//! bandwidth. Pure (no I/O): the fabric lab (`rocev2 lab collective`) runs
//! these plans with real packets, and the fabric simulator predicts their
//! completion time from the same plan.
//!
//! - **Ring AllReduce** over n ranks: 2(n-1) steps (n-1 of reduce-scatter,
//!   n-1 of all-gather). In every step each rank sends one n-th of the
//!   buffer to the next rank of the ring, and what it sends in step s is
//!   what it received in step s-1, so the steps depend on each other and
//!   the slowest hop of the ring sets the pace. The dependency is per
//!   message (chunk), as NCCL pipelines it: message m of step s leaves a
//!   rank once message m of step s-1 has arrived there.
//! - **All-to-all**: one step, every rank sends one n-th of its buffer to
//!   every other rank.
//! - **Incast**: one step, every other rank sends its share of `size`
//!   bytes to rank 0 (many-to-one, the congestion case of the transports).
//!
//! Every transfer is split into messages of at most `chunk` bytes (128 KiB
//! by default, NCCL-like), and the messages of a connection go round-robin
//! over its `qps` QPs; each message is one RDMA WRITE of
//! [`packets_of`] packets.

use rocev2_common::{bth::ROCEV2_UDP_PORT, hash::FlowKey};
use serde::{Deserialize, Serialize};

use crate::{control::decision::PacketFields, tools::fabric::Fabric};

pub mod cspf;
pub mod maxmin;
pub mod model;

/// Default message (chunk) size.
pub const DEFAULT_CHUNK: u64 = 128 << 10;
/// RDMA payload bytes per packet (a path MTU of 1024).
pub const MTU_PAYLOAD: u64 = 1024;
/// Frame bytes around the payload of a RoCEv2 packet: Ethernet 14, IPv4
/// 20, UDP 8, BTH 12, ICRC 4 (IPv6: 20 more).
pub const FRAME_OVERHEAD_V4: u64 = 14 + 20 + 8 + 12 + 4;
pub const FRAME_OVERHEAD_V6: u64 = FRAME_OVERHEAD_V4 + 20;
/// The RETH on the first packet of every WRITE message.
pub const RETH_BYTES: u64 = 16;
/// Ranks a plan numbers QPs for (9 bits each for source and destination).
pub const MAX_RANKS: usize = 511;
/// QPs per connection (the QP number keeps 6 bits for it, the last one
/// for the connection's control messages).
pub const MAX_QPS: u32 = 32;

/// Which collective.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Ring AllReduce: 2(n-1) dependent steps around the ring.
    Allreduce,
    /// Every rank to every other rank, one step.
    Alltoall,
    /// Every other rank to rank 0, one step.
    Incast,
}

impl Op {
    /// Bus bandwidth over algorithm bandwidth (nccl-tests,
    /// doc/PERFORMANCE.md): what each rank's link carries per byte of
    /// `size`, so that the bus bandwidth of a perfect fabric is the link
    /// rate whatever n is. AllReduce 2(n-1)/n, all-to-all (n-1)/n; an
    /// incast's receiver link carries all of `size`: 1.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Alltoall => (n - 1.0) / n,
            Op::Incast => 1.0,
        }
    }

    /// Steps of the collective over `n` ranks: 2(n-1) for the ring, 1 otherwise.
    pub fn steps(self, n: usize) -> usize {
        match self {
            Op::Allreduce => 2 * (n - 1),
            Op::Alltoall | Op::Incast => 1,
        }
    }

    /// The transfers of every step (the ring's steps are all alike) over
    /// `n` ranks, for `size` bytes per rank.
    pub fn step_transfers(self, n: usize, size: u64) -> Vec<Transfer> {
        let bytes = self.transfer_bytes(n, size);
        match self {
            Op::Allreduce => (0..n).map(|k| Transfer { src: k, dst: (k + 1) % n, bytes }).collect(),
            Op::Alltoall => (0..n)
                .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| Transfer { src: s, dst: d, bytes }))
                .collect(),
            Op::Incast => (1..n).map(|s| Transfer { src: s, dst: 0, bytes }).collect(),
        }
    }

    /// The bytes of each transfer (all of a collective's are alike): one
    /// n-th of `size`, or for an incast one (n-1)-th.
    pub fn transfer_bytes(self, n: usize, size: u64) -> u64 {
        match self {
            Op::Allreduce | Op::Alltoall => size.div_ceil(n as u64),
            Op::Incast => size.div_ceil(n.saturating_sub(1).max(1) as u64),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Alltoall => "alltoall",
            Op::Incast => "incast",
        }
    }
}

/// How ranks are placed on the fabric's hosts (the ring follows rank order).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Rank k on host k / racks + 1 of rack k % racks + 1: consecutive
    /// ranks sit in different racks, so every ring hop crosses the fabric
    /// (a job scattered over a fragmented cluster).
    #[default]
    Interleaved,
    /// Ranks fill rack 1, then rack 2, ...: only the last rank of each rack
    /// sends across the fabric (a topology-aware ring on whole racks).
    RackMajor,
}

/// A host of the fabric: (rack, host index), both from 1.
pub type Host = (u32, u32);

/// The hosts in rank order.
pub fn place(racks: u32, hosts: u32, placement: Placement) -> Vec<Host> {
    match placement {
        Placement::Interleaved => (1..=hosts).flat_map(|i| (1..=racks).map(move |r| (r, i))).collect(),
        Placement::RackMajor => (1..=racks).flat_map(|r| (1..=hosts).map(move |i| (r, i))).collect(),
    }
}

/// `bytes` from rank `src` to rank `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub src: usize,
    pub dst: usize,
    pub bytes: u64,
}

/// One step: transfers that may run at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub transfers: Vec<Transfer>,
}

/// One message of a transfer: the unit of a WRITE, of a dependency and of
/// a CTS grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub step: usize,
    /// Index among its transfer's messages.
    pub index: usize,
    pub bytes: u64,
    /// The connection QP (0..qps) that carries it.
    pub qp: u32,
}

/// A collective over ranks placed on hosts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub op: Op,
    /// Bytes per rank (nccl-tests' size: the buffer each rank reduces or exchanges).
    pub size: u64,
    /// Hosts in rank order.
    pub ranks: Vec<Host>,
    pub qps: u32,
    pub chunk: u64,
    pub steps: Vec<Step>,
}

impl Plan {
    /// The plan of `op` over `ranks`; errors name the option to change.
    pub fn new(op: Op, size: u64, ranks: Vec<Host>, qps: u32, chunk: u64) -> Result<Self, String> {
        let n = ranks.len();
        if n < 2 {
            return Err(format!("{} needs at least 2 hosts, the fabric has {n}", op.name()));
        }
        if n > MAX_RANKS {
            return Err(format!("{n} ranks are more than the {MAX_RANKS} a plan numbers QPs for"));
        }
        if size == 0 {
            return Err("--size 0 moves nothing; give a size such as 64m".into());
        }
        if !(1..=MAX_QPS).contains(&qps) {
            return Err(format!("--qps must be 1..={MAX_QPS}, not {qps}"));
        }
        if chunk < MTU_PAYLOAD {
            return Err(format!("--chunk {chunk} is smaller than one packet's {MTU_PAYLOAD} bytes"));
        }
        let steps = vec![Step { transfers: op.step_transfers(n, size) }; op.steps(n)];
        Ok(Self { op, size, ranks, qps, chunk, steps })
    }

    pub fn n(&self) -> usize {
        self.ranks.len()
    }

    /// The messages of one transfer, in the order they are posted.
    pub fn messages(&self, step: usize, t: &Transfer) -> Vec<Message> {
        let count = t.bytes.div_ceil(self.chunk) as usize;
        (0..count)
            .map(|index| Message {
                step,
                index,
                bytes: (t.bytes - index as u64 * self.chunk).min(self.chunk),
                qp: (index % self.qps as usize) as u32,
            })
            .collect()
    }

    /// The bytes each (source rank, destination rank, QP) carries over the
    /// whole collective: `lab te`'s traffic matrix.
    pub fn traffic_matrix(&self) -> std::collections::BTreeMap<(usize, usize, u32), u64> {
        let mut m = std::collections::BTreeMap::new();
        for (s, step) in self.steps.iter().enumerate() {
            for t in &step.transfers {
                for msg in self.messages(s, t) {
                    *m.entry((t.src, t.dst, msg.qp)).or_default() += msg.bytes;
                }
            }
        }
        m
    }

    /// Every message the connection `src -> dst` carries on its QP `qp`,
    /// in the order of that QP's PSNs (step by step).
    pub fn qp_sequence(&self, src: usize, dst: usize, qp: u32) -> Vec<Message> {
        let mut out = Vec::new();
        for (s, step) in self.steps.iter().enumerate() {
            for t in step.transfers.iter().filter(|t| t.src == src && t.dst == dst) {
                out.extend(self.messages(s, t).into_iter().filter(|m| m.qp == qp));
            }
        }
        out
    }

    /// The connections (src, dst) of the whole collective.
    pub fn connections(&self) -> Vec<(usize, usize)> {
        let mut c: Vec<(usize, usize)> =
            self.steps.iter().flat_map(|s| s.transfers.iter().map(|t| (t.src, t.dst))).collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// What must have arrived at `m`'s sender before `m` may leave:
    /// the same message of the previous step (ring AllReduce), from the
    /// sender's ring predecessor.
    pub fn depends_on(&self, src: usize, m: &Message) -> Option<(usize, Message)> {
        if self.op != Op::Allreduce || m.step == 0 {
            return None;
        }
        let pred = (src + self.n() - 1) % self.n();
        let t = self.steps[m.step - 1].transfers.iter().find(|t| t.dst == src)?;
        let prev = self.messages(m.step - 1, t).into_iter().nth(m.index)?;
        Some((pred, prev))
    }

    /// Payload bytes each rank sends (the busiest rank's, for an incast's receiver: what it receives).
    pub fn bytes_per_rank(&self) -> u64 {
        let mut sent = vec![0u64; self.n()];
        let mut received = vec![0u64; self.n()];
        for t in self.steps.iter().flat_map(|s| &s.transfers) {
            sent[t.src] += t.bytes;
            received[t.dst] += t.bytes;
        }
        sent.into_iter().chain(received).max().unwrap_or(0)
    }

    /// Algorithm bandwidth (bytes/s): `size` over the completion time.
    pub fn algbw(&self, seconds: f64) -> f64 {
        self.size as f64 / seconds
    }

    /// Bus bandwidth (bytes/s): algorithm bandwidth times the bus factor.
    pub fn busbw(&self, seconds: f64) -> f64 {
        self.algbw(seconds) * self.op.bus_factor(self.n())
    }

    /// Bus bandwidth on an ideal non-blocking fabric with the same host
    /// links: every host link busy the whole time, so the link's payload
    /// rate (its rate less the frame overhead of [`packets_of`]).
    pub fn ideal_busbw(&self, link_bps: u64, v6: bool) -> f64 {
        ideal_busbw(self.op, self.n(), self.size, self.chunk, link_bps, v6)
    }

    /// Completion time on the ideal fabric of [`Plan::ideal_busbw`].
    pub fn ideal_seconds(&self, link_bps: u64, v6: bool) -> f64 {
        self.size as f64 * self.op.bus_factor(self.n()) / self.ideal_busbw(link_bps, v6)
    }

    /// Data packets the whole collective sends (without retransmissions).
    pub fn packets(&self) -> u64 {
        self.steps
            .iter()
            .enumerate()
            .flat_map(|(s, step)| step.transfers.iter().map(move |t| (s, t)))
            .flat_map(|(s, t)| self.messages(s, t))
            .map(|m| packets_of(m.bytes))
            .sum()
    }
}

/// Packets of a message of `bytes` (a path MTU of [`MTU_PAYLOAD`]).
pub fn packets_of(bytes: u64) -> u64 {
    bytes.div_ceil(MTU_PAYLOAD).max(1)
}

/// Frame bytes a message of `bytes` puts on a link.
pub fn wire_bytes(bytes: u64, v6: bool) -> u64 {
    let overhead = if v6 { FRAME_OVERHEAD_V6 } else { FRAME_OVERHEAD_V4 };
    bytes + packets_of(bytes) * overhead + RETH_BYTES
}

/// Bus bandwidth (bytes/s) on an ideal non-blocking fabric whose host
/// links run at `link_bps` (frame bits per second): every host link busy
/// the whole time, so its payload rate. A collective's transfers all have
/// one size, so this is the link's byte rate times one transfer's payload
/// over its frame bytes.
pub fn ideal_busbw(op: Op, n: usize, size: u64, chunk: u64, link_bps: u64, v6: bool) -> f64 {
    let bytes = op.transfer_bytes(n, size);
    link_bps as f64 / 8.0 * bytes as f64 / transfer_wire_bytes(bytes, chunk, v6).max(1) as f64
}

/// Frame bytes a transfer of `bytes` puts on a link, in messages of at
/// most `chunk` bytes.
pub fn transfer_wire_bytes(bytes: u64, chunk: u64, v6: bool) -> u64 {
    let (full, last) = (bytes / chunk, bytes % chunk);
    full * wire_bytes(chunk, v6) + if last > 0 { wire_bytes(last, v6) } else { 0 }
}

/// The UDP source port the lab's RC endpoints give QP number `qpn`: the
/// Linux/NIC derivation from both QP numbers, which are equal because both
/// ends number a QP alike ([`qp_number`]).
pub fn qp_source_port(qpn: u32) -> u16 {
    crate::tools::gen::nic_sport(qpn, qpn)
}

/// The flow key every switch hashes for the data packets of QP number
/// `qpn` from host `src` to host `dst` (the fabric's addresses, the
/// RoCEv2 port, the QP's source port and DestQP): what the simulator
/// places and what the lab's endpoints send.
pub fn qp_flow_key(src: Host, dst: Host, qpn: u32, v6: bool) -> FlowKey {
    let fields = PacketFields {
        src: Fabric::host_addr(src.0, src.1, v6),
        dst: Fabric::host_addr(dst.0, dst.1, v6),
        protocol: 17,
        src_port: qp_source_port(qpn),
        dst_port: ROCEV2_UDP_PORT,
        dest_qp: Some(qpn),
    };
    fields.flow_key().expect("both addresses are of one family")
}

/// The 24-bit QP number of QP `q` of the connection `src -> dst` (ranks):
/// source rank in bits 23..15, destination rank in 14..6, the QP below.
/// Both ends number it alike, as `gen` and `sink --rc` do.
pub fn qp_number(src: usize, dst: usize, q: u32) -> u32 {
    ((src as u32) << 15) | ((dst as u32) << 6) | (q & 0x3F)
}

/// The QP number the connection `src -> dst` uses for its RTS/CTS control
/// messages (its own PSN sequence, apart from the data's).
pub fn control_qp_number(src: usize, dst: usize) -> u32 {
    qp_number(src, dst, 0x3F)
}

/// The (src, dst, q) of a QP number made by [`qp_number`].
pub fn split_qp_number(qp: u32) -> (usize, usize, u32) {
    (((qp >> 15) & 0x1FF) as usize, ((qp >> 6) & 0x1FF) as usize, qp & 0x3F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_ring_allreduce_has_2n_minus_2_dependent_steps() {
        let ranks = place(2, 2, Placement::Interleaved);
        assert_eq!(ranks, [(1, 1), (2, 1), (1, 2), (2, 2)]);
        let p = Plan::new(Op::Allreduce, 1 << 20, ranks, 4, DEFAULT_CHUNK).unwrap();
        assert_eq!(p.steps.len(), 6);
        assert!(p.steps.iter().all(|s| s.transfers.len() == 4 && s.transfers.iter().all(|t| t.bytes == 256 << 10)));
        assert_eq!(p.connections(), [(0, 1), (1, 2), (2, 3), (3, 0)]);
        let t = p.steps[1].transfers[2];
        let m = p.messages(1, &t);
        assert_eq!(m.len(), 2);
        assert_eq!((m[1].qp, m[1].bytes), (1, 128 << 10));
        // Message 1 of step 1 from rank 2 waits for message 1 of step 0 from rank 1.
        let (from, dep) = p.depends_on(2, &m[1]).unwrap();
        assert_eq!((from, dep.step, dep.index), (1, 0, 1));
        assert!(p.depends_on(2, &p.messages(0, &t)[0]).is_none());
        // QP 1 of 2 -> 3 carries message 1 of every step.
        let seq = p.qp_sequence(2, 3, 1);
        assert_eq!(seq.len(), 6);
        assert!(seq.iter().enumerate().all(|(s, m)| m.step == s && m.index == 1));
        assert_eq!(p.packets(), 6 * 4 * 256);
    }

    #[test]
    fn collective_bus_bandwidth_follows_nccl_tests() {
        let ranks = place(4, 4, Placement::RackMajor);
        assert_eq!(ranks[4], (2, 1));
        let p = Plan::new(Op::Allreduce, 64 << 20, ranks.clone(), 1, DEFAULT_CHUNK).unwrap();
        assert_eq!(p.steps.len(), 30);
        let secs = 2.0;
        assert!((p.algbw(secs) - (32 << 20) as f64).abs() < 1e-6);
        assert!((p.busbw(secs) - (32 << 20) as f64 * 2.0 * 15.0 / 16.0).abs() < 1e-3);
        // The ideal fabric: every host link busy with payload the whole time.
        let ideal = p.ideal_busbw(20_000_000, false);
        let expect = 2.5e6 * 131072.0 / (131072.0 + 128.0 * 58.0 + 16.0);
        assert!((ideal - expect).abs() < 1e-6, "{ideal} {expect}");
        assert!((p.busbw(p.ideal_seconds(20_000_000, false)) - ideal).abs() < 1e-6);
        let a = Plan::new(Op::Alltoall, 64 << 20, ranks.clone(), 1, DEFAULT_CHUNK).unwrap();
        assert_eq!(a.steps[0].transfers.len(), 16 * 15);
        assert!((a.op.bus_factor(16) - 15.0 / 16.0).abs() < 1e-12);
        let i = Plan::new(Op::Incast, 3 << 20, ranks[..4].to_vec(), 1, DEFAULT_CHUNK).unwrap();
        assert!(i.steps[0].transfers.iter().all(|t| t.dst == 0 && t.bytes == 1 << 20));
        assert_eq!(i.bytes_per_rank(), 3 << 20);
    }

    #[test]
    fn collective_bad_input_is_named() {
        let e = Plan::new(Op::Allreduce, 1 << 20, vec![(1, 1)], 1, DEFAULT_CHUNK).unwrap_err();
        assert!(e.contains("at least 2 hosts"), "{e}");
        let e = Plan::new(Op::Allreduce, 0, place(2, 1, Placement::Interleaved), 1, DEFAULT_CHUNK).unwrap_err();
        assert!(e.contains("--size 0"), "{e}");
        let e = Plan::new(Op::Alltoall, 1, place(2, 1, Placement::Interleaved), 33, DEFAULT_CHUNK).unwrap_err();
        assert!(e.contains("--qps"), "{e}");
    }

    #[test]
    fn collective_qp_numbers_round_trip() {
        for (s, d, q) in [(0, 1, 0), (510, 3, 31), (7, 509, 63)] {
            assert_eq!(split_qp_number(qp_number(s, d, q)), (s, d, q));
            assert!(qp_number(s, d, q) <= 0xFF_FFFF);
        }
        assert_ne!(control_qp_number(1, 2), qp_number(1, 2, 0));
    }

    #[test]
    fn collective_qp_flow_key_is_what_the_endpoints_send() {
        let qpn = qp_number(3, 4, 2);
        let key = qp_flow_key((1, 2), (2, 2), qpn, false);
        let expect = FlowKey::v4([10, 1, 2, 1], [10, 2, 2, 1], 17, crate::tools::gen::nic_sport(qpn, qpn), 4791)
            .with_dest_qp(qpn);
        assert_eq!(key, expect);
        assert!(qp_source_port(qpn) >= 0xC000);
        // A transfer's frames: 2 full chunks and a 1-byte tail.
        let t = transfer_wire_bytes(2 * DEFAULT_CHUNK + 1, DEFAULT_CHUNK, false);
        assert_eq!(t, 2 * (DEFAULT_CHUNK + 128 * 58 + 16) + (1 + 58 + 16));
    }
}
