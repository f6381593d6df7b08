//! Host bridge mode (`[bridge]`): the program on every port of a Linux
//! bridge. Layer 2: the destination MAC's entry in the mirrored FDB says
//! where a frame goes, and it leaves unchanged (no MAC rewrite, no TTL
//! change; DSCP and ECN change only where classes or ECN marking say so,
//! as in routed mode). A MAC reachable through every port of an uplink
//! group takes the member a routed group would choose: the same group
//! entry, bucket table, hash, flowlets and pins ([`forward::decide`]).
//!
//! Everything the kernel bridge must see goes to it (XDP_PASS), counted by
//! reason: broadcast and multicast (STP BPDUs, LLDP and every other
//! link-local frame among them), unknown unicast (the bridge floods it),
//! frames for the bridge's own MACs, frames whose source the FDB does not
//! have on this port (so the bridge learns new hosts and moves), frames
//! that arrive on, or are due for, a port outside STP forwarding state,
//! non-IP frames (ARP keeps the kernel bridge's own choice of port) and IP
//! packets rocev2 cannot read a flow from. Nothing is dropped that the
//! kernel bridge would forward.

use core::mem::MaybeUninit;

use aya_ebpf::programs::XdpContext;
use network_types::eth::EthHdr;
use rocev2_common::{
    counters::PortCounter,
    features::Features,
    maps::{
        fdb_cache_slot, fdb_key_words, FdbCacheEntry, FdbKey, BRIDGE_PORT_FORWARDING, BRIDGE_PORT_GROUP, FDB_LOCAL,
        FDB_PORT, FDB_UPLINK,
    },
};

use crate::{
    args::BridgeTarget,
    class, counters,
    ctx::PacketBuf,
    features::enabled,
    forward::{self, decide, flow_key_v4, flow_key_v6, hand_on, new_tos, Decision, FORWARDED},
    forwarded::Forward,
    maps::{BRIDGE_PORTS, CONFIG, FDB, FDB_CACHE},
    parse::{self, drop, pass, ptr_at, L3Kind, Outcome, Verdict, L4},
    pin::{self, NO_PIN},
    rewrite,
};

/// XDP entry point body on a bridge port.
#[inline(always)]
pub fn xdp_bridge(ctx: &XdpContext) -> u32 {
    let slot = counters::port_slot(ctx.ingress_ifindex() as u32);
    let mut out = MaybeUninit::<Forward>::uninit();
    let result = bridge(ctx, slot, &mut out);
    forward::send(ctx, slot, &out, result, counters::count_bridged)
}

/// The layer-2 decision, then the IP part in a BPF function per family.
#[inline(always)]
fn bridge<C: PacketBuf>(ctx: &C, slot: u32, out: &mut MaybeUninit<Forward>) -> Result<(), Outcome> {
    let target = fdb_target(ctx, slot);
    if target.kind() == NO_TARGET {
        return Err(Outcome::decode(target.id()));
    }
    // A header cut short is the kernel bridge's to judge, not a drop: it
    // forwards by MAC whatever follows.
    let l2 = parse::parse_l2(ctx).map_err(|o| match o.verdict {
        Verdict::Drop => pass(PortCounter::PassBridgeMalformed),
        Verdict::Pass => o,
    })?;
    let code = match l2.kind {
        L3Kind::V4 => bridge_v4_call(ctx, slot, l2.l3_off, target, out),
        L3Kind::V6 => bridge_v6_call(ctx, slot, l2.l3_off, target, out),
    };
    if code == FORWARDED {
        Ok(())
    } else {
        Err(Outcome::decode(code))
    }
}

/// [`fdb_target`]'s kind when the frame goes no further in XDP: the id is
/// then the encoded [`Outcome`].
const NO_TARGET: u32 = 0;

/// Where the destination MAC's FDB entry sends the frame, or (kind
/// NO_TARGET) why the kernel bridge gets it. Its own BPF function: its
/// keys and entries stay out of the frame the member choice runs under.
#[inline(never)]
fn fdb_target<C: PacketBuf>(ctx: &C, slot: u32) -> BridgeTarget {
    // Opaque, so LLVM passes the context itself rather than its data and
    // data_end values (the verifier refuses packet pointers split that way).
    let ctx = core::hint::black_box(ctx);
    match fdb_lookup(ctx, slot) {
        Ok(target) => target,
        Err(o) => BridgeTarget::new(NO_TARGET, o.encode()),
    }
}

#[inline(always)]
fn fdb_lookup<C: PacketBuf>(ctx: &C, slot: u32) -> Result<BridgeTarget, Outcome> {
    let eth: *const EthHdr = ptr_at(ctx, 0).ok_or(drop(PortCounter::DropRunt))?;
    // The two MACs as three word loads (frame_mac_words), not twelve byte
    // loads reassembled into keys (LLVM split the [u8; 6] reads). SAFETY:
    // bounds checked by ptr_at; the verifier allows packet loads at any
    // alignment on CPUs with efficient unaligned access (x86, arm64).
    let macs: [u32; 3] = unsafe { core::ptr::read(eth.cast::<[u32; 3]>()) };
    // Group bit: broadcast, multicast, STP and the other link-local frames.
    if macs[0] & 1 != 0 {
        return Err(pass(PortCounter::PassL2Multicast));
    }
    let port = BRIDGE_PORTS.get(slot).ok_or(pass(PortCounter::PassBridgePortBlocked))?;
    if port.flags & BRIDGE_PORT_FORWARDING == 0 {
        return Err(pass(PortCounter::PassBridgePortBlocked));
    }
    // The generation is read before the FDB: a result stored under it is
    // discarded by the bump that follows any FDB or port change.
    let generation = CONFIG.get(0).map_or(0, |c| c.fdb_generation);
    let Some(cached) = FDB_CACHE.get_ptr_mut(fdb_cache_slot(&macs, slot)) else {
        return fdb_entries(&macs, slot, port.uplink);
    };
    // SAFETY: this CPU's own slot; nothing else runs on it meanwhile.
    let cached = unsafe { &mut *cached };
    let hit = cached.port_slot == slot
        && cached.fdb_generation == generation
        && cached.macs[0] == macs[0]
        && cached.macs[1] == macs[1]
        && cached.macs[2] == macs[2];
    // Each kind returned as its constant: the verifier then knows a hit is
    // never NO_TARGET (with the kind as read from the slot it follows the
    // NO_TARGET branch into the outcome decoder with an unbounded index).
    if hit && cached.kind == FDB_UPLINK {
        return Ok(BridgeTarget::new(FDB_UPLINK, cached.target));
    }
    if hit && cached.kind == FDB_PORT {
        return Ok(BridgeTarget::new(FDB_PORT, cached.target));
    }
    let target = fdb_entries(&macs, slot, port.uplink)?;
    *cached =
        FdbCacheEntry { macs, port_slot: slot, fdb_generation: generation, kind: target.kind(), target: target.id() };
    Ok(target)
}

/// An FDB key (VLAN 0) from its little-endian u64 ([`fdb_key_words`]).
#[inline(always)]
fn fdb_key(word: u64) -> FdbKey {
    // SAFETY: FdbKey is 8 bytes of plain data (mac, vlan), any bits valid.
    unsafe { core::mem::transmute::<u64, FdbKey>(word) }
}

/// The FDB's own answer for a frame with MACs `macs` on port `slot`
/// (whose uplink group is `uplink`): the destination's entry, once the
/// source is found learned where the frame came from.
#[inline(always)]
fn fdb_entries(macs: &[u32; 3], slot: u32, uplink: u32) -> Result<BridgeTarget, Outcome> {
    let (dst, src) = fdb_key_words(macs);
    // SAFETY: a map value, only read.
    let to = unsafe { FDB.get(fdb_key(dst)) }.ok_or(pass(PortCounter::PassBridgeUnknownUnicast))?;
    let (kind, id, port_slot) = (to.kind, to.target, to.port_slot);
    learned_here(src, slot, uplink)?;
    match kind {
        FDB_PORT if port_slot == slot => Err(pass(PortCounter::PassBridgeSamePort)),
        FDB_PORT | FDB_UPLINK => Ok(BridgeTarget::new(kind, id)),
        FDB_LOCAL => Err(pass(PortCounter::PassBridgeLocal)),
        _ => Err(pass(PortCounter::PassBridgeEgressBlocked)),
    }
}

/// Whether the kernel bridge already has the frame's source where it came
/// from: on this port, or (an uplink group's MAC) on any port of its group.
/// If not, the frame goes to the kernel, which learns the host or its move
/// and announces it, and the FDB mirror follows. A host's entry is marked
/// active, so its ageing in the kernel is refreshed while XDP forwards its
/// frames.
#[inline(always)]
fn learned_here(src: u64, slot: u32, uplink: u32) -> Result<(), Outcome> {
    let learn = pass(PortCounter::PassBridgeLearn);
    let from = FDB.get_ptr_mut(fdb_key(src)).ok_or(learn)?;
    // SAFETY: a map value. The activity bit is one aligned store; the
    // control program clearing it at the same time only delays a refresh.
    unsafe {
        match (*from).kind {
            FDB_PORT if (*from).port_slot == slot => {
                if (*from).active == 0 {
                    (*from).active = 1;
                }
                Ok(())
            }
            FDB_UPLINK if (*from).target.wrapping_add(1) == uplink => Ok(()),
            _ => Err(learn),
        }
    }
}

#[inline(never)]
fn bridge_v4_call<C: PacketBuf>(
    ctx: &C,
    slot: u32,
    l3_off: usize,
    target: BridgeTarget,
    out: &mut MaybeUninit<Forward>,
) -> u32 {
    hand_on(ctx, bridge_v4(ctx, slot, l3_off, target), out)
}

#[inline(never)]
fn bridge_v6_call<C: PacketBuf>(
    ctx: &C,
    slot: u32,
    l3_off: usize,
    target: BridgeTarget,
    out: &mut MaybeUninit<Forward>,
) -> u32 {
    hand_on(ctx, bridge_v6(ctx, slot, l3_off, target), out)
}

/// The class of a frame bridged to one port (no member to choose).
#[inline(always)]
fn to_port(ifindex: u32, l4: &L4, dscp: u8, len: u64) -> Decision {
    let class = if enabled(Features::CLASSES) {
        class::matched(&class::fields(&l4.roce, l4.dest_qp, dscp), len)
    } else {
        class::NO_ACTION
    };
    Decision::to_port(ifindex, class)
}

#[inline(always)]
fn bridge_v4<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, target: BridgeTarget) -> Result<Forward, Outcome> {
    let ip = parse::parse_ipv4(ctx, l3_off).map_err(|_| pass(PortCounter::PassBridgeMalformed))?;
    let len = ip.frame_len as u64;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv4 checked the header lies in the packet.
    let (src, dst, ttl, protocol, tos) =
        unsafe { ((*hdr).src_addr, (*hdr).dst_addr, (*hdr).ttl, (*hdr).proto, (*hdr).tos) };
    // A fragment after the first has no ports: hashed on its own it could
    // overtake the first. The kernel bridge forwards fragments as they are.
    if parse::is_fragment(hdr) {
        return Err(pass(PortCounter::PassFragment));
    }
    let l4 = parse::parse_l4(ctx, protocol, ip.l4_off, ip.l4_end)?;
    let (d, group) = if target.kind() == FDB_UPLINK {
        let group = target.id();
        let key = flow_key_v4(src, dst, protocol, &l4)?;
        let pin = if enabled(Features::PINNED) { pin::pinned_v4(dst, &l4, group) } else { NO_PIN };
        (decide::<true>(slot, group, key, &l4, tos >> 2, pin, len)?, group)
    } else {
        // Telemetry reads the flow's addresses, ports and QP from the key.
        if enabled(Features::TELEMETRY) {
            flow_key_v4(src, dst, protocol, &l4)?;
        }
        (to_port(target.id(), &l4, tos >> 2, len), BRIDGE_PORT_GROUP)
    };
    let tos_out = new_tos(&d, tos, len)?;
    if tos_out != tos {
        // SAFETY: header checked above; the TTL stays as it is.
        unsafe { rewrite::set_ipv4_tos_ttl(hdr, tos_out, ttl) };
    }
    Ok(d.forward(group, l4.roce, len, tos_out))
}

#[inline(always)]
fn bridge_v6<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, target: BridgeTarget) -> Result<Forward, Outcome> {
    let ip = parse::parse_ipv6(ctx, l3_off).map_err(|_| pass(PortCounter::PassBridgeMalformed))?;
    let len = ip.frame_len as u64;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv6 checked the header lies in the packet. The
    // addresses are borrowed from the packet, not copied.
    let (src, dst, hop_limit, next_header, vcf) =
        unsafe { (&(*hdr).src_addr, &(*hdr).dst_addr, (*hdr).hop_limit, (*hdr).next_hdr, (*hdr).vcf) };
    if parse::is_ipv6_extension(next_header) {
        return Err(pass(PortCounter::PassIpv6ExtHeader));
    }
    let l4 = parse::parse_l4(ctx, next_header, ip.l4_off, ip.l4_end)?;
    let tc = rewrite::ipv6_traffic_class(vcf);
    let (d, group) = if target.kind() == FDB_UPLINK {
        let group = target.id();
        let key = flow_key_v6(src, dst, next_header, &l4)?;
        let pin = if enabled(Features::PINNED) { pin::pinned_v6(dst, &l4, group) } else { NO_PIN };
        (decide::<false>(slot, group, key, &l4, tc >> 2, pin, len)?, group)
    } else {
        // As for IPv4.
        if enabled(Features::TELEMETRY) {
            flow_key_v6(src, dst, next_header, &l4)?;
        }
        (to_port(target.id(), &l4, tc >> 2, len), BRIDGE_PORT_GROUP)
    };
    let tc_out = new_tos(&d, tc, len)?;
    if tc_out != tc {
        // SAFETY: header checked above; the hop limit stays as it is.
        unsafe { rewrite::set_ipv6_class_hop_limit(hdr, tc_out, hop_limit) };
    }
    Ok(d.forward(group, l4.roce, len, tc_out))
}
