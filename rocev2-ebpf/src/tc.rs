//! tc (clsact) programs: forwarding in tc ingress for boxes where XDP is not
//! an option, and classes + ECN marking in tc egress for traffic the box
//! itself sends (host bridge mode), which passes through the kernel's
//! qdiscs (an HTB with priority classes serves control packets first).

use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
    helpers::bpf_redirect,
    programs::TcContext,
};
use rocev2_common::{counters::PortCounter, features::Features};

use crate::{
    class, counters, ecn,
    features::enabled,
    forward::forward,
    forwarded::Forward,
    parse::{self, drop, L3Kind, Outcome, Verdict, L4},
    rewrite,
};

/// Bytes of headers made linear before parsing: Ethernet + VLAN + IPv6 +
/// UDP + BTH with room for IPv4 options.
const PULL_LEN: u32 = 160;

#[inline(always)]
fn pull_headers(ctx: &TcContext) {
    let len = ctx.len();
    let _ = ctx.pull_data(if len < PULL_LEN { len } else { PULL_LEN });
}

#[inline(always)]
fn skb_field<T: Copy>(ctx: &TcContext, f: impl FnOnce(&aya_ebpf::bindings::__sk_buff) -> T) -> T {
    // SAFETY: the context pointer is valid for the program's run.
    f(unsafe { &*ctx.skb.skb })
}

pub fn tc_forward(ctx: &TcContext) -> i32 {
    let slot = counters::port_slot(skb_field(ctx, |s| s.ifindex));
    let len = u64::from(ctx.len());
    pull_headers(ctx);
    let mut out = MaybeUninit::<Forward>::uninit();
    let mut result = forward(ctx, slot, &mut out);
    if result.is_ok() {
        // SAFETY: forward wrote `out` when it returned Ok.
        let f = unsafe { out.assume_init_ref() };
        if f.priority != 0 {
            // SAFETY: priority is writable by tc programs.
            unsafe { (*ctx.skb.skb).priority = f.priority };
        }
        if unsafe { bpf_redirect(f.ifindex, 0) } as i32 != TC_ACT_REDIRECT {
            result = Err(drop(PortCounter::DropRedirectFailed));
        }
    }
    counters::count_packet(slot, len, &out, result);
    match result {
        Ok(()) => TC_ACT_REDIRECT,
        Err(Outcome { verdict: Verdict::Pass, .. }) => TC_ACT_OK,
        Err(Outcome { verdict: Verdict::Drop, .. }) => TC_ACT_SHOT,
    }
}

/// Locally originated packets only: forwarded ones (non-zero ingress
/// ifindex) were handled on their way in.
pub fn tc_egress(ctx: &TcContext) -> i32 {
    if skb_field(ctx, |s| s.ingress_ifindex) != 0 {
        return TC_ACT_OK;
    }
    pull_headers(ctx);
    match mark_local(ctx) {
        Ok(priority) => {
            if priority != 0 {
                // SAFETY: priority is writable by tc programs.
                unsafe { (*ctx.skb.skb).priority = priority };
            }
            TC_ACT_OK
        }
        Err(Outcome { verdict: Verdict::Drop, .. }) => TC_ACT_SHOT,
        Err(_) => TC_ACT_OK,
    }
}

/// Classifies a local packet, rewrites DSCP/ECN, returns its priority.
#[inline(always)]
fn mark_local(ctx: &TcContext) -> Result<u32, Outcome> {
    let egress = skb_field(ctx, |s| s.ifindex);
    let len = u64::from(ctx.len());
    let l2 = parse::parse_l2(ctx)?;
    match l2.kind {
        L3Kind::V4 => {
            let ip = parse::parse_ipv4(ctx, l2.l3_off)?;
            let hdr = ip.hdr;
            // SAFETY: header checked by parse_ipv4.
            let (tos, ttl, protocol) = unsafe { ((*hdr).tos, (*hdr).ttl, (*hdr).proto) };
            let l4 = parse::parse_l4(ctx, protocol, ip.l4_off, ip.l4_end)?;
            let (tos_out, priority) = local_tos(egress, tos, &l4, len)?;
            if tos_out != tos {
                // SAFETY: as above.
                unsafe { rewrite::set_ipv4_tos_ttl(hdr, tos_out, ttl) };
            }
            Ok(priority)
        }
        L3Kind::V6 => {
            let ip = parse::parse_ipv6(ctx, l2.l3_off)?;
            let hdr = ip.hdr;
            // SAFETY: header checked by parse_ipv6.
            let (vcf, hop_limit, next_header) = unsafe { ((*hdr).vcf, (*hdr).hop_limit, (*hdr).next_hdr) };
            let l4 = parse::parse_l4(ctx, next_header, ip.l4_off, ip.l4_end)?;
            let tc = rewrite::ipv6_traffic_class(vcf);
            let (tc_out, priority) = local_tos(egress, tc, &l4, len)?;
            // SAFETY: as above.
            unsafe { rewrite::set_ipv6_class_hop_limit(hdr, tc_out, hop_limit) };
            Ok(priority)
        }
    }
}

/// The class's DSCP and priority, then ECN marking on the egress queue.
#[inline(always)]
fn local_tos(egress: u32, tos: u8, l4: &L4, len: u64) -> Result<(u8, u32), Outcome> {
    let matched = if enabled(Features::CLASSES) {
        class::matched(&class::fields(&l4.roce, l4.dest_qp, tos >> 2), len)
    } else {
        class::NO_ACTION
    };
    let tos = class::apply_dscp(&matched, tos);
    let tos = if enabled(Features::ECN) { ecn::mark(egress, tos, len, &matched, 0)? } else { tos };
    Ok((tos, class::priority(&matched)))
}
