//! The second eBPF object, `rocev2-tools`: programs the traffic tools, the
//! lab and the benchmark load, never `rocev2 run`. Keeping them apart keeps
//! the production object to what a switch runs, and gives these programs
//! maps of their own.
//!
//! The packet modules (parse, rewrite, transport) are the pipeline's own,
//! shared by path, so the peer and the fault injector read frames exactly
//! as the pipeline does.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

// Shared with the forwarding programs; this object uses part of each.
#[allow(dead_code, reason = "shared with the forwarding programs; this object uses part of it")]
#[path = "../ctx.rs"]
mod ctx;
#[allow(dead_code, reason = "shared with the forwarding programs; this object uses part of it")]
#[path = "../parse.rs"]
mod parse;
#[path = "../redirect.rs"]
mod redirect;
#[allow(dead_code, reason = "shared with the forwarding programs; this object uses part of it")]
#[path = "../rewrite.rs"]
mod rewrite;
#[allow(dead_code, reason = "shared with the forwarding programs; this object uses part of it")]
#[path = "../transport.rs"]
mod transport;

mod arrival;
mod fault;
mod generator;
mod maps;
#[path = "../object.rs"]
mod object;
mod peer;
mod primitives;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_OK, TC_ACT_SHOT},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

/// The lab's fault injector: drops or corrupts chosen (DestQP, PSN)
/// packets a chosen number of times, passes everything else.
#[xdp]
pub fn rocev2_xdp_fault(ctx: XdpContext) -> u32 {
    fault::xdp_fault(&ctx)
}

/// Ethernet + VLAN + IPv6 + UDP + BTH.
const HEADERS_TO_BTH: u32 = 14 + 4 + 40 + 8 + 12;

/// The fault injector on a link's egress (tc): what a sender transmits can
/// be lost before it reaches the next hop. A packet socket's send of a
/// dropped frame fails with ENOBUFS (tcx has no silent "stolen"); the RC
/// requester counts that as a loss.
#[classifier]
pub fn rocev2_tc_fault(ctx: TcContext) -> i32 {
    // A packet socket's frames carry only the Ethernet header in the linear
    // part: pull the headers up to the BTH in (VLAN + IPv6 is the longest).
    let _ = ctx.pull_data(ctx.len().min(HEADERS_TO_BTH));
    match fault::take(&ctx) {
        fault::Fault::Pass => TC_ACT_OK,
        fault::Fault::Drop => TC_ACT_SHOT,
        fault::Fault::Corrupt(bth_off) => {
            // The byte to flip is at the end: make the whole frame linear.
            let _ = ctx.pull_data(ctx.len());
            fault::corrupt(&ctx, bth_off);
            TC_ACT_OK
        }
    }
}

/// Transmits every frame back out of the device it runs on. The traffic
/// generator runs it through BPF_PROG_TEST_RUN with live frames, which
/// sends each XDP_TX frame out of the test run's ingress device; it first
/// restores the MACs and TTL a recycled frame may have lost.
#[xdp]
pub fn rocev2_xdp_tx(ctx: XdpContext) -> u32 {
    generator::restore(&ctx);
    xdp_action::XDP_TX
}

/// Benchmark floor (`cargo xtask bench`): redirects every frame, unparsed
/// and unchanged, to the device stored at index 0 of EGRESS_DEVS_DIRECT (no
/// real ifindex is 0, so it never collides with an egress device's): the
/// cheapest redirect there is, as the pipeline's (redirect.rs).
#[xdp]
pub fn rocev2_xdp_redirect(_ctx: XdpContext) -> u32 {
    match maps::EGRESS_DEVS_DIRECT.redirect(0, u64::from(xdp_action::XDP_DROP)) {
        Ok(action) | Err(action) => action,
    }
}

/// Benchmark primitives (primitives.rs): the floor plus REPEAT chained
/// ARRAY lookups.
#[xdp]
pub fn rocev2_prim_array(ctx: XdpContext) -> u32 {
    primitives::array(&ctx)
}

/// The floor plus REPEAT chained PERCPU_ARRAY lookups.
#[xdp]
pub fn rocev2_prim_percpu(ctx: XdpContext) -> u32 {
    primitives::percpu(&ctx)
}

/// The floor plus REPEAT chained LRU hash lookups of a flowlet-table key.
#[xdp]
pub fn rocev2_prim_hash(ctx: XdpContext) -> u32 {
    primitives::hash(&ctx)
}

/// The floor plus REPEAT reads of the precise clock (`bpf_ktime_get_ns`).
#[xdp]
pub fn rocev2_prim_clock(_ctx: XdpContext) -> u32 {
    primitives::clock()
}

/// The floor plus REPEAT reads of the coarse clock (`bpf_ktime_get_coarse_ns`).
#[xdp]
pub fn rocev2_prim_coarse(_ctx: XdpContext) -> u32 {
    primitives::coarse_clock()
}

/// The floor plus REPEAT reads of `jiffies` (`bpf_jiffies64`, which the
/// verifier inlines on 64-bit JITs).
#[xdp]
pub fn rocev2_prim_jiffies(_ctx: XdpContext) -> u32 {
    primitives::jiffies()
}

/// The floor plus REPEAT chained BPF-to-BPF calls.
#[xdp]
pub fn rocev2_prim_call(ctx: XdpContext) -> u32 {
    primitives::call(&ctx)
}

/// The floor plus the pipeline's parse of Ethernet, IP, UDP and BTH (once).
#[xdp]
pub fn rocev2_prim_parse(ctx: XdpContext) -> u32 {
    primitives::parse(&ctx)
}

/// The floor plus REPEAT chained hash_version 2 hashes of an IPv4 key.
#[xdp]
pub fn rocev2_prim_hash_v2_v4(ctx: XdpContext) -> u32 {
    primitives::member_hash::<true>(&ctx, rocev2_common::hash::HashVersion::V2)
}

/// The floor plus REPEAT chained hash_version 2 hashes of an IPv6 key.
#[xdp]
pub fn rocev2_prim_hash_v2_v6(ctx: XdpContext) -> u32 {
    primitives::member_hash::<false>(&ctx, rocev2_common::hash::HashVersion::V2)
}

/// The floor plus REPEAT chained hash_version 1 hashes (all 11 words).
#[xdp]
pub fn rocev2_prim_hash_v1(ctx: XdpContext) -> u32 {
    primitives::member_hash::<false>(&ctx, rocev2_common::hash::HashVersion::V1)
}

/// The floor plus REPEAT IPv4 rewrites (TTL, DSCP/ECN, checksum, MACs).
#[xdp]
pub fn rocev2_prim_rewrite(ctx: XdpContext) -> u32 {
    primitives::rewrite(&ctx)
}

/// The floor plus REPEAT countings of a forwarded packet (7 adds).
#[xdp]
pub fn rocev2_prim_counters(ctx: XdpContext) -> u32 {
    primitives::counter_adds(&ctx)
}

/// The floor plus REPEAT reads of the ingress port and its IFINDEX_SLOTS slot.
#[xdp]
pub fn rocev2_prim_ingress(ctx: XdpContext) -> u32 {
    primitives::ingress_port(&ctx)
}

/// The floor plus REPEAT IPv4 flow keys' volatile stores.
#[xdp]
pub fn rocev2_prim_flow_key(ctx: XdpContext) -> u32 {
    primitives::flow_key_stores(&ctx)
}

/// The floor plus REPEAT groups' and members' checks.
#[xdp]
pub fn rocev2_prim_group(ctx: XdpContext) -> u32 {
    primitives::group_checks(&ctx)
}

/// The floor plus REPEAT route-cache hits (slot, compares, target's tests).
#[xdp]
pub fn rocev2_prim_route_cache(ctx: XdpContext) -> u32 {
    primitives::route_cache(&ctx)
}

/// The floor plus REPEAT IPv4 headers' field reads and TTL and options tests.
#[xdp]
pub fn rocev2_prim_ipv4_checks(ctx: XdpContext) -> u32 {
    primitives::ipv4_checks(&ctx)
}

/// The floor plus REPEAT classes tried, none matching.
#[xdp]
pub fn rocev2_prim_class(ctx: XdpContext) -> u32 {
    primitives::class_tests(&ctx)
}

/// The floor plus REPEAT packets through egress ports' virtual queues.
#[xdp]
pub fn rocev2_prim_ecn(ctx: XdpContext) -> u32 {
    primitives::ecn_queue(&ctx)
}

/// The floor plus REPEAT flowlet decisions and entry updates (keyed table).
#[xdp]
pub fn rocev2_prim_flowlet(ctx: XdpContext) -> u32 {
    primitives::flowlet_step(&ctx)
}

/// The floor plus REPEAT data packets' QP entries (set hash, ways, update).
#[xdp]
pub fn rocev2_prim_qp_entry(ctx: XdpContext) -> u32 {
    primitives::qp_entry(&ctx)
}

/// The floor padded to the qp pipeline's JITed size with code never run.
#[xdp]
pub fn rocev2_prim_padded(ctx: XdpContext) -> u32 {
    primitives::padded(&ctx)
}

/// Benchmark peer: forwarding by the kernel FIB (`bpf_fib_lookup`), the
/// method of xdp-forward.
#[xdp]
pub fn rocev2_xdp_fib(ctx: XdpContext) -> u32 {
    peer::fib_forward(&ctx)
}

/// The lab's arrival probe: counts and sequence-checks the RoCEv2 frames
/// that land on a device, then passes every frame on (arrival.rs).
#[xdp(frags)]
pub fn rocev2_xdp_arrival(ctx: XdpContext) -> u32 {
    arrival::count(&ctx);
    xdp_action::XDP_PASS
}

/// The arrival probe of a receiver no application listens on (the churn
/// soak's hosts): counts like `rocev2_xdp_arrival`, then drops RoCEv2
/// frames (no stack answers them) and passes the rest, so the host still
/// answers ARP and neighbour discovery.
#[xdp(frags)]
pub fn rocev2_xdp_arrival_drop(ctx: XdpContext) -> u32 {
    if arrival::count(&ctx) {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// Benchmark receiver: drops every frame; the device's rx counters count
/// what arrived. Also gives a veth peer the NAPI that XDP-redirected
/// frames need to be delivered.
#[xdp]
pub fn rocev2_xdp_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("rocev2-tools holds eBPF programs; it is built for the BPF target by rocev2-user's build.rs");
}
