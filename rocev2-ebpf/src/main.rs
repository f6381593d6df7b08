//! rocev2's eBPF programs. The entry points are thin: each calls into a
//! module per concern (parse, route, select, pin, class, ecn, rewrite,
//! counters; forward strings them together), the way Cilium splits
//! `bpf/lib/`. Optional stages are gated by load-time constants
//! (features.rs). All decisions that do not need kernel helpers (hash, member
//! choice, checksum arithmetic, BTH fields) live in rocev2-common so host
//! tests and the userspace simulator run the same code.
// no_std/no_main only for the BPF target, so `cargo clippy --workspace`
// can still type-check this crate on the host.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod args;
mod class;
mod counters;
mod ctx;
mod ecn;
mod fault;
mod features;
mod forward;
mod generator;
mod maps;
mod parse;
mod peer;
mod pin;
mod rewrite;
mod route;
mod select;
mod spread;
mod tc;
mod telemetry;
mod transport;

use aya_ebpf::{
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

/// XDP ingress on every configured port: route, pick a group member, rewrite
/// and redirect; anything it does not fully understand goes to the kernel.
/// Multi-buffer aware (`frags`), so jumbo frames (RoCE's 4096 MTU, 9000)
/// work on drivers that split them.
#[xdp(frags)]
pub fn rocev2_xdp(ctx: XdpContext) -> u32 {
    forward::xdp_forward(&ctx)
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

/// The lab's fault injector: drops chosen (DestQP, PSN) packets a chosen
/// number of times, passes everything else.
#[xdp]
pub fn rocev2_xdp_fault(ctx: XdpContext) -> u32 {
    fault::xdp_fault(&ctx)
}

/// Attached to veth peers that need NAPI for redirected frames to be
/// delivered, and used as the benchmark floor: it passes everything.
#[xdp]
pub fn rocev2_xdp_pass(_ctx: XdpContext) -> u32 {
    aya_ebpf::bindings::xdp_action::XDP_PASS
}

/// Transmits every frame back out of the device it runs on. The traffic
/// generator runs it through BPF_PROG_TEST_RUN with live frames, which
/// sends each XDP_TX frame out of the test run's ingress device; it first
/// restores the MACs and TTL a recycled frame may have lost.
#[xdp]
pub fn rocev2_xdp_tx(ctx: XdpContext) -> u32 {
    generator::restore(&ctx);
    aya_ebpf::bindings::xdp_action::XDP_TX
}

/// Benchmark floor (`rocev2 bench`): redirects every frame, unparsed and
/// unchanged, to the device stored under key 0 of EGRESS_DEVS (no real
/// ifindex is 0, so the key never collides with a member's).
#[xdp]
pub fn rocev2_xdp_redirect(_ctx: XdpContext) -> u32 {
    match maps::EGRESS_DEVS.redirect(0, u64::from(aya_ebpf::bindings::xdp_action::XDP_DROP)) {
        Ok(action) | Err(action) => action,
    }
}

/// Benchmark peer (`rocev2 bench`): forwarding by the kernel FIB
/// (`bpf_fib_lookup`), the method of xdp-forward.
#[xdp]
pub fn rocev2_xdp_fib(ctx: XdpContext) -> u32 {
    peer::fib_forward(&ctx)
}

/// Benchmark receiver (`rocev2 bench`): drops every frame; the device's
/// rx counters count what arrived.
#[xdp]
pub fn rocev2_xdp_drop(_ctx: XdpContext) -> u32 {
    aya_ebpf::bindings::xdp_action::XDP_DROP
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program; the verifier rejects code paths
    // that could get here, so there is nothing to report.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("rocev2-ebpf holds eBPF programs; it is built for the BPF target by rocev2-user's build.rs");
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
