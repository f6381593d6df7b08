//! rocev2's eBPF programs. The entry points are thin: each calls into a
//! module per concern (parse, route, select, pin, class, ecn, rewrite,
//! counters; forward strings them together), the way Cilium splits
//! `bpf/lib/`. Optional stages are gated by load-time constants
//! (features.rs). All decisions that do not need kernel helpers (hash, member
//! choice, checksum arithmetic, BTH fields) live in rocev2-common so host
//! tests and the userspace simulator run the same code.
//!
//! This object holds only what `rocev2 run` loads. The traffic tools' and
//! the benchmark's programs (generator, fault injector, floor, FIB peer)
//! are a second object with their own maps: tools/main.rs.
// no_std/no_main only for the BPF target, so `cargo clippy --workspace`
// can still type-check this crate on the host.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod args;
mod bridge;
mod class;
mod counters;
mod ctx;
mod ecn;
mod features;
mod forward;
mod forwarded;
mod maps;
mod object;
mod parse;
mod pin;
mod redirect;
mod refused;
mod rewrite;
mod route;
mod select;
mod spread;
mod tc;
mod telemetry;
#[allow(dead_code, reason = "locate is the tools object's (fault injector, arrival recorder)")]
mod transport;

use aya_ebpf::{
    macros::{classifier, raw_tracepoint, xdp},
    programs::{RawTracePointContext, TcContext, XdpContext},
};

/// XDP ingress on every configured port: route, pick a group member, rewrite
/// and redirect; anything it does not fully understand goes to the kernel.
/// Multi-buffer aware (`frags`), so jumbo frames (RoCE's 4096 MTU, 9000)
/// work on drivers that split them.
#[xdp(frags)]
pub fn rocev2_xdp(ctx: XdpContext) -> u32 {
    forward::xdp_forward(&ctx)
}

/// XDP ingress on every port of the Linux bridge of host bridge mode
/// (`[bridge]`): forwards known unicast by the mirrored FDB, unchanged,
/// and a MAC reachable through an uplink group by the routed groups'
/// member choice; everything else goes to the kernel bridge (bridge.rs).
#[xdp(frags)]
pub fn rocev2_bridge(ctx: XdpContext) -> u32 {
    bridge::xdp_bridge(&ctx)
}

/// XDP ingress with `cpu_spread = "qp"`: hands each flow to a CPU by its
/// hash through the CPUS map (see spread.rs).
#[xdp(frags)]
pub fn rocev2_xdp_spread(ctx: XdpContext) -> u32 {
    spread::spread(&ctx)
}

/// Runs on each CPUS entry's CPU: the forwarding pipeline for the frames
/// the spreading stage handed over (the ingress port is the original one).
#[xdp(frags, map = "cpumap")]
pub fn rocev2_xdp_cpu(ctx: XdpContext) -> u32 {
    forward::xdp_forward(&ctx)
}

/// tc ingress forwarding (`attach = "tc"`): the same pipeline for boxes
/// where XDP is not an option; sets the skb priority of classified packets.
#[classifier]
pub fn rocev2_tc_ingress(ctx: TcContext) -> i32 {
    tc::tc_forward(&ctx)
}

/// tc egress for locally originated traffic (host bridge mode): classes
/// (DSCP, skb priority) and ECN marking on this port's virtual queue.
#[classifier]
pub fn rocev2_tc_egress(ctx: TcContext) -> i32 {
    tc::tc_egress(&ctx)
}

/// Counts the frames an egress device refused after a redirect (its ring
/// full, a veth peer without NAPI): see refused.rs.
#[raw_tracepoint(tracepoint = "xdp_devmap_xmit")]
pub fn rocev2_devmap_xmit(ctx: RawTracePointContext) -> i32 {
    refused::devmap_xmit(&ctx);
    0
}

/// Counts redirects that failed before the frame was queued (the egress
/// device down, the frame too big for it): see refused.rs.
#[raw_tracepoint(tracepoint = "xdp_redirect_err")]
pub fn rocev2_redirect_err(ctx: RawTracePointContext) -> i32 {
    refused::redirect_err(&ctx);
    0
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("rocev2-ebpf holds eBPF programs; it is built for the BPF target by rocev2-user's build.rs");
}
