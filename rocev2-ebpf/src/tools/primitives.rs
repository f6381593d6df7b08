//! The benchmark's primitive programs (`rocev2 bench`, part 1): each is
//! the floor (`rocev2_xdp_redirect`: one devmap redirect) plus one thing
//! the pipeline pays for, done [`REPEAT`] times (once for the parse), so
//! its time above the floor, divided by the repeat count, is that
//! primitive's cost on this machine. Repeated steps form a chain (each
//! uses the previous result), as the pipeline's do: the time is their
//! latency, not their throughput. The budget tables of BENCHMARKS.md
//! split the pipelines' costs into these.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
    programs::XdpContext,
};
use rocev2_common::{
    hash::{member_hash_of_family, FlowKey, HashMode, HashVersion},
    maps::FlowletKey,
};

use crate::{
    maps::EGRESS_DEVS_DIRECT,
    parse::{self, L3Kind, Roce},
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
