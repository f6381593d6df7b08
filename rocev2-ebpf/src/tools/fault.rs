//! The lab's fault injector: an XDP program that drops chosen RoCEv2
//! packets, by (DestQP, PSN), a chosen number of times each, and passes
//! everything else. It makes a lost packet reproducible, so a test can ask
//! that exactly the NAKed range is sent again.

use aya_ebpf::{bindings::xdp_action, macros::map, maps::HashMap, programs::XdpContext};
use rocev2_common::maps::{fault_key, MAX_FAULTS};

use crate::transport;

/// (DestQP << 32 | PSN) -> how many more times to drop it.
#[map]
pub static FAULT_DROPS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_FAULTS, 0);

#[inline(always)]
pub fn xdp_fault(ctx: &XdpContext) -> u32 {
    let Some(at) = transport::locate(ctx, crate::parse::frame_len(ctx)) else { return xdp_action::XDP_PASS };
    if let Some(left) = FAULT_DROPS.get_ptr_mut(fault_key(at.bth.dest_qp, at.bth.psn)) {
        // SAFETY: a plain u32 in the map; a lost race drops once more or less.
        unsafe {
            if *left > 0 {
                *left -= 1;
                return xdp_action::XDP_DROP;
            }
        }
    }
    xdp_action::XDP_PASS
}
