//! The benchmark's peer: IPv4 forwarding the way xdp-forward and the XDP
//! paper's router do it, with the kernel's FIB (`bpf_fib_lookup`: route,
//! multipath choice, neighbour) per packet, then a TTL decrement, new MACs
//! and a device-map redirect. It shares the parser and the rewrite with
//! the pipeline so the two differ only in how they decide.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action, BPF_FIB_LKUP_RET_SUCCESS},
    helpers::bpf_fib_lookup,
    programs::XdpContext,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    maps::{EGRESS_DEVS, EGRESS_DEVS_DIRECT},
    parse::{self, ptr_at, L3Kind},
    redirect::redirect,
    rewrite,
};

const AF_INET: u8 = 2;

#[inline(always)]
pub fn fib_forward(ctx: &XdpContext) -> u32 {
    let Ok(l2) = parse::parse_l2(ctx) else { return xdp_action::XDP_PASS };
    let L3Kind::V4 = l2.kind else { return xdp_action::XDP_PASS };
    let (Some(eth), Some(hdr)) = (ptr_at::<EthHdr, _>(ctx, 0), ptr_at::<Ipv4Hdr, _>(ctx, l2.l3_off)) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: bounds checked by ptr_at.
    let (ttl, tos, protocol, tot_len, src, dst) =
        unsafe { ((*hdr).ttl, (*hdr).tos, (*hdr).proto, (*hdr).tot_len, (*hdr).src_addr, (*hdr).dst_addr) };
    if ttl <= 1 {
        return xdp_action::XDP_PASS;
    }
    // Zeroed word by word: `mem::zeroed` becomes a call to memset, a byte
    // loop on BPF, where C's __builtin_memset (xdp-forward) is inlined.
    let mut fib = core::mem::MaybeUninit::<FibParams>::uninit();
    let words = fib.as_mut_ptr() as *mut u64;
    for i in 0..core::mem::size_of::<FibParams>() / 8 {
        // SAFETY: within the struct, which is a multiple of 8 bytes.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
    }
    // SAFETY: all-zero is a valid lookup request; the fields it needs follow.
    let mut fib = unsafe { fib.assume_init() };
    fib.family = AF_INET;
    fib.l4_protocol = protocol;
    fib.__bindgen_anon_1.tot_len = u16::from_be_bytes(tot_len);
    fib.__bindgen_anon_2.tos = tos;
    fib.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(src);
    fib.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
    fib.ifindex = ctx.ingress_ifindex() as u32;
    // SAFETY: the helper reads the context and fills `fib`.
    let rc = unsafe { bpf_fib_lookup(ctx.ctx as *mut _, &mut fib, core::mem::size_of::<FibParams>() as i32, 0) };
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return xdp_action::XDP_PASS;
    }
    // SAFETY: headers checked above.
    unsafe {
        rewrite::set_ipv4_tos_ttl(hdr, tos, ttl - 1);
        rewrite::set_macs(eth, fib.dmac, fib.smac);
    }
    match redirect(&EGRESS_DEVS_DIRECT, &EGRESS_DEVS, fib.ifindex, u64::from(xdp_action::XDP_PASS)) {
        Ok(action) | Err(action) => action,
    }
}
