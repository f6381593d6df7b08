//! The spreading stage (`[dataplane] cpu_spread = "qp"`). A NIC's RSS
//! hashes the five-tuple, so every QP between two hosts lands on one CPU:
//! the low-entropy problem again, inside the box. This stage runs first on
//! the receiving CPU, hashes the flow with its DestQP (the `qp` hash) and
//! hands the frame through the CPUS map to the CPU the hash names, whose
//! `rocev2_xdp_cpu` program runs the pipeline; a flow whose CPU is the
//! receiving one is forwarded right away. One flow always maps to one CPU,
//! so a QP's packets stay in order.

use aya_ebpf::{helpers::bpf_get_smp_processor_id, programs::XdpContext};
use rocev2_common::{
    hash::{member_hash_of_family, HashMode, HashVersion},
    maps::MAX_SPREAD_CPUS,
};

use crate::{
    forward::{flow_key_v4, flow_key_v6},
    maps::{CONFIG, CPUS},
    parse::{self, L3Kind},
};

/// Hands the frame to its flow's CPU; a frame that cannot be parsed that
/// far, or a stage with no CPUs, runs the pipeline here.
#[inline(always)]
pub fn spread(ctx: &XdpContext) -> u32 {
    let Some(config) = CONFIG.get(0) else { return crate::forward::xdp_forward(ctx) };
    let cpus = config.spread_cpus;
    if cpus == 0 || cpus > MAX_SPREAD_CPUS {
        return crate::forward::xdp_forward(ctx);
    }
    let hash = flow_hash_of(ctx, config.hash_seed, HashVersion::from_config(config.hash_version));
    // Multiply-shift: the hash's top bits pick one of `cpus` evenly.
    let cpu = ((u64::from(hash) * u64::from(cpus)) >> 32) as u32;
    // A flow that is already on its CPU is forwarded here: the hop
    // through the CPU map (a queue and a kthread wake-up) would only add
    // work on the CPU that receives, which is the one to spare.
    // SAFETY: the helper only reads the current CPU's id.
    if cpu == unsafe { bpf_get_smp_processor_id() } {
        return crate::forward::xdp_forward(ctx);
    }
    match CPUS.redirect(cpu, 0) {
        Ok(action) => action,
        Err(_) => crate::forward::xdp_forward(ctx),
    }
}

/// The flow's `qp` hash, 0 where the frame ends early (such frames all
/// go to one CPU, where the pipeline sorts them). Its own BPF function:
/// the parse stays out of the frame that also runs the pipeline's
/// fallback (the stack limit is for the chain). The key goes to the
/// per-CPU FLOW_KEY slot, which the pipeline rewrites after it.
#[inline(never)]
fn flow_hash_of(ctx: &XdpContext, seed: u32, version: HashVersion) -> u32 {
    let Ok(l2) = parse::parse_l2(ctx) else { return 0 };
    match l2.kind {
        L3Kind::V4 => {
            let Ok(ip) = parse::parse_ipv4(ctx, l2.l3_off) else { return 0 };
            // SAFETY: parse_ipv4 checked the header.
            let (src, dst, protocol) = unsafe { ((*ip.hdr).src_addr, (*ip.hdr).dst_addr, (*ip.hdr).proto) };
            let Ok(l4) = parse::parse_l4(ctx, protocol, ip.l4_off, ip.l4_end) else { return 0 };
            let Ok(key) = flow_key_v4(src, dst, protocol, &l4) else { return 0 };
            member_hash_of_family::<true>(key, HashMode::Qp, seed, version)
        }
        L3Kind::V6 => {
            let Ok(ip) = parse::parse_ipv6(ctx, l2.l3_off) else { return 0 };
            // SAFETY: parse_ipv6 checked the header.
            let (src, dst, next) = unsafe { (&(*ip.hdr).src_addr, &(*ip.hdr).dst_addr, (*ip.hdr).next_hdr) };
            let Ok(l4) = parse::parse_l4(ctx, next, ip.l4_off, ip.l4_end) else { return 0 };
            let Ok(key) = flow_key_v6(src, dst, next, &l4) else { return 0 };
            member_hash_of_family::<false>(key, HashMode::Qp, seed, version)
        }
    }
}
