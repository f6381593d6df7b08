//! Per-QP transport telemetry: what the dataplane learns from the BTHs it
//! forwards, kept in a bounded LRU table of the most recently active QPs
//! (destination, DestQP) and summed per group member.
//!
//! Both directions of an RC connection cross a rack switch: the data one
//! way, its ACKs, NAKs and CNPs the other. A reply carries the requester's
//! QP number, not the data's, so the table links the two through the pair
//! of addresses and the UDP source port, which a NIC derives from both QP
//! numbers and uses in both directions.

use crate::bth::{aeth, opcode, PSN_MASK};

/// Default size of the QP table (entries; LRU beyond).
pub const DEFAULT_QP_TABLE_SIZE: u32 = 4096;
/// Sequence jumps larger than this (24-bit PSN space) are backward.
pub const PSN_HALF: u32 = 0x80_0000;
/// Set in [`QpStats::next_psn`] once a PSN was seen (PSNs are 24 bits).
pub const PSN_SEEN: u32 = 1 << 31;

pub mod names {
    pub use crate::maps::names::{MEMBER_TRANSPORT, QP_REPLIES, QP_TELEMETRY, TRACE_EVENTS, TRACE_FILTER};
}

/// A data QP: destination address (IPv4 in the first word) and DestQP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QpKey {
    pub dst: [u32; 4],
    pub dest_qp: u32,
    /// 4 or 6.
    pub family: u32,
}

/// The direction-free identity of a connection's packets: where a data
/// packet goes, where it comes from, its UDP source port. A reply's key
/// has the addresses the other way round.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReplyKey {
    /// The data's destination (the reply's source).
    pub responder: [u32; 4],
    /// The data's source (the reply's destination).
    pub requester: [u32; 4],
    pub src_port: u32,
    pub family: u32,
}

/// What the table holds per data QP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct QpStats {
    /// Data packets and their frame bytes.
    pub packets: u64,
    pub bytes: u64,
    pub last_seen_ns: u64,
    /// The group and member position of the last data packet (JSON names
    /// the slot `group_index`: `top` names the group as `group`).
    #[cfg_attr(feature = "user", serde(rename = "group_index"))]
    pub group: u32,
    pub position: u32,
    /// The PSN after the highest seen, with [`PSN_SEEN`] set once one was.
    #[cfg_attr(feature = "user", serde(skip))]
    pub next_psn: u32,
    /// The last data PSN seen.
    #[cfg_attr(feature = "user", serde(skip))]
    pub last_psn: u32,
    /// Above: what an in-order data packet writes (40 bytes, in the slot's
    /// first cache line with the key, see [`QpSlot`]). Below: written on
    /// the first packet, on trouble or by replies.
    pub first_seen_ns: u64,
    /// PSNs ahead of the next expected one (loss upstream) and the PSNs
    /// they skipped.
    pub psn_forward_jumps: u64,
    pub psns_skipped: u64,
    /// PSNs below the next expected one: retransmissions or reordering.
    pub psn_backward_jumps: u64,
    /// Replies from the responder attributed to this QP.
    pub acks: u64,
    pub naks_sequence: u64,
    pub naks_rnr: u64,
    pub naks_other: u64,
    pub cnps: u64,
    /// Data packets that left CE-marked (by this dataplane's ECN marking
    /// or upstream).
    pub ce_marked: u64,
    /// Times the member carrying the QP's data changed.
    pub member_changes: u64,
    /// The data's source address and UDP source port (the rest of the
    /// flow key: what `explain` needs to repeat the member choice; JSON
    /// has them as addresses beside the stats).
    #[cfg_attr(feature = "user", serde(skip))]
    pub src: [u32; 4],
    #[cfg_attr(feature = "user", serde(skip))]
    pub src_port: u32,
    #[cfg_attr(feature = "user", serde(skip))]
    pub _pad: u32,
}

/// One entry of the QP table (`QP_TELEMETRY`, an array): the QP it holds
/// and its stats, three cache lines. The key and the fields an in-order
/// data packet writes fill the first line exactly, so the steady state of
/// a busy QP reads and writes one line (the array is mmapable, which puts
/// its first value on a page boundary).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpSlot {
    /// `family` 0: the slot is empty.
    pub key: QpKey,
    pub stats: QpStats,
    pub _pad: [u32; 4],
}

/// Ways of the QP table: a QP lives in one of the [`QP_WAYS`] slots of the
/// set its key hashes to ([`qp_set`]); a new QP takes an empty one, else
/// the one seen least recently (an LRU per set).
pub const QP_WAYS: u32 = 8;

/// Slots of the QP table for `telemetry_qps` (0 = off, one slot then):
/// twice that, rounded up to a power of two, at least one set. Twice, so
/// a set rarely overflows: with the table a quarter full (`telemetry_qps`
/// QPs or fewer, at most half), a set of 8 holds more than 8 QPs about
/// once in 4,000 sets.
pub const fn qp_table_slots(telemetry_qps: u32) -> u32 {
    if telemetry_qps == 0 {
        return QP_WAYS;
    }
    let want = (telemetry_qps as u64) * 2;
    let slots = want.next_power_of_two();
    if slots < QP_WAYS as u64 {
        QP_WAYS
    } else {
        slots as u32
    }
}

/// The set (its first slot is `set * QP_WAYS`) of a QP in a table of
/// `sets_mask + 1` sets (a power of two). Four 64-bit multiplies: the
/// table is an array, so this replaces the hash map's jhash and bucket
/// walk. The eBPF program and the readers' tests share it.
#[inline(always)]
pub fn qp_set(key: &QpKey, sets_mask: u32) -> u32 {
    qp_set_of(&key.dst, key.dest_qp, sets_mask)
}

/// [`qp_set`] of a QP given by its parts, read where they lie (the eBPF
/// program hashes the flow key's words, not a copy of them).
///
/// The five words as three 64-bit lanes, each folded in by a multiply,
/// then a 64-bit finaliser that brings every bit down to the low ones
/// (BPF has 64-bit registers: a 32-bit hash's rotates and wrap-arounds
/// each cost masks there, which took this hash from some 50 instructions
/// to about 25).
#[inline(always)]
pub fn qp_set_of(dst: &[u32; 4], dest_qp: u32, sets_mask: u32) -> u32 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let a = u64::from(dst[0]) | u64::from(dest_qp) << 32;
    let b = u64::from(dst[1]) | u64::from(dst[2]) << 32;
    let mut h = a.wrapping_mul(K);
    h = (h ^ b).wrapping_mul(K);
    h = (h ^ u64::from(dst[3])).wrapping_mul(K);
    h ^= h >> 29;
    h = h.wrapping_mul(K);
    h ^= h >> 32;
    h as u32 & sets_mask
}

/// Where the QP table's slots are: the QP_TELEMETRY array in the pipeline,
/// a map value's copies in the bench's primitive, so both run [`find`] and
/// [`data_of_known`].
///
/// # Safety
/// A slot returned is valid for the program run.
pub unsafe trait QpTable {
    /// The slot at `index`, if the table has one there.
    fn slot(&self, index: u32) -> Option<*mut QpSlot>;
}

/// The first slot of a QP's set ([`qp_set_of`] times [`QP_WAYS`]).
#[inline(always)]
pub fn set_start(dst: &[u32; 4], dest_qp: u32, sets_mask: u32) -> u32 {
    qp_set_of(dst, dest_qp, sets_mask) * QP_WAYS
}

/// The slot of the set starting at `set` that holds the QP (`dst`,
/// `dest_qp`) of `family`: the set's ways compared in order.
#[inline(always)]
pub fn find<T: QpTable>(table: &T, dst: &[u32; 4], dest_qp: u32, family: u32, set: u32) -> Option<*mut QpSlot> {
    for way in 0..QP_WAYS {
        let slot = table.slot(set + way)?;
        // SAFETY: a valid slot (QpTable's contract); a slot being
        // rewritten on another CPU may match or not, as with any race on
        // this table.
        let k = unsafe { &(*slot).key };
        if k.dest_qp == dest_qp && k.dst == *dst && k.family == family {
            return Some(slot);
        }
    }
    None
}

/// A data packet of a QP the table holds, in its slot's stats: the member
/// the QP's data took before this packet (the one a jump back blames, as
/// group and position), then the packet counted ([`QpStats::data`]).
#[inline(always)]
pub fn data_of_known(
    s: &mut QpStats,
    psn: u32,
    bytes: u64,
    group: u32,
    position: u32,
    ce_marked: bool,
    now: u64,
) -> (u32, u32, PsnStep) {
    let (before_group, before_position) = (s.group, s.position);
    (before_group, before_position, s.data(psn, bytes, group, position, ce_marked, now))
}

/// Per group member: the transport signals of the QPs it carries. Indexed
/// like MEMBER_STATS; per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberTransport {
    pub psn_forward_jumps: u64,
    /// Counted on the member the QP took before the jump back (where the
    /// loss that caused the resend happened), not the one the resend took.
    pub psn_backward_jumps: u64,
    pub naks_sequence: u64,
    pub naks_other: u64,
    pub cnps: u64,
    pub ce_marked: u64,
    /// Flowlets of its QPs ended by an ACK of everything they had sent
    /// (`repick = "idle-or-acked"`): their next packet chose a member again.
    pub acked_repicks: u64,
}

/// `rocev2 trace`'s filter, in `TRACE_FILTER[0]`; `active` 0 = no trace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceFilter {
    pub active: u32,
    /// TRACE_MATCH_* bits: which of the fields below must match.
    pub matches: u32,
    pub family: u32,
    pub dest_qp: u32,
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub opcode: u32,
    /// UDP source port.
    pub src_port: u32,
}

pub const TRACE_MATCH_SRC: u32 = 1;
pub const TRACE_MATCH_DST: u32 = 2;
pub const TRACE_MATCH_QP: u32 = 4;
pub const TRACE_MATCH_OPCODE: u32 = 8;
pub const TRACE_MATCH_PORT: u32 = 16;
/// Ring buffer size for trace events (bytes, a power of two).
pub const TRACE_RING_BYTES: u32 = 256 * 1024;

/// One traced packet's decision, as forwarded (headers already rewritten).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// CLOCK_MONOTONIC ns as of the tick (the coarse clock, which the
    /// program reads once a tick per CPU); `trace` prints no time.
    pub ts_ns: u64,
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub family: u32,
    pub dest_qp: u32,
    pub psn: u32,
    pub group: u32,
    pub position: u32,
    pub ifindex: u32,
    /// skb priority the class set (tc only), 0 otherwise.
    pub priority: u32,
    pub len: u32,
    pub src_port: u16,
    pub opcode: u8,
    /// DSCP << 2 | ECN as the packet leaves.
    pub tos: u8,
}

impl TraceFilter {
    #[inline(always)]
    pub fn matches(
        &self,
        family: u32,
        src: &[u32; 4],
        dst: &[u32; 4],
        src_port: u16,
        dest_qp: u32,
        opcode: u8,
    ) -> bool {
        let m = self.matches;
        (m & (TRACE_MATCH_SRC | TRACE_MATCH_DST) == 0 || self.family == family)
            && (m & TRACE_MATCH_SRC == 0 || self.src == *src)
            && (m & TRACE_MATCH_DST == 0 || self.dst == *dst)
            && (m & TRACE_MATCH_QP == 0 || self.dest_qp == dest_qp)
            && (m & TRACE_MATCH_OPCODE == 0 || self.opcode == u32::from(opcode))
            && (m & TRACE_MATCH_PORT == 0 || self.src_port == u32::from(src_port))
    }
}

const _: () = {
    assert!(core::mem::size_of::<TraceFilter>() == 56);
    assert!(core::mem::size_of::<TraceEvent>() == 80);
    assert!(core::mem::size_of::<QpKey>() == 24);
    assert!(core::mem::size_of::<ReplyKey>() == 40);
    assert!(core::mem::size_of::<QpStats>() == 152);
    assert!(core::mem::size_of::<QpSlot>() == 192);
    // The key and the in-order data fields: the first 64 bytes.
    assert!(core::mem::offset_of!(QpSlot, stats) + core::mem::offset_of!(QpStats, first_seen_ns) == 64);
    assert!(core::mem::size_of::<MemberTransport>() == 56);
};

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::QpKey {}
    unsafe impl aya::Pod for super::ReplyKey {}
    unsafe impl aya::Pod for super::QpStats {}
    unsafe impl aya::Pod for super::QpSlot {}
    unsafe impl aya::Pod for super::MemberTransport {}
    unsafe impl aya::Pod for super::TraceFilter {}
    unsafe impl aya::Pod for super::TraceEvent {}
}

/// What a BTH opcode carries: data, an acknowledgement or a CNP (for the
/// telemetry, the sink and the RC responder alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A request or response carrying data, with its PSN.
    Data,
    /// An ACK whose AETH syndrome is given.
    Ack(u8),
    Cnp,
}

#[inline(always)]
pub fn seen(op: u8) -> Seen {
    if op == opcode::CNP {
        Seen::Cnp
    } else if matches!(op & 0x1F, opcode::ACK | opcode::ATOMIC_ACK) && op >> 5 != 3 {
        // RC/UC/RD (never UD) acknowledgements.
        Seen::Ack(0)
    } else {
        Seen::Data
    }
}

/// What one data PSN says, given the QP's next expected PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsnStep {
    InOrder,
    /// Skipped this many PSNs.
    Forward(u32),
    Backward,
}

#[inline(always)]
pub fn psn_step(next: u32, psn: u32) -> PsnStep {
    let ahead = psn.wrapping_sub(next) & PSN_MASK;
    if ahead == 0 {
        PsnStep::InOrder
    } else if ahead < PSN_HALF {
        PsnStep::Forward(ahead)
    } else {
        PsnStep::Backward
    }
}

impl QpStats {
    /// Transport trouble signals: NAKs, retransmissions, gaps and CNPs.
    pub fn trouble(&self) -> u64 {
        self.naks_sequence
            + self.naks_rnr
            + self.naks_other
            + self.psn_backward_jumps
            + self.psn_forward_jumps
            + self.cnps
    }

    /// Counts one data packet; `now` in ns, `position` the member it takes.
    #[inline(always)]
    pub fn data(&mut self, psn: u32, bytes: u64, group: u32, position: u32, ce_marked: bool, now: u64) -> PsnStep {
        if self.packets == 0 {
            self.first_seen_ns = now;
        } else if self.group != group || self.position != position {
            self.member_changes += 1;
        }
        self.packets += 1;
        self.bytes += bytes;
        self.last_seen_ns = now;
        self.group = group;
        self.position = position;
        if ce_marked {
            // Only then: an unmarked packet leaves this line alone.
            self.ce_marked += 1;
        }
        // Against the highest PSN: ahead is a gap (loss upstream). Behind
        // it, a jump back from the last PSN starts a resend (or a late
        // packet); the resend climbing back up in order is not counted again.
        let step = if self.next_psn & PSN_SEEN == 0 {
            PsnStep::InOrder
        } else {
            match psn_step(self.next_psn & PSN_MASK, psn) {
                PsnStep::Backward if psn == (self.last_psn.wrapping_add(1) & PSN_MASK) => PsnStep::InOrder,
                step => step,
            }
        };
        match step {
            PsnStep::Forward(n) => {
                self.psn_forward_jumps += 1;
                self.psns_skipped += u64::from(n);
            }
            PsnStep::Backward => self.psn_backward_jumps += 1,
            PsnStep::InOrder => {}
        }
        let beyond_highest =
            self.next_psn & PSN_SEEN == 0 || psn_step(self.next_psn & PSN_MASK, psn) != PsnStep::Backward;
        if beyond_highest {
            self.next_psn = (psn.wrapping_add(1) & PSN_MASK) | PSN_SEEN;
        }
        self.last_psn = psn & PSN_MASK;
        step
    }

    /// Whether an ACK of `psn` acknowledges the highest data PSN seen: the
    /// QP has nothing in flight, so its next packet may take another path
    /// without overtaking any of its own.
    #[inline(always)]
    pub fn all_acked(&self, psn: u32) -> bool {
        self.next_psn & PSN_SEEN != 0 && psn & PSN_MASK == self.next_psn.wrapping_sub(1) & PSN_MASK
    }

    /// Counts a reply (ACK/NAK with its AETH syndrome, or a CNP).
    #[inline(always)]
    pub fn reply(&mut self, seen: Seen) {
        match seen {
            Seen::Ack(syndrome) => match aeth::kind(syndrome) {
                aeth::Kind::Ack => self.acks += 1,
                aeth::Kind::SequenceError => self.naks_sequence += 1,
                aeth::Kind::RnrNak => self.naks_rnr += 1,
                aeth::Kind::OtherNak | aeth::Kind::Reserved => self.naks_other += 1,
            },
            Seen::Cnp => self.cnps += 1,
            Seen::Data => {}
        }
    }
}

impl MemberTransport {
    pub fn add(&mut self, other: &MemberTransport) {
        self.psn_forward_jumps += other.psn_forward_jumps;
        self.psn_backward_jumps += other.psn_backward_jumps;
        self.naks_sequence += other.naks_sequence;
        self.naks_other += other.naks_other;
        self.cnps += other.cnps;
        self.ce_marked += other.ce_marked;
        self.acked_repicks += other.acked_repicks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_table_sizes_and_sets() {
        assert_eq!(qp_table_slots(0), QP_WAYS);
        assert_eq!(qp_table_slots(1), QP_WAYS);
        assert_eq!(qp_table_slots(4096), 8192);
        assert_eq!(qp_table_slots(5000), 16384);
        assert_eq!(qp_table_slots(1_048_576), 1 << 21);
        // 1,024 QPs (one destination, consecutive QP numbers, then 1,024
        // destinations with one QP each) in the default table: a quarter
        // full, no set over its ways.
        let sets_mask = qp_table_slots(DEFAULT_QP_TABLE_SIZE) / QP_WAYS - 1;
        assert_eq!(sets_mask, 1023);
        let one_dst = |i: u32| QpKey { dst: [0x0a01_0001, 0, 0, 0], dest_qp: 0x100 + i, family: 4 };
        let many_dsts =
            |i: u32| QpKey { dst: crate::hash::ipv4_words([10, 1, (i >> 8) as u8, i as u8]), dest_qp: 0x11, family: 4 };
        let v6 = |i: u32| QpKey { dst: [0xfd01_0000, 0, 0, i.to_be()], dest_qp: 0x100 + (i & 7), family: 6 };
        // QP numbers a stride apart (bits only above the set index), and
        // IPv6 hosts of one /64 with a few QPs each.
        let strided = |i: u32| QpKey { dst: [0x0a01_0001, 0, 0, 0], dest_qp: 0x100 + (i << 10), family: 4 };
        let v6_hosts = |i: u32| QpKey {
            dst: [0xfd00_0000, 1, (i >> 2).to_be(), 1u32.to_be()],
            dest_qp: 0x11 + (i & 3),
            family: 6,
        };
        for key in [&one_dst as &dyn Fn(u32) -> QpKey, &many_dsts, &v6, &strided, &v6_hosts] {
            let mut per_set = [0u32; 1024];
            for i in 0..1024 {
                per_set[qp_set(&key(i), sets_mask) as usize] += 1;
            }
            assert!(per_set.iter().all(|&n| n <= QP_WAYS), "{:?}", per_set.iter().max());
        }
    }

    #[test]
    fn psn_steps_and_replies() {
        let mut s = QpStats::default();
        assert_eq!(s.data(PSN_MASK, 100, 1, 2, false, 10), PsnStep::InOrder);
        assert_eq!(s.data(0, 100, 1, 2, false, 11), PsnStep::InOrder);
        assert_eq!(s.data(3, 100, 1, 2, true, 12), PsnStep::Forward(2));
        assert_eq!(s.data(1, 100, 1, 3, false, 13), PsnStep::Backward);
        // The go-back-N resend climbs back in order, then goes on.
        assert_eq!(s.data(2, 100, 1, 3, false, 14), PsnStep::InOrder);
        assert_eq!(s.data(3, 100, 1, 3, false, 15), PsnStep::InOrder);
        assert_eq!(s.data(4, 100, 1, 3, false, 16), PsnStep::InOrder);
        assert_eq!(s.next_psn, 5 | PSN_SEEN);
        assert_eq!((s.psn_forward_jumps, s.psn_backward_jumps), (1, 1));
        assert_eq!((s.packets, s.bytes, s.psns_skipped, s.ce_marked, s.member_changes), (7, 700, 2, 1, 1));
        assert_eq!((s.first_seen_ns, s.last_seen_ns), (10, 16));
        for syndrome in [aeth::ACK, aeth::NAK_PSN_SEQUENCE_ERROR, aeth::RNR_NAK | 3, 0x61] {
            s.reply(Seen::Ack(syndrome));
        }
        s.reply(Seen::Cnp);
        assert_eq!((s.acks, s.naks_sequence, s.naks_rnr, s.naks_other, s.cnps), (1, 1, 1, 1, 1));
        assert_eq!(seen(opcode::ACK), Seen::Ack(0));
        assert_eq!(seen(opcode::CNP), Seen::Cnp);
        assert_eq!(seen(opcode::WRITE_LAST), Seen::Data);
        // PSN 4 was the highest sent: its ACK leaves nothing in flight.
        assert!(s.all_acked(4) && !s.all_acked(3) && !QpStats::default().all_acked(PSN_MASK));
        let mut wrapped = QpStats::default();
        wrapped.data(PSN_MASK, 100, 1, 2, false, 10);
        assert!(wrapped.all_acked(PSN_MASK) && !wrapped.all_acked(0));
    }
}
