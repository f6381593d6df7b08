//! The receiving side of RC QPs: in-order acceptance, coalesced ACKs,
//! one NAK per sequence error, CNPs for CE-marked data (the DCQCN
//! notification point) and, with admission, the CTS grants.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use rocev2_common::{
    bth::{aeth, ends_message, opcode, Bth, PSN_MASK},
    telemetry::{seen, Seen},
};
use serde::Serialize;

use super::admission::{self, Admission, Control, Kind};
use crate::{
    render::{Align::*, Table},
    tools::gen::{CNP_RESERVED_LEN, GEN_TTL},
    tools::packet::{build_roce_frame_with_header, ParsedRoce, RoceFrameSpec},
};

/// A responder sends at most one CNP per QP this often (DCQCN's default
/// notification interval on NICs is 50 us or more).
pub const CNP_INTERVAL: Duration = Duration::from_micros(50);
/// DSCP of the responder's ACKs, NAKs, CNPs and CTSs: the high-priority
/// class (priority 6, as RoCE NICs are configured).
pub const CONTROL_DSCP: u8 = 48;

/// One responder QP's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ResponderQpReport {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub dest_qp: u32,
    /// PSNs accepted, each once and in order.
    pub delivered: u64,
    /// RDMA payload bytes accepted.
    pub delivered_bytes: u64,
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
    /// In-order packets not acknowledged yet (since when), and the reply addressing.
    unacked: u32,
    unacked_since: Option<Instant>,
    reply: RoceFrameSpec,
    last_cnp: Option<Instant>,
}

/// A message that arrived whole and in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub src: IpAddr,
    pub dest_qp: u32,
    /// Its number on the QP, from 0.
    pub message: u32,
}

/// The receiving side of RC QPs (`sink --rc`).
pub struct Responder {
    first_psn: u32,
    ack_every: u32,
    cnp_interval: Duration,
    qps: HashMap<(IpAddr, IpAddr, u32), ResponderQp>,
    /// Receiver-driven admission (`--transport cts`).
    admission: Option<Admission>,
    /// The next PSN of each control QP this responder sends CTSs on.
    control_psns: HashMap<(IpAddr, u32), u32>,
    /// Messages delivered since the last [`Responder::take_delivered`].
    delivered: Vec<Delivered>,
}

impl Responder {
    pub fn new(first_psn: u32, ack_every: u32) -> Self {
        Self {
            first_psn: first_psn & PSN_MASK,
            ack_every: ack_every.max(1),
            cnp_interval: CNP_INTERVAL,
            qps: HashMap::new(),
            admission: None,
            control_psns: HashMap::new(),
            delivered: Vec::new(),
        }
    }

    /// Grants messages with CTSs, `window` bytes outstanding at most (see [`admission`]).
    pub fn with_admission(mut self, window: u64) -> Self {
        self.admission = Some(Admission::new(window));
        self
    }

    pub fn admission(&self) -> Option<&Admission> {
        self.admission.as_ref()
    }

    /// Reacts to one received frame (`raw` its bytes, for the control
    /// messages' headers); returns the frames to send back.
    pub fn frame_with(&mut self, p: &ParsedRoce, raw: &[u8]) -> Vec<Vec<u8>> {
        if let Some(c) = Control::parse(p, raw) {
            return self.control(p, c);
        }
        self.frame(p)
    }

    /// An RTS: queue it; answer what can be granted.
    fn control(&mut self, p: &ParsedRoce, c: Control) -> Vec<Vec<u8>> {
        if c.kind != Kind::Rts || !p.icrc_ok {
            return Vec::new();
        }
        let Some(a) = self.admission.as_mut() else { return Vec::new() };
        let again = a.request(admission::Request { src: p.src_ip, control: c, reply: reply_spec(p) });
        let mut out: Vec<Vec<u8>> = again.into_iter().map(|r| self.cts(r)).collect();
        out.extend(self.grants());
        out
    }

    fn grants(&mut self) -> Vec<Vec<u8>> {
        let granted = self.admission.as_mut().map(Admission::grant).unwrap_or_default();
        granted.into_iter().map(|r| self.cts(r)).collect()
    }

    fn cts(&mut self, r: admission::Request) -> Vec<u8> {
        let c = Control { kind: Kind::Cts, ..r.control };
        let psn = self.control_psns.entry((r.src, admission::control_qp(c.data_qp))).or_insert(0);
        let frame = c.frame(&r.reply, *psn);
        *psn = (*psn + 1) & PSN_MASK;
        frame
    }

    /// Reacts to one received data frame; returns the frames to send back.
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
            unacked_since: None,
            reply: reply_spec(p),
            last_cnp: None,
        });
        // Replies go back the way the latest data came: a responder
        // reachable over several paths (behind two spines) answers on the
        // one the QP uses now.
        qp.reply = reply_spec(p);
        let r = &mut qp.report;
        if p.ecn == 3 && qp.last_cnp.is_none_or(|t| t.elapsed() >= self.cnp_interval) {
            qp.last_cnp = Some(Instant::now());
            r.cnps_sent += 1;
            let mut cnp = qp.reply.clone();
            cnp.bth = Bth { becn: true, ..Bth::new(opcode::CNP, r.dest_qp, 0) };
            cnp.payload_len = CNP_RESERVED_LEN;
            out.push(build_roce_frame_with_header(&cnp, &[0; CNP_RESERVED_LEN]));
        }
        let ahead = p.bth.psn.wrapping_sub(r.next_psn) & PSN_MASK;
        if ahead == 0 {
            let bytes = data_bytes(p);
            r.delivered += 1;
            r.delivered_bytes += bytes;
            r.next_psn = (r.next_psn + 1) & PSN_MASK;
            qp.nak_sent = false;
            if ends_message(p.bth.opcode) {
                self.delivered.push(Delivered { src: p.src_ip, dest_qp: r.dest_qp, message: r.messages });
                r.messages = (r.messages + 1) & PSN_MASK;
            }
            qp.unacked += 1;
            qp.unacked_since.get_or_insert_with(Instant::now);
            if p.bth.ack_req || qp.unacked >= self.ack_every {
                out.push(ack(qp, aeth::ACK));
            }
            if let Some(a) = self.admission.as_mut() {
                a.received(p.src_ip, p.bth.dest_qp, bytes);
                out.extend(self.grants());
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

    /// ACKs for QPs whose oldest unacknowledged packet arrived `age` ago
    /// or more: a NIC's ACK coalescing timer, so a slow QP on a busy
    /// responder still hears within `age`.
    pub fn flush_older(&mut self, age: Duration) -> Vec<Vec<u8>> {
        self.qps
            .values_mut()
            .filter(|q| q.unacked > 0 && q.unacked_since.is_some_and(|t| t.elapsed() >= age))
            .map(|q| ack(q, aeth::ACK))
            .collect()
    }

    /// The messages that arrived whole since the last call.
    pub fn take_delivered(&mut self) -> Vec<Delivered> {
        std::mem::take(&mut self.delivered)
    }

    pub fn report(&self) -> Vec<ResponderQpReport> {
        let mut v: Vec<_> = self.qps.values().map(|q| q.report.clone()).collect();
        v.sort_by_key(|q| (q.src, q.dst, q.dest_qp));
        v
    }
}

/// RDMA data bytes of a WRITE packet (its payload less the RETH of a FIRST or ONLY).
pub fn data_bytes(p: &ParsedRoce) -> u64 {
    let reth = match p.bth.opcode {
        opcode::WRITE_FIRST | opcode::WRITE_ONLY | opcode::WRITE_ONLY_IMM => crate::tools::gen::RETH_LEN,
        _ => 0,
    };
    p.payload_len.saturating_sub(reth) as u64
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
        qp.unacked_since = None;
        r.next_psn.wrapping_sub(1) & PSN_MASK
    };
    let mut spec = qp.reply.clone();
    spec.bth = Bth::new(opcode::ACK, r.dest_qp, psn);
    spec.payload_len = aeth::LEN;
    let m = r.messages.to_be_bytes();
    build_roce_frame_with_header(&spec, &[syndrome, m[1], m[2], m[3]])
}

/// Addressing of the replies to `p`'s QP: back to where it came from, on
/// its UDP source port, in the control class.
fn reply_spec(p: &ParsedRoce) -> RoceFrameSpec {
    RoceFrameSpec {
        src_mac: p.dst_mac,
        dst_mac: p.src_mac,
        vlan: p.vlan,
        src_ip: p.dst_ip,
        dst_ip: p.src_ip,
        ttl: GEN_TTL,
        dscp: CONTROL_DSCP,
        ecn: 0,
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
    use crate::tools::packet::{build_roce_frame, parse_roce};

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
                assert_eq!((p.src_port, p.dst_ip, p.dscp), (0xC123, "10.0.0.1".parse().unwrap(), CONTROL_DSCP));
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
        assert_eq!((q.sequence_naks_sent, q.cnps_sent, q.delivered_bytes), (1, 1, 8 * 64));
    }

    #[test]
    fn responder_grants_requests_with_cts_and_reports_whole_messages() {
        let mut r = Responder::new(0, 8).with_admission(4096);
        let spec = |op: u8, qp: u32, psn: u32, len: usize| RoceFrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src_ip: "10.0.0.1".parse().unwrap(),
            dst_ip: "10.1.0.1".parse().unwrap(),
            ttl: 64,
            dscp: 48,
            ecn: 0,
            src_port: 0xC123,
            bth: Bth { ack_req: true, ..Bth::new(op, qp, psn) },
            payload_len: len,
        };
        let rts = Control { kind: Kind::Rts, data_qp: 0x140, message: 0, bytes: 3000 };
        let f = rts.frame(&spec(0, 0, 0, 0), 0);
        let out = r.frame_with(&parse_roce(&f).unwrap(), &f);
        assert_eq!(out.len(), 1);
        let p = parse_roce(&out[0]).unwrap();
        let cts = Control::parse(&p, &out[0]).unwrap();
        assert_eq!((cts.kind, cts.data_qp, cts.message, p.dst_ip), (Kind::Cts, 0x140, 0, "10.0.0.1".parse().unwrap()));
        // A second request waits while 3000 of 4096 bytes are outstanding.
        let rts1 = Control { message: 1, ..rts };
        let f = rts1.frame(&spec(0, 0, 0, 0), 1);
        assert!(r.frame_with(&parse_roce(&f).unwrap(), &f).is_empty());
        // The data of message 0 (one WRITE ONLY) arrives: message 1 is granted, message 0 delivered.
        let data = build_roce_frame_with_header(&spec(opcode::WRITE_ONLY, 0x140, 0, 16 + 3000), &[0; 16]);
        let out = r.frame_with(&parse_roce(&data).unwrap(), &data);
        assert_eq!(out.len(), 2, "an ACK and the CTS of message 1");
        let last = parse_roce(&out[1]).unwrap();
        assert_eq!(Control::parse(&last, &out[1]).unwrap().message, 1);
        assert_eq!(last.bth.psn, 1, "the control QP's own PSN sequence");
        assert_eq!(r.take_delivered(), [Delivered { src: "10.0.0.1".parse().unwrap(), dest_qp: 0x140, message: 0 }]);
        assert_eq!(r.report()[0].delivered_bytes, 3000);
    }
}
