//! `rocev2 gen`: a RoCEv2 traffic generator.
//!
//! No Soft-RoCE here and no RDMA NIC in the labs, so the dataplane's tests,
//! benchmarks and demos need frames that look like a real NIC's: RC WRITE
//! messages (FIRST/MIDDLE.../LAST with consecutive 24-bit PSNs per QP and
//! AckReq on the last packet), ACKs with an AETH, CNPs, small WRITE-with-
//! immediate control messages, per-QP UDP source ports the way NICs pick
//! them, and every frame with a correct ICRC.
//!
//! Frames are built once (one *pass*: every QP's unit of traffic, packets
//! round-robin over the QPs) by [`crate::tools::packet::build_roce_frame`]. Sending
//! more than one pass re-sends the same buffers with the PSN (and an ACK's
//! MSN) advanced in place; only the ICRC (and, on IPv6, the UDP checksum)
//! is recomputed, from a CRC state cached up to the PSN, so the send loop
//! never allocates.
//!
//! Two ways out of the box:
//! - `packet`: an AF_PACKET socket, one `send` per frame. The kernel treats
//!   the frames like any received traffic, so this is the generator for
//!   measuring kernel forwarding.
//! - `live-frames`: `BPF_PROG_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES` on the
//!   tools object's XDP_TX program: the kernel runs the program `repeat` times
//!   on copies of one frame and transmits each copy out of `--dev` through
//!   the XDP path, without a socket or the stack. Far higher rates, but each
//!   call repeats one frame (so one PSN), and on a veth the peer must have
//!   NAPI (GRO on, or an XDP program) or the frames are dropped. With
//!   `--rate` the frames go out in calls of `--live-repeat` frames, each
//!   at its due time (see `Pacer`).
//!
//! Every BPF_PROG_RUN call with a repeat count registers its program in the
//! kernel's XDP dispatcher and removes it again afterwards, two RCU grace
//! periods (about 25 ms per call on a busy 2-CPU machine): a flat-out
//! stream had a 25 ms hole after every call, and a paced one could make
//! only ~40 calls a second. Live-frames mode therefore keeps the program
//! registered for the whole run by attaching it to a private veth pair
//! that stays down (nothing ever arrives there), created in the current
//! network namespace and removed at the end; calls then cost microseconds.
//!
//! On a veth, the receiving side's NAPI runs on the CPU that transmitted:
//! a live-frames sender does the switch's forwarding inline, one batch at
//! a time. `--cpu` pins the sender so it never migrates away from a NAPI
//! it left pending on another CPU (which then overflows the 256-frame veth
//! ring while that CPU is busy elsewhere; see the high-rate test).

use rocev2_common::rng::splitmix64;
use std::{
    net::IpAddr,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use aya::{TestRun as _, TestRunAttrs, TestRunOptions};
use clap::ValueEnum;
use rocev2_common::{
    bth::{opcode, Bth, BTH_LEN, ICRC_LEN},
    checksum,
};
use serde::Serialize;

use crate::{
    sys::rawsock::PacketSocket,
    sys::signals::SigintGuard,
    tools::packet::{build_roce_frame, RoceFrameSpec},
    tools::programs::{ToolPrograms, XDP_TX_PROGRAM},
};

/// PSNs and MSNs are 24 bits and wrap.
pub use rocev2_common::bth::PSN_MASK;
/// RDMA Extended Transport Header: virtual address, R_Key, DMA length.
pub const RETH_LEN: usize = 16;
/// ACK Extended Transport Header: syndrome + 24-bit MSN.
pub const AETH_LEN: usize = rocev2_common::bth::aeth::LEN;
/// Immediate data of a WRITE with immediate.
pub const IMM_LEN: usize = 4;
/// A CNP carries 16 reserved bytes after its BTH.
pub const CNP_RESERVED_LEN: usize = 16;
/// AETH syndrome of a plain ACK: bits 7..5 = 000 (ACK), credit count 0x1F
/// ("invalid": end-to-end flow control not used), as NICs commonly send.
pub const AETH_ACK_SYNDROME: u8 = rocev2_common::bth::aeth::ACK;
/// Frames are sent with this TTL / hop limit.
pub const GEN_TTL: u8 = 64;
/// Packets per token-bucket burst in rate-limited mode.
const BURST: u64 = 32;
/// Frames per XDP batch in live-frames mode (the kernel's default is 64,
/// its maximum 256).
const LIVE_BATCH: u32 = 64;

/// How each QP's UDP source port is chosen (fixed per QP in every model,
/// as NICs do).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SportModel {
    /// Every QP uses one port (`gen --sport-value`, default 49152): the
    /// worst case for five-tuple ECMP.
    Fixed,
    /// The Linux/NIC formula: a port per QP, from the QP numbers.
    Nic,
    /// A seeded pseudo-random port per QP in 0xC000-0xFFFF.
    Random,
}

/// What each QP sends per pass.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrafficKind {
    /// One RDMA WRITE message of `--message-packets` packets.
    Write,
    /// One RC ACK (opcode 0x11 + AETH).
    Ack,
    /// One CNP (opcode 0x81, BECN, 16 reserved bytes, PSN 0).
    Cnp,
    /// One zero-length WRITE_ONLY with immediate: a small control message
    /// such as a clear-to-send.
    Cts,
    /// A WRITE message, then a CTS, then an ACK.
    Mix,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EcnArg {
    /// 00: not ECN-capable (never marked).
    NotEct,
    /// 10: ECN-capable, as RoCE NICs send.
    Ect0,
    /// 01: ECN-capable.
    Ect1,
    /// 11: congestion experienced (already marked).
    Ce,
}

impl EcnArg {
    /// The 2-bit codepoint: 00 Not-ECT, 10 ECT(0), 01 ECT(1), 11 CE.
    pub fn codepoint(self) -> u8 {
        match self {
            EcnArg::NotEct => 0,
            EcnArg::Ect0 => 2,
            EcnArg::Ect1 => 1,
            EcnArg::Ce => 3,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GenMode {
    /// AF_PACKET: frames the kernel stack accepts like received traffic.
    Packet,
    /// BPF_PROG_RUN live frames through the XDP_TX program (high rate).
    LiveFrames,
}

/// `rocev2 gen`: send RoCEv2 traffic out of one interface.
#[derive(clap::Args, Debug, Clone)]
pub struct GenArgs {
    /// Egress interface.
    #[arg(long)]
    pub dev: String,
    /// The next hop's MAC (e.g. the switch port), aa:bb:cc:dd:ee:ff.
    #[arg(long)]
    pub dst_mac: String,
    /// Source MAC; default: the device's own.
    #[arg(long)]
    pub src_mac: Option<String>,
    /// Source IP address (IPv4 or IPv6) of the packets.
    #[arg(long)]
    pub src: IpAddr,
    /// Destination IP address, of the same family as --src.
    #[arg(long)]
    pub dst: IpAddr,
    /// Number of QPs; packets go round-robin over them.
    #[arg(long, default_value_t = 1)]
    pub qps: u32,
    /// Destination QP number of the first QP; the others follow.
    #[arg(long, default_value_t = 0x100)]
    pub first_qp: u32,
    /// UDP source port model.
    #[arg(long, value_enum, default_value = "fixed")]
    pub sport: SportModel,
    /// The source port of `--sport fixed`.
    #[arg(long, default_value_t = 0xC000)]
    pub sport_value: u16,
    /// Seed of `--sport random`.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Packets per WRITE message (1 = WRITE_ONLY).
    #[arg(long, default_value_t = 4)]
    pub message_packets: u32,
    /// RDMA data bytes per WRITE packet (the path MTU's worth); WRITE
    /// FIRST/ONLY also carry a 16-byte RETH.
    #[arg(long, default_value_t = 1024)]
    pub payload: usize,
    /// First PSN of every QP (24 bits; PSNs wrap).
    #[arg(long, default_value_t = 0)]
    pub first_psn: u32,
    /// What each QP sends per pass.
    #[arg(long, value_enum, default_value = "write")]
    pub traffic: TrafficKind,
    /// The ECN codepoint of every packet.
    #[arg(long, value_enum, default_value = "ect0")]
    pub ecn: EcnArg,
    /// The DSCP of every packet (26 is the usual RoCE class).
    #[arg(long, default_value_t = 26)]
    pub dscp: u8,
    /// 802.1Q VLAN id.
    #[arg(long)]
    pub vlan: Option<u16>,
    /// Packets per second; default: as fast as possible.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Total packets. Default: one pass (every QP sends one unit: a WRITE
    /// message, an ACK, ...) unless --duration is given, then unlimited.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// How frames are sent.
    #[arg(long, value_enum, default_value = "packet")]
    pub mode: GenMode,
    /// live-frames: how many times each BPF_PROG_RUN call transmits its
    /// frame (copies share one PSN).
    #[arg(long, default_value_t = 64)]
    pub live_repeat: u32,
    /// Pin the sending thread to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Library users: stop sending once this is set (without a count or a
    /// duration, send until then).
    #[arg(skip)]
    pub stop: Option<std::sync::Arc<AtomicBool>>,
    /// Be an RC requester (`sink --rc` is the responder): send
    /// `--messages` WRITE messages per QP with at most `--window` PSNs
    /// unacknowledged, go back to a NAKed PSN, resend after
    /// `--ack-timeout-ms` without progress; report retransmissions and
    /// goodput per QP.
    #[arg(long)]
    pub rc: bool,
    /// --rc: unacknowledged PSNs allowed per QP.
    #[arg(long, default_value_t = 32)]
    pub window: u32,
    /// --rc: WRITE messages each QP delivers.
    #[arg(long, default_value_t = 16)]
    pub messages: u32,
    /// --rc: resend from the oldest unacknowledged PSN after this long
    /// without progress.
    #[arg(long, default_value_t = 100)]
    pub ack_timeout_ms: u64,
    /// --rc: how the requester reacts to congestion: `none`, `dcqcn` (every
    /// QP's rate, from --rate, falls on CNPs and climbs back), `cts` (each
    /// message waits for the receiver's grant; `sink --rc --transport cts`).
    #[arg(long, value_enum, default_value = "none", requires = "rc")]
    pub transport: crate::tools::rc::transport::Transport,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl GenArgs {
    /// Arguments with the CLI defaults, for library users and tests.
    pub fn new(dev: &str, dst_mac: &str, src: IpAddr, dst: IpAddr) -> Self {
        Self {
            dev: dev.to_owned(),
            dst_mac: dst_mac.to_owned(),
            src_mac: None,
            src,
            dst,
            qps: 1,
            first_qp: 0x100,
            sport: SportModel::Fixed,
            sport_value: 0xC000,
            seed: 1,
            message_packets: 4,
            payload: 1024,
            first_psn: 0,
            traffic: TrafficKind::Write,
            ecn: EcnArg::Ect0,
            dscp: 26,
            vlan: None,
            rate: None,
            count: None,
            duration: None,
            mode: GenMode::Packet,
            live_repeat: 64,
            cpu: None,
            stop: None,
            rc: false,
            window: 32,
            messages: 16,
            ack_timeout_ms: 100,
            transport: crate::tools::rc::transport::Transport::None,
            json: false,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.src.is_ipv4() != self.dst.is_ipv4() {
            bail!("--src {} and --dst {} must be of the same IP family", self.src, self.dst);
        }
        if self.qps == 0 {
            bail!("--qps must be at least 1");
        }
        if u64::from(self.first_qp) + u64::from(self.qps) - 1 > u64::from(PSN_MASK) {
            bail!(
                "--first-qp {:#x} + --qps {} goes past the largest QP number {PSN_MASK:#x} (QP numbers are 24 bits)",
                self.first_qp,
                self.qps
            );
        }
        if self.message_packets == 0 {
            bail!("--message-packets must be at least 1");
        }
        if self.first_psn > PSN_MASK {
            bail!("--first-psn {:#x} does not fit in 24 bits", self.first_psn);
        }
        if self.dscp > 63 {
            bail!("--dscp {} does not fit in 6 bits (0-63)", self.dscp);
        }
        if let Some(v) = self.vlan {
            if v == 0 || v >= 4095 {
                bail!("--vlan {v} is not a usable VLAN id (1-4094)");
            }
        }
        // 9216 is the largest jumbo frame anything here carries.
        if self.payload > 9000 {
            bail!("--payload {} is larger than a jumbo frame; use at most 9000", self.payload);
        }
        if self.rate == Some(0) {
            bail!("--rate must be above 0 (leave it out for as fast as possible)");
        }
        if let Some(d) = self.duration {
            if !(d.is_finite() && d > 0.0) {
                bail!("--duration must be a positive number of seconds");
            }
        }
        if self.live_repeat == 0 {
            bail!("--live-repeat must be at least 1");
        }
        if let Some(cpu) = self.cpu {
            if cpu >= libc::CPU_SETSIZE as usize {
                bail!("--cpu {cpu} is out of range; CPUs are numbered from 0 (see `nproc`)");
            }
        }
        Ok(())
    }
}

/// The RETH of a WRITE FIRST/ONLY of `qp` moving `dma_len` bytes: a per-QP
/// buffer address and key (any values do, but a real NIC never sends zeros).
pub fn reth(qp: u32, dma_len: u32) -> [u8; RETH_LEN] {
    let mut r = [0u8; RETH_LEN];
    r[..8].copy_from_slice(&(0x7F00_0000_0000u64 | (u64::from(qp) << 20)).to_be_bytes());
    r[8..12].copy_from_slice(&(0x0010_0000 | qp).to_be_bytes());
    r[12..].copy_from_slice(&dma_len.to_be_bytes());
    r
}

/// The UDP source port a Linux RDMA stack (and NICs following it) derives
/// for a QP: flow label = 20-bit fold of lqpn * rqpn
/// (`rdma_calc_flow_label`), then the high 6 bits folded into the low 14
/// and 0xC000 set (`rdma_flow_label_to_udp_sport`). The generator uses the
/// destination QP for both ends, as when both hosts number their QPs alike.
pub fn nic_sport(local_qpn: u32, remote_qpn: u32) -> u16 {
    rocev2_common::bth::nic_sport(rocev2_common::bth::flow_label(local_qpn, remote_qpn))
}

/// Parses aa:bb:cc:dd:ee:ff (any MAC: a generator may send to a group
/// address on purpose).
pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    crate::sys::parse_mac(s).map_err(anyhow::Error::msg)
}

/// One packet of a QP's per-pass unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// Packet `index` of a WRITE message of `of` packets.
    Write {
        index: u32,
        of: u32,
    },
    Cts,
    Ack,
    Cnp,
}

fn unit(kind: TrafficKind, message_packets: u32) -> Vec<Op> {
    let write = (0..message_packets).map(|index| Op::Write { index, of: message_packets });
    match kind {
        TrafficKind::Write => write.collect(),
        TrafficKind::Ack => vec![Op::Ack],
        TrafficKind::Cnp => vec![Op::Cnp],
        TrafficKind::Cts => vec![Op::Cts],
        TrafficKind::Mix => write.chain([Op::Cts, Op::Ack]).collect(),
    }
}

/// A pre-built frame and how to move it to a later pass.
struct Template {
    frame: Vec<u8>,
    bth_off: usize,
    /// PSN in pass 0 and how far it moves per pass (0 for CNPs).
    psn: u32,
    psn_step: u32,
    /// For ACKs: MSN in pass 0 and its step per pass.
    msn: Option<(u32, u32)>,
    /// The pass the frame's bytes currently carry.
    pass: u64,
    /// CRC state over the ICRC's masked input up to (not including) the PSN,
    /// which never changes between passes.
    icrc_prefix: crc32fast::Hasher,
    /// IPv6 only: UDP header offset and the ones'-complement sum of the
    /// pseudo-header plus the first 16 UDP bytes (checksum field as 0).
    udp6: Option<(usize, u32)>,
}

impl Template {
    /// `frame` is a complete frame from `build_roce_frame` whose bytes after
    /// the BTH may have been overwritten: computes the cached state and
    /// fixes ICRC and checksum.
    fn new(frame: Vec<u8>, ip_off: usize, ipv6: bool, psn: u32, psn_step: u32, msn: Option<(u32, u32)>) -> Self {
        let udp_off = ip_off + if ipv6 { 40 } else { 20 };
        let bth_off = udp_off + 8;
        // The ICRC input (RoCEv2 annex A17): 8 bytes of ones, then IP header, UDP
        // header and BTH with the variant fields set to ones.
        let mut masked = frame[ip_off..bth_off + 9].to_vec();
        if ipv6 {
            masked[0] |= 0x0F; // traffic class, high nibble
            masked[1..4].fill(0xFF); // traffic class low nibble + flow label
            masked[7] = 0xFF; // hop limit
        } else {
            masked[1] = 0xFF; // TOS
            masked[8] = 0xFF; // TTL
            masked[10..12].fill(0xFF); // header checksum
        }
        let u = udp_off - ip_off;
        masked[u + 6..u + 8].fill(0xFF); // UDP checksum
        masked[u + 8 + 4] = 0xFF; // BTH FECN/BECN/reserved
        let mut icrc_prefix = crc32fast::Hasher::new();
        icrc_prefix.update(&[0xFF; 8]);
        icrc_prefix.update(&masked);

        let udp6 = ipv6.then(|| {
            let udp_len = frame.len() - udp_off;
            let mut pseudo = frame[ip_off + 8..ip_off + 40].to_vec(); // addresses
            pseudo.extend_from_slice(&(udp_len as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 17]);
            pseudo.extend_from_slice(&frame[udp_off..udp_off + 6]);
            pseudo.extend_from_slice(&frame[udp_off + 8..udp_off + 16]);
            (udp_off, checksum::word_sum(&pseudo))
        });
        let mut t = Template { frame, bth_off, psn, psn_step, msn, pass: 0, icrc_prefix, udp6 };
        t.seal();
        t
    }

    /// Recomputes the ICRC, then (IPv6) the UDP checksum, which covers it.
    fn seal(&mut self) {
        let end = self.frame.len();
        let mut h = self.icrc_prefix.clone();
        h.update(&self.frame[self.bth_off + 9..end - ICRC_LEN]);
        self.frame[end - ICRC_LEN..].copy_from_slice(&h.finalize().to_le_bytes());
        if let Some((udp_off, prefix)) = self.udp6 {
            let sum = !checksum::fold(prefix + checksum::word_sum(&self.frame[udp_off + 16..]));
            // 0 means "no checksum", which IPv6 does not allow.
            let sum = if sum == 0 { 0xFFFF } else { sum };
            self.frame[udp_off + 6..udp_off + 8].copy_from_slice(&sum.to_be_bytes());
        }
    }

    /// The frame as pass `pass` sends it.
    fn at_pass(&mut self, pass: u64) -> &[u8] {
        if pass != self.pass && (self.psn_step != 0 || self.msn.is_some()) {
            // Pass numbers matter only modulo 2^24 (times any step).
            let p = pass & u64::from(PSN_MASK);
            let psn = ((u64::from(self.psn) + p * u64::from(self.psn_step)) & u64::from(PSN_MASK)) as u32;
            self.frame[self.bth_off + 9..self.bth_off + 12].copy_from_slice(&psn.to_be_bytes()[1..]);
            if let Some((msn, step)) = self.msn {
                let msn = ((u64::from(msn) + p * u64::from(step)) & u64::from(PSN_MASK)) as u32;
                let at = self.bth_off + BTH_LEN + 1;
                self.frame[at..at + 3].copy_from_slice(&msn.to_be_bytes()[1..]);
            }
            self.seal();
        }
        self.pass = pass;
        &self.frame
    }
}

/// The generator's frames: one pass pre-built, later passes derived in
/// place. Frame `i` of the stream is pass `i / pass_len`, slot `i % pass_len`.
pub struct FrameSource {
    templates: Vec<Template>,
}

impl FrameSource {
    /// Builds one pass for `args` with source MAC `src_mac`.
    pub fn new(args: &GenArgs, src_mac: [u8; 6]) -> Result<Self> {
        args.validate()?;
        let dst_mac = parse_mac(&args.dst_mac).context("--dst-mac")?;
        let ops = unit(args.traffic, args.message_packets);
        let ipv6 = args.src.is_ipv6();
        let ip_off = 14 + if args.vlan.is_some() { 4 } else { 0 };

        // How far each QP's request PSN and MSN move per pass.
        let psn_step = ops.iter().filter(|op| matches!(op, Op::Write { .. } | Op::Cts | Op::Ack)).count() as u32
            - u32::from(args.traffic == TrafficKind::Mix); // mix: the ACK acks the CTS, no PSN of its own
        let msn_step = ops.iter().filter(|op| matches!(op, Op::Write { index: 0, .. } | Op::Cts | Op::Ack)).count()
            as u32
            - u32::from(args.traffic == TrafficKind::Mix);

        let mut rng = args.seed;
        let sports: Vec<u16> = (0..args.qps)
            .map(|q| {
                let qp = args.first_qp + q;
                match args.sport {
                    SportModel::Fixed => args.sport_value,
                    SportModel::Nic => nic_sport(qp, qp),
                    SportModel::Random => 0xC000 | (splitmix64(&mut rng) as u16 & 0x3FFF),
                }
            })
            .collect();

        // Per QP: the next request PSN and the number of completed messages.
        let mut next_psn = vec![args.first_psn; args.qps as usize];
        let mut msn = vec![0u32; args.qps as usize];
        let mut templates = Vec::with_capacity(ops.len() * args.qps as usize);
        for op in &ops {
            for q in 0..args.qps as usize {
                let qp = args.first_qp + q as u32;
                let mut bth = Bth::new(0, qp, next_psn[q]);
                let message_bytes = u64::from(args.message_packets) * args.payload as u64;
                let reth = |dma_len: u32| reth(qp, dma_len);
                let (ext, data_len, psn_advance, msn_field): (Vec<u8>, usize, bool, bool) = match *op {
                    Op::Write { index, of } => {
                        bth.opcode = match (index, of) {
                            (_, 1) => opcode::WRITE_ONLY,
                            (0, _) => opcode::WRITE_FIRST,
                            (i, n) if i == n - 1 => opcode::WRITE_LAST,
                            _ => opcode::WRITE_MIDDLE,
                        };
                        bth.ack_req = index == of - 1;
                        if index == of - 1 {
                            msn[q] = (msn[q] + 1) & PSN_MASK;
                        }
                        let ext = if index == 0 {
                            reth(message_bytes.min(u64::from(u32::MAX)) as u32).to_vec()
                        } else {
                            Vec::new()
                        };
                        (ext, args.payload, true, false)
                    }
                    Op::Cts => {
                        bth.opcode = opcode::WRITE_ONLY_IMM;
                        bth.ack_req = true;
                        msn[q] = (msn[q] + 1) & PSN_MASK;
                        let mut ext = reth(0).to_vec();
                        ext.extend_from_slice(&(0xC75_0000 | qp).to_be_bytes()); // immediate data
                        (ext, 0, true, false)
                    }
                    Op::Ack => {
                        bth.opcode = opcode::ACK;
                        let acked = if args.traffic == TrafficKind::Mix {
                            // Acknowledges everything so far (coalesced ACK).
                            next_psn[q].wrapping_sub(1) & PSN_MASK
                        } else {
                            msn[q] = (msn[q] + 1) & PSN_MASK;
                            next_psn[q]
                        };
                        bth.psn = acked;
                        let mut aeth = vec![AETH_ACK_SYNDROME];
                        aeth.extend_from_slice(&msn[q].to_be_bytes()[1..]);
                        (aeth, 0, args.traffic != TrafficKind::Mix, true)
                    }
                    Op::Cnp => {
                        bth.opcode = opcode::CNP;
                        bth.becn = true;
                        bth.psn = 0;
                        (vec![0; CNP_RESERVED_LEN], 0, false, false)
                    }
                };
                if psn_advance {
                    next_psn[q] = (next_psn[q] + 1) & PSN_MASK;
                }
                let spec = RoceFrameSpec {
                    src_mac,
                    dst_mac,
                    vlan: args.vlan,
                    src_ip: args.src,
                    dst_ip: args.dst,
                    ttl: GEN_TTL,
                    dscp: args.dscp,
                    ecn: args.ecn.codepoint(),
                    src_port: sports[q],
                    bth,
                    payload_len: ext.len() + data_len,
                };
                // build_roce_frame gets lengths, pad and IP checksum right
                // and fills the payload with its pattern; the extension
                // header goes over the pattern's first bytes and the ICRC
                // is redone by Template::new.
                let mut frame = build_roce_frame(&spec);
                let bth_off = ip_off + if ipv6 { 40 } else { 20 } + 8;
                frame[bth_off + BTH_LEN..bth_off + BTH_LEN + ext.len()].copy_from_slice(&ext);
                let psn_step = if bth.opcode == opcode::CNP { 0 } else { psn_step };
                let msn = msn_field.then_some((msn[q], msn_step));
                templates.push(Template::new(frame, ip_off, ipv6, bth.psn, psn_step, msn));
            }
        }
        Ok(Self { templates })
    }

    /// Frames per pass: QPs × packets per QP unit.
    pub fn pass_len(&self) -> usize {
        self.templates.len()
    }

    /// Frame `i` of the stream.
    pub fn frame(&mut self, i: u64) -> &[u8] {
        let n = self.templates.len() as u64;
        self.templates[(i % n) as usize].at_pass(i / n)
    }
}

/// The first `count` frames `gen` would send for `args` (for tests and
/// offline checks).
pub fn build_frames(args: &GenArgs, src_mac: [u8; 6], count: u64) -> Result<Vec<Vec<u8>>> {
    let mut source = FrameSource::new(args, src_mac)?;
    Ok((0..count).map(|i| source.frame(i).to_vec()).collect())
}

/// What `gen` did.
#[derive(Clone, Debug, Serialize)]
pub struct GenReport {
    pub dev: String,
    pub mode: GenMode,
    pub traffic: TrafficKind,
    pub qps: u32,
    /// Frames per pass (each QP's unit once).
    pub frames_per_pass: usize,
    /// Frames handed to the socket / submitted to BPF_PROG_RUN. In
    /// live-frames mode the kernel may still drop some on the way out.
    pub packets: u64,
    pub bytes: u64,
    pub elapsed_secs: f64,
    pub pps: f64,
    pub gbps: f64,
    /// Live-frames mode: BPF_PROG_RUN calls made.
    pub prog_runs: u64,
    /// Stopped by SIGINT before the count/duration was reached.
    pub interrupted: bool,
}

impl GenReport {
    pub fn render(&self) -> String {
        let mode = match self.mode {
            GenMode::Packet => "AF_PACKET",
            GenMode::LiveFrames => "XDP live frames",
        };
        let mut s = format!(
            "rocev2 gen: {} packets ({} bytes) out of {} via {mode} in {:.3} s: {:.0} pps, {:.3} Gbit/s\n  {} QPs, {:?} traffic, {} frames per pass",
            self.packets, self.bytes, self.dev, self.elapsed_secs, self.pps, self.gbps, self.qps, self.traffic, self.frames_per_pass
        );
        if self.mode == GenMode::LiveFrames {
            s.push_str(&format!(", {} BPF_PROG_RUN calls", self.prog_runs));
        }
        if self.interrupted {
            s.push_str("\n  interrupted");
        }
        s
    }
}

/// `rocev2 gen`: builds the frames, sends them, prints and returns the report.
pub fn run(args: &GenArgs) -> Result<GenReport> {
    let report = generate(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.render());
    }
    Ok(report)
}

/// Like [`run`] without printing.
pub fn generate(args: &GenArgs) -> Result<GenReport> {
    args.validate()?;
    let src_mac = match &args.src_mac {
        Some(m) => parse_mac(m).context("--src-mac")?,
        None => crate::sys::device_mac(&args.dev)?,
    };
    let mut source = FrameSource::new(args, src_mac)?;
    let limit = match (args.count, args.duration) {
        (Some(c), _) => c,
        (None, Some(_)) => u64::MAX,
        (None, None) if args.stop.is_some() => u64::MAX,
        (None, None) => source.pass_len() as u64,
    };
    let deadline = args.duration.map(Duration::from_secs_f64);
    let _sigint = SigintGuard::install();
    let _pin = args.cpu.map(CpuPin::new).transpose()?;

    // The clock starts after the socket is open / the program loaded.
    let Sent { packets, bytes, prog_runs, elapsed } = match args.mode {
        GenMode::Packet => send_packets(args, &mut source, limit, deadline)?,
        GenMode::LiveFrames => send_live(args, src_mac, &mut source, limit, deadline)?,
    };
    let elapsed = elapsed.as_secs_f64().max(1e-9);
    Ok(GenReport {
        dev: args.dev.clone(),
        mode: args.mode,
        traffic: args.traffic,
        qps: args.qps,
        frames_per_pass: source.pass_len(),
        packets,
        bytes,
        elapsed_secs: elapsed,
        pps: packets as f64 / elapsed,
        gbps: bytes as f64 * 8.0 / elapsed / 1e9,
        prog_runs,
        interrupted: SigintGuard::interrupted() && packets < limit,
    })
}

fn should_stop(args: &GenArgs, sent: u64, limit: u64, deadline: Option<Duration>, start: Instant) -> bool {
    sent >= limit
        || deadline.is_some_and(|d| start.elapsed() >= d)
        || SigintGuard::interrupted()
        || args.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed))
}

struct Sent {
    packets: u64,
    bytes: u64,
    prog_runs: u64,
    elapsed: Duration,
}

fn send_packets(args: &GenArgs, source: &mut FrameSource, limit: u64, deadline: Option<Duration>) -> Result<Sent> {
    let socket =
        PacketSocket::open(&args.dev).with_context(|| format!("cannot open a packet socket on {:?}", args.dev))?;
    let start = Instant::now();
    let mut bucket = args.rate.map(|r| TokenBucket::new(r, BURST));
    let (mut sent, mut bytes) = (0u64, 0u64);
    while !should_stop(args, sent, limit, deadline, start) {
        let want = BURST.min(limit - sent);
        let n = bucket.as_mut().map_or(want, |b| b.take(want));
        for _ in 0..n {
            let frame = source.frame(sent);
            socket
                .send(frame)
                .with_context(|| format!("sending frame {sent} ({} bytes) on {}", frame.len(), args.dev))?;
            sent += 1;
            bytes += frame.len() as u64;
        }
    }
    Ok(Sent { packets: sent, bytes, prog_runs: 0, elapsed: start.elapsed() })
}

mod live;
mod pace;

pub use pace::{allowed_cpus, CpuPin};
#[allow(unused_imports, reason = "the tests use what this module does not")]
use {live::*, pace::*};

#[cfg(test)]
mod tests;
