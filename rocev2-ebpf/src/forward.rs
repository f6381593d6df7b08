//! The forwarding pipeline: parse, route (longest prefix), choose a group
//! member (hash), rewrite (MACs, TTL/hop limit, IPv4 checksum), redirect.
//!
//! Nothing covered by the RoCEv2 ICRC is touched except the TTL/hop limit
//! and the IPv4 header checksum, which the ICRC masks out.

use aya_ebpf::{bindings::xdp_action, maps::lpm_trie::Key, programs::XdpContext};
use network_types::eth::EthHdr;
use rocev2_common::{
    checksum,
    counters::PortCounter,
    hash::{member_hash, pick_member, FlowKey, HashMode},
    maps::{member_index, RouteEntry, MAX_MEMBERS_PER_GROUP, MEMBER_UP, ROUTE_LOCAL},
};

use crate::{
    counters,
    maps::{CONFIG, EGRESS_DEVS, GROUPS, MEMBERS, ROUTES_V4, ROUTES_V6},
    parse::{self, drop, pass, L3Kind, Outcome, Roce, L4},
};

/// Entry point body: counts the frame and its outcome, returns the action.
#[inline(always)]
pub fn xdp_forward(ctx: &XdpContext) -> u32 {
    let slot = counters::port_slot(ctx.ingress_ifindex() as u32);
    let len = parse::frame_len(ctx) as u64;
    counters::add(slot, PortCounter::RxPackets, 1);
    counters::add(slot, PortCounter::RxBytes, len);
    match try_forward(ctx, len) {
        Ok(roce) => {
            counters::add(slot, PortCounter::Forwarded, 1);
            counters::add(slot, PortCounter::ForwardedBytes, len);
            match roce {
                Roce::Yes { .. } => counters::add(slot, PortCounter::ForwardedRoce, 1),
                Roce::ShortBth => {
                    counters::add(slot, PortCounter::ForwardedRoce, 1);
                    counters::add(slot, PortCounter::RoceShortBth, 1);
                }
                Roce::No => {}
            }
            xdp_action::XDP_REDIRECT
        }
        Err(Outcome { action, counter }) => {
            counters::add(slot, counter, 1);
            action
        }
    }
}

#[inline(always)]
fn try_forward(ctx: &XdpContext, len: u64) -> Result<Roce, Outcome> {
    let l2 = parse::parse_l2(ctx)?;
    match l2.kind {
        L3Kind::V4 => forward_v4(ctx, l2.eth, l2.l3_off, len),
        L3Kind::V6 => forward_v6(ctx, l2.eth, l2.l3_off, len),
    }
}

/// Route lookup result: the group to use, or why not.
#[inline(always)]
fn route_group(entry: Option<&RouteEntry>) -> Result<u32, Outcome> {
    match entry {
        None => Err(pass(PortCounter::PassNoRoute)),
        Some(r) if r.group == ROUTE_LOCAL => Err(pass(PortCounter::PassLocal)),
        Some(r) => Ok(r.group),
    }
}

#[inline(always)]
fn forward_v4(ctx: &XdpContext, eth: *mut EthHdr, l3_off: usize, len: u64) -> Result<Roce, Outcome> {
    let ip = parse::parse_ipv4(ctx, l3_off)?;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv4 checked the header lies in the packet.
    let (src, dst, ttl, protocol) =
        unsafe { ((*hdr).src_addr, (*hdr).dst_addr, (*hdr).ttl, (*hdr).proto) };
    let group = route_group(ROUTES_V4.get(Key::new(32, dst)))?;
    if parse::is_fragment(hdr) {
        return Err(pass(PortCounter::PassFragment));
    }
    if ttl <= 1 {
        return Err(pass(PortCounter::PassTtlExpired));
    }
    let l4 = parse::parse_l4(ctx, protocol, ip.l4_off, ip.l4_end)?;
    let key = flow_key(FlowKey::v4(src, dst, protocol, l4.src_port, l4.dst_port), &l4);
    let member = choose_member(group, &key)?;

    // SAFETY: header checked above; the TTL and protocol share one 16-bit
    // checksum word, which is what RFC 1624 patches.
    unsafe {
        let old = u16::from_be_bytes([ttl, protocol]);
        let new = u16::from_be_bytes([ttl - 1, protocol]);
        (*hdr).ttl = ttl - 1;
        let check = u16::from_be_bytes((*hdr).check);
        (*hdr).check = checksum::update_u16(check, old, new).to_be_bytes();
    }
    finish(eth, group, member, len)?;
    Ok(l4.roce)
}

#[inline(always)]
fn forward_v6(ctx: &XdpContext, eth: *mut EthHdr, l3_off: usize, len: u64) -> Result<Roce, Outcome> {
    let ip = parse::parse_ipv6(ctx, l3_off)?;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv6 checked the header lies in the packet.
    let (src, dst, hop_limit, next_header) =
        unsafe { ((*hdr).src_addr, (*hdr).dst_addr, (*hdr).hop_limit, (*hdr).next_hdr) };
    let group = route_group(ROUTES_V6.get(Key::new(128, dst)))?;
    if parse::is_ipv6_extension(next_header) {
        return Err(pass(PortCounter::PassIpv6ExtHeader));
    }
    if hop_limit <= 1 {
        return Err(pass(PortCounter::PassTtlExpired));
    }
    let l4 = parse::parse_l4(ctx, next_header, ip.l4_off, ip.l4_end)?;
    let key = flow_key(FlowKey::v6(src, dst, next_header, l4.src_port, l4.dst_port), &l4);
    let member = choose_member(group, &key)?;
    // SAFETY: header checked above. IPv6 has no header checksum.
    unsafe { (*hdr).hop_limit = hop_limit - 1 };
    finish(eth, group, member, len)?;
    Ok(l4.roce)
}

#[inline(always)]
fn flow_key(key: FlowKey, l4: &L4) -> FlowKey {
    match l4.roce {
        Roce::Yes { dest_qp } => key.with_dest_qp(dest_qp),
        _ => key,
    }
}

/// The member chosen for this flow, with its position in the group.
struct Chosen {
    position: u32,
    ifindex: u32,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
}

#[inline(always)]
fn choose_member(group: u32, key: &FlowKey) -> Result<Chosen, Outcome> {
    let no_member = pass(PortCounter::PassNoMember);
    let entry = GROUPS.get(group).ok_or(no_member)?;
    let count = entry.member_count;
    if count == 0 || count > MAX_MEMBERS_PER_GROUP {
        return Err(no_member);
    }
    let mode = HashMode::from_u32(entry.hash_mode).unwrap_or(HashMode::FiveTuple);
    let seed = CONFIG.get(0).map_or(0, |c| c.hash_seed);
    let position = pick_member(member_hash(key, mode, seed), count);
    let member = MEMBERS.get(member_index(group, entry.bank & 1, position)).ok_or(no_member)?;
    if member.flags & MEMBER_UP == 0 {
        return Err(no_member);
    }
    Ok(Chosen {
        position,
        ifindex: member.ifindex,
        src_mac: member.src_mac,
        dst_mac: member.dst_mac,
    })
}

/// Writes the next hop's MACs, redirects, and counts the member.
#[inline(always)]
fn finish(eth: *mut EthHdr, group: u32, member: Chosen, len: u64) -> Result<(), Outcome> {
    // SAFETY: parse_l2 checked the Ethernet header lies in the packet.
    unsafe {
        (*eth).dst_addr = member.dst_mac;
        (*eth).src_addr = member.src_mac;
    }
    // The low bits of the flags are the action when the device is missing.
    match EGRESS_DEVS.redirect(member.ifindex, u64::from(xdp_action::XDP_DROP)) {
        Ok(_) => {
            counters::member_sent(group, member.position, len);
            Ok(())
        }
        Err(_) => Err(drop(PortCounter::DropRedirectFailed)),
    }
}
