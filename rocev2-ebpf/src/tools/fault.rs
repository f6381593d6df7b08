//! The lab's fault injector: drops chosen RoCEv2 packets, by (DestQP,
//! PSN), a chosen number of times each, and passes everything else. It
//! makes a lost packet reproducible, so a test can ask that exactly the
//! NAKed range is sent again. As XDP it drops what arrives on a link; as a
//! tc egress program what leaves one, e.g. a sender's packets before they
//! reach the switch.

use aya_ebpf::{bindings::xdp_action, macros::map, maps::HashMap, programs::XdpContext};
use rocev2_common::maps::{fault_key, MAX_FAULTS};

use crate::{ctx::PacketBuf, transport};

/// (DestQP << 32 | PSN) -> how many more times to drop it.
#[map]
pub static FAULT_DROPS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_FAULTS, 0);

#[inline(always)]
pub fn xdp_fault(ctx: &XdpContext) -> u32 {
    if take_drop(ctx) {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// Whether to drop this frame now; counts the drop down if so.
#[inline(always)]
pub fn take_drop<C: PacketBuf>(ctx: &C) -> bool {
    let Some(at) = transport::locate(ctx) else { return false };
    if let Some(left) = FAULT_DROPS.get_ptr_mut(fault_key(at.bth.dest_qp, at.bth.psn)) {
        // SAFETY: a plain u32 in the map; a lost race drops once more or less.
        unsafe {
            if *left > 0 {
                *left -= 1;
                return true;
            }
        }
    }
    false
}
