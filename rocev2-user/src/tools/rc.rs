//! Reliable Connected (RC) endpoints for the lab: `gen --rc` is a requester
//! and `sink --rc` a responder, behaving the way go-back-N RDMA NICs do.
//!
//! Without Soft-RoCE or an RDMA NIC, nothing in a lab ever sent an ACK or a
//! NAK, so the price of loss or reordering (a whole window sent again) was
//! invisible. These two ends make it visible:
//!
//! - The responder accepts only the next expected PSN of each QP. It sends
//!   a coalesced ACK (the last PSN accepted) on every AckReq packet, every
//!   `--ack-every` in-order packets and when the link goes quiet; on a PSN
//!   ahead of the expected one it drops the packet and sends one NAK with
//!   the PSN-sequence-error syndrome carrying the expected PSN (one NAK per
//!   error, until that PSN arrives); duplicates are dropped and, when they
//!   ask for it, ACKed again. CE-marked data makes it send a CNP, at most
//!   one per QP per [`CNP_INTERVAL`] (the DCQCN notification point).
//! - The requester keeps at most `--window` PSNs per QP unacknowledged, goes
//!   back to the NAKed PSN and sends everything from there again, and after
//!   `--ack-timeout-ms` without progress sends again from the oldest
//!   unacknowledged PSN. It reports per QP the packets sent, how many were
//!   retransmissions (and which ranges, why), NAKs, timeouts, completion
//!   time and goodput.
//!
//! Both ends number the QP alike (the requester's QP number is the DestQP
//! of the responder's ACKs), as `gen` already does for its source ports, and
//! the ACKs leave with the data's UDP source port, as a NIC derives it from
//! both QP numbers.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use rocev2_common::{
    bth::{aeth, ends_message, opcode, Bth, PSN_MASK},
    telemetry::{seen, Seen},
};
use serde::Serialize;

use crate::{
    render::{Align::*, Table},
    sys::rawsock::PacketSocket,
    tools::gen::{nic_sport, parse_mac, reth, GenArgs, SportModel, CNP_RESERVED_LEN, GEN_TTL},
    tools::packet::{build_roce_frame_with_header, parse_roce, ParsedRoce, RoceFrameSpec},
};

/// A responder sends at most one CNP per QP this often (DCQCN's default
/// notification interval on NICs is 50 us or more).
pub const CNP_INTERVAL: Duration = Duration::from_micros(50);
/// DSCP of the responder's CNPs (priority 6, as NICs are configured).
const CNP_DSCP: u8 = 48;
/// The requester gives up after this long without completing (a lab whose
/// path is down should not hang a test).
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// Offset of `psn` from `first` in the 24-bit PSN space.
fn psn_offset(psn: u32, first: u32) -> u32 {
    psn.wrapping_sub(first) & PSN_MASK
}

fn psn_at(first: u32, offset: u32) -> u32 {
    first.wrapping_add(offset) & PSN_MASK
}

/// A span of PSNs the requester sent again, and why.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Retransmission {
    /// The first PSN sent again (the NAKed one, or the oldest unACKed one
    /// after a timeout).
    pub from_psn: u32,
    /// The last PSN sent again (the highest sent before going back).
    pub to_psn: u32,
    /// "nak" or "timeout".
    pub cause: &'static str,
}

/// One requester QP's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RequesterQpReport {
    pub dest_qp: u32,
    pub src_port: u16,
    /// PSNs the QP had to deliver.
    pub psns: u32,
    /// Packets sent, retransmissions included.
    pub sent: u64,
    pub retransmitted: u64,
    pub sequence_naks: u64,
    pub rnr_naks: u64,
    pub other_naks: u64,
    pub timeouts: u64,
    /// Sends the local egress refused (ENOBUFS: a full device queue, or a
    /// tc program that dropped the frame). Like a frame lost on the wire,
    /// the responder's NAK or the ACK timeout brings it back.
    pub lost_at_sender: u64,
    pub retransmissions: Vec<Retransmission>,
    /// Every PSN acknowledged.
    pub complete: bool,
    /// From the first packet to the last ACK.
    pub completion_secs: f64,
    /// RDMA payload bits delivered per second.
    pub goodput_gbps: f64,
}

/// What `gen --rc` did.
#[derive(Clone, Debug, Serialize)]
pub struct RequesterReport {
    pub dev: String,
    pub window: u32,
    pub packets: u64,
    pub retransmitted: u64,
    pub sequence_naks: u64,
    pub timeouts: u64,
    pub elapsed_secs: f64,
    pub goodput_gbps: f64,
    pub complete: bool,
    pub qps: Vec<RequesterQpReport>,
}

impl RequesterReport {
    pub fn qp(&self, dest_qp: u32) -> Option<&RequesterQpReport> {
        self.qps.iter().find(|q| q.dest_qp == dest_qp)
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "rocev2 gen --rc on {}: {} QPs {}, {} packets sent ({} retransmitted), {} sequence NAKs, {} timeouts, {:.3} s, goodput {:.3} Gbit/s (window {})\n",
            self.dev,
            self.qps.len(),
            if self.complete { "complete" } else { "NOT complete" },
            self.packets,
            self.retransmitted,
            self.sequence_naks,
            self.timeouts,
            self.elapsed_secs,
            self.goodput_gbps,
            self.window
        );
        let lost: u64 = self.qps.iter().map(|q| q.lost_at_sender).sum();
        if lost > 0 {
            s.push_str(&format!("  sends the local egress refused (ENOBUFS): {lost}, recovered like any loss\n"));
        }
        let mut table = Table::new(&[
            ("QP", Right),
            ("PSNS", Right),
            ("SENT", Right),
            ("RETX", Right),
            ("SEQ NAK", Right),
            ("RNR", Right),
            ("TIMEOUT", Right),
            ("DONE (s)", Right),
            ("GOODPUT Gb/s", Right),
            ("RETRANSMITTED", Left),
        ])
        .indent(1);
        for q in &self.qps {
            let ranges: Vec<String> =
                q.retransmissions.iter().map(|r| format!("{}..={} ({})", r.from_psn, r.to_psn, r.cause)).collect();
            table.row([
                format!("{:#x}", q.dest_qp),
                q.psns.to_string(),
                q.sent.to_string(),
                q.retransmitted.to_string(),
                q.sequence_naks.to_string(),
                q.rnr_naks.to_string(),
                q.timeouts.to_string(),
                if q.complete { format!("{:.4}", q.completion_secs) } else { "-".into() },
                format!("{:.3}", q.goodput_gbps),
                if ranges.is_empty() { "-".into() } else { ranges.join(", ") },
            ]);
        }
        s.push_str(&table.render());
        s
    }
}

/// One QP of the requester.
struct RequesterQp {
    qp: u32,
    sport: u16,
    first_psn: u32,
    total: u32,
    /// Offset of the next PSN to send.
    next: u32,
    /// Offsets below this are acknowledged.
    acked: u32,
    /// One past the highest offset ever sent.
    high: u32,
    last_progress: Instant,
    report: RequesterQpReport,
}

impl RequesterQp {
    fn done(&self) -> bool {
        self.acked >= self.total
    }

    /// Go back to `offset` and send everything from there again.
    fn go_back(&mut self, offset: u32, cause: &'static str) {
        if offset < self.next {
            self.report.retransmissions.push(Retransmission {
                from_psn: psn_at(self.first_psn, offset),
                to_psn: psn_at(self.first_psn, self.high - 1),
                cause,
            });
        }
        self.next = offset;
        self.last_progress = Instant::now();
    }

    /// Handles an ACK or NAK for this QP.
    fn acknowledged(&mut self, psn: u32, syndrome: u8, start: Instant) {
        let offset = psn_offset(psn, self.first_psn);
        match aeth::kind(syndrome) {
            aeth::Kind::Ack => {
                // A cumulative ACK of `psn`; stale or foreign PSNs are ignored.
                if offset < self.high && offset + 1 > self.acked {
                    self.acked = offset + 1;
                    self.next = self.next.max(self.acked);
                    self.last_progress = Instant::now();
                }
            }
            aeth::Kind::SequenceError => {
                self.report.sequence_naks += 1;
                // Everything before the expected PSN arrived.
                if offset <= self.high && offset >= self.acked {
                    self.acked = offset;
                    self.go_back(offset, "nak");
                }
            }
            aeth::Kind::RnrNak => {
                self.report.rnr_naks += 1;
                if offset <= self.high && offset >= self.acked {
                    self.acked = offset;
                    self.go_back(offset, "nak");
                }
            }
            aeth::Kind::OtherNak | aeth::Kind::Reserved => self.report.other_naks += 1,
        }
        if self.done() && !self.report.complete {
            self.report.complete = true;
            self.report.completion_secs = start.elapsed().as_secs_f64();
        }
    }
}

/// Checks the RC options of `gen`.
pub fn validate_requester(args: &GenArgs) -> Result<()> {
    if args.window == 0 {
        bail!("--window must be at least 1");
    }
    let psns = u64::from(args.messages) * u64::from(args.message_packets);
    if psns == 0 || psns >= u64::from(PSN_MASK / 2) {
        bail!("--messages x --message-packets must be 1..{} PSNs per QP, not {psns}", PSN_MASK / 2);
    }
    if args.ack_timeout_ms == 0 {
        bail!("--ack-timeout-ms must be at least 1");
    }
    if args.mode != crate::tools::gen::GenMode::Packet {
        bail!("--rc sends through a packet socket; leave out --mode live-frames");
    }
    Ok(())
}

/// `gen --rc`: delivers `--messages` WRITE messages on every QP, reliably.
pub fn request(args: &GenArgs) -> Result<RequesterReport> {
    validate_requester(args)?;
    let src_mac = match &args.src_mac {
        Some(m) => parse_mac(m).context("--src-mac")?,
        None => crate::sys::device_mac(&args.dev)?,
    };
    let dst_mac = parse_mac(&args.dst_mac).context("--dst-mac")?;
    let socket =
        PacketSocket::open(&args.dev).with_context(|| format!("cannot open a packet socket on {:?}", args.dev))?;
    let total = args.messages * args.message_packets;
    let now = Instant::now();
    let mut rng = args.seed;
    let mut qps: Vec<RequesterQp> = (0..args.qps)
        .map(|q| {
            let qp = args.first_qp + q;
            let sport = match args.sport {
                SportModel::Fixed => args.sport_value,
                SportModel::Nic => nic_sport(qp, qp),
                SportModel::Random => 0xC000 | (rocev2_common::rng::splitmix64(&mut rng) as u16 & 0x3FFF),
            };
            RequesterQp {
                qp,
                sport,
                first_psn: args.first_psn,
                total,
                next: 0,
                acked: 0,
                high: 0,
                last_progress: now,
                report: RequesterQpReport { dest_qp: qp, src_port: sport, psns: total, ..Default::default() },
            }
        })
        .collect();
    let by_qp: HashMap<u32, usize> = qps.iter().enumerate().map(|(i, q)| (q.qp, i)).collect();
    let timeout = Duration::from_millis(args.ack_timeout_ms);
    let mut buf = vec![0u8; 65536];
    let start = Instant::now();
    let mut packets = 0u64;
    while !qps.iter().all(RequesterQp::done) {
        if start.elapsed() > args.duration.map_or(GIVE_UP_AFTER, Duration::from_secs_f64) {
            break;
        }
        let mut sent_now = false;
        for q in qps.iter_mut() {
            while q.next < q.total && q.next - q.acked < args.window {
                let frame = write_frame(args, src_mac, dst_mac, q.qp, q.sport, q.first_psn, q.next);
                match socket.send(&frame) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => q.report.lost_at_sender += 1,
                    Err(e) => return Err(e).with_context(|| format!("sending on {}", args.dev)),
                }
                q.report.sent += 1;
                if q.next < q.high {
                    q.report.retransmitted += 1;
                }
                q.next += 1;
                q.high = q.high.max(q.next);
                packets += 1;
                sent_now = true;
            }
        }
        // Wait for ACKs only when the windows are full; then take every
        // frame already queued.
        let mut wait = if sent_now { Duration::ZERO } else { Duration::from_millis(1) };
        while let Some(n) = socket.recv(&mut buf, wait).with_context(|| format!("receiving on {}", args.dev))? {
            wait = Duration::ZERO;
            let Ok(p) = parse_roce(&buf[..n]) else { continue };
            if p.bth.opcode != opcode::ACK || p.src_ip != args.dst || p.dst_ip != args.src {
                continue;
            }
            let Some(&i) = by_qp.get(&p.bth.dest_qp) else { continue };
            let Some(&syndrome) = buf.get(p.bth_offset + rocev2_common::bth::BTH_LEN) else { continue };
            qps[i].acknowledged(p.bth.psn, syndrome, start);
        }
        for q in qps.iter_mut() {
            if !q.done() && q.acked < q.next && q.last_progress.elapsed() >= timeout {
                q.report.timeouts += 1;
                let oldest = q.acked;
                q.go_back(oldest, "timeout");
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    let payload_bits = |psns: u32| f64::from(psns) * args.payload as f64 * 8.0;
    let mut report = RequesterReport {
        dev: args.dev.clone(),
        window: args.window,
        packets,
        retransmitted: 0,
        sequence_naks: 0,
        timeouts: 0,
        elapsed_secs: elapsed,
        goodput_gbps: 0.0,
        complete: true,
        qps: Vec::new(),
    };
    let mut delivered = 0u64;
    for q in qps {
        let mut r = q.report;
        if r.complete {
            r.goodput_gbps = payload_bits(r.psns) / r.completion_secs.max(1e-9) / 1e9;
            delivered += u64::from(r.psns);
        }
        report.retransmitted += r.retransmitted;
        report.sequence_naks += r.sequence_naks;
        report.timeouts += r.timeouts;
        report.complete &= r.complete;
        report.qps.push(r);
    }
    report.goodput_gbps = delivered as f64 * args.payload as f64 * 8.0 / elapsed / 1e9;
    Ok(report)
}

/// The WRITE packet at `offset` of a QP's stream of `--message-packets`
/// messages: FIRST (with a RETH) / MIDDLE / LAST with AckReq, or ONLY.
fn write_frame(
    args: &GenArgs,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    qp: u32,
    sport: u16,
    first_psn: u32,
    offset: u32,
) -> Vec<u8> {
    let (index, of) = (offset % args.message_packets, args.message_packets);
    let op = match (index, of) {
        (_, 1) => opcode::WRITE_ONLY,
        (0, _) => opcode::WRITE_FIRST,
        (i, n) if i == n - 1 => opcode::WRITE_LAST,
        _ => opcode::WRITE_MIDDLE,
    };
    let bth = Bth { ack_req: index == of - 1, ..Bth::new(op, qp, psn_at(first_psn, offset)) };
    let dma_len = (u64::from(of) * args.payload as u64).min(u64::from(u32::MAX)) as u32;
    let reth = if index == 0 { reth(qp, dma_len).to_vec() } else { Vec::new() };
    let spec = RoceFrameSpec {
        src_mac,
        dst_mac,
        vlan: args.vlan,
        src_ip: args.src,
        dst_ip: args.dst,
        ttl: GEN_TTL,
        dscp: args.dscp,
        ecn: args.ecn.codepoint(),
        src_port: sport,
        bth,
        payload_len: reth.len() + args.payload,
    };
    build_roce_frame_with_header(&spec, &reth)
}

/// One responder QP's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ResponderQpReport {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub dest_qp: u32,
    /// PSNs accepted, each once and in order.
    pub delivered: u64,
    /// The next PSN expected.
    pub next_psn: u32,
    pub messages: u32,
    pub acks_sent: u64,
    pub sequence_naks_sent: u64,
    pub cnps_sent: u64,
    /// Data dropped because it was ahead of the expected PSN.
    pub out_of_sequence: u64,
    /// Data dropped because it had been accepted before.
    pub duplicates: u64,
}

struct ResponderQp {
    report: ResponderQpReport,
    /// A NAK for the current expected PSN went out; no other until it arrives.
    nak_sent: bool,
    /// In-order packets not acknowledged yet, and the reply addressing.
    unacked: u32,
    reply: RoceFrameSpec,
    last_cnp: Option<Instant>,
}

/// The receiving side of RC QPs (`sink --rc`).
pub struct Responder {
    first_psn: u32,
    ack_every: u32,
    qps: HashMap<(IpAddr, IpAddr, u32), ResponderQp>,
}

impl Responder {
    pub fn new(first_psn: u32, ack_every: u32) -> Self {
        Self { first_psn: first_psn & PSN_MASK, ack_every: ack_every.max(1), qps: HashMap::new() }
    }

    /// Reacts to one received frame; returns the frames to send back.
    pub fn frame(&mut self, p: &ParsedRoce) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        // Only requests: ACKs and CNPs going the other way are not ours.
        if seen(p.bth.opcode) != Seen::Data {
            return out;
        }
        if !p.icrc_ok {
            return out; // a NIC drops a packet with a bad ICRC silently
        }
        let first_psn = self.first_psn;
        let qp = self.qps.entry((p.src_ip, p.dst_ip, p.bth.dest_qp)).or_insert_with(|| ResponderQp {
            report: ResponderQpReport {
                src: Some(p.src_ip),
                dst: Some(p.dst_ip),
                dest_qp: p.bth.dest_qp,
                next_psn: first_psn,
                ..Default::default()
            },
            nak_sent: false,
            unacked: 0,
            reply: reply_spec(p),
            last_cnp: None,
        });
        // Replies go back the way the latest data came: a responder
        // reachable over several paths (behind two spines) answers on the
        // one the QP uses now.
        qp.reply = reply_spec(p);
        let r = &mut qp.report;
        if p.ecn == 3 && qp.last_cnp.is_none_or(|t| t.elapsed() >= CNP_INTERVAL) {
            qp.last_cnp = Some(Instant::now());
            r.cnps_sent += 1;
            let mut cnp = qp.reply.clone();
            cnp.bth = Bth { becn: true, ..Bth::new(opcode::CNP, r.dest_qp, 0) };
            cnp.dscp = CNP_DSCP;
            cnp.payload_len = CNP_RESERVED_LEN;
            out.push(build_roce_frame_with_header(&cnp, &[0; CNP_RESERVED_LEN]));
        }
        let ahead = p.bth.psn.wrapping_sub(r.next_psn) & PSN_MASK;
        if ahead == 0 {
            r.delivered += 1;
            r.next_psn = (r.next_psn + 1) & PSN_MASK;
            qp.nak_sent = false;
            if ends_message(p.bth.opcode) {
                r.messages = (r.messages + 1) & PSN_MASK;
            }
            qp.unacked += 1;
            if p.bth.ack_req || qp.unacked >= self.ack_every {
                out.push(ack(qp, aeth::ACK));
            }
        } else if ahead < PSN_MASK / 2 {
            r.out_of_sequence += 1;
            if !qp.nak_sent {
                qp.nak_sent = true;
                out.push(ack(qp, aeth::NAK_PSN_SEQUENCE_ERROR));
            }
        } else {
            r.duplicates += 1;
            if p.bth.ack_req {
                out.push(ack(qp, aeth::ACK));
            }
        }
        out
    }

    /// ACKs for in-order packets not acknowledged yet: sent when the link
    /// goes quiet, so a requester whose window ends mid-message still hears.
    pub fn flush(&mut self) -> Vec<Vec<u8>> {
        self.qps.values_mut().filter(|q| q.unacked > 0).map(|q| ack(q, aeth::ACK)).collect()
    }

    pub fn report(&self) -> Vec<ResponderQpReport> {
        let mut v: Vec<_> = self.qps.values().map(|q| q.report.clone()).collect();
        v.sort_by_key(|q| (q.src, q.dst, q.dest_qp));
        v
    }
}

/// An ACK (or NAK) for `qp`: the last PSN accepted, or for a sequence NAK
/// the PSN expected.
fn ack(qp: &mut ResponderQp, syndrome: u8) -> Vec<u8> {
    let r = &mut qp.report;
    let psn = if syndrome == aeth::NAK_PSN_SEQUENCE_ERROR {
        r.sequence_naks_sent += 1;
        r.next_psn
    } else {
        r.acks_sent += 1;
        qp.unacked = 0;
        r.next_psn.wrapping_sub(1) & PSN_MASK
    };
    let mut spec = qp.reply.clone();
    spec.bth = Bth::new(opcode::ACK, r.dest_qp, psn);
    spec.payload_len = aeth::LEN;
    let m = r.messages.to_be_bytes();
    build_roce_frame_with_header(&spec, &[syndrome, m[1], m[2], m[3]])
}

/// Addressing of the replies to `p`'s QP: back to where it came from, on
/// its UDP source port.
fn reply_spec(p: &ParsedRoce) -> RoceFrameSpec {
    RoceFrameSpec {
        src_mac: p.dst_mac,
        dst_mac: p.src_mac,
        vlan: p.vlan,
        src_ip: p.dst_ip,
        dst_ip: p.src_ip,
        ttl: GEN_TTL,
        dscp: p.dscp,
        ecn: 2,
        src_port: p.src_port,
        bth: Bth::new(opcode::ACK, p.bth.dest_qp, 0),
        payload_len: aeth::LEN,
    }
}

/// Renders the responder's per-QP table.
pub fn render_responder(qps: &[ResponderQpReport]) -> String {
    let mut table = Table::new(&[
        ("SRC", Left),
        ("DST", Left),
        ("QP", Right),
        ("DELIVERED", Right),
        ("NEXT PSN", Right),
        ("MSGS", Right),
        ("ACKS", Right),
        ("SEQ NAKS", Right),
        ("CNPS", Right),
        ("OUT OF SEQ", Right),
        ("DUP", Right),
    ])
    .indent(1);
    let ip = |a: Option<IpAddr>| a.map_or("-".to_string(), |a| a.to_string());
    for q in qps {
        table.row([
            ip(q.src),
            ip(q.dst),
            format!("{:#x}", q.dest_qp),
            q.delivered.to_string(),
            q.next_psn.to_string(),
            q.messages.to_string(),
            q.acks_sent.to_string(),
            q.sequence_naks_sent.to_string(),
            q.cnps_sent.to_string(),
            q.out_of_sequence.to_string(),
            q.duplicates.to_string(),
        ]);
    }
    format!("  RC responder:\n{}", table.render())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::packet::build_roce_frame;

    fn data(psn: u32, ack_req: bool, ecn: u8) -> ParsedRoce {
        let bth = Bth { ack_req, ..Bth::new(opcode::WRITE_MIDDLE, 0x100, psn) };
        let frame = build_roce_frame(&RoceFrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src_ip: "10.0.0.1".parse().unwrap(),
            dst_ip: "10.1.0.1".parse().unwrap(),
            ttl: 64,
            dscp: 26,
            ecn,
            src_port: 0xC123,
            bth,
            payload_len: 64,
        });
        parse_roce(&frame).unwrap()
    }

    /// (syndrome, PSN) of every reply.
    fn replies(frames: Vec<Vec<u8>>) -> Vec<(u8, u32)> {
        frames
            .iter()
            .map(|f| {
                let p = parse_roce(f).unwrap();
                assert!(p.icrc_ok);
                assert_eq!((p.src_port, p.dst_ip), (0xC123, "10.0.0.1".parse().unwrap()));
                if p.bth.opcode == opcode::CNP {
                    (0xFF, p.bth.psn)
                } else {
                    (f[p.bth_offset + 12], p.bth.psn)
                }
            })
            .collect()
    }

    #[test]
    fn responder_acks_coalesced_naks_once_and_drops_duplicates() {
        let mut r = Responder::new(0, 4);
        let mut got = Vec::new();
        for (psn, ack_req) in [(0, false), (1, false), (2, false), (3, false), (4, true)] {
            got.extend(replies(r.frame(&data(psn, ack_req, 2))));
        }
        // Every 4th in-order packet and the AckReq one.
        assert_eq!(got, [(aeth::ACK, 3), (aeth::ACK, 4)]);
        // PSN 5 lost: 6 and 7 bring one NAK for 5, then nothing.
        let nak: Vec<_> = [6, 7].iter().flat_map(|&p| replies(r.frame(&data(p, false, 2)))).collect();
        assert_eq!(nak, [(aeth::NAK_PSN_SEQUENCE_ERROR, 5)]);
        // The go-back-N resend: 5, 6 accepted; an old 3 is a duplicate.
        assert!(r.frame(&data(5, false, 2)).is_empty());
        assert!(r.frame(&data(6, false, 2)).is_empty());
        assert!(r.frame(&data(3, false, 2)).is_empty());
        assert_eq!(replies(r.flush()), [(aeth::ACK, 6)]);
        assert!(r.flush().is_empty());
        // CE-marked data brings a CNP.
        assert_eq!(replies(r.frame(&data(7, false, 3))), [(0xFF, 0)]);
        let q = &r.report()[0];
        assert_eq!((q.delivered, q.next_psn, q.out_of_sequence, q.duplicates), (8, 8, 2, 1));
        assert_eq!((q.sequence_naks_sent, q.cnps_sent), (1, 1));
    }

    #[test]
    fn requester_goes_back_to_the_naked_psn() {
        let now = Instant::now();
        let mut q = RequesterQp {
            qp: 1,
            sport: 0xC000,
            first_psn: PSN_MASK - 1,
            total: 20,
            next: 10,
            acked: 0,
            high: 10,
            last_progress: now,
            report: RequesterQpReport::default(),
        };
        q.acknowledged(PSN_MASK, aeth::ACK, now); // offset 1 acked
        assert_eq!(q.acked, 2);
        q.acknowledged(3, aeth::NAK_PSN_SEQUENCE_ERROR, now); // offset 5 expected
        assert_eq!((q.acked, q.next), (5, 5));
        assert_eq!(q.report.retransmissions, [Retransmission { from_psn: 3, to_psn: 7, cause: "nak" }]);
        // A stale NAK for something already acknowledged changes nothing.
        q.acknowledged(0, aeth::NAK_PSN_SEQUENCE_ERROR, now);
        assert_eq!((q.acked, q.next, q.report.sequence_naks), (5, 5, 2));
        q.high = 20;
        q.next = 20;
        q.acknowledged(17, aeth::ACK, now);
        assert!(q.report.complete);
    }
}
