//! The traffic generator's transmit program: live frames are recycled by
//! the kernel without being rebuilt, and a forwarder on the way (rocev2 or
//! the kernel) rewrites their MACs and TTL in place. Restoring them before
//! each XDP_TX keeps every trip identical.

use crate::{
    maps::GEN_REWRITE,
    parse::{self, ptr_at, L3Kind},
    rewrite,
};
use aya_ebpf::programs::XdpContext;
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};

#[inline(always)]
pub fn restore(ctx: &XdpContext) {
    let Some(r) = GEN_REWRITE.get(0) else { return };
    if r.enabled == 0 {
        return;
    }
    let Some(eth) = ptr_at::<EthHdr, _>(ctx, 0) else { return };
    // SAFETY: bounds checked by ptr_at.
    unsafe { rewrite::set_macs(eth, r.dst_mac, r.src_mac) };
    let Ok(l2) = parse::parse_l2(ctx) else { return };
    match l2.kind {
        L3Kind::V4 => {
            let Some(hdr) = ptr_at::<Ipv4Hdr, _>(ctx, l2.l3_off) else { return };
            // SAFETY: bounds checked; TOS kept, TTL restored with the
            // checksum patched.
            unsafe {
                if (*hdr).ttl != r.ttl {
                    rewrite::set_ipv4_tos_ttl(hdr, (*hdr).tos, r.ttl);
                }
            }
        }
        L3Kind::V6 => {
            if let Some(hdr) = ptr_at::<Ipv6Hdr, _>(ctx, l2.l3_off) {
                // SAFETY: bounds checked; IPv6 has no header checksum.
                unsafe { (*hdr).hop_limit = r.ttl };
            }
        }
    }
}
