//! The forwarding pipeline, shared by the XDP and tc programs: parse, route
//! (longest prefix), choose a group member (hash, flowlet or pin), classify,
//! mark ECN, rewrite (MACs, TTL/hop limit, DSCP/ECN, IPv4 checksum).
//!
//! Nothing covered by the RoCEv2 ICRC is touched: TTL/hop limit, DSCP, ECN
//! and the IPv4 header checksum are masked out of it; MACs are outside it.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_ktime_get_ns, maps::lpm_trie::Key, programs::XdpContext};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};
use rocev2_common::{
    bth, checksum,
    class::{ClassAction, ClassFields, RoceFields, CLASS_SET_DSCP, CLASS_SET_PRIORITY},
    counters::PortCounter,
    ecn::NO_PROFILE,
    hash::{ipv4_words, ipv6_words, FlowKey},
    maps::{
        member_index, route_cache_slot, GroupEntry, RouteEntry, CACHED_NO_ROUTE, MAX_MEMBERS_PER_GROUP, MEMBER_UP,
        PIN_MEMBER_DOWN, POLICY_FLOWLET, POLICY_PINNED, ROUTE_KERNEL, ROUTE_LOCAL,
    },
};

use crate::{
    counters,
    ctx::PacketBuf,
    maps::{CLASSES, CONFIG, EGRESS_DEVS, GROUPS, MEMBERS, PINS_V4, PINS_V6, ROUTES_V4, ROUTES_V6, ROUTE_CACHE},
    parse::{self, drop, pass, L3Kind, Outcome, Roce, Verdict, L4},
    qos, select, telemetry,
};

/// A packet ready to leave: where to, and what to count.
#[derive(Clone, Copy)]
pub struct Forward {
    pub ifindex: u32,
    pub group: u32,
    pub position: u32,
    pub roce: Roce,
    /// skb priority for tc (0 = leave as is).
    pub priority: u32,
}

/// XDP entry point body: counts the frame and its outcome, returns the action.
#[inline(always)]
pub fn xdp_forward(ctx: &XdpContext) -> u32 {
    let slot = counters::port_slot(ctx.ingress_ifindex() as u32);
    let len = parse::frame_len(ctx) as u64;
    counters::add(slot, PortCounter::RxPackets, 1);
    counters::add(slot, PortCounter::RxBytes, len);
    let result = forward(ctx, slot, len).and_then(|f| {
        // The low bits of the flags are the action when the device is missing.
        match EGRESS_DEVS.redirect(f.ifindex, u64::from(xdp_action::XDP_DROP)) {
            Ok(_) => Ok(f),
            Err(_) => Err(drop(PortCounter::DropRedirectFailed)),
        }
    });
    match result {
        Ok(f) => {
            count_forwarded(slot, &f, len);
            xdp_action::XDP_REDIRECT
        }
        Err(Outcome { verdict, counter }) => {
            counters::add(slot, counter, 1);
            match verdict {
                Verdict::Pass => xdp_action::XDP_PASS,
                Verdict::Drop => xdp_action::XDP_DROP,
            }
        }
    }
}

#[inline(always)]
pub fn count_forwarded(slot: u32, f: &Forward, len: u64) {
    counters::add(slot, PortCounter::Forwarded, 1);
    counters::add(slot, PortCounter::ForwardedBytes, len);
    counters::member_sent(f.group, f.position, len);
    match f.roce {
        Roce::Yes { .. } => counters::add(slot, PortCounter::ForwardedRoce, 1),
        Roce::ShortBth => {
            counters::add(slot, PortCounter::ForwardedRoce, 1);
            counters::add(slot, PortCounter::RoceShortBth, 1);
        }
        Roce::No => {}
    }
}

#[inline(always)]
pub fn forward<C: PacketBuf>(ctx: &C, slot: u32, len: u64) -> Result<Forward, Outcome> {
    let l2 = parse::parse_l2(ctx)?;
    let mut out = Forward { ifindex: 0, group: 0, position: 0, roce: Roce::No, priority: 0 };
    // Each family runs in its own BPF function: inlined together they need
    // more than the 512-byte stack. They return an encoded Outcome and
    // write a forwarded packet's details to `out`.
    let code = match l2.kind {
        L3Kind::V4 => forward_v4_call(ctx, slot, l2.l3_off, len, &mut out),
        L3Kind::V6 => forward_v6_call(ctx, slot, l2.l3_off, len, &mut out),
    };
    if code == FORWARDED {
        Ok(out)
    } else {
        Err(Outcome::decode(code))
    }
}

/// Return code of the per-family functions for "forwarded".
const FORWARDED: u32 = u32::MAX;

#[inline(never)]
fn forward_v4_call<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, len: u64, out: &mut Forward) -> u32 {
    match forward_v4(ctx, slot, l3_off, len) {
        Ok(f) => {
            *out = f;
            if telemetry::enabled() {
                telemetry::observe(ctx, out);
            }
            FORWARDED
        }
        Err(o) => o.encode(),
    }
}

#[inline(never)]
fn forward_v6_call<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, len: u64, out: &mut Forward) -> u32 {
    match forward_v6(ctx, slot, l3_off, len) {
        Ok(f) => {
            *out = f;
            if telemetry::enabled() {
                telemetry::observe(ctx, out);
            }
            FORWARDED
        }
        Err(o) => o.encode(),
    }
}

/// The Ethernet header (checked again here: subprograms see the packet
/// afresh).
#[inline(always)]
fn eth_header<C: PacketBuf>(ctx: &C) -> Result<*mut EthHdr, Outcome> {
    parse::ptr_at(ctx, 0).ok_or(drop(PortCounter::DropRunt))
}

/// Route lookup result: the group to use, or why not.
#[inline(always)]
fn route_group(target: u32) -> Result<u32, Outcome> {
    match target {
        CACHED_NO_ROUTE => Err(pass(PortCounter::PassNoRoute)),
        ROUTE_LOCAL => Err(pass(PortCounter::PassLocal)),
        ROUTE_KERNEL => Err(pass(PortCounter::PassKernelRoute)),
        group => Ok(group),
    }
}

/// The route target of `dst` (family 4 or 6): from this CPU's ROUTE_CACHE
/// when the slot holds `dst` from the current route generation, else from
/// `lookup` (the LPM trie), which then fills the slot.
#[inline(always)]
fn cached_route(family: u32, dst: &[u32; 4], lookup: impl FnOnce() -> Option<&'static RouteEntry>) -> u32 {
    // The generation is read before the trie: a result stored under it is
    // discarded by the bump that follows any route change.
    let generation = CONFIG.get(0).map_or(0, |c| c.route_generation);
    let Some(slot) = ROUTE_CACHE.get_ptr_mut(route_cache_slot(dst)) else {
        return lookup().map_or(CACHED_NO_ROUTE, |r| r.group);
    };
    // SAFETY: this CPU's own slot; nothing else runs on it meanwhile.
    let slot = unsafe { &mut *slot };
    if slot.family == family && slot.route_generation == generation && slot.dst == *dst {
        return slot.target;
    }
    let target = lookup().map_or(CACHED_NO_ROUTE, |r| r.group);
    slot.dst = *dst;
    slot.route_generation = generation;
    slot.family = family;
    slot.target = target;
    target
}

/// Everything decided about a routed packet before its headers change.
struct Decision {
    ifindex: u32,
    position: u32,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    class: Option<ClassAction>,
    /// The clock reading if the member choice took one, else 0.
    now: u64,
}

/// Group lookup, member choice and classification.
#[inline(always)]
fn decide(
    slot: u32,
    group_id: u32,
    key: &FlowKey,
    l4: &L4,
    dscp: u8,
    pin: Option<u32>,
    len: u64,
) -> Result<Decision, Outcome> {
    let no_member = pass(PortCounter::PassNoMember);
    let group: &GroupEntry = GROUPS.get(group_id).ok_or(no_member)?;
    if group.member_count == 0 || group.member_count > MAX_MEMBERS_PER_GROUP {
        return Err(no_member);
    }
    let ends_message = match l4.roce {
        Roce::Yes { opcode, .. } => bth::ends_message(opcode),
        _ => true,
    };
    let slot_group = (u64::from(slot) << 32) | u64::from(group_id);
    let pin_boundary = (u64::from(ends_message) << 32) | u64::from(pin.unwrap_or(select::NO_PIN));
    // One clock read per packet, shared by the flowlet table and the
    // virtual queue; only flowlet groups need it this early.
    let now = if group.policy == POLICY_FLOWLET { unsafe { bpf_ktime_get_ns() } } else { 0 };
    let position = select::choose_position(slot_group, group, key, pin_boundary, now);
    if position >= MAX_MEMBERS_PER_GROUP {
        return Err(no_member);
    }
    let member = MEMBERS.get(member_index(group_id, group.bank & 1, position)).ok_or(no_member)?;
    if member.flags & MEMBER_UP == 0 {
        return Err(no_member);
    }
    let fields = ClassFields {
        roce: match l4.roce {
            Roce::Yes { opcode, dest_qp, payload_len } => Some(RoceFields { opcode, dest_qp, payload_len }),
            _ => None,
        },
        dscp,
    };
    let class = match qos::classify_index(&fields) {
        qos::NO_CLASS => None,
        index => {
            counters::class_matched(index, len);
            CLASSES.get(index).map(|c| c.action())
        }
    };
    Ok(Decision { ifindex: member.ifindex, position, src_mac: member.src_mac, dst_mac: member.dst_mac, class, now })
}

/// DSCP rewrite by class, then ECN marking on the egress virtual queue.
#[inline(always)]
fn new_tos(d: &Decision, tos: u8, len: u64) -> Result<u8, Outcome> {
    let mut tos = tos;
    if let Some(c) = &d.class {
        if c.flags & CLASS_SET_DSCP != 0 {
            tos = ((c.set_dscp as u8) << 2) | (tos & 3);
        }
    }
    let (flags, profile) = d.class.map_or((0, NO_PROFILE), |c| (c.flags, c.profile));
    match qos::ecn_mark_code(d.ifindex, u32::from(tos), len, (u64::from(flags) << 32) | u64::from(profile), d.now) {
        qos::ECN_DROP => Err(drop(PortCounter::DropNotEct)),
        t => Ok(t as u8),
    }
}

#[inline(always)]
fn priority(d: &Decision) -> u32 {
    match &d.class {
        Some(c) if c.flags & CLASS_SET_PRIORITY != 0 => c.priority,
        _ => 0,
    }
}

/// The pinned position for (destination, DestQP) if a pin is valid for
/// `group`'s current generation.
/// Only `pinned` groups look pins up: the pin table lookup is an LPM
/// search every other packet can skip.
#[inline(always)]
fn is_pinned(group_id: u32) -> bool {
    GROUPS.get(group_id).is_some_and(|g| g.policy == POLICY_PINNED)
}

#[inline(always)]
fn pinned_v4(dst: [u8; 4], l4: &L4, group_id: u32) -> Option<u32> {
    let Roce::Yes { dest_qp, .. } = l4.roce else { return None };
    match pin_lookup_v4(u32::from_ne_bytes(dst), dest_qp, group_id) {
        NO_PIN => None,
        position => Some(position),
    }
}

/// Its own BPF function, like [`pin_lookup_v6`]: keeps map-value pointers
/// out of the caller's frame.
#[inline(never)]
fn pin_lookup_v4(dst: u32, dest_qp: u32, group_id: u32) -> u32 {
    let q = dest_qp.to_be_bytes();
    let d = dst.to_ne_bytes();
    let key = [q[0], q[1], q[2], q[3], d[0], d[1], d[2], d[3]];
    let Some(pin) = PINS_V4.get(Key::new(64, key)) else { return NO_PIN };
    valid_pin(pin.group, pin.position, pin.generation, group_id).unwrap_or(NO_PIN)
}

#[inline(always)]
fn pinned_v6(dst: &[u8; 16], l4: &L4, group_id: u32) -> Option<u32> {
    let Roce::Yes { dest_qp, .. } = l4.roce else { return None };
    match pin_lookup_v6(dst, dest_qp, group_id) {
        NO_PIN => None,
        position => Some(position),
    }
}

const NO_PIN: u32 = u32::MAX;

/// Its own BPF function: the 24-byte LPM key would not fit the IPv6 frame.
#[inline(never)]
fn pin_lookup_v6(dst: &[u8; 16], dest_qp: u32, group_id: u32) -> u32 {
    let mut key = [0u8; 20];
    key[0..4].copy_from_slice(&dest_qp.to_be_bytes());
    key[4..20].copy_from_slice(dst);
    let Some(pin) = PINS_V6.get(Key::new(160, key)) else { return NO_PIN };
    valid_pin(pin.group, pin.position, pin.generation, group_id).unwrap_or(NO_PIN)
}

#[inline(always)]
fn valid_pin(pin_group: u32, position: u32, generation: u32, group_id: u32) -> Option<u32> {
    let group = GROUPS.get(group_id)?;
    if pin_group != group_id || position == PIN_MEMBER_DOWN || generation != group.generation {
        return None;
    }
    Some(position)
}

#[inline(always)]
fn set_macs(eth: *mut EthHdr, d: &Decision) {
    // SAFETY: parse_l2 checked the Ethernet header lies in the packet.
    unsafe {
        (*eth).dst_addr = d.dst_mac;
        (*eth).src_addr = d.src_mac;
    }
}

#[inline(always)]
fn forward_v4<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, len: u64) -> Result<Forward, Outcome> {
    let eth = eth_header(ctx)?;
    let ip = parse::parse_ipv4(ctx, l3_off)?;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv4 checked the header lies in the packet.
    let (src, dst, ttl, protocol, vihl, tos) =
        unsafe { ((*hdr).src_addr, (*hdr).dst_addr, (*hdr).ttl, (*hdr).proto, (*hdr).vihl, (*hdr).tos) };
    let dst_words = ipv4_words(dst);
    let group = route_group(cached_route(4, &dst_words, || ROUTES_V4.get(Key::new(32, dst))))?;
    if parse::is_fragment(hdr) {
        return Err(pass(PortCounter::PassFragment));
    }
    if ttl <= 1 {
        return Err(pass(PortCounter::PassTtlExpired));
    }
    // Options (Record Route, Timestamp, Router Alert) need processing
    // the kernel does; RoCE NICs never send them.
    if ip.l4_off != l3_off + Ipv4Hdr::LEN {
        return Err(pass(PortCounter::PassIpv4Options));
    }
    // Checked only for packets to forward (the kernel checks the ones it
    // gets): the kernel drops a wrong one too, and forwarding it would
    // carry a possibly corrupted address or length onward.
    if !parse::ipv4_checksum_ok(hdr) {
        return Err(drop(PortCounter::DropBadIpv4Checksum));
    }
    let l4 = parse::parse_l4(ctx, protocol, ip.l4_off, ip.l4_end)?;
    let key = flow_key(FlowKey::v4(src, dst, protocol, l4.src_port, l4.dst_port), &l4);
    let pin = if is_pinned(group) { pinned_v4(dst, &l4, group) } else { None };
    let d = decide(slot, group, &key, &l4, tos >> 2, pin, len)?;
    let tos_out = new_tos(&d, tos, len)?;

    // SAFETY: header checked above. The checksum is patched for the two
    // 16-bit words that change: version/IHL+TOS and TTL+protocol (RFC 1624).
    unsafe {
        let check = u16::from_be_bytes((*hdr).check);
        let check = checksum::update_u16(check, u16::from_be_bytes([vihl, tos]), u16::from_be_bytes([vihl, tos_out]));
        let check =
            checksum::update_u16(check, u16::from_be_bytes([ttl, protocol]), u16::from_be_bytes([ttl - 1, protocol]));
        (*hdr).tos = tos_out;
        (*hdr).ttl = ttl - 1;
        (*hdr).check = check.to_be_bytes();
    }
    set_macs(eth, &d);
    Ok(Forward { ifindex: d.ifindex, group, position: d.position, roce: l4.roce, priority: priority(&d) })
}

#[inline(always)]
fn forward_v6<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, len: u64) -> Result<Forward, Outcome> {
    let eth = eth_header(ctx)?;
    let ip = parse::parse_ipv6(ctx, l3_off)?;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv6 checked the header lies in the packet. The
    // addresses are borrowed from the packet, not copied.
    let (src, dst, hop_limit, next_header, vcf) =
        unsafe { (&(*hdr).src_addr, &(*hdr).dst_addr, (*hdr).hop_limit, (*hdr).next_hdr, (*hdr).vcf) };
    let dst_words = ipv6_words(dst);
    let group = route_group(cached_route(6, &dst_words, || ROUTES_V6.get(Key::new(128, *dst))))?;
    if parse::is_ipv6_extension(next_header) {
        return Err(pass(PortCounter::PassIpv6ExtHeader));
    }
    if hop_limit <= 1 {
        return Err(pass(PortCounter::PassTtlExpired));
    }
    let l4 = parse::parse_l4(ctx, next_header, ip.l4_off, ip.l4_end)?;
    let mut key = FlowKey::v6_ref(src, dst, next_header, l4.src_port, l4.dst_port);
    if let Roce::Yes { dest_qp, .. } = l4.roce {
        key.dest_qp = dest_qp & 0x00FF_FFFF;
    }
    // The traffic class straddles the first two bytes of the header.
    let tc = ((vcf[0] & 0x0F) << 4) | (vcf[1] >> 4);
    let pin = if is_pinned(group) { pinned_v6(dst, &l4, group) } else { None };
    let d = decide(slot, group, &key, &l4, tc >> 2, pin, len)?;
    let tc_out = new_tos(&d, tc, len)?;
    // SAFETY: header checked above. IPv6 has no header checksum.
    unsafe {
        (*hdr).vcf[0] = (vcf[0] & 0xF0) | (tc_out >> 4);
        (*hdr).vcf[1] = (vcf[1] & 0x0F) | (tc_out << 4);
        (*hdr).hop_limit = hop_limit - 1;
    }
    set_macs(eth, &d);
    Ok(Forward { ifindex: d.ifindex, group, position: d.position, roce: l4.roce, priority: priority(&d) })
}

#[inline(always)]
fn flow_key(key: FlowKey, l4: &L4) -> FlowKey {
    match l4.roce {
        Roce::Yes { dest_qp, .. } => key.with_dest_qp(dest_qp),
        _ => key,
    }
}
