//! Per-QP transport telemetry (see rocev2_common::telemetry): after a
//! packet is forwarded, data PSNs are followed per (destination, DestQP) and
//! replies (ACK/NAK, CNP) are attributed to the data QP they answer and to
//! the member its data took.
//!
//! A load-time feature (`Features::TELEMETRY`, on with `telemetry_qps`):
//! off, the verifier drops the whole call, so a dataplane without
//! telemetry runs the same instructions as before.
//!
//! Updates are plain stores: a QP's data arrives on one CPU (receive
//! hashing keeps a flow on one queue) and its replies, which may arrive on
//! another, touch other fields. A rare lost count is the price of no atomics.

use core::ptr::write_volatile;

use aya_ebpf::{
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    Global,
};
use rocev2_common::{
    bth::ROCEV2_UDP_PORT,
    features::Features,
    hash::FlowKey,
    maps::{member_stat_index, FlowletKey, FLOWLET_KEYLESS, FLOWLET_REPICK_ACKED, MEMBER_STAT_ENTRIES, POLICY_FLOWLET},
    telemetry::{
        data_of_known, find, qp_table_slots, seen, set_start, MemberTransport, PsnStep, QpKey, QpSlot, QpStats,
        QpTable, ReplyKey, Seen, TraceEvent, TraceFilter, DEFAULT_QP_TABLE_SIZE, QP_WAYS, TRACE_RING_BYTES,
    },
};

use crate::{
    ctx::PacketBuf,
    features::enabled,
    forwarded::Forward,
    maps::{FLOWLETS, FLOWLET_SLOTS, FLOW_KEY, GROUPS},
    parse::{Roce, IPPROTO_UDP},
    transport,
};

/// The most recently active data QPs: sets of QP_WAYS slots, indexed by
/// [`rocev2_common::telemetry::qp_set`] (an array: no hash-map lookup or
/// update per packet); sized at load time (`qp_table_slots`). Mmapable:
/// its values start on a page, so every slot's first 64 bytes are one
/// cache line.
#[map]
pub static QP_TELEMETRY: Array<QpSlot> = Array::with_max_entries(qp_table_slots(DEFAULT_QP_TABLE_SIZE), BPF_F_MMAPABLE);

/// The QP table's sets less one (a power of two less one), set at load time.
#[unsafe(no_mangle)]
static QP_SETS_MASK: Global<u32> = Global::new(qp_table_slots(DEFAULT_QP_TABLE_SIZE) / QP_WAYS - 1);

const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Reply direction -> the data QP it answers (see ReplyKey).
#[map]
pub static QP_REPLIES: LruHashMap<ReplyKey, QpKey> = LruHashMap::with_max_entries(DEFAULT_QP_TABLE_SIZE, 0);

/// Transport signals per group member, per CPU.
#[map]
pub static MEMBER_TRANSPORT: PerCpuArray<MemberTransport> = PerCpuArray::with_max_entries(MEMBER_STAT_ENTRIES, 0);

/// `rocev2 trace`'s filter (entry 0; inactive unless a trace runs).
#[map]
static TRACE_FILTER: Array<TraceFilter> = Array::with_max_entries(1, 0);

/// Decisions of traced packets, read by `rocev2 trace`.
#[map]
static TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(TRACE_RING_BYTES, 0);

/// Keys and a new entry: too big for the stack next to the pipeline's.
#[repr(C)]
pub struct Scratch {
    /// The QP a reply answers; for a new QP, its reply link's value (a
    /// data packet's QP is read from the flow key, not copied here).
    qp: QpKey,
    reply: ReplyKey,
    /// The member the QP's data took before this packet.
    before_group: u32,
    before_position: u32,
    /// The data flow's key and flowlet key, when an ACK ends its flowlet.
    flow: FlowKey,
    flowlet: FlowletKey,
    /// The tick (`jiffies`) of this CPU's last coarse clock reading, and
    /// that reading (see [`coarse_now`]).
    tick: u64,
    tick_ns: u64,
}

#[map]
static TELEMETRY_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// What telemetry reads of a forwarded RoCEv2 packet, all found by the
/// pipeline: the flow key it wrote (addresses, UDP source port, DestQP),
/// the opcode and the BTH's place its parse found, the TOS it sent.
struct Packet<'a> {
    key: &'a FlowKey,
    /// 4 or 6.
    family: u32,
    opcode: u8,
    bth_off: u8,
    psn: u32,
    /// DSCP << 2 | ECN, as sent (after our own marking).
    tos: u8,
}

/// Records a forwarded packet (its headers already rewritten) and the
/// member it took. Nothing is parsed again: the flow key is this CPU's
/// FLOW_KEY slot, which the pipeline wrote for this packet, and `f` says
/// where the BTH is. Inlined into the family functions (no BPF-to-BPF
/// call): with its keys and entry in per-CPU scratch it adds 16 bytes to
/// their frames (IPv6: 216), and the longest call chain (entry, IPv6
/// function, keyed flowlet table) stays at 456 of the verifier's 512.
#[inline(always)]
#[allow(clippy::needless_borrows_for_generic_args, reason = "by value would copy the keys onto the stack")]
pub fn observe<C: PacketBuf>(ctx: &C, f: &Forward) {
    let Roce::Yes { opcode, bth_off, .. } = f.roce else { return };
    let (group, position) = (f.group, f.position);
    let len = u64::from(f.len);
    let Some(key) = FLOW_KEY.get(0) else { return };
    let Some(psn) = transport::psn_at(ctx, bth_off) else { return };
    let at = Packet { key, family: if key.ipv6 { 6 } else { 4 }, opcode, bth_off, psn, tos: f.tos };
    let Some(scratch) = TELEMETRY_SCRATCH.get_ptr_mut(0) else { return };
    // SAFETY: this CPU's own scratch slot.
    let scratch = unsafe { &mut *scratch };
    let ce_marked = at.tos & 3 == 3;
    trace(&at, f, len, scratch);
    match seen(at.opcode) {
        Seen::Data => {
            // The coarse clock (a tick's resolution) is plenty for first and
            // last seen, and a fraction of the precise one's cost. An
            // ACK-ended flowlet compares last seen with the flowlet's own
            // (precise) time: then both are precise.
            let now = if enabled(Features::ACKED_REPICK) {
                // SAFETY: a clock helper without arguments.
                unsafe { bpf_ktime_get_ns() }
            } else {
                coarse_now(scratch)
            };
            // The QP is hashed and looked for in the flow key, where the
            // pipeline wrote it: copied only into a new entry.
            let set = set_start(&key.dst, key.dest_qp, QP_SETS_MASK.load());
            let step = match find(&Table, &key.dst, key.dest_qp, at.family, set) {
                Some(s) => {
                    // SAFETY: a map value; see the module note on races.
                    let s = unsafe { &mut (*s).stats };
                    let step;
                    (scratch.before_group, scratch.before_position, step) =
                        data_of_known(s, at.psn, len, group, position, ce_marked, now);
                    step
                }
                None => {
                    (scratch.before_group, scratch.before_position) = (group, position);
                    let Some(slot) = victim(set) else { return };
                    // SAFETY: as above; the slot is written field by field
                    // (a struct assignment would be a byte-loop memset).
                    let step = unsafe {
                        (*slot).key.family = 0;
                        fresh(&mut (*slot).stats, key);
                        copy_words(&mut (*slot).key.dst, &key.dst);
                        (*slot).key.dest_qp = key.dest_qp;
                        (*slot).key.family = at.family;
                        (*slot).stats.data(at.psn, len, group, position, ce_marked, now)
                    };
                    copy_words(&mut scratch.qp.dst, &key.dst);
                    (scratch.qp.dest_qp, scratch.qp.family) = (key.dest_qp, at.family);
                    copy_words(&mut scratch.reply.responder, &key.dst);
                    copy_words(&mut scratch.reply.requester, &key.src);
                    (scratch.reply.src_port, scratch.reply.family) = (u32::from(key.src_port), at.family);
                    let _ = QP_REPLIES.insert(&scratch.reply, &scratch.qp, 0);
                    step
                }
            };
            // The member sums change only on trouble: an in-order packet
            // that was not marked costs no second lookup. A jump back (a
            // go-back-N resend) answers loss on the path the QP took until
            // now, which is the member blamed, even when the resend starts
            // a flowlet on another one.
            if step != PsnStep::InOrder || ce_marked {
                let (blamed_group, blamed_position) = match step {
                    PsnStep::Backward => (scratch.before_group, scratch.before_position),
                    _ => (group, position),
                };
                member_add(blamed_group, blamed_position, |m| {
                    m.ce_marked += u64::from(ce_marked);
                    match step {
                        PsnStep::InOrder => {}
                        PsnStep::Forward(_) => m.psn_forward_jumps += 1,
                        PsnStep::Backward => m.psn_backward_jumps += 1,
                    }
                });
            }
        }
        reply => {
            // The syndrome as a value of its own, 0 for a CNP: read out of
            // the enum, LLVM computed on the payload register of the other
            // variant too, which the verifier refuses when it holds a
            // pointer (observe inlined).
            let syndrome = match reply {
                Seen::Ack(_) => transport::aeth_syndrome(ctx, at.bth_off).unwrap_or(0),
                _ => 0,
            };
            let is_ack = matches!(reply, Seen::Ack(_));
            let reply = if is_ack { Seen::Ack(syndrome) } else { reply };
            let kind = rocev2_common::bth::aeth::kind(syndrome);
            copy_words(&mut scratch.reply.responder, &key.src);
            copy_words(&mut scratch.reply.requester, &key.dst);
            (scratch.reply.src_port, scratch.reply.family) = (u32::from(key.src_port), at.family);
            // SAFETY: map values, copied out.
            let Some(qp) = (unsafe { QP_REPLIES.get(&scratch.reply) }) else { return };
            copy_words(&mut scratch.qp.dst, &qp.dst);
            (scratch.qp.dest_qp, scratch.qp.family) = (qp.dest_qp, qp.family);
            let set = set_start(&scratch.qp.dst, scratch.qp.dest_qp, QP_SETS_MASK.load());
            let Some(s) = find(&Table, &scratch.qp.dst, scratch.qp.dest_qp, scratch.qp.family, set) else { return };
            // SAFETY: as above.
            let s = unsafe { &mut (*s).stats };
            s.reply(reply);
            let (data_group, data_position, data_seen_ns) = (s.group, s.position, s.last_seen_ns);
            // SAFETY: as above.
            if enabled(Features::ACKED_REPICK)
                && is_ack
                && kind == rocev2_common::bth::aeth::Kind::Ack
                && s.all_acked(at.psn)
                && end_flowlet(scratch, key, data_group, data_seen_ns)
            {
                member_add(data_group, data_position, |m| m.acked_repicks += 1);
            }
            member_add(data_group, data_position, |m| match (is_ack, kind) {
                (true, rocev2_common::bth::aeth::Kind::SequenceError) => m.naks_sequence += 1,
                (true, rocev2_common::bth::aeth::Kind::Ack) => {}
                (true, _) => m.naks_other += 1,
                (false, _) => m.cnps += 1,
            });
        }
    }
}

/// The coarse clock (CLOCK_MONOTONIC ns as of the last tick), read once
/// per tick on each CPU: `jiffies` (`bpf_jiffies64`, a load the verifier
/// inlines) says when the tick moved on; the call to
/// `bpf_ktime_get_coarse_ns` costs about as much as the rest of
/// telemetry's path. Every reader keeps its unit and epoch. A reading may
/// be the tick before (the tick that bumps `jiffies` updates the clock
/// right after): at most one tick older than the coarse clock itself.
#[inline(always)]
fn coarse_now(scratch: &mut Scratch) -> u64 {
    // SAFETY: helpers without arguments.
    let tick = unsafe { bpf_jiffies64() };
    if tick != scratch.tick {
        scratch.tick = tick;
        scratch.tick_ns = unsafe { bpf_ktime_get_coarse_ns() };
    }
    scratch.tick_ns
}

/// The QP table as the shared lookup finds its slots.
struct Table;

// SAFETY: QP_TELEMETRY's values, valid for the program run.
unsafe impl QpTable for Table {
    #[inline(always)]
    fn slot(&self, index: u32) -> Option<*mut QpSlot> {
        QP_TELEMETRY.get_ptr_mut(index)
    }
}

/// The slot a new QP takes in the set starting at `set`: an empty one,
/// else the one whose QP was seen least recently.
#[inline(always)]
fn victim(set: u32) -> Option<*mut QpSlot> {
    let mut oldest: Option<*mut QpSlot> = None;
    let mut oldest_ns = u64::MAX;
    for way in 0..QP_WAYS {
        let slot = QP_TELEMETRY.get_ptr_mut(set + way)?;
        // SAFETY: a map value.
        let (family, seen) = unsafe { ((*slot).key.family, (*slot).stats.last_seen_ns) };
        if family == 0 {
            return Some(slot);
        }
        if seen < oldest_ns {
            (oldest, oldest_ns) = (Some(slot), seen);
        }
    }
    oldest
}

/// A slot's stats set to a new QP's (the data source's address and port,
/// from the packet's flow key) before its first packet. Volatile stores:
/// plain ones LLVM merges into a memset, a 132-byte byte loop on BPF.
#[inline(always)]
fn fresh(s: &mut QpStats, key: &FlowKey) {
    /// Zeroes each field named, one store each.
    macro_rules! zero {
        ($($field:ident),*) => {
            // SAFETY: fields of a live reference.
            $(unsafe { write_volatile(&raw mut s.$field, 0) };)*
        };
    }
    zero!(
        packets,
        bytes,
        last_seen_ns,
        group,
        position,
        next_psn,
        last_psn,
        first_seen_ns,
        psn_forward_jumps,
        psns_skipped,
        psn_backward_jumps,
        acks,
        naks_sequence,
        naks_rnr,
        naks_other,
        cnps,
        ce_marked,
        member_changes,
        _pad
    );
    copy_words(&mut s.src, &key.src);
    s.src_port = u32::from(key.src_port);
}

/// An ACK of everything the QP in `scratch` sent: in a flowlet group with
/// `FLOWLET_REPICK_ACKED`, ends its data flow's flowlet, so the next packet
/// chooses a member again (it cannot overtake anything: nothing is in
/// flight). The flow is the reply's (`reply`, its flow key), the other way
/// round.
///
/// "Everything it sent" is everything this table saw, which is updated
/// after a packet is forwarded: a packet already given its member but not
/// yet counted (on another CPU, this very moment) would be missed. So the
/// flowlet ends only if its last packet's time (taken before the choice)
/// is not after the QP's last seen (taken after forwarding, `data_seen_ns`,
/// the same clock with this feature): then every packet given a member
/// has been counted, and the ACK covers them all.
#[inline(always)]
fn end_flowlet(scratch: &mut Scratch, reply: &FlowKey, group: u32, data_seen_ns: u64) -> bool {
    let Some(g) = GROUPS.get(group) else { return false };
    if g.policy != POLICY_FLOWLET || g.flowlet_flags & FLOWLET_REPICK_ACKED == 0 {
        return false;
    }
    let flow = &mut scratch.flow;
    copy_words(&mut flow.src, &reply.dst);
    copy_words(&mut flow.dst, &reply.src);
    (flow.src_port, flow.dst_port, flow.protocol) = (reply.src_port, ROCEV2_UDP_PORT, IPPROTO_UDP);
    (flow.ipv6, flow.dest_qp) = (reply.ipv6, scratch.qp.dest_qp);
    // Each table's code only when its feature is loaded (a group of the
    // other kind is hashed: no flowlet to end).
    if g.flowlet_flags & FLOWLET_KEYLESS != 0 {
        return enabled(Features::FLOWLET_KEYLESS)
            && end_keyless_flowlet(&scratch.flow, group, g.flowlet_slot_mask, data_seen_ns);
    }
    if !enabled(Features::FLOWLET_KEYED) {
        return false;
    }
    scratch.flowlet = FlowletKey::new(&scratch.flow, group);
    #[allow(clippy::needless_borrows_for_generic_args, reason = "by value would copy the key onto the stack")]
    let Some(e) = FLOWLETS.get_ptr_mut(&scratch.flowlet) else {
        return false;
    };
    // SAFETY: a map value; a data packet storing its own time at once
    // only keeps the flowlet going, as without this.
    unsafe {
        let last = (*e).last_seen_ns;
        if last == 0 || last > data_seen_ns {
            return false;
        }
        (*e).last_seen_ns = 0;
    }
    true
}

/// The keyless table's counterpart: ends the flowlet of the data flow's
/// slot, but only while the slot is still that flow's (its tag): another
/// flow sharing the slot may have packets in flight.
#[inline(always)]
fn end_keyless_flowlet(flow: &FlowKey, group: u32, mask: u32, data_seen_ns: u64) -> bool {
    let at = rocev2_common::flowlet::slot_of(flow, group, mask);
    let Some(slot) = FLOWLET_SLOTS.get_ptr_mut(at.index) else {
        return false;
    };
    // SAFETY: an array value; single aligned stores, as above.
    unsafe {
        let last = (*slot).entry.last_seen_ns;
        if (*slot).used == 0 || last == 0 || (*slot).tag != at.tag || last > data_seen_ns {
            return false;
        }
        (*slot).entry.last_seen_ns = 0;
    }
    true
}

/// `rocev2 trace`: when a trace runs and the packet matches its filter,
/// the decision goes to the ring buffer, written in place (no stack copy).
/// Its time is this CPU's coarse clock reading of the tick (as first and
/// last seen): the coarse clock's helper is called once a tick.
#[inline(always)]
fn trace(at: &Packet, f: &Forward, len: u64, scratch: &mut Scratch) {
    let Some(filter) = TRACE_FILTER.get(0) else { return };
    let k = at.key;
    if filter.active == 0 || !filter.matches(at.family, &k.src, &k.dst, k.src_port, k.dest_qp, at.opcode) {
        return;
    }
    let Some(mut entry) = TRACE_EVENTS.reserve::<TraceEvent>(0) else { return };
    let e = entry.as_mut_ptr();
    // SAFETY: a reserved ring buffer record of TraceEvent's size; every
    // field is written before it is submitted.
    unsafe {
        (*e).ts_ns = coarse_now(scratch);
        copy_words(&mut (*e).src, &k.src);
        copy_words(&mut (*e).dst, &k.dst);
        (*e).family = at.family;
        (*e).dest_qp = k.dest_qp;
        (*e).psn = at.psn;
        (*e).group = f.group;
        (*e).position = f.position;
        (*e).ifindex = f.ifindex;
        (*e).priority = f.priority;
        (*e).len = len as u32;
        (*e).src_port = k.src_port;
        (*e).opcode = at.opcode;
        (*e).tos = at.tos;
    }
    entry.submit(0);
}

/// An address's four words, one store each: a plain copy of an array (or
/// of a key holding one) becomes a call to memmove, a byte loop on BPF, on
/// every packet.
#[inline(always)]
fn copy_words(to: &mut [u32; 4], from: &[u32; 4]) {
    for i in 0..4 {
        // SAFETY: both are references; volatile only so the stores are not
        // merged back into a memmove.
        unsafe { write_volatile(&raw mut to[i], from[i]) };
    }
}

#[inline(always)]
fn member_add(group: u32, position: u32, f: impl FnOnce(&mut MemberTransport)) {
    if let Some(m) = MEMBER_TRANSPORT.get_ptr_mut(member_stat_index(group, position)) {
        // SAFETY: per-CPU slot.
        f(unsafe { &mut *m });
    }
}
