//! tc (clsact) programs: forwarding in tc ingress for boxes where XDP is not
//! an option, and classes + ECN marking in tc egress for traffic the box
//! itself sends (host bridge mode), which passes through the kernel's
//! qdiscs (an HTB with priority classes serves control packets first).

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
    helpers::bpf_redirect,
    programs::TcContext,
};
use rocev2_common::{
    checksum,
    class::{ClassFields, RoceFields, CLASS_SET_DSCP, CLASS_SET_PRIORITY},
    counters::PortCounter,
};

use crate::{
    counters,
    forward::{count_forwarded, forward},
    parse::{self, L3Kind, Outcome, Roce, Verdict},
    qos,
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
    counters::add(slot, PortCounter::RxPackets, 1);
    counters::add(slot, PortCounter::RxBytes, len);
    pull_headers(ctx);
    match forward(ctx, slot, len) {
        Ok(f) => {
            if f.priority != 0 {
                // SAFETY: priority is writable by tc programs.
                unsafe { (*ctx.skb.skb).priority = f.priority };
            }
            let action = unsafe { bpf_redirect(f.ifindex, 0) };
            if action as i32 == TC_ACT_REDIRECT {
                count_forwarded(slot, &f, len);
                TC_ACT_REDIRECT
            } else {
                counters::add(slot, PortCounter::DropRedirectFailed, 1);
                TC_ACT_SHOT
            }
        }
        Err(Outcome { verdict, counter }) => {
            counters::add(slot, counter, 1);
            match verdict {
                Verdict::Pass => TC_ACT_OK,
                Verdict::Drop => TC_ACT_SHOT,
            }
        }
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
            let (vihl, tos, protocol) = unsafe { ((*hdr).vihl, (*hdr).tos, (*hdr).proto) };
            let l4 = parse::parse_l4(ctx, protocol, ip.l4_off, ip.l4_end)?;
            let (tos_out, priority) = local_tos(egress, tos, &l4.roce, len)?;
            if tos_out != tos {
                // SAFETY: as above; RFC 1624 patch of the first header word.
                unsafe {
                    let check = u16::from_be_bytes((*hdr).check);
                    let check = checksum::update_u16(
                        check,
                        u16::from_be_bytes([vihl, tos]),
                        u16::from_be_bytes([vihl, tos_out]),
                    );
                    (*hdr).tos = tos_out;
                    (*hdr).check = check.to_be_bytes();
                }
            }
            Ok(priority)
        }
        L3Kind::V6 => {
            let ip = parse::parse_ipv6(ctx, l2.l3_off)?;
            let hdr = ip.hdr;
            // SAFETY: header checked by parse_ipv6.
            let (vcf, next_header) = unsafe { ((*hdr).vcf, (*hdr).next_hdr) };
            let l4 = parse::parse_l4(ctx, next_header, ip.l4_off, ip.l4_end)?;
            let tc = ((vcf[0] & 0x0F) << 4) | (vcf[1] >> 4);
            let (tc_out, priority) = local_tos(egress, tc, &l4.roce, len)?;
            // SAFETY: as above.
            unsafe {
                (*hdr).vcf[0] = (vcf[0] & 0xF0) | (tc_out >> 4);
                (*hdr).vcf[1] = (vcf[1] & 0x0F) | (tc_out << 4);
            }
            Ok(priority)
        }
    }
}

#[inline(always)]
fn local_tos(egress: u32, tos: u8, roce: &Roce, len: u64) -> Result<(u8, u32), Outcome> {
    let fields = ClassFields {
        roce: match *roce {
            Roce::Yes { opcode, dest_qp, payload_len } => Some(RoceFields { opcode, dest_qp, payload_len }),
            _ => None,
        },
        dscp: tos >> 2,
    };
    let class = qos::classify(&fields).map(|(index, c)| {
        counters::class_matched(index, len);
        c
    });
    let mut tos = tos;
    let mut priority = 0;
    if let Some(c) = &class {
        if c.flags & CLASS_SET_DSCP != 0 {
            tos = ((c.set_dscp as u8) << 2) | (tos & 3);
        }
        if c.flags & CLASS_SET_PRIORITY != 0 {
            priority = c.priority;
        }
    }
    Ok((qos::ecn_mark(egress, tos, len, class.as_ref(), 0)?, priority))
}
