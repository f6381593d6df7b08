//! What the sink counts and checks, frame by frame: per QP (source,
//! destination, DestQP) packets, ICRC, ECN codepoints and CE marks, and the
//! order of each QP's PSNs (`Tally`). Apart from the socket, so it is
//! testable, and an RC endpoint checks what it receives with it.

use std::{collections::HashMap, net::IpAddr};

use rocev2_common::bth::PSN_MASK;
use rocev2_common::telemetry::{seen, Seen};
use serde::Serialize;

use crate::tools::packet::parse_roce;
use crate::tools::rc::responder::{render_responder, ResponderQpReport};

/// PSNs are 24 bits; "ahead" means less than half the space ahead.
const PSN_HALF: u32 = 0x80_0000;
/// How far back (in PSNs) a late packet can be told apart from a duplicate.
const WINDOW: u32 = 4096;
/// How many QPs the text report lists (JSON has all).
const TABLE_ROWS: usize = 64;

/// What one PSN said about the order of its QP's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    InOrder,
    /// Ahead of the next expected PSN: this many PSNs were skipped.
    Gap(u32),
    /// Behind the next expected PSN and not seen before: arrived late.
    Reordered,
    Duplicate,
}

/// Follows one PSN sequence; remembers the last [`WINDOW`] PSNs so a late
/// packet is told apart from a duplicate and fills the gap it left.
#[derive(Clone, Debug)]
struct PsnTracker {
    /// Next expected PSN (one past the highest seen).
    next: Option<u32>,
    seen: Vec<u64>,
}

impl PsnTracker {
    fn new() -> Self {
        Self { next: None, seen: vec![0; (WINDOW / 64) as usize] }
    }

    fn bit(&mut self, psn: u32) -> (&mut u64, u64) {
        let i = psn % WINDOW;
        (&mut self.seen[(i / 64) as usize], 1u64 << (i % 64))
    }

    fn mark(&mut self, psn: u32, on: bool) {
        let (word, mask) = self.bit(psn);
        if on {
            *word |= mask;
        } else {
            *word &= !mask;
        }
    }

    fn observe(&mut self, psn: u32) -> Arrival {
        let psn = psn & PSN_MASK;
        let Some(next) = self.next else {
            self.next = Some((psn + 1) & PSN_MASK);
            self.mark(psn, true);
            return Arrival::InOrder;
        };
        let ahead = psn.wrapping_sub(next) & PSN_MASK;
        if ahead < PSN_HALF {
            // Forget what is about to leave the window, then record.
            if ahead >= WINDOW {
                self.seen.fill(0);
            } else {
                for skipped in 0..ahead {
                    self.mark(next.wrapping_add(skipped) & PSN_MASK, false);
                }
            }
            self.mark(psn, true);
            self.next = Some((psn + 1) & PSN_MASK);
            return if ahead == 0 { Arrival::InOrder } else { Arrival::Gap(ahead) };
        }
        // Behind: how far below the highest PSN seen.
        let back = next.wrapping_sub(1).wrapping_sub(psn) & PSN_MASK;
        if back < WINDOW {
            let (word, mask) = self.bit(psn);
            if *word & mask != 0 {
                return Arrival::Duplicate;
            }
            *word |= mask;
        }
        Arrival::Reordered
    }
}

/// Counters of one QP (one source, destination and DestQP).
#[derive(Clone, Debug, Default, Serialize)]
pub struct QpReport {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub dest_qp: u32,
    pub packets: u64,
    pub bytes: u64,
    /// Requests: SEND/WRITE/READ and everything not ACK or CNP.
    pub data: u64,
    pub acks: u64,
    pub cnps: u64,
    /// First and last request PSN received.
    pub first_psn: Option<u32>,
    pub last_psn: Option<u32>,
    /// Packets whose PSN was below the next expected one (arrived after a
    /// later packet of the same QP): reordering.
    pub reordered: u64,
    /// Jumps ahead in the request PSNs, and the PSNs skipped that never
    /// arrived late.
    pub gaps: u64,
    pub missing: u64,
    pub duplicates: u64,
    pub bad_icrc: u64,
    pub ce: u64,
}

/// Packets per ECN codepoint.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct EcnCounts {
    pub not_ect: u64,
    pub ect0: u64,
    pub ect1: u64,
    pub ce: u64,
}

/// Everything the sink saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SinkReport {
    pub dev: String,
    /// RoCEv2 packets and their frame bytes.
    pub packets: u64,
    pub bytes: u64,
    /// Frames that were not RoCEv2 (ARP, IPv6 ND, other UDP...), ignored.
    pub not_roce: u64,
    pub bad_icrc: u64,
    pub bad_ipv4_checksum: u64,
    pub ecn: EcnCounts,
    /// Packets carrying CE (same as ecn.ce).
    pub ce_marked: u64,
    pub fecn: u64,
    pub becn: u64,
    pub data: u64,
    pub acks: u64,
    pub cnps: u64,
    pub reordered: u64,
    pub gaps: u64,
    pub missing: u64,
    pub duplicates: u64,
    /// Packets by IPv4 TTL / IPv6 hop limit: each switch on the way takes one.
    pub ttl: std::collections::BTreeMap<u8, u64>,
    /// From the first to the last RoCEv2 packet.
    pub elapsed_secs: f64,
    pub pps: f64,
    /// Per QP, sorted by source, destination, DestQP.
    pub qps: Vec<QpReport>,
    /// Frames the kernel dropped before this sink read them (its socket's
    /// receive buffer was full): they arrived, and are missing above.
    pub observer_dropped: u64,
    /// `--rc`: what the responder accepted and answered, per QP.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub responder: Vec<ResponderQpReport>,
}

impl SinkReport {
    /// Every packet of every QP arrived in PSN order, once.
    pub fn in_order(&self) -> bool {
        self.reordered == 0 && self.duplicates == 0 && self.missing == 0
    }

    pub fn qp(&self, dest_qp: u32) -> Option<&QpReport> {
        self.qps.iter().find(|q| q.dest_qp == dest_qp)
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "rocev2 sink on {}: {} RoCEv2 packets ({} bytes) from {} QPs in {:.3} s from the first to the last ({:.0} pps); {} other frames ignored\n",
            self.dev,
            self.packets,
            self.bytes,
            self.qps.len(),
            self.elapsed_secs,
            self.pps,
            self.not_roce
        );
        use crate::render::{Align::*, Table};
        let mut table = Table::new(&[
            ("SRC", Left),
            ("DST", Left),
            ("QP", Right),
            ("PACKETS", Right),
            ("BYTES", Right),
            ("DATA", Right),
            ("ACK", Right),
            ("CNP", Right),
            ("PSN FIRST..LAST", Right),
            ("REORDERED", Right),
            ("GAPS(MISS)", Right),
            ("DUP", Right),
            ("BADICRC", Right),
            ("CE", Right),
        ])
        .indent(2);
        for q in self.qps.iter().take(TABLE_ROWS) {
            let ip = |a: Option<IpAddr>| a.map_or("-".to_string(), |a| a.to_string());
            let psns = match (q.first_psn, q.last_psn) {
                (Some(f), Some(l)) => format!("{f}..{l}"),
                _ => "-".into(),
            };
            table.row([
                ip(q.src),
                ip(q.dst),
                format!("{:#x}", q.dest_qp),
                q.packets.to_string(),
                q.bytes.to_string(),
                q.data.to_string(),
                q.acks.to_string(),
                q.cnps.to_string(),
                psns,
                q.reordered.to_string(),
                format!("{}({})", q.gaps, q.missing),
                q.duplicates.to_string(),
                q.bad_icrc.to_string(),
                q.ce.to_string(),
            ]);
        }
        s.push_str(&table.render());
        if self.qps.len() > TABLE_ROWS {
            s.push_str(&format!("  ... {} more QPs (see --json)\n", self.qps.len() - TABLE_ROWS));
        }
        let e = &self.ecn;
        s.push_str(&format!(
            "  classes: {} data, {} ACK, {} CNP; ECN: {} Not-ECT, {} ECT(0), {} ECT(1), {} CE; FECN {}, BECN {}\n",
            self.data, self.acks, self.cnps, e.not_ect, e.ect0, e.ect1, e.ce, self.fecn, self.becn
        ));
        s.push_str(&if self.bad_icrc == 0 {
            "  ICRC: all valid\n".to_string()
        } else {
            format!("  ICRC: {} packets with a BAD ICRC (something rewrote protected bytes)\n", self.bad_icrc)
        });
        if self.bad_ipv4_checksum > 0 {
            s.push_str(&format!("  IPv4 header checksum: {} bad\n", self.bad_ipv4_checksum));
        }
        let packets = |n: u64| if n == 1 { "1 packet".to_string() } else { format!("{n} packets") };
        s.push_str(&match (self.reordered, self.responder.is_empty()) {
            (0, _) => "  order: no packet reordered".to_string(),
            // A responder NAKs a gap and the requester goes back to it
            // (go-back-N): what arrives below the next PSN is that resend.
            (n, false) => format!(
                "  order: {} below the next expected PSN of their QP: go-back-N resends after a loss (see the NAKs below), or, without a loss, paths that changed inside a message",
                packets(n)
            ),
            (n, true) => format!(
                "  order: {} REORDERED (PSN below the next expected one of their QP): paths changed inside messages, e.g. a flowlet gap shorter than the path delay difference",
                packets(n)
            ),
        });
        s.push_str(&format!("; {} gaps ({} PSNs missing), {} duplicates", self.gaps, self.missing, self.duplicates));
        if self.observer_dropped > 0 {
            s.push_str(&format!(
                "\n  WARNING: this sink's socket dropped {} frames that arrived (its receive buffer was full): gaps above may be the sink's, not the network's",
                self.observer_dropped
            ));
        }
        if !self.responder.is_empty() {
            s.push('\n');
            s.push_str(&render_responder(&self.responder));
        }
        s
    }
}

#[derive(Clone)]
struct QpState {
    report: QpReport,
    requests: PsnTracker,
    acks: PsnTracker,
}

/// Tallies parsed frames; separate from the socket so it is testable (and
/// an RC endpoint checks what it receives with it).
#[derive(Default)]
pub(crate) struct Tally {
    pub(super) report: SinkReport,
    qps: HashMap<(IpAddr, IpAddr, u32), QpState>,
}

impl Tally {
    /// Counts and checks one frame; returns how its PSN arrived (None for
    /// frames without one worth checking).
    pub(crate) fn frame(&mut self, frame: &[u8]) -> Option<Arrival> {
        let Ok(p) = parse_roce(frame) else {
            self.report.not_roce += 1;
            return None;
        };
        let r = &mut self.report;
        r.packets += 1;
        r.bytes += frame.len() as u64;
        if !p.icrc_ok {
            r.bad_icrc += 1;
        }
        if p.ipv4_checksum_ok == Some(false) {
            r.bad_ipv4_checksum += 1;
        }
        *r.ttl.entry(p.ttl_or_hop_limit).or_default() += 1;
        match p.ecn {
            0 => r.ecn.not_ect += 1,
            2 => r.ecn.ect0 += 1,
            1 => r.ecn.ect1 += 1,
            _ => r.ecn.ce += 1,
        }
        r.fecn += u64::from(p.bth.fecn);
        r.becn += u64::from(p.bth.becn);
        let qp = self.qps.entry((p.src_ip, p.dst_ip, p.bth.dest_qp)).or_insert_with(|| QpState {
            report: QpReport { src: Some(p.src_ip), dst: Some(p.dst_ip), dest_qp: p.bth.dest_qp, ..Default::default() },
            requests: PsnTracker::new(),
            acks: PsnTracker::new(),
        });
        let q = &mut qp.report;
        q.packets += 1;
        q.bytes += frame.len() as u64;
        q.bad_icrc += u64::from(!p.icrc_ok);
        q.ce += u64::from(p.ecn == 3);
        let arrival = match seen(p.bth.opcode) {
            Seen::Cnp => {
                q.cnps += 1;
                None // CNPs carry no PSN worth checking (NICs send 0)
            }
            Seen::Ack(_) => {
                q.acks += 1;
                // ACKs are cumulative: skipping PSNs is normal, going back is not.
                match qp.acks.observe(p.bth.psn) {
                    Arrival::Gap(_) => Some(Arrival::InOrder),
                    a => Some(a),
                }
            }
            Seen::Data => {
                q.data += 1;
                q.first_psn.get_or_insert(p.bth.psn);
                q.last_psn = Some(p.bth.psn);
                Some(qp.requests.observe(p.bth.psn))
            }
        };
        match arrival {
            Some(Arrival::Gap(n)) => {
                q.gaps += 1;
                q.missing += u64::from(n);
            }
            Some(Arrival::Reordered) => {
                q.reordered += 1;
                // It had been counted missing when the gap opened.
                q.missing = q.missing.saturating_sub(1);
            }
            Some(Arrival::Duplicate) => q.duplicates += 1,
            Some(Arrival::InOrder) | None => {}
        }
        arrival
    }

    pub(crate) fn finish(mut self, dev: &str, elapsed: f64) -> SinkReport {
        let mut qps: Vec<QpReport> = self.qps.into_values().map(|s| s.report).collect();
        qps.sort_by_key(|q| (q.src, q.dst, q.dest_qp));
        let r = &mut self.report;
        r.dev = dev.to_owned();
        r.ce_marked = r.ecn.ce;
        for q in &qps {
            r.data += q.data;
            r.acks += q.acks;
            r.cnps += q.cnps;
            r.reordered += q.reordered;
            r.gaps += q.gaps;
            r.missing += q.missing;
            r.duplicates += q.duplicates;
        }
        r.elapsed_secs = elapsed;
        r.pps = if elapsed > 0.0 { r.packets as f64 / elapsed } else { 0.0 };
        r.qps = qps;
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocev2_common::bth::opcode;

    fn observe_all(psns: &[u32]) -> Vec<Arrival> {
        let mut t = PsnTracker::new();
        psns.iter().map(|p| t.observe(*p)).collect()
    }

    #[test]
    fn psn_tracker_classifies_arrivals() {
        use Arrival::*;
        assert_eq!(observe_all(&[5, 6, 7]), [InOrder, InOrder, InOrder]);
        assert_eq!(observe_all(&[5, 7, 6, 8]), [InOrder, Gap(1), Reordered, InOrder]);
        assert_eq!(observe_all(&[5, 6, 6, 5]), [InOrder, InOrder, Duplicate, Duplicate]);
        assert_eq!(observe_all(&[PSN_MASK - 1, PSN_MASK, 0, 1]), [InOrder; 4]);
        assert_eq!(observe_all(&[PSN_MASK, 1, 0]), [InOrder, Gap(1), Reordered]);
        // A late packet far behind the window is still reordering.
        assert_eq!(observe_all(&[0, 10_000, 5]), [InOrder, Gap(9_999), Reordered]);
    }

    #[test]
    fn reorder_fills_the_gap_it_left() {
        use crate::tools::packet::{build_roce_frame, RoceFrameSpec};
        use rocev2_common::bth::Bth;
        let frame = |qp: u32, psn: u32, op: u8| {
            build_roce_frame(&RoceFrameSpec {
                src_mac: [2, 0, 0, 0, 0, 1],
                dst_mac: [2, 0, 0, 0, 0, 2],
                vlan: None,
                src_ip: "10.0.0.1".parse().unwrap(),
                dst_ip: "10.0.0.2".parse().unwrap(),
                ttl: 64,
                dscp: 26,
                ecn: 3,
                src_port: 0xC000,
                bth: Bth {
                    opcode: op,
                    solicited: false,
                    pad_count: 0,
                    pkey: 0xFFFF,
                    fecn: false,
                    becn: op == opcode::CNP,
                    dest_qp: qp,
                    ack_req: false,
                    psn,
                },
                payload_len: 16,
            })
        };
        let mut t = Tally::default();
        for (qp, psn, op) in [
            (1, 0, 7),
            (1, 2, 7),
            (1, 1, 7),
            (1, 3, 7),
            (2, 0, 7),
            (2, 0, 7),
            (1, 0, opcode::CNP),
            (1, 0, opcode::CNP),
            (1, 9, opcode::ACK),
        ] {
            t.frame(&frame(qp, psn, op));
        }
        let mut bad = frame(2, 1, 7);
        let n = bad.len();
        bad[n - 10] ^= 1;
        t.frame(&bad);
        t.frame(&[0u8; 60]);
        let r = t.finish("x", 1.0);
        assert_eq!(r.packets, 10);
        assert_eq!(r.not_roce, 1);
        assert_eq!(r.bad_icrc, 1);
        assert_eq!(r.ce_marked, 10);
        assert_eq!((r.data, r.acks, r.cnps), (7, 1, 2));
        let q1 = r.qp(1).unwrap();
        assert_eq!((q1.reordered, q1.gaps, q1.missing, q1.duplicates), (1, 1, 0, 0));
        let q2 = r.qp(2).unwrap();
        assert_eq!((q2.reordered, q2.gaps, q2.missing, q2.duplicates), (0, 0, 0, 1));
        assert!(!r.in_order());
        let text = r.render();
        assert!(text.contains("1 packet REORDERED"), "{text}");
        assert!(text.contains("BAD ICRC"), "{text}");
    }
}
