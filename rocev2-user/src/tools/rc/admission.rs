//! Receiver-driven admission (the paper's choice over DCQCN): a sender asks
//! before it sends a message, and the receiver grants each sender bytes
//! with a clear-to-send (CTS) when it can take them, so what converges on
//! a receiver never queues more than the receiver allows.
//!
//! - For every message it has ready, the sender sends a request-to-send
//!   (RTS) naming the message and its size, and sends the message's data
//!   only once the receiver has granted it.
//! - The receiver queues the requests of all its senders in the order they
//!   arrive and grants them in that order while the bytes granted but not
//!   yet received stay within its window: one message, and a little more so
//!   that the next grant is on its way before the current message ends
//!   (the overlap is the most that two senders' traffic can queue at the
//!   receiver's link).
//! - RTS and CTS are small control messages in the high-priority class
//!   (DSCP 48, exempt from ECN, served first by every queue): an RDMA WRITE
//!   only with immediate and no data (opcode 0x0B) whose RETH carries the
//!   bytes and whose immediate names the message, on the connection's
//!   control QP (its data QPs' number with the low 6 bits set), each
//!   direction with its own PSN sequence. A sender repeats an RTS that got
//!   no CTS for [`RTS_RETRY`]; a receiver answers a repeated RTS of a
//!   granted message with its CTS again.

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    time::Duration,
};

use rocev2_common::bth::{opcode, Bth};

use crate::tools::{
    gen::reth,
    packet::{build_roce_frame_with_header, ParsedRoce, RoceFrameSpec},
};

/// The low bits of a control QP's number.
pub const CONTROL_QP_BITS: u32 = 0x3F;
/// A sender asks again after this long without a CTS.
pub const RTS_RETRY: Duration = Duration::from_millis(200);
/// Bytes after the BTH of a control message: RETH and immediate.
const CONTROL_LEN: usize = 16 + 4;

/// The control QP of the connection whose data QPs include `data_qp`.
pub fn control_qp(data_qp: u32) -> u32 {
    data_qp | CONTROL_QP_BITS
}

pub fn is_control_qp(qp: u32) -> bool {
    qp & CONTROL_QP_BITS == CONTROL_QP_BITS
}

/// Request to send (sender to receiver) or clear to send (receiver to sender).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Rts,
    Cts,
}

/// One RTS or CTS: message `message` (its number on its QP, from 0) of
/// the data QP `data_qp`, of `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    pub kind: Kind,
    pub data_qp: u32,
    pub message: u32,
    pub bytes: u32,
}

impl Control {
    /// The frame, with `base`'s addressing, DSCP and ECN, at PSN `psn` of the control QP.
    pub fn frame(&self, base: &RoceFrameSpec, psn: u32) -> Vec<u8> {
        let qp = control_qp(self.data_qp);
        let mut spec = base.clone();
        spec.bth = Bth::new(opcode::WRITE_ONLY_IMM, qp, psn);
        spec.payload_len = CONTROL_LEN;
        let mut ext = reth(qp, self.bytes).to_vec();
        let kind = u32::from(self.kind == Kind::Cts) << 7;
        ext.extend_from_slice(&((self.message << 8) | kind | (self.data_qp & CONTROL_QP_BITS)).to_be_bytes());
        build_roce_frame_with_header(&spec, &ext)
    }

    /// The control message `p` carries, if it is one.
    pub fn parse(p: &ParsedRoce, frame: &[u8]) -> Option<Self> {
        if p.bth.opcode != opcode::WRITE_ONLY_IMM || !is_control_qp(p.bth.dest_qp) || p.payload_len != CONTROL_LEN {
            return None;
        }
        let ext = frame.get(p.bth_offset + rocev2_common::bth::BTH_LEN..)?.get(..CONTROL_LEN)?;
        let bytes = u32::from_be_bytes(ext[12..16].try_into().ok()?);
        let imm = u32::from_be_bytes(ext[16..20].try_into().ok()?);
        Some(Self {
            kind: if imm & 0x80 != 0 { Kind::Cts } else { Kind::Rts },
            data_qp: (p.bth.dest_qp & !CONTROL_QP_BITS) | (imm & CONTROL_QP_BITS),
            message: imm >> 8,
            bytes,
        })
    }
}

/// A request waiting for its grant, and where the grant goes.
#[derive(Clone, Debug)]
pub struct Request {
    pub src: IpAddr,
    pub control: Control,
    /// Addressing of the CTS back to the sender.
    pub reply: RoceFrameSpec,
}

#[derive(Clone, Copy, Debug, Default)]
struct QpCredit {
    /// Bytes granted to this QP so far, and received of them.
    granted: u64,
    received: u64,
    /// The highest message number granted, if any.
    last_granted: Option<u32>,
}

/// The receiver's side: requests in arrival order, grants within a window.
#[derive(Clone, Debug)]
pub struct Admission {
    window: u64,
    queue: VecDeque<Request>,
    qps: HashMap<(IpAddr, u32), QpCredit>,
    /// RTS received, CTS sent, RTS repeated.
    pub requests: u64,
    pub grants: u64,
    pub repeats: u64,
}

impl Admission {
    /// Grants while the bytes granted and not yet received stay within
    /// `window` (a message is granted whole, one at a time at least).
    pub fn new(window: u64) -> Self {
        Self { window, queue: VecDeque::new(), qps: HashMap::new(), requests: 0, grants: 0, repeats: 0 }
    }

    /// Bytes granted that have not arrived.
    pub fn outstanding(&self) -> u64 {
        self.qps.values().map(|c| c.granted.saturating_sub(c.received)).sum()
    }

    /// An RTS arrived; returns a CTS to send again if the message had been granted.
    pub fn request(&mut self, r: Request) -> Option<Request> {
        let key = (r.src, r.control.data_qp);
        let granted = self.qps.get(&key).and_then(|c| c.last_granted).is_some_and(|g| r.control.message <= g);
        let queued = self
            .queue
            .iter()
            .any(|q| q.src == r.src && q.control.data_qp == key.1 && q.control.message == r.control.message);
        if granted {
            self.repeats += 1;
            return Some(r);
        }
        if queued {
            self.repeats += 1;
        } else {
            self.requests += 1;
            self.queue.push_back(r);
        }
        None
    }

    /// Data of a granted message arrived (accepted in order).
    pub fn received(&mut self, src: IpAddr, data_qp: u32, bytes: u64) {
        if let Some(c) = self.qps.get_mut(&(src, data_qp)) {
            c.received += bytes;
        }
    }

    /// The requests to grant now, in order.
    pub fn grant(&mut self) -> Vec<Request> {
        let mut out = Vec::new();
        while let Some(next) = self.queue.front() {
            let outstanding = self.outstanding();
            if outstanding > 0 && outstanding + u64::from(next.control.bytes) > self.window {
                break;
            }
            let r = self.queue.pop_front().expect("peeked");
            let c = self.qps.entry((r.src, r.control.data_qp)).or_default();
            c.granted += u64::from(r.control.bytes);
            c.last_granted = Some(c.last_granted.map_or(r.control.message, |g| g.max(r.control.message)));
            self.grants += 1;
            out.push(r);
        }
        out
    }

    pub fn waiting(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::packet::parse_roce;

    fn base() -> RoceFrameSpec {
        RoceFrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src_ip: "10.1.1.1".parse().unwrap(),
            dst_ip: "10.2.1.1".parse().unwrap(),
            ttl: 64,
            dscp: 48,
            ecn: 0,
            src_port: 0xC001,
            bth: Bth::new(0, 0, 0),
            payload_len: 0,
        }
    }

    #[test]
    fn admission_control_messages_round_trip() {
        let c = Control { kind: Kind::Cts, data_qp: 0x8043, message: 77, bytes: 131072 };
        let f = c.frame(&base(), 9);
        let p = parse_roce(&f).unwrap();
        assert!(p.icrc_ok);
        assert_eq!((p.bth.opcode, p.bth.dest_qp, p.bth.psn), (0x0B, 0x807F, 9));
        assert_eq!(Control::parse(&p, &f), Some(c));
        let rts = Control { kind: Kind::Rts, ..c };
        let f = rts.frame(&base(), 0);
        assert_eq!(Control::parse(&parse_roce(&f).unwrap(), &f), Some(rts));
        assert_eq!(control_qp(0x8043), 0x807F);
    }

    #[test]
    fn admission_grants_in_order_within_the_window() {
        let mut a = Admission::new(160 << 10);
        let req = |src: &str, qp: u32, message: u32| Request {
            src: src.parse().unwrap(),
            control: Control { kind: Kind::Rts, data_qp: qp, message, bytes: 128 << 10 },
            reply: base(),
        };
        for r in [req("10.1.1.1", 0x40, 0), req("10.1.2.1", 0x80, 0), req("10.1.1.1", 0x40, 1)] {
            assert!(a.request(r).is_none());
        }
        // One message at a time: the second waits for all but 32k of the first.
        let g = a.grant();
        assert_eq!(g.len(), 1);
        assert_eq!(a.outstanding(), 128 << 10);
        a.received("10.1.1.1".parse().unwrap(), 0x40, 64 << 10);
        assert!(a.grant().is_empty());
        a.received("10.1.1.1".parse().unwrap(), 0x40, 32 << 10);
        let g = a.grant();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].src, "10.1.2.1".parse::<IpAddr>().unwrap());
        // A repeated RTS of a granted message brings its CTS again; of a queued one, nothing.
        assert!(a.request(req("10.1.2.1", 0x80, 0)).is_some());
        assert!(a.request(req("10.1.1.1", 0x40, 1)).is_none());
        assert_eq!((a.requests, a.grants, a.repeats, a.waiting()), (3, 2, 2, 1));
    }
}
