//! Redirects the kernel refuses after the XDP program returned.
//!
//! XDP_REDIRECT only asks: the kernel then queues the frame for the egress
//! device (and may find it down, or the frame too big: `xdp_redirect_err`)
//! and, at the end of the receive poll, hands the queue to the device's
//! driver, which may take only part of it (its ring is full, or a veth
//! whose peer has no XDP/NAPI set-up takes none: `xdp_devmap_xmit` with
//! drops). Those frames are lost after the pipeline counted them
//! forwarded. Two raw tracepoint programs count them: per egress device
//! (EGRESS_REFUSED) and on the ingress port as `drop_egress_refused`,
//! which userspace subtracts from `forwarded` (so forwarded means handed
//! to the egress device).
//!
//! The tracepoints fire for every XDP redirect on the machine, in every
//! network namespace; an event is ours when its ingress device is in our
//! namespace (the netns cookie) and is one of our ports. The kernel's
//! structs are read at offsets userspace finds in the kernel's BTF and
//! sets at load (no CO-RE in Rust eBPF yet).

use aya_ebpf::{
    helpers::bpf_probe_read_kernel, macros::map, maps::PerCpuHashMap, programs::RawTracePointContext, Global,
};
use rocev2_common::{counters::PortCounter, maps::MAX_EGRESS_DEVS};

use crate::counters;

/// Offsets in the kernel's structs, and our namespace's cookie; set at load.
#[unsafe(no_mangle)]
static NETDEV_IFINDEX_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static NETDEV_NET_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static NET_COOKIE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static NETNS_COOKIE: Global<u64> = Global::new(0);

/// Frames each egress device (by ifindex; 0 = a CPU map entry) refused.
#[map]
pub static EGRESS_REFUSED: PerCpuHashMap<u32, u64> = PerCpuHashMap::with_max_entries(MAX_EGRESS_DEVS, 0);

/// bpf_map_type values of the device maps (uapi).
const BPF_MAP_TYPE_DEVMAP: u64 = 14;
const BPF_MAP_TYPE_DEVMAP_HASH: u64 = 25;

/// `xdp_devmap_xmit(from_dev, to_dev, sent, drops, err)`: the driver took
/// `sent` of a bulk queue; `drops` are lost.
#[inline(always)]
pub fn devmap_xmit(ctx: &RawTracePointContext) {
    let drops = ctx.arg::<u64>(3) as i32;
    if drops <= 0 {
        return;
    }
    let (from, to) = (ctx.arg::<u64>(0) as *const u8, ctx.arg::<u64>(1) as *const u8);
    let Some(ingress) = our_port(from) else { return };
    let Some(egress) = ifindex(to) else { return };
    count(ingress, egress, drops as u64);
}

/// `xdp_redirect_err(dev, xdp, tgt, err, map_type, map_id, index)`: the
/// redirect failed before the frame was queued (device down, frame too
/// big, CPU map full). For a device map, `index` is the egress ifindex.
#[inline(always)]
pub fn redirect_err(ctx: &RawTracePointContext) {
    let Some(ingress) = our_port(ctx.arg::<u64>(0) as *const u8) else { return };
    let map_type = ctx.arg::<u64>(4) & 0xFFFF_FFFF;
    let egress = if map_type == BPF_MAP_TYPE_DEVMAP || map_type == BPF_MAP_TYPE_DEVMAP_HASH {
        ctx.arg::<u64>(6) as u32
    } else {
        0
    };
    count(ingress, egress, 1);
}

/// The port slot of `dev` if it is one of our ports in our namespace.
#[inline(always)]
fn our_port(dev: *const u8) -> Option<u32> {
    let net_offset = NETDEV_NET_OFFSET.load() as usize;
    if net_offset == 0 || dev.is_null() {
        return None;
    }
    // SAFETY: probe reads of kernel memory; a bad address fails, never faults.
    let net: u64 = unsafe { bpf_probe_read_kernel(dev.add(net_offset) as *const u64) }.ok()?;
    let cookie: u64 =
        unsafe { bpf_probe_read_kernel((net as *const u8).add(NET_COOKIE_OFFSET.load() as usize) as *const u64) }
            .ok()?;
    if cookie != NETNS_COOKIE.load() {
        return None;
    }
    let slot = counters::port_slot(ifindex(dev)?);
    (slot != 0).then_some(slot)
}

#[inline(always)]
fn ifindex(dev: *const u8) -> Option<u32> {
    // SAFETY: as above.
    let i: i32 = unsafe { bpf_probe_read_kernel(dev.add(NETDEV_IFINDEX_OFFSET.load() as usize) as *const i32) }.ok()?;
    Some(i as u32)
}

#[inline(always)]
fn count(port_slot: u32, egress: u32, frames: u64) {
    counters::add(port_slot, PortCounter::DropEgressRefused, frames);
    match EGRESS_REFUSED.get_ptr_mut(egress) {
        // SAFETY: this CPU's value; tracepoints of one CPU do not overlap.
        Some(n) => unsafe { *n += frames },
        None => {
            let _ = EGRESS_REFUSED.insert(egress, frames, 0);
        }
    }
}
