//! Arrival counting: what a receiving device's own XDP program (the lab's
//! arrival probe, in the tools object) records of the RoCEv2 frames that
//! land on it, before any socket could drop them. Per flow (source,
//! destination, DestQP) it follows the data PSNs: in order, a gap (PSNs
//! skipped), a late packet (fills a gap: reordering) or a duplicate, and it
//! reports each anomaly with its time as an [`ArrivalEvent`], so a test can
//! tell when frames went missing.

use crate::telemetry::{psn_step, PsnStep};

/// Flows one probe follows (beyond: counted in `untracked`).
pub const MAX_ARRIVAL_FLOWS: u32 = 4096;
/// Bytes of the anomaly event ring.
pub const ARRIVAL_EVENT_RING_BYTES: u32 = 1 << 20;
/// PSNs behind the highest seen that are remembered one by one, so a
/// duplicate is told from a late packet (further back: late).
pub const ARRIVAL_WINDOW: u32 = 64;

pub mod names {
    pub const ARRIVAL_FLOWS: &str = "ARRIVAL_FLOWS";
    pub const ARRIVAL_TOTALS: &str = "ARRIVAL_TOTALS";
    pub const ARRIVAL_EVENTS: &str = "ARRIVAL_EVENTS";
}

/// One flow: the packet's source, destination (IPv4 in the first word) and DestQP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArrivalKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub dest_qp: u32,
    /// 4 or 6.
    pub family: u32,
}

/// What arrived of one flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowArrival {
    /// Every RoCEv2 frame of the flow (data, ACKs, CNPs).
    pub packets: u64,
    /// Data PSNs skipped (gaps opened) less those that arrived late.
    pub missing: u64,
    pub gaps: u64,
    /// Data packets behind the highest PSN seen, not seen before.
    pub late: u64,
    pub duplicates: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    /// Bit i: PSN `next_psn - 1 - i` arrived.
    pub window: u64,
    /// One past the highest data PSN seen.
    pub next_psn: u32,
    /// 1 once a data PSN was seen.
    pub started: u32,
}

/// What one data PSN was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    InOrder,
    /// Ahead of the next expected PSN: this many were skipped.
    Gap(u32),
    /// Behind the highest PSN, not seen before.
    Late,
    Duplicate,
}

impl FlowArrival {
    /// Counts one frame at `now` (ns); `psn` for data packets, `None` for
    /// ACKs and CNPs (whose PSNs are not a sequence).
    #[inline(always)]
    pub fn observe(&mut self, psn: Option<u32>, now: u64) -> Arrival {
        if self.packets == 0 {
            self.first_ns = now;
        }
        self.packets += 1;
        self.last_ns = now;
        let Some(psn) = psn else { return Arrival::InOrder };
        let psn = psn & crate::bth::PSN_MASK;
        if self.started == 0 {
            self.started = 1;
            self.next_psn = (psn + 1) & crate::bth::PSN_MASK;
            self.window = 1;
            return Arrival::InOrder;
        }
        match psn_step(self.next_psn, psn) {
            PsnStep::InOrder => {
                self.advance(psn, 1);
                Arrival::InOrder
            }
            PsnStep::Forward(skipped) => {
                self.advance(psn, skipped + 1);
                self.gaps += 1;
                self.missing += u64::from(skipped);
                Arrival::Gap(skipped)
            }
            PsnStep::Backward => {
                let back = self.next_psn.wrapping_sub(1).wrapping_sub(psn) & crate::bth::PSN_MASK;
                if back < ARRIVAL_WINDOW {
                    let bit = 1u64 << back;
                    if self.window & bit != 0 {
                        self.duplicates += 1;
                        return Arrival::Duplicate;
                    }
                    self.window |= bit;
                }
                self.late += 1;
                self.missing = self.missing.saturating_sub(1);
                Arrival::Late
            }
        }
    }

    #[inline(always)]
    fn advance(&mut self, psn: u32, shift: u32) {
        self.window = if shift >= 64 { 1 } else { (self.window << shift) | 1 };
        self.next_psn = (psn + 1) & crate::bth::PSN_MASK;
    }
}

/// Frames one probe saw, per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrivalTotals {
    /// RoCEv2 frames (UDP 4791 with a BTH).
    pub roce: u64,
    /// Everything else (ARP, neighbour discovery, BGP, ...).
    pub other: u64,
    /// RoCEv2 frames of flows beyond MAX_ARRIVAL_FLOWS (counted, not followed).
    pub untracked: u64,
    /// Anomalies the event ring had no room for.
    pub events_lost: u64,
}

/// `ArrivalEvent::kind`.
pub const EVENT_GAP: u32 = 1;
pub const EVENT_LATE: u32 = 2;
pub const EVENT_DUPLICATE: u32 = 3;

/// One anomaly: a gap opened (`count` PSNs skipped before `psn`), a late
/// packet or a duplicate (`psn`), at `time_ns` (CLOCK_MONOTONIC).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrivalEvent {
    pub key: ArrivalKey,
    pub kind: u32,
    pub psn: u32,
    pub count: u32,
    pub _reserved: u32,
    pub time_ns: u64,
}

const _: () = assert!(core::mem::size_of::<ArrivalKey>() == 40);
const _: () = assert!(core::mem::size_of::<FlowArrival>() == 72);
const _: () = assert!(core::mem::size_of::<ArrivalEvent>() == 64);

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::ArrivalKey {}
    unsafe impl aya::Pod for super::FlowArrival {}
    unsafe impl aya::Pod for super::ArrivalTotals {}
    unsafe impl aya::Pod for super::ArrivalEvent {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bth::PSN_MASK;
    use std::vec::Vec;

    fn run(psns: &[u32]) -> (Vec<Arrival>, FlowArrival) {
        let mut f = FlowArrival::default();
        let out = psns.iter().map(|p| f.observe(Some(*p), 0)).collect();
        (out, f)
    }

    #[test]
    fn classifies_gaps_late_packets_and_duplicates() {
        use Arrival::*;
        assert_eq!(run(&[5, 6, 7]).0, [InOrder, InOrder, InOrder]);
        let (a, f) = run(&[5, 8, 6, 7, 9]);
        assert_eq!(a, [InOrder, Gap(2), Late, Late, InOrder]);
        assert_eq!((f.gaps, f.missing, f.late, f.duplicates), (1, 0, 2, 0));
        let (a, f) = run(&[5, 6, 6, 5, 7]);
        assert_eq!(a, [InOrder, InOrder, Duplicate, Duplicate, InOrder]);
        assert_eq!((f.missing, f.duplicates), (0, 2));
        assert_eq!(run(&[PSN_MASK - 1, PSN_MASK, 0, 1]).0, [InOrder; 4]);
        let (a, f) = run(&[PSN_MASK, 1, 0]);
        assert_eq!(a, [InOrder, Gap(1), Late]);
        assert_eq!(f.missing, 0);
        // A gap that never fills stays missing; far-behind packets are late.
        let (a, f) = run(&[0, 100, 101, 3]);
        assert_eq!(a, [InOrder, Gap(99), InOrder, Late]);
        assert_eq!((f.gaps, f.missing, f.late), (1, 98, 1));
        // A duplicate just inside the window; the window survives big jumps.
        let (a, _) = run(&[0, 63, 0, 1000, 1000 - 63, 1000 - 63]);
        assert_eq!(a, [InOrder, Gap(62), Duplicate, Gap(936), Late, Duplicate]);
    }

    #[test]
    fn acks_and_cnps_count_without_a_sequence() {
        let mut f = FlowArrival::default();
        assert_eq!(f.observe(None, 10), Arrival::InOrder);
        assert_eq!(f.observe(Some(7), 20), Arrival::InOrder);
        assert_eq!(f.observe(None, 30), Arrival::InOrder);
        assert_eq!((f.packets, f.first_ns, f.last_ns, f.next_psn), (3, 10, 30, 8));
    }
}
