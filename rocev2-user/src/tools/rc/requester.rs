//! One requester QP: a stream of WRITE messages over 24-bit PSNs, sent
//! go-back-N within a window, paced by DCQCN when it runs, and held back
//! by admission until the receiver grants each message.

use std::{
    collections::VecDeque,
    net::IpAddr,
    time::{Duration, Instant},
};

use rocev2_common::bth::{aeth, opcode, Bth, PSN_MASK};
use serde::Serialize;

use super::dcqcn::Dcqcn;
use crate::tools::{
    gen::reth,
    packet::{build_roce_frame_with_header, RoceFrameSpec},
};

/// Offset of `psn` from `first` in the 24-bit PSN space.
pub(super) fn psn_offset(psn: u32, first: u32) -> u32 {
    psn.wrapping_sub(first) & PSN_MASK
}

pub(super) fn psn_at(first: u32, offset: u32) -> u32 {
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
    /// When, in seconds from the requester's start.
    #[serde(skip)]
    pub at: Duration,
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
    /// DCQCN: CNPs received, rate cuts, the lowest rate reached (bits/s).
    pub cnps: u64,
    pub rate_cuts: u64,
    pub min_rate_bps: Option<f64>,
}

/// One message posted on a QP.
#[derive(Clone, Copy, Debug)]
pub(super) struct OutMessage {
    /// Its number on the QP (from 0), as RTS and CTS name it.
    pub number: u32,
    /// Its PSN offsets: first..first + packets.
    pub first: u32,
    pub packets: u32,
    pub bytes: u64,
    pub granted: bool,
    /// When its RTS last went out (admission).
    pub asked: Option<Instant>,
}

impl OutMessage {
    pub fn end(&self) -> u32 {
        self.first + self.packets
    }
}

/// One requester QP.
pub(super) struct SendQp {
    pub qp: u32,
    pub sport: u16,
    pub peer: IpAddr,
    pub first_psn: u32,
    /// RDMA payload bytes per packet (the path MTU's worth).
    pub mtu: u32,
    /// PSNs posted so far.
    pub posted: u32,
    /// Offset of the next PSN to send.
    pub next: u32,
    /// Offsets below this are acknowledged.
    pub acked: u32,
    /// One past the highest offset ever sent.
    pub high: u32,
    /// Posted messages not fully acknowledged yet, in PSN order.
    pub messages: VecDeque<OutMessage>,
    pub next_number: u32,
    /// Messages must be granted before they go (receiver-driven admission).
    pub needs_grant: bool,
    pub last_progress: Instant,
    pub dcqcn: Option<Dcqcn>,
    /// When the rate limiter lets the next packet go.
    pub next_send_at: Instant,
    pub report: RequesterQpReport,
}

impl SendQp {
    pub fn new(qp: u32, sport: u16, peer: IpAddr, first_psn: u32, mtu: u32, now: Instant) -> Self {
        Self {
            qp,
            sport,
            peer,
            first_psn: first_psn & PSN_MASK,
            mtu: mtu.max(1),
            posted: 0,
            next: 0,
            acked: 0,
            high: 0,
            messages: VecDeque::new(),
            next_number: 0,
            needs_grant: false,
            last_progress: now,
            dcqcn: None,
            next_send_at: now,
            report: RequesterQpReport { dest_qp: qp, src_port: sport, ..Default::default() },
        }
    }

    /// Appends a message of `bytes`; returns its number.
    pub fn post(&mut self, bytes: u64) -> u32 {
        let packets = bytes.div_ceil(u64::from(self.mtu)).max(1) as u32;
        let m = OutMessage {
            number: self.next_number,
            first: self.posted,
            packets,
            bytes,
            granted: !self.needs_grant,
            asked: None,
        };
        self.next_number += 1;
        self.posted += packets;
        self.report.psns += packets;
        self.messages.push_back(m);
        m.number
    }

    /// Every posted PSN acknowledged.
    pub fn done(&self) -> bool {
        self.acked >= self.posted
    }

    /// One past the last offset it may send: the end of the granted
    /// messages in front (all posted ones without admission).
    pub fn sendable(&self) -> u32 {
        if !self.needs_grant {
            return self.posted;
        }
        let mut end = self.acked;
        for m in &self.messages {
            if !m.granted {
                break;
            }
            end = m.end();
        }
        end
    }

    /// The CTS of message `number` arrived.
    pub fn grant(&mut self, number: u32) {
        if let Some(m) = self.messages.iter_mut().find(|m| m.number == number) {
            m.granted = true;
        }
    }

    /// Whether a packet may go now: data it may send, room in the window,
    /// and the rate limiter agrees.
    pub fn can_send(&self, window: u32, now: Instant) -> bool {
        self.next < self.sendable() && self.next - self.acked < window && now >= self.next_send_at
    }

    /// The frame of the packet at `next` (with `base`'s addressing);
    /// [`SendQp::advance`] once it went out.
    pub fn next_frame(&self, base: &RoceFrameSpec) -> Vec<u8> {
        let offset = self.next;
        let m =
            *self.messages.iter().find(|m| offset < m.end()).expect("a posted message holds every PSN below posted");
        let (index, of) = (offset - m.first, m.packets);
        let op = match (index, of) {
            (_, 1) => opcode::WRITE_ONLY,
            (0, _) => opcode::WRITE_FIRST,
            (i, n) if i == n - 1 => opcode::WRITE_LAST,
            _ => opcode::WRITE_MIDDLE,
        };
        let data = if index + 1 < of { u64::from(self.mtu) } else { m.bytes - u64::from(of - 1) * u64::from(self.mtu) };
        let ext = if index == 0 { reth(self.qp, m.bytes.min(u64::from(u32::MAX)) as u32).to_vec() } else { Vec::new() };
        let mut spec = base.clone();
        spec.bth = Bth { ack_req: index == of - 1, ..Bth::new(op, self.qp, psn_at(self.first_psn, offset)) };
        spec.src_port = self.sport;
        spec.dst_ip = self.peer;
        spec.payload_len = ext.len() + data as usize;
        build_roce_frame_with_header(&spec, &ext)
    }

    /// The packet at `next` was handed to the NIC.
    pub fn advance(&mut self) {
        // The ACK timer runs from the first packet in flight, not from
        // the last ACK of an idle QP (one waiting for a grant or a step).
        if self.next == self.acked {
            self.last_progress = Instant::now();
        }
        self.report.sent += 1;
        if self.next < self.high {
            self.report.retransmitted += 1;
        }
        self.next += 1;
        self.high = self.high.max(self.next);
    }

    /// The frame just taken went out at `now`: the rate limiter's next slot.
    pub fn paced(&mut self, bytes: usize, now: Instant) {
        if let Some(d) = &self.dcqcn {
            if d.rate_bps < d.params.line_bps {
                self.next_send_at = self.next_send_at.max(now) + d.gap(bytes);
                return;
            }
        }
        self.next_send_at = now;
    }

    /// Go back to `offset` and send everything from there again.
    pub fn go_back(&mut self, offset: u32, cause: &'static str, since_start: Duration) {
        if offset < self.next {
            self.report.retransmissions.push(Retransmission {
                from_psn: psn_at(self.first_psn, offset),
                to_psn: psn_at(self.first_psn, self.high - 1),
                cause,
                at: since_start,
            });
        }
        self.next = offset;
        self.last_progress = Instant::now();
    }

    /// Handles an ACK or NAK for this QP; returns the numbers of the
    /// messages it completed.
    pub fn acknowledged(&mut self, psn: u32, syndrome: u8, start: Instant) -> Vec<u32> {
        let offset = psn_offset(psn, self.first_psn);
        let since = start.elapsed();
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
                    self.go_back(offset, "nak", since);
                }
            }
            aeth::Kind::RnrNak => {
                self.report.rnr_naks += 1;
                if offset <= self.high && offset >= self.acked {
                    self.acked = offset;
                    self.go_back(offset, "nak", since);
                }
            }
            aeth::Kind::OtherNak | aeth::Kind::Reserved => self.report.other_naks += 1,
        }
        let mut completed = Vec::new();
        while self.messages.front().is_some_and(|m| m.end() <= self.acked) {
            completed.push(self.messages.pop_front().expect("checked").number);
        }
        if self.done() && self.posted > 0 && !self.report.complete {
            self.report.complete = true;
            self.report.completion_secs = start.elapsed().as_secs_f64();
        }
        completed
    }

    /// After `timeout` without progress, send again from the oldest unacknowledged PSN.
    pub fn check_timeout(&mut self, timeout: Duration, start: Instant) {
        if !self.done() && self.acked < self.next && self.last_progress.elapsed() >= timeout {
            self.report.timeouts += 1;
            let oldest = self.acked;
            self.go_back(oldest, "timeout", start.elapsed());
        }
    }

    /// When this QP next needs attention: its pacing slot if it has
    /// something to send, its ACK timeout if something is in flight.
    /// Without `sending` (the NIC queue is full) only the timers count.
    pub fn next_event(&self, window: u32, timeout: Duration, sending: bool) -> Option<Instant> {
        let send =
            (sending && self.next < self.sendable() && self.next - self.acked < window).then_some(self.next_send_at);
        let ack = (self.acked < self.next).then_some(self.last_progress + timeout);
        let rate = self.dcqcn.as_ref().filter(|d| d.rate_bps < d.params.line_bps).map(Dcqcn::next_timer);
        [send, ack, rate].into_iter().flatten().min()
    }

    /// The report with the DCQCN figures filled in.
    pub fn finish(mut self, payload_bits_per_psn: f64) -> RequesterQpReport {
        let r = &mut self.report;
        if r.complete {
            r.goodput_gbps = f64::from(r.psns) * payload_bits_per_psn / r.completion_secs.max(1e-9) / 1e9;
        }
        if let Some(d) = &self.dcqcn {
            r.cnps = d.cnps;
            r.rate_cuts = d.cuts;
            r.min_rate_bps = Some(d.min_seen_bps);
        }
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::packet::parse_roce;

    #[test]
    fn requester_goes_back_to_the_naked_psn() {
        let now = Instant::now();
        let mut q = SendQp::new(1, 0xC000, "10.1.0.1".parse().unwrap(), PSN_MASK - 1, 1024, now);
        q.post(20 * 1024);
        q.next = 10;
        q.high = 10;
        q.acknowledged(PSN_MASK, aeth::ACK, now); // offset 1 acked
        assert_eq!(q.acked, 2);
        q.acknowledged(3, aeth::NAK_PSN_SEQUENCE_ERROR, now); // offset 5 expected
        assert_eq!((q.acked, q.next), (5, 5));
        assert_eq!(q.report.retransmissions.len(), 1);
        let r = &q.report.retransmissions[0];
        assert_eq!((r.from_psn, r.to_psn, r.cause), (3, 7, "nak"));
        // A stale NAK for something already acknowledged changes nothing.
        q.acknowledged(0, aeth::NAK_PSN_SEQUENCE_ERROR, now);
        assert_eq!((q.acked, q.next, q.report.sequence_naks), (5, 5, 2));
        q.high = 20;
        q.next = 20;
        assert_eq!(q.acknowledged(17, aeth::ACK, now), [0]);
        assert!(q.report.complete);
    }

    #[test]
    fn requester_sends_granted_messages_only_and_frames_them() {
        let now = Instant::now();
        let mut q = SendQp::new(0x40, 0xC123, "10.2.1.1".parse().unwrap(), 0, 1024, now);
        q.needs_grant = true;
        assert_eq!((q.post(2500), q.post(1024)), (0, 1));
        assert_eq!(q.posted, 4);
        assert!(!q.can_send(16, now));
        q.grant(0);
        assert_eq!(q.sendable(), 3);
        let base = RoceFrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src_ip: "10.1.1.1".parse().unwrap(),
            dst_ip: "10.1.1.1".parse().unwrap(),
            ttl: 64,
            dscp: 26,
            ecn: 2,
            src_port: 0,
            bth: Bth::new(0, 0, 0),
            payload_len: 0,
        };
        let take = |q: &mut SendQp| {
            let f = q.next_frame(&base);
            q.advance();
            parse_roce(&f).unwrap()
        };
        let frames: Vec<_> = (0..3).map(|_| take(&mut q)).collect();
        let ops: Vec<u8> = frames.iter().map(|p| p.bth.opcode).collect();
        assert_eq!(ops, [opcode::WRITE_FIRST, opcode::WRITE_MIDDLE, opcode::WRITE_LAST]);
        assert_eq!(frames[0].payload_len, 16 + 1024);
        assert_eq!(frames[2].payload_len, 2500 - 2048);
        assert!(frames[2].bth.ack_req && frames.iter().all(|p| p.icrc_ok && p.src_port == 0xC123));
        assert!(!q.can_send(16, now), "message 1 is not granted");
        q.grant(1);
        assert_eq!(take(&mut q).bth.opcode, opcode::WRITE_ONLY);
        assert_eq!(q.acknowledged(3, aeth::ACK, now), [0, 1]);
        assert!(q.done());
    }
}
