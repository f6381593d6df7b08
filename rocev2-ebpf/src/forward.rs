//! The forwarding pipeline, shared by the XDP and tc programs: parse, route
//! (longest prefix), choose a group member (hash, flowlet or pin), classify,
//! mark ECN, rewrite (MACs, TTL/hop limit, DSCP/ECN, IPv4 checksum).
//!
//! Each optional stage is one call behind a load-time feature test
//! (`enabled(Features::X)`, see features.rs): with the feature off the
//! verifier removes the call and everything under it.
//!
//! Nothing covered by the RoCEv2 ICRC is touched: TTL/hop limit, DSCP, ECN
//! and the IPv4 header checksum are masked out of it; MACs are outside it.

use core::mem::MaybeUninit;

use aya_ebpf::{bindings::xdp_action, helpers::bpf_ktime_get_ns, programs::XdpContext};
use network_types::eth::EthHdr;
use rocev2_common::{
    bth,
    class::ClassAction,
    counters::PortCounter,
    features::Features,
    hash::{ipv4_words, ipv6_word, store_flow_key, FlowKey},
    maps::{member_index, MAX_MEMBERS_PER_GROUP, POLICY_FLOWLET},
};

use crate::{
    args::{BoundaryPin, SlotGroup},
    class, counters,
    ctx::PacketBuf,
    ecn,
    features::enabled,
    forwarded::Forward,
    maps::{EGRESS_DEVS, EGRESS_DEVS_DIRECT, FLOW_KEY, GROUPS, MEMBERS},
    parse::{self, drop, pass, Ipv4Fields, L3Kind, Outcome, Roce, Verdict, L4},
    pin::{self, NO_PIN},
    redirect::redirect,
    rewrite, route, select, telemetry,
};

/// XDP entry point body: counts the frame and its outcome, returns the action.
#[inline(always)]
pub fn xdp_forward(ctx: &XdpContext) -> u32 {
    let slot = counters::port_slot(ctx.ingress_ifindex() as u32);
    let mut out = MaybeUninit::<Forward>::uninit();
    let result = forward(ctx, slot, &mut out);
    send(ctx, slot, &out, result, counters::count_packet)
}

/// The end of an XDP pipeline (routed and bridged alike): redirects a
/// forwarded frame, counts the frame with `count`, returns the action.
#[inline(always)]
pub fn send(
    ctx: &XdpContext,
    slot: u32,
    out: &MaybeUninit<Forward>,
    mut result: Result<(), Outcome>,
    count: impl FnOnce(u32, u64, &MaybeUninit<Forward>, Result<(), Outcome>),
) -> u32 {
    // A forwarded frame's length was measured by the IP parser; any other
    // frame's is read now (a helper call, off the fast path).
    let mut len = None;
    if result.is_ok() {
        // SAFETY: forward wrote `out` when it returned Ok.
        let f = unsafe { out.assume_init_ref() };
        len = Some(u64::from(f.len));
        // The low bits of the flags are the action when the device is missing.
        if redirect(&EGRESS_DEVS_DIRECT, &EGRESS_DEVS, f.ifindex, u64::from(xdp_action::XDP_DROP)).is_err() {
            result = Err(drop(PortCounter::DropRedirectFailed));
        }
    }
    let len = len.unwrap_or_else(|| parse::frame_len(ctx) as u64);
    count(slot, len, out, result);
    match result {
        Ok(()) => xdp_action::XDP_REDIRECT,
        Err(Outcome { verdict: Verdict::Pass, .. }) => xdp_action::XDP_PASS,
        Err(Outcome { verdict: Verdict::Drop, .. }) => xdp_action::XDP_DROP,
    }
}

/// Runs the pipeline; a forwarded packet's details go to `out`, written
/// exactly when the result is Ok. Not zeroed first: zeroing a struct is a
/// call to memset, which on BPF is a byte loop (28 iterations here).
#[inline(always)]
pub fn forward<C: PacketBuf>(ctx: &C, slot: u32, out: &mut MaybeUninit<Forward>) -> Result<(), Outcome> {
    let l2 = parse::parse_l2(ctx)?;
    // Each family runs in its own BPF function: inlined together they need
    // more than the 512-byte stack. They return an encoded Outcome and
    // write a forwarded packet's details to `out`.
    let code = match l2.kind {
        L3Kind::V4 => forward_v4_call(ctx, slot, l2.l3_off, out),
        L3Kind::V6 => forward_v6_call(ctx, slot, l2.l3_off, out),
    };
    if code == FORWARDED {
        Ok(())
    } else {
        Err(Outcome::decode(code))
    }
}

/// Return code of the per-family functions for "forwarded".
pub const FORWARDED: u32 = u32::MAX;

#[inline(never)]
fn forward_v4_call<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, out: &mut MaybeUninit<Forward>) -> u32 {
    hand_on(ctx, forward_v4(ctx, slot, l3_off), out)
}

#[inline(never)]
fn forward_v6_call<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize, out: &mut MaybeUninit<Forward>) -> u32 {
    hand_on(ctx, forward_v6(ctx, slot, l3_off), out)
}

/// What a family's subprogram returns to the program: a forwarded packet's
/// decision written to `out` (and seen by telemetry) as [`FORWARDED`], or
/// the encoded outcome. One place for the router's and the bridge's
/// subprograms.
#[inline(always)]
pub fn hand_on<C: PacketBuf>(ctx: &C, decided: Result<Forward, Outcome>, out: &mut MaybeUninit<Forward>) -> u32 {
    match decided {
        Ok(f) => {
            let f = out.write(f);
            if enabled(Features::TELEMETRY) {
                telemetry::observe(ctx, f);
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

/// Everything decided about a packet before its headers change.
pub struct Decision {
    ifindex: u32,
    position: u32,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    /// class::NO_ACTION when no class matched.
    class: ClassAction,
    /// The clock reading if the member choice took one, else 0.
    now: u64,
}

impl Decision {
    /// A bridged frame to the one port its FDB entry names: no member
    /// choice (so no clock reading yet) and no MACs to write.
    #[inline(always)]
    pub fn to_port(ifindex: u32, class: ClassAction) -> Self {
        Decision { ifindex, position: 0, src_mac: [0; 6], dst_mac: [0; 6], class, now: 0 }
    }

    /// The forwarded packet's details, once its headers are rewritten
    /// (`tos`: the TOS or traffic class byte sent).
    #[inline(always)]
    pub fn forward(&self, group: u32, roce: Roce, len: u64, tos: u8) -> Forward {
        Forward {
            ifindex: self.ifindex,
            group,
            position: self.position,
            roce,
            priority: class::priority(&self.class),
            len: len as u32,
            tos,
        }
    }
}

/// Group lookup, member choice and classification. `pin` is a pinned
/// position or NO_PIN; `V4`: the key is an IPv4 one.
#[inline(always)]
pub fn decide<const V4: bool>(
    slot: u32,
    group_id: u32,
    key: &FlowKey,
    l4: &L4,
    dscp: u8,
    pin: u32,
    len: u64,
) -> Result<Decision, Outcome> {
    let no_member = pass(PortCounter::PassNoMember);
    let group = GROUPS.get(group_id).ok_or(no_member)?;
    if !group.usable() {
        return Err(no_member);
    }
    let ends_message = match l4.roce {
        Roce::Yes { opcode, .. } => bth::ends_message(opcode),
        _ => true,
    };
    // One clock read per packet, shared by the flowlet table and the
    // virtual queue; only flowlet groups need it this early.
    let now =
        if enabled(Features::FLOWLET) && group.policy == POLICY_FLOWLET { unsafe { bpf_ktime_get_ns() } } else { 0 };
    let position = select::choose_position::<V4>(
        SlotGroup::new(slot, group_id),
        group,
        key,
        BoundaryPin::new(u32::from(ends_message), pin),
        now,
    );
    if position >= MAX_MEMBERS_PER_GROUP {
        return Err(no_member);
    }
    let member = MEMBERS.get(member_index(group_id, group.bank & 1, position)).ok_or(no_member)?;
    if !member.up() {
        return Err(no_member);
    }
    let class = if enabled(Features::CLASSES) {
        class::matched(&class::fields(&l4.roce, l4.dest_qp, dscp), len)
    } else {
        class::NO_ACTION
    };
    Ok(Decision { ifindex: member.ifindex, position, src_mac: member.src_mac, dst_mac: member.dst_mac, class, now })
}

/// The TOS/traffic-class byte to send: the class's DSCP, then ECN marking
/// on the egress virtual queue.
#[inline(always)]
pub fn new_tos(d: &Decision, tos: u8, len: u64) -> Result<u8, Outcome> {
    let tos = class::apply_dscp(&d.class, tos);
    if !enabled(Features::ECN) {
        return Ok(tos);
    }
    ecn::mark_forwarded(d.ifindex, tos, len, &d.class, d.now)
}

#[inline(always)]
fn forward_v4<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize) -> Result<Forward, Outcome> {
    let eth = eth_header(ctx)?;
    let ip = parse::parse_ipv4(ctx, l3_off)?;
    let len = ip.frame_len as u64;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv4 checked the header lies in the packet.
    let Ipv4Fields { src, dst, ttl, protocol, tos } = unsafe { parse::ipv4_fields(hdr) };
    let group = route::group_v4(dst)?;
    if parse::is_fragment(hdr) {
        return Err(pass(PortCounter::PassFragment));
    }
    parse::ipv4_ttl_and_options(ttl, l3_off, ip.l4_off)?;
    // Checked only for packets to forward (the kernel checks the ones it
    // gets): the kernel drops a wrong one too, and forwarding it would
    // carry a possibly corrupted address or length onward.
    if !parse::ipv4_checksum_ok(hdr) {
        return Err(drop(PortCounter::DropBadIpv4Checksum));
    }
    let l4 = parse::parse_l4(ctx, protocol, ip.l4_off, ip.l4_end)?;
    let key = flow_key_v4(src, dst, protocol, &l4)?;
    let pin = if enabled(Features::PINNED) { pin::pinned_v4(dst, &l4, group) } else { NO_PIN };
    let d = decide::<true>(slot, group, key, &l4, tos >> 2, pin, len)?;
    let tos_out = new_tos(&d, tos, len)?;
    // SAFETY: headers checked above.
    unsafe {
        rewrite::set_ipv4_tos_ttl(hdr, tos_out, ttl - 1);
        rewrite::set_macs(eth, d.dst_mac, d.src_mac);
    }
    Ok(d.forward(group, l4.roce, len, tos_out))
}

#[inline(always)]
fn forward_v6<C: PacketBuf>(ctx: &C, slot: u32, l3_off: usize) -> Result<Forward, Outcome> {
    let eth = eth_header(ctx)?;
    let ip = parse::parse_ipv6(ctx, l3_off)?;
    let len = ip.frame_len as u64;
    let hdr = ip.hdr;
    // SAFETY: parse_ipv6 checked the header lies in the packet. The
    // addresses are borrowed from the packet, not copied.
    let (src, dst, hop_limit, next_header, vcf) =
        unsafe { (&(*hdr).src_addr, &(*hdr).dst_addr, (*hdr).hop_limit, (*hdr).next_hdr, (*hdr).vcf) };
    let group = route::group_v6(dst)?;
    if parse::is_ipv6_extension(next_header) {
        return Err(pass(PortCounter::PassIpv6ExtHeader));
    }
    if hop_limit <= 1 {
        return Err(pass(PortCounter::PassTtlExpired));
    }
    let l4 = parse::parse_l4(ctx, next_header, ip.l4_off, ip.l4_end)?;
    let key = flow_key_v6(src, dst, next_header, &l4)?;
    let tc = rewrite::ipv6_traffic_class(vcf);
    let pin = if enabled(Features::PINNED) { pin::pinned_v6(dst, &l4, group) } else { NO_PIN };
    let d = decide::<false>(slot, group, key, &l4, tc >> 2, pin, len)?;
    let tc_out = new_tos(&d, tc, len)?;
    // SAFETY: headers checked above.
    unsafe {
        rewrite::set_ipv6_class_hop_limit(hdr, tc_out, hop_limit - 1);
        rewrite::set_macs(eth, d.dst_mac, d.src_mac);
    }
    Ok(d.forward(group, l4.roce, len, tc_out))
}

/// An IPv4 packet's flow key (addresses as [`ipv4_words`] gives them,
/// plus the DestQP), written into this CPU's FLOW_KEY slot rather than
/// onto the stack.
#[inline(always)]
pub fn flow_key_v4(src: [u8; 4], dst: [u8; 4], protocol: u8, l4: &L4) -> Result<&'static FlowKey, Outcome> {
    let (src, dst) = (ipv4_words(src), ipv4_words(dst));
    flow_key(|i| src[i], |i| dst[i], false, protocol, l4)
}

/// An IPv6 packet's flow key, read word by word from the addresses in
/// the packet (copies of them would take the stack's room).
#[inline(always)]
pub fn flow_key_v6(src: &[u8; 16], dst: &[u8; 16], protocol: u8, l4: &L4) -> Result<&'static FlowKey, Outcome> {
    flow_key(|i| ipv6_word(src, i), |i| ipv6_word(dst, i), true, protocol, l4)
}

/// Writes the key into FLOW_KEY, one volatile store per field
/// ([`store_flow_key`]: never merged into a memset).
#[inline(always)]
fn flow_key(
    src_word: impl Fn(usize) -> u32,
    dst_word: impl Fn(usize) -> u32,
    ipv6: bool,
    protocol: u8,
    l4: &L4,
) -> Result<&'static FlowKey, Outcome> {
    // A per-CPU array's slot 0 always exists; the check is for the verifier.
    let k = FLOW_KEY.get_ptr_mut(0).ok_or(pass(PortCounter::PassNoMember))?;
    // SAFETY: this CPU's slot, ours for this program run; every field is
    // written before the key is read (padding never is).
    unsafe {
        store_flow_key(k, src_word, dst_word, ipv6, protocol, (l4.src_port, l4.dst_port), l4.dest_qp);
        Ok(&*k)
    }
}
