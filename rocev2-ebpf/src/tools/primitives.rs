//! The benchmark's primitive programs (`rocev2 bench`, part 1): each is
//! the floor (`rocev2_xdp_redirect`: one devmap redirect) plus one thing
//! the pipeline pays for, done [`REPEAT`] times (once for the parse), so
//! its time above the floor, divided by the repeat count, is that
//! primitive's cost on this machine. Repeated steps form a chain (each
//! uses the previous result), as the pipeline's do: the time is their
//! latency, not their throughput. The exceptions are steps the pipeline
//! does once per packet on memory no earlier step of the packet wrote,
//! or on inputs it has at once, which are not chained: the rewrite, the
//! counter adds, the flow key's stores and the IPv4 header's reads and
//! tests are done on REPEAT separate copies (a chain through the same
//! bytes would measure store-forwarding stalls the pipeline does not
//! have); the class tests try REPEAT classes against the same packet's
//! fields, as the pipeline tries its classes in turn; the ingress port's
//! context reads depend on nothing before them (its slot lookups are
//! chained). The stateful steps (the ECN virtual queue, the flowlet
//! decision, telemetry's QP entry) are chained, each on a separate copy
//! of its state. The budget tables of BENCHMARKS.md split the pipelines'
//! costs into these.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_get_prandom_u32, bpf_jiffies64, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
    programs::XdpContext,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};
use rocev2_common::{
    bth::{self, opcode, PSN_MASK},
    buckets::{member_for, BucketTable},
    class::{
        self, ClassAction, ClassEntry, ClassFields, RoceFields, CLASS_ECN_EXEMPT, CLASS_MATCH_OPCODE,
        CLASS_MATCH_PAYLOAD, CLASS_SET_DSCP,
    },
    counters::{EgressCounters, PortCounter},
    ecn::{self, DrainRate, EcnProfile, EgressEntry, PortState, VirtualQueue, ECT0, NO_PROFILE},
    flowlet::{self, FlowletEntry},
    hash::{ipv4_words, member_hash_of_family, store_flow_key, FlowKey, HashMode, HashVersion},
    maps::{
        member_index, route_cache_slot, route_target, FlowletKey, GroupEntry, IfindexSlots, MemberEntry, MemberStats,
        PortCounters, RouteCacheEntry, RouteTarget, FLOWLET_AT_BOUNDARY, MAX_DIRECT_IFINDEX, MAX_MEMBERS_PER_GROUP,
        MEMBER_UP, POLICY_FLOWLET, ROUTE_CACHE_SLOTS,
    },
    telemetry::{data_of_known, find, set_start, PsnStep, QpSlot, QpTable, QP_WAYS},
};

use crate::{
    maps::EGRESS_DEVS_DIRECT,
    parse::{self, L3Kind, Roce},
    rewrite,
};

/// How many times a primitive program repeats its step (the bench divides
/// by the same constant).
const REPEAT: u32 = rocev2_common::BENCH_PRIMITIVE_REPEAT;

/// A plain array of one u32 (0): one ARRAY lookup, inlined by the verifier.
#[map]
pub static PRIM_ARRAY: Array<u32> = Array::with_max_entries(1, 0);

/// A per-CPU array of one u32 (0): one PERCPU_ARRAY lookup.
#[map]
pub static PRIM_PERCPU: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// An LRU hash keyed like the keyed flowlet table (FLOWLETS), one entry.
#[map]
pub static PRIM_HASH: LruHashMap<FlowletKey, u32> = LruHashMap::with_max_entries(64, 0);

/// REPEAT ports' counter blocks and REPEAT members' packets and bytes, per
/// CPU, like PORT_COUNTERS' and MEMBER_STATS' values, in one value each.
#[map]
pub static PRIM_COUNTERS: PerCpuArray<[PortCounters; REPEAT as usize]> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub static PRIM_MEMBER: PerCpuArray<[MemberStats; REPEAT as usize]> = PerCpuArray::with_max_entries(1, 0);

/// Ingress ports' slots, as IFINDEX_SLOTS (all zero: no port registered).
#[map]
pub static PRIM_SLOTS: Array<IfindexSlots> = Array::with_max_entries(MAX_DIRECT_IFINDEX, 0);

/// REPEAT flow keys, per CPU, like FLOW_KEY's one, in one value.
#[map]
pub static PRIM_FLOW_KEYS: PerCpuArray<[FlowKey; REPEAT as usize]> = PerCpuArray::with_max_entries(1, 0);

/// REPEAT groups, each with its bucket table and its bank of members, as
/// GROUPS, BUCKETS and MEMBERS hold them (the first run fills them in).
#[repr(C)]
pub struct PrimGroups {
    groups: [GroupEntry; REPEAT as usize],
    tables: [BucketTable; REPEAT as usize],
    members: [[MemberEntry; PRIM_MEMBERS as usize]; REPEAT as usize],
}

/// Members of each of PrimGroups' groups.
const PRIM_MEMBERS: u32 = 4;

#[map]
pub static PRIM_GROUPS: Array<PrimGroups> = Array::with_max_entries(1, 0);

/// A route cache's slots, per CPU, as one ROUTE_CACHE holds them, in one
/// value (the first run fills REPEAT of them).
#[map]
pub static PRIM_ROUTE_CACHE: PerCpuArray<[RouteCacheEntry; ROUTE_CACHE_SLOTS as usize]> =
    PerCpuArray::with_max_entries(1, 0);

/// REPEAT IPv4 headers and where each one's payload starts, as a frame
/// and `parse_ipv4` give them to the pipeline (the first run fills them).
#[repr(C)]
pub struct PrimIpv4 {
    hdrs: [Ipv4Hdr; REPEAT as usize],
    l4_offs: [u32; REPEAT as usize],
}

#[map]
pub static PRIM_IPV4: PerCpuArray<PrimIpv4> = PerCpuArray::with_max_entries(1, 0);

/// Bytes between the copies of the rewritten headers in the frame.
const REWRITE_STRIDE: usize = 64;

/// A value none of the programs' results takes for the bench's frame.
const NEVER: u32 = 0x5EAD_BEEF;

/// The floor's redirect, unless `value` is [`NEVER`]: the compiler must
/// compute `value` (a test it could prove false would let it drop the
/// work), and for the bench's frame it is not NEVER (the bench checks
/// every run's action).
#[inline(always)]
fn finish(value: u32) -> u32 {
    if value == NEVER {
        return xdp_action::XDP_PASS;
    }
    match EGRESS_DEVS_DIRECT.redirect(0, u64::from(xdp_action::XDP_DROP)) {
        Ok(action) | Err(action) => action,
    }
}

/// The frame's linear length: an input the compiler cannot know.
#[inline(always)]
fn input(ctx: &XdpContext) -> u32 {
    (ctx.data_end() - ctx.data()) as u32
}

#[inline(always)]
pub fn array(ctx: &XdpContext) -> u32 {
    let mut v = input(ctx) & 0x8000_0000; // 0 for any frame
    for _ in 0..REPEAT {
        v = PRIM_ARRAY.get(v).copied().unwrap_or(NEVER);
    }
    finish(v)
}

#[inline(always)]
pub fn percpu(ctx: &XdpContext) -> u32 {
    let mut v = input(ctx) & 0x8000_0000;
    for _ in 0..REPEAT {
        v = PRIM_PERCPU.get(v).copied().unwrap_or(NEVER);
    }
    finish(v)
}

/// REPEAT lookups of one key, each key word 0 xored with the last value
/// (0); the first packet inserts the entry, every later one finds it.
#[inline(always)]
#[allow(clippy::needless_borrows_for_generic_args, reason = "by reference, as the flowlet table's lookup")]
pub fn hash(ctx: &XdpContext) -> u32 {
    let mut key = FlowletKey { ports: input(ctx) & 0x8000_0000, ..FlowletKey::default() };
    let mut v = 0;
    for _ in 0..REPEAT {
        key.group ^= v;
        // SAFETY: the value is read once, right away.
        v = match unsafe { PRIM_HASH.get(&key) } {
            Some(v) => *v,
            None => {
                let _ = PRIM_HASH.insert(&key, &0, 0);
                0
            }
        };
    }
    finish(v)
}

/// The clock reads are helper calls, which the compiler keeps whether
/// or not their values are used (a time could be NEVER by chance).
#[inline(always)]
pub fn clock() -> u32 {
    for _ in 0..REPEAT {
        // SAFETY: no arguments.
        let _ = unsafe { bpf_ktime_get_ns() };
    }
    finish(0)
}

#[inline(always)]
pub fn coarse_clock() -> u32 {
    for _ in 0..REPEAT {
        // SAFETY: no arguments.
        let _ = unsafe { bpf_ktime_get_coarse_ns() };
    }
    finish(0)
}

/// `jiffies`: the verifier replaces the helper call with a load of the
/// kernel's `jiffies` (64-bit JITs), so the reads are summed into the
/// result (an unused load could be dropped). A tick's resolution, like the
/// coarse clock, but in ticks since boot plus the kernel's offset, not
/// CLOCK_MONOTONIC ns.
#[inline(always)]
pub fn jiffies() -> u32 {
    let mut sum = 0u64;
    for _ in 0..REPEAT {
        // SAFETY: no arguments.
        sum = sum.wrapping_add(unsafe { bpf_jiffies64() });
    }
    finish(sum as u32 & 0x7FFF_FFFF)
}

/// A BPF-to-BPF call and its return (through this CPU's return thunk).
#[inline(never)]
fn step(v: u32) -> u32 {
    v.rotate_left(5) ^ 0x55
}

#[inline(always)]
pub fn call(ctx: &XdpContext) -> u32 {
    let mut v = input(ctx);
    for _ in 0..REPEAT {
        v = step(v);
    }
    finish(v)
}

/// The pipeline's parse of one frame, once: Ethernet (and VLAN), the IP
/// header with its bounds and (IPv4) checksum checks, UDP and the BTH.
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> u32 {
    let Ok(l2) = parse::parse_l2(ctx) else { return xdp_action::XDP_PASS };
    let (protocol, l4_off, l4_end) = match l2.kind {
        L3Kind::V4 => {
            let Ok(ip) = parse::parse_ipv4(ctx, l2.l3_off) else { return xdp_action::XDP_PASS };
            if !parse::ipv4_checksum_ok(ip.hdr) || parse::is_fragment(ip.hdr) {
                return xdp_action::XDP_PASS;
            }
            // SAFETY: parse_ipv4 checked the header.
            (unsafe { (*ip.hdr).proto }, ip.l4_off, ip.l4_end)
        }
        L3Kind::V6 => {
            let Ok(ip) = parse::parse_ipv6(ctx, l2.l3_off) else { return xdp_action::XDP_PASS };
            // SAFETY: parse_ipv6 checked the header.
            (unsafe { (*ip.hdr).next_hdr }, ip.l4_off, ip.l4_end)
        }
    };
    match parse::parse_l4(ctx, protocol, l4_off, l4_end) {
        Ok(l4) if matches!(l4.roce, Roce::Yes { .. }) => finish(l4.dest_qp),
        _ => xdp_action::XDP_PASS,
    }
}

/// The member hash of `version` over an IPv4 key (`V4`) or an IPv6 one,
/// REPEAT times, each seeded with the last.
#[inline(always)]
pub fn member_hash<const V4: bool>(ctx: &XdpContext, version: HashVersion) -> u32 {
    let x = input(ctx);
    let mut key = FlowKey { src_port: 0xC000, dst_port: 4791, protocol: 17, dest_qp: 0x100, ..FlowKey::default() };
    key.ipv6 = !V4;
    for i in 0..4 {
        key.src[i] = x.wrapping_add(i as u32);
        key.dst[i] = x ^ (i as u32);
    }
    if V4 {
        key.src[1..].fill(0);
        key.dst[1..].fill(0);
    }
    let mut h = x;
    for _ in 0..REPEAT {
        h = member_hash_of_family::<V4>(&key, HashMode::Qp, h, version);
    }
    finish(h)
}

/// The forwarding's IPv4 rewrite, REPEAT times: TTL minus one and the
/// DSCP/ECN byte with their two incremental checksum updates (rewrite.rs,
/// the pipeline's own) and both MACs (swapped), each time on another 34
/// bytes of the frame (the real headers, then payload read as headers),
/// so no rewrite waits for another's stores and none can be merged: what
/// one packet's rewrite costs at the least. One bounds check covers them.
#[inline(always)]
pub fn rewrite(ctx: &XdpContext) -> u32 {
    let Some(frame) = parse::ptr_at::<[u8; REPEAT as usize * REWRITE_STRIDE], _>(ctx, 0) else {
        return xdp_action::XDP_PASS;
    };
    let mut ttls = 0u32;
    for i in 0..REPEAT as usize {
        // SAFETY: ptr_at checked the frame holds REPEAT strides; each
        // header pair lies within its stride (14 + 20 bytes of 64).
        unsafe {
            let eth = frame.cast::<u8>().add(i * REWRITE_STRIDE).cast::<EthHdr>();
            let hdr = eth.cast::<u8>().add(EthHdr::LEN).cast::<Ipv4Hdr>();
            let (tos, ttl) = ((*hdr).tos, (*hdr).ttl);
            rewrite::set_ipv4_tos_ttl(hdr, tos, ttl.wrapping_sub(1));
            rewrite::set_macs(eth, (*eth).src_addr, (*eth).dst_addr);
            ttls += u32::from(ttl);
        }
    }
    finish(ttls)
}

/// What counting one forwarded RoCE packet adds, REPEAT times: the port
/// block's five (received and forwarded packets and bytes, RoCE; the
/// pipeline's `tally`) and the member's packets and bytes, each time in
/// another port's block and member's entry (no add waits for another's
/// store, none can be merged), on values found once (the lookups are the
/// PERCPU_ARRAY primitive's).
#[inline(always)]
pub fn counter_adds(ctx: &XdpContext) -> u32 {
    let len = u64::from(input(ctx));
    let (Some(c), Some(m)) = (PRIM_COUNTERS.get_ptr_mut(0), PRIM_MEMBER.get_ptr_mut(0)) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: this CPU's values, ours for this program run.
    let (c, m) = unsafe { (&mut *c, &mut *m) };
    for i in 0..REPEAT as usize {
        let block = &mut c[i];
        block.add(PortCounter::RxPackets, 1);
        block.add(PortCounter::RxBytes, len);
        block.add(PortCounter::Forwarded, 1);
        block.add(PortCounter::ForwardedBytes, len);
        block.add(PortCounter::ForwardedRoce, 1);
        m[i].packets += 1;
        m[i].bytes += len;
    }
    finish(m[REPEAT as usize - 1].packets as u32)
}

/// The ingress port, REPEAT times: `xdp_md.ingress_ifindex` (a volatile
/// read, so none is merged with another; the verifier rewrites each into
/// three dependent loads: the xdp_buff's rxq, its device, the device's
/// ifindex) and its slot in an IFINDEX_SLOTS-like array, as `port_slot`
/// finds it (bounds test, inlined ARRAY lookup, the slot's field). Each
/// lookup's key takes the last slot found (0), so the lookups form a
/// chain; the context reads do not depend on it, so the CPU may start
/// them early, as it may in the pipeline, where nothing precedes them.
#[inline(always)]
pub fn ingress_port(ctx: &XdpContext) -> u32 {
    let mut slot = 0;
    for _ in 0..REPEAT {
        // SAFETY: the context's own field, read as XDP programs read it.
        let ifindex = unsafe { core::ptr::read_volatile(&raw const (*ctx.ctx).ingress_ifindex) } ^ (slot & 0x8000_0000);
        slot = if ifindex < MAX_DIRECT_IFINDEX { PRIM_SLOTS.get(ifindex).map_or(NEVER, |s| s.port_slot) } else { 0 };
    }
    finish(slot)
}

/// One IPv4 flow key stored REPEAT times, each into another key of a
/// per-CPU value found once (the lookup is the PERCPU_ARRAY primitive's),
/// by the pipeline's own volatile stores (`store_flow_key`): 13 stores
/// per key, 4 address words each side (3 of them zero), ports, protocol,
/// family, DestQP. Separate keys: a store never waits for another.
#[inline(always)]
pub fn flow_key_stores(ctx: &XdpContext) -> u32 {
    let x = input(ctx);
    let Some(keys) = PRIM_FLOW_KEYS.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: this CPU's value, ours for this program run.
    let keys = unsafe { &mut *keys };
    let (src, dst) = (ipv4_words(x.to_be_bytes()), ipv4_words((x ^ 0x0A01_0001).to_be_bytes()));
    for (i, key) in keys.iter_mut().enumerate() {
        let ports = (0xC000 | i as u16, 4791);
        // SAFETY: a key of this CPU's value.
        unsafe { store_flow_key(key, |w| src[w], |w| dst[w], false, 17, ports, x & 0x00FF_FFFF) };
    }
    finish(keys[REPEAT as usize - 1].dest_qp)
}

/// The pipeline's tests on a group and its chosen member, REPEAT times,
/// each on another group of one value found once (the GROUPS, BUCKETS and
/// MEMBERS lookups are the ARRAY primitive's): the group usable (member
/// count in range), its hash mode and bank read, the hash's bucket in the
/// bank's table, the position in range, the member's index, the member up,
/// its port and MACs read for the rewrite. Each hash takes the last
/// member's port and position, so the steps form a chain, as the
/// pipeline's do from its hash to its member.
#[inline(always)]
pub fn group_checks(ctx: &XdpContext) -> u32 {
    let Some(g) = PRIM_GROUPS.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: the value is only this program's, and plain data.
    let g = unsafe { &mut *g };
    if g.groups[0].member_count == 0 {
        fill_groups(g);
    }
    let mut hash = input(ctx).wrapping_mul(0x9E37_79B9);
    let mut macs = 0u32;
    for i in 0..REPEAT as usize {
        let group = &g.groups[i];
        if !group.usable() {
            return xdp_action::XDP_PASS;
        }
        let mode = HashMode::from_u32(group.hash_mode).unwrap_or(HashMode::FiveTuple) as u32;
        let bank = group.bank & 1;
        let position = member_for(&g.tables[i], hash ^ mode);
        if position >= MAX_MEMBERS_PER_GROUP {
            return xdp_action::XDP_PASS;
        }
        // One bank of PRIM_MEMBERS members per group: the index as the
        // pipeline computes it, folded into the bank this value holds.
        let index = member_index(i as u32, bank, position) % PRIM_MEMBERS;
        let Some(member) = g.members[i].get(index as usize) else { return xdp_action::XDP_PASS };
        if !member.up() {
            return xdp_action::XDP_PASS;
        }
        macs ^= u32::from(member.src_mac[5]) ^ u32::from(member.dst_mac[5]);
        hash = hash.rotate_left(8) ^ member.ifindex ^ position;
    }
    // The top bit set: never NEVER, whatever the hash.
    finish((hash ^ macs) | 0x8000_0000)
}

/// The route cache's hit, REPEAT times, each on another destination and
/// so another slot of one per-CPU value found once (the ROUTE_CACHE and
/// CONFIG lookups are the PERCPU_ARRAY and ARRAY primitives'): the
/// destination's slot (`route_cache_slot`: the words folded, a multiply,
/// a shift), the slot's compare of family, route generation and address
/// and its target (`RouteCacheEntry::cached_target`), the target's tests
/// (`route_target`: no route, local, kernel, else a group), all the
/// pipeline's own code. The first run misses and fills the slots; every
/// later one hits, as a flow's packets after its first do. Each address
/// takes the last group found (0 here), so the steps form a chain, as the
/// pipeline's do from the header's load to the group.
#[inline(always)]
pub fn route_cache(ctx: &XdpContext) -> u32 {
    let x = input(ctx);
    let Some(cache) = PRIM_ROUTE_CACHE.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: this CPU's value, ours for this program run.
    let cache = unsafe { &mut *cache };
    // 0 for any frame, as CONFIG's route_generation is until a route changes.
    let generation = x & 0x8000_0000;
    let mut group = 0;
    for i in 0..REPEAT {
        // 10.0.<frame length>.<i> as ipv4_words keeps it: the last byte,
        // which differs, is the top one, so each address has a slot of its own.
        let dst = [(0x0A | (x & 0xFF) << 16 | i << 24) ^ (group & 0x8000_0000), 0, 0, 0];
        let slot = &mut cache[route_cache_slot(&dst) as usize % ROUTE_CACHE_SLOTS as usize];
        group = match route_target(slot.cached_target(4, generation, &dst, || Some(i))) {
            RouteTarget::Group(g) => g,
            _ => return xdp_action::XDP_PASS,
        };
    }
    // The top bit set: never NEVER, whatever the group.
    finish(group | 0x8000_0000)
}

/// The IPv4 pipeline's header reads and tests, REPEAT times, each on
/// another header of one per-CPU value found once (the lookup is the
/// PERCPU_ARRAY primitive's), by the pipeline's own code: the fields it
/// uses read once (`ipv4_fields`: addresses, TTL, protocol, TOS), the TTL
/// and options tests (`ipv4_ttl_and_options`). The fragment and checksum
/// tests between them are the parse primitive's (`is_fragment`,
/// `ipv4_checksum_ok`). Separate headers, as the pipeline reads one per
/// packet; the fields are folded into the result so none is dropped.
#[inline(always)]
pub fn ipv4_checks(ctx: &XdpContext) -> u32 {
    let x = input(ctx);
    let Some(v) = PRIM_IPV4.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: this CPU's value, ours for this program run.
    let v = unsafe { &mut *v };
    if v.hdrs[0].ttl == 0 {
        fill_ipv4(v);
    }
    // The Ethernet header's length for any frame, as the pipeline's l3_off.
    let l3_off = EthHdr::LEN + (x & 0x8000_0000) as usize;
    let mut fields = 0u32;
    for i in 0..REPEAT as usize {
        // SAFETY: a whole header of this CPU's value.
        let f = unsafe { parse::ipv4_fields(&v.hdrs[i]) };
        if parse::ipv4_ttl_and_options(f.ttl, l3_off, v.l4_offs[i] as usize).is_err() {
            return xdp_action::XDP_PASS;
        }
        fields ^= u32::from_ne_bytes(f.src) ^ u32::from_ne_bytes(f.dst) ^ u32::from(f.protocol) ^ u32::from(f.tos);
    }
    finish(fields)
}

/// The first run's headers: 10.0.0.i to 10.1.0.i, UDP, TTL 64, DF, no
/// options.
#[inline(never)]
fn fill_ipv4(v: &mut PrimIpv4) {
    for i in 0..REPEAT as usize {
        v.hdrs[i] = Ipv4Hdr {
            vihl: 0x45,
            tos: 0x68,
            tot_len: 128u16.to_be_bytes(),
            id: [0; 2],
            frags: [0x40, 0],
            ttl: 64,
            proto: 17,
            check: [0; 2],
            src_addr: [10, 0, 0, i as u8],
            dst_addr: [10, 1, 0, i as u8],
        };
        v.l4_offs[i] = (EthHdr::LEN + Ipv4Hdr::LEN) as u32;
    }
}

/// REPEAT classes as CLASSES holds the bench's full config's two, the
/// control class (ACK, CNP) and the CTS class (WRITE_ONLY_IMM of at most
/// 64 bytes), alternately (the first run fills them).
#[map]
pub static PRIM_CLASSES: Array<[ClassEntry; REPEAT as usize]> = Array::with_max_entries(1, 0);

/// REPEAT classes tried against the bench's packet (a WRITE_ONLY), none
/// matching, as the pipeline's class loop tries each configured class in
/// turn: the pipeline's own test (`class::matches`: the match flags, then
/// the DSCP, opcode set, QP range and payload size the class asks for), on
/// classes of one value found once (the CLASSES lookups are the ARRAY
/// primitive's). The packet's fields are read through a reference the
/// compiler cannot see into, as `classify_index` gets them.
#[inline(always)]
pub fn class_tests(ctx: &XdpContext) -> u32 {
    let x = input(ctx);
    let Some(classes) = PRIM_CLASSES.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: the value is only this program's, and plain data.
    let classes = unsafe { &mut *classes };
    if classes[0].flags == 0 {
        fill_classes(classes);
    }
    let fields = ClassFields {
        roce: Some(RoceFields { opcode: opcode::WRITE_ONLY, dest_qp: x, payload_len: x }),
        dscp: (x >> 26) as u8,
    };
    let fields = core::hint::black_box(&fields);
    for c in classes.iter() {
        if class::matches(c, fields) {
            return xdp_action::XDP_PASS;
        }
    }
    finish(x)
}

/// The first run's classes: the bench's control and CTS classes in turn.
#[inline(never)]
fn fill_classes(classes: &mut [ClassEntry; REPEAT as usize]) {
    for (i, c) in classes.iter_mut().enumerate() {
        *c = if i % 2 == 0 {
            let mut control = ClassEntry {
                flags: CLASS_MATCH_OPCODE | CLASS_SET_DSCP | CLASS_ECN_EXEMPT,
                set_dscp: 48,
                ..ClassEntry::default()
            };
            class::add_opcode(&mut control.opcodes, opcode::ACK);
            class::add_opcode(&mut control.opcodes, opcode::CNP);
            control
        } else {
            let mut cts = ClassEntry {
                flags: CLASS_MATCH_OPCODE | CLASS_MATCH_PAYLOAD | CLASS_SET_DSCP,
                set_dscp: 46,
                max_payload: 64,
                ..ClassEntry::default()
            };
            class::add_opcode(&mut cts.opcodes, opcode::WRITE_ONLY_IMM);
            cts
        };
    }
}

/// The first run's groups: PRIM_MEMBERS members each, all up, the
/// buckets shared among them as a publish shares them.
#[inline(never)]
fn fill_groups(g: &mut PrimGroups) {
    for i in 0..REPEAT as usize {
        g.groups[i] =
            GroupEntry { member_count: PRIM_MEMBERS, hash_mode: HashMode::Qp as u32, ..GroupEntry::default() };
        for (b, bucket) in g.tables[i].iter_mut().enumerate() {
            *bucket = (b as u32 % PRIM_MEMBERS) as u8;
        }
        for (m, member) in g.members[i].iter_mut().enumerate() {
            *member = MemberEntry {
                ifindex: 1,
                flags: MEMBER_UP,
                src_mac: [2, 0, 0, 0, 0, m as u8],
                dst_mac: [2, 0, 0, 0, 1, m as u8],
            };
        }
    }
}

/// REPEAT egress ports' virtual queues and egress counter blocks, the
/// port's settings (the bench's ECN row's: a 25 Gbit/s drain, profile 0)
/// and profile (SONiC's lossless one, as the bench configures), the
/// packet's class action (no class: no flags, no profile of its own, read
/// from here so the marker's class tests run, as the pipeline's do on the
/// class it found) and the program's own clock (see [`ecn_queue`]), in
/// one value.
#[repr(C)]
pub struct PrimEcn {
    egress: EgressEntry,
    profile: EcnProfile,
    class: ClassAction,
    clock: u64,
    queues: [VirtualQueue; REPEAT as usize],
    counters: [EgressCounters; REPEAT as usize],
}

#[map]
pub static PRIM_ECN: Array<PrimEcn> = Array::with_max_entries(1, 0);

/// The ECN row's port rate (bytes per second) and the program's clock
/// step per run: the bench's IPv4 frame (1,082 bytes) every 1,000 ns is
/// 1.08 bytes per ns against the port's 3.125, so each queue holds the
/// one packet, below kmin, as the bench's ECN row's (one test run per
/// call, microseconds apart) does.
const PRIM_ECN_RATE: u64 = 25_000_000_000 / 8;
const PRIM_ECN_STEP_NS: u64 = 1_000;
/// The drain's multiplier and shift, by the compiler (128-bit arithmetic
/// is not for the BPF program).
const PRIM_ECN_DRAIN: DrainRate = DrainRate::new(PRIM_ECN_RATE);

/// One of PrimEcn's ports, as the marker finds its state: the queue and
/// counters of copy `i`, whatever the slot (the lookups are the ARRAY and
/// PERCPU_ARRAY primitives'), the profile in place, the program's clock.
struct PrimPort {
    value: *mut PrimEcn,
    i: usize,
}

// SAFETY: PRIM_ECN's value, this program's alone in the bench's test runs.
unsafe impl PortState for PrimPort {
    #[inline(always)]
    fn counters(&self, _slot: u32) -> Option<*mut EgressCounters> {
        // SAFETY: a field of the map value.
        Some(unsafe { &raw mut (*self.value).counters[self.i] })
    }

    #[inline(always)]
    fn queue(&self, _slot: u32) -> Option<*mut VirtualQueue> {
        // SAFETY: as above.
        Some(unsafe { &raw mut (*self.value).queues[self.i] })
    }

    #[inline(always)]
    fn profile(&self, _id: u32) -> Option<&EcnProfile> {
        // SAFETY: as above.
        Some(unsafe { &(*self.value).profile })
    }

    #[inline(always)]
    fn now(&self) -> u64 {
        // SAFETY: as above.
        unsafe { (*self.value).clock }
    }

    #[inline(always)]
    fn random(&self) -> u32 {
        // SAFETY: a helper without arguments.
        unsafe { bpf_get_prandom_u32() }
    }
}

/// The egress port's virtual queue for one packet, REPEAT times, each on
/// another port's queue and counters of one value found once, by the
/// pipeline's own marker (`rocev2_common::ecn::mark_on`): the egress
/// entry's fields, the transmit counters, the drain since the queue's last
/// packet (a multiply and a shift), depth and high water, the queue's
/// update, the class and profile tests, the thresholds, the ECT test and
/// its counter. The bench's frame as the ECN row's packet: ECT(0), its own
/// length, no class, below kmin (no random draw, not marked). The time is
/// a clock the program keeps (1 µs later every run), not a helper's: the
/// clock is its own primitive. Each packet's time takes the TOS the last
/// marking returned, so the steps form a chain.
#[inline(always)]
pub fn ecn_queue(ctx: &XdpContext) -> u32 {
    let Some(v) = PRIM_ECN.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: the value is only this program's, and plain data.
    let now = unsafe {
        if (*v).egress.drain.mult == 0 {
            fill_ecn(&mut *v);
        }
        (*v).clock += PRIM_ECN_STEP_NS;
        (*v).clock
    };
    let x = input(ctx);
    let len = u64::from(x);
    // ECT(0) and DSCP 0 for any frame (its length's top byte is 0), all
    // eight bits unknown to the compiler, so the ECT test runs.
    let mut tos = (x >> 24) as u8 ^ ECT0;
    let mut now = now;
    for i in 0..REPEAT as usize {
        // SAFETY: as above.
        let (egress, class) = unsafe { (&(*v).egress, &(*v).class) };
        tos = match ecn::mark_on(&PrimPort { value: v, i }, egress, tos, len, class, now) {
            Ok(t) => t,
            Err(ecn::DropNotEct) => return xdp_action::XDP_PASS,
        };
        // DSCP's top bit: 0, so every queue sees the same time.
        now += u64::from(tos >> 7);
    }
    finish(u32::from(tos))
}

/// The first run's port settings and profile.
#[inline(never)]
fn fill_ecn(v: &mut PrimEcn) {
    v.egress = EgressEntry { slot: 0, profile: 0, drain: PRIM_ECN_DRAIN };
    v.profile = EcnProfile { kmin_bytes: 1 << 20, kmax_bytes: 2 << 20, pmax_scaled: u32::MAX / 20, flags: 0 };
    v.class = ClassAction { flags: 0, set_dscp: 0, priority: 0, profile: NO_PROFILE };
}

/// REPEAT flows of a keyed flowlet table, each with its flow key (as
/// FLOW_KEY holds a packet's), its flowlet-table key (as FLOWLET_SCRATCH
/// holds it), its entry (as FLOWLETS holds it) and its group (the bench's
/// flowlet group: 4 members, a 50 µs gap, new flowlets at message ends),
/// and the program's clock, in one value.
#[repr(C)]
pub struct PrimFlowlets {
    clock: u64,
    groups: [GroupEntry; REPEAT as usize],
    flows: [FlowKey; REPEAT as usize],
    keys: [FlowletKey; REPEAT as usize],
    entries: [FlowletEntry; REPEAT as usize],
}

#[map]
pub static PRIM_FLOWLETS: Array<PrimFlowlets> = Array::with_max_entries(1, 0);

/// The bench's flowlet gap, and the program's clock step per run (within it).
const PRIM_FLOWLET_GAP_NS: u64 = 50_000;
const PRIM_FLOWLET_STEP_NS: u64 = 1_000;

/// A packet of a flow inside its flowlet, REPEAT times, each on another
/// flow of one value found once (the FLOWLET_SCRATCH lookup is the
/// PERCPU_ARRAY primitive's, the FLOWLETS one the LRU_HASH primitive's),
/// by the pipeline's own code: whether the packet ends a message
/// (`bth::ends_message`), the flowlet-table key built from the flow key
/// (`FlowletKey::new`), the group's flowlet settings read, the decision and
/// the entry's update in place (`flowlet::keyed_step`: generation, member
/// count, the gap since the flow's last packet, the entry's five fields).
/// The bench's flowlet packet (a WRITE_ONLY, microseconds after the last,
/// within the 50 µs gap: the flowlet kept) on a clock the program keeps
/// (1 µs later every run; the clock is its own primitive). Each packet's
/// time and opcode take the last decision's position, so the steps form a
/// chain.
#[inline(always)]
pub fn flowlet_step(ctx: &XdpContext) -> u32 {
    let Some(v) = PRIM_FLOWLETS.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: the value is only this program's, and plain data.
    let v = unsafe { &mut *v };
    if v.groups[0].member_count == 0 {
        fill_flowlets(v, input(ctx));
    }
    v.clock += PRIM_FLOWLET_STEP_NS;
    let mut now = v.clock;
    // 0 for any frame; the compiler cannot know it.
    let mut position = input(ctx) & 0x8000_0000;
    for i in 0..REPEAT as usize {
        // The top bits of a position: 0, unknown to the compiler.
        let op = (position >> 24) as u8 | opcode::WRITE_ONLY;
        let ends_message = bth::ends_message(op);
        v.keys[i] = FlowletKey::new(&v.flows[i], i as u32);
        let group = &v.groups[i];
        let rules = group.flowlet_rules();
        // Found, as the LRU_HASH lookup finds a known flow's entry; its
        // test is the pipeline's null test.
        let existing = if position == NEVER { None } else { Some(&raw mut v.entries[i]) };
        // SAFETY: an entry of this program's value.
        position = unsafe { flowlet::keyed_step(existing, now, rules, ends_message, |_, _| 0, |_| {}) };
        now += u64::from(position >> 16);
    }
    finish(position)
}

/// The first run's groups, flows and entries: each flow on member
/// `i % 4` of its group, in the group's generation, its last packet ending
/// a message at time 0.
#[inline(never)]
fn fill_flowlets(v: &mut PrimFlowlets, x: u32) {
    for i in 0..REPEAT as usize {
        v.groups[i] = GroupEntry {
            member_count: 4,
            policy: POLICY_FLOWLET,
            generation: 1,
            flowlet_flags: FLOWLET_AT_BOUNDARY,
            flowlet_gap_ns: PRIM_FLOWLET_GAP_NS,
            ..GroupEntry::default()
        };
        let flow = &mut v.flows[i];
        (flow.src, flow.dst) = ([x ^ i as u32, 0, 0, 0], [0x0A01_0001, 0, 0, 0]);
        (flow.src_port, flow.dst_port, flow.protocol, flow.dest_qp) = (0xC000 | i as u16, 4791, 17, 0x100);
        v.entries[i] =
            FlowletEntry { position: i as u32 % 4, generation: 1, at_boundary: 1, ..FlowletEntry::default() };
    }
}

/// REPEAT QPs, each in a table of one set (QP_WAYS slots, the QP in its
/// first way, as the telemetry row's QP is found), each with the flow key
/// its packets carry (as FLOW_KEY holds it); the sets' mask (0, as the
/// program reads QP_SETS_MASK), the next PSN and the program's clock. The
/// tables first: the map is mmapable, so they start on a page and each
/// slot's first 64 bytes are one cache line, as in QP_TELEMETRY.
#[repr(C)]
pub struct PrimQps {
    tables: [[QpSlot; QP_WAYS as usize]; REPEAT as usize],
    flows: [FlowKey; REPEAT as usize],
    sets_mask: u32,
    psn: u32,
    clock: u64,
}

#[map]
pub static PRIM_QPS: Array<PrimQps> = Array::with_max_entries(1, BPF_F_MMAPABLE);

const BPF_F_MMAPABLE: u32 = 1 << 10;

/// One of PrimQps' tables, as the shared lookup finds its slots: the
/// index's way within the table's one set (an AND, which the compiler
/// knows keeps it in bounds), the slot's address. The QP_TELEMETRY
/// lookup's bounds test and address computation are the ARRAY
/// primitive's, counted apart.
struct PrimTable<'a>(&'a mut [QpSlot; QP_WAYS as usize]);

// SAFETY: slots of this program's value.
unsafe impl QpTable for PrimTable<'_> {
    #[inline(always)]
    fn slot(&self, index: u32) -> Option<*mut QpSlot> {
        Some((&raw const self.0[(index % QP_WAYS) as usize]).cast_mut())
    }
}

/// Telemetry's part of a data packet of a QP the table holds, REPEAT
/// times, each on another QP of one value found once (the QP_TELEMETRY
/// lookup is the ARRAY primitive's), by the pipeline's own code: the QP's
/// set (`set_start`: the 64-bit hash of the flow key's destination and
/// DestQP), its ways compared (`find`: the first holds it), the member it
/// took before, the stats' update (`data_of_known`: packets, bytes, last
/// seen, member, the PSN against the highest seen), the CE test and the
/// test for a member sum to update. The telemetry row's packet: the next
/// PSN of its QP (in order), ECT(0) (not marked), the same member; on a
/// clock the program keeps (the coarse clock and jiffies are primitives
/// of their own). Each packet's DestQP takes the member the last one found
/// (its top bits, 0), so the steps form a chain.
#[inline(always)]
pub fn qp_entry(ctx: &XdpContext) -> u32 {
    let Some(v) = PRIM_QPS.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: the value is only this program's, and plain data.
    let v = unsafe { &mut *v };
    let x = input(ctx);
    if v.flows[0].protocol == 0 {
        fill_qps(v, x);
    }
    v.clock += 1_000;
    v.psn = v.psn.wrapping_add(1) & PSN_MASK;
    let (now, psn, len, mask) = (v.clock, v.psn, u64::from(x), v.sets_mask);
    // ECT(0) and DSCP 0 for any frame (its length's top byte is 0), all
    // eight bits unknown to the compiler, so the CE test runs.
    let tos = (x >> 24) as u8 ^ ECT0;
    let mut chain = x & 0x8000_0000;
    for i in 0..REPEAT as usize {
        let key = &v.flows[i];
        let dest_qp = key.dest_qp ^ chain;
        let ce_marked = tos & 3 == 3;
        let set = set_start(&key.dst, dest_qp, mask);
        let table = PrimTable(&mut v.tables[i]);
        let Some(slot) = find(&table, &key.dst, dest_qp, 4, set) else {
            return xdp_action::XDP_PASS;
        };
        // SAFETY: a slot of this program's value.
        let s = unsafe { &mut (*slot).stats };
        let (before_group, before_position, step) = data_of_known(s, psn, len, 0, i as u32 % 4, ce_marked, now);
        if step != PsnStep::InOrder || ce_marked {
            return xdp_action::XDP_PASS;
        }
        chain = (before_group | before_position) & 0x8000_0000;
    }
    finish(chain)
}

/// The first run's QPs: one per table, in its first way, each a flow of
/// its own to 10.1.0.1.
#[inline(never)]
fn fill_qps(v: &mut PrimQps, x: u32) {
    for i in 0..REPEAT as usize {
        let flow = &mut v.flows[i];
        (flow.src, flow.dst) = ([x ^ i as u32, 0, 0, 0], [0x0A01_0001, 0, 0, 0]);
        (flow.src_port, flow.dst_port, flow.protocol, flow.dest_qp) = (0xC000, 4791, 17, 0x100 + i as u32);
        let key = &mut v.tables[i][0].key;
        (key.dst, key.dest_qp, key.family) = (flow.dst, flow.dest_qp, 4);
    }
}

/// Never run for the bench's frame (no frame is [`NEVER`] bytes long):
/// code that makes the program as large as the qp pipeline's, JITed, so
/// the padded floor differs from the floor by its size alone. Inlined:
/// the program's own function is the large one, as the pipeline's is.
#[inline(always)]
fn padding(ctx: &XdpContext) -> u32 {
    let x = input(ctx);
    let mut key =
        FlowKey { src_port: 0xC000, dst_port: 4791, protocol: 17, dest_qp: x, ipv6: true, ..FlowKey::default() };
    key.src = [x, x ^ 1, x ^ 2, x ^ 3];
    key.dst = [x ^ 4, x ^ 5, x ^ 6, x ^ 7];
    let mut h = x;
    macro_rules! x4 {
        ($($b:tt)*) => { $($b)* $($b)* $($b)* $($b)* };
    }
    x4! {
        x4! {
            h = member_hash_of_family::<false>(&key, HashMode::Qp, h, HashVersion::V1);
            key.src[0] ^= h;
        }
    }
    h
}

/// The floor padded to about the qp pipeline's JITed size (9.7 KB) with
/// code no bench frame runs: what a program's size and place cost by
/// themselves, against the floor.
#[inline(always)]
pub fn padded(ctx: &XdpContext) -> u32 {
    if input(ctx) == NEVER {
        return padding(ctx);
    }
    finish(0)
}
