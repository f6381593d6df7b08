//! The lab's fault injector: drops or corrupts chosen RoCEv2 packets, by
//! (DestQP, PSN), a chosen number of times each, and passes everything
//! else. It makes a lost packet reproducible, so a test can ask that
//! exactly the NAKed range is sent again; a corrupted one (its last byte
//! before the ICRC flipped) is what a receiver's ICRC check must catch. As
//! XDP it acts on what arrives on a link; as a tc egress program on what
//! leaves one, e.g. a sender's packets before they reach the switch.

use aya_ebpf::{bindings::xdp_action, macros::map, maps::HashMap, programs::XdpContext};
use rocev2_common::maps::{fault_key, FAULT_CORRUPT, FAULT_COUNT_MASK, MAX_FAULTS};

use crate::{ctx::PacketBuf, parse::ptr_at, transport};

/// (DestQP << 32 | PSN) -> how many more times to act on it, with
/// FAULT_CORRUPT set to corrupt instead of drop.
#[map]
pub static FAULT_DROPS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_FAULTS, 0);

/// What to do with a frame.
pub enum Fault {
    Pass,
    Drop,
    /// Corrupt it; the BTH starts at this offset.
    Corrupt(usize),
}

#[inline(always)]
pub fn xdp_fault(ctx: &XdpContext) -> u32 {
    match take(ctx) {
        Fault::Pass => xdp_action::XDP_PASS,
        Fault::Drop => xdp_action::XDP_DROP,
        Fault::Corrupt(bth_off) => {
            corrupt(ctx, bth_off);
            xdp_action::XDP_PASS
        }
    }
}

/// What to do with this frame now; counts the fault down if it is one.
#[inline(always)]
pub fn take<C: PacketBuf>(ctx: &C) -> Fault {
    let Some(at) = transport::locate(ctx) else { return Fault::Pass };
    if let Some(entry) = FAULT_DROPS.get_ptr_mut(fault_key(at.bth.dest_qp, at.bth.psn)) {
        // SAFETY: a plain u32 in the map; a lost race acts once more or less.
        unsafe {
            if *entry & FAULT_COUNT_MASK > 0 {
                *entry -= 1;
                return if *entry & FAULT_CORRUPT != 0 { Fault::Corrupt(at.bth_off) } else { Fault::Drop };
            }
        }
    }
    Fault::Pass
}

/// Flips every bit of the last byte the ICRC covers (the one before it,
/// found from the UDP length): payload, pad or AETH, which a receiver
/// reads only once the ICRC matched. False if that byte is not in the
/// linear part.
#[inline(always)]
pub fn corrupt<C: PacketBuf>(ctx: &C, bth_off: usize) -> bool {
    // The UDP length field is 4 bytes before the BTH.
    let Some(len) = ptr_at::<[u8; 2], C>(ctx, bth_off - 4) else { return false };
    // SAFETY: ptr_at checked the field lies in the packet.
    let udp_len = usize::from(u16::from_be_bytes(unsafe { *len })) & 0x3fff;
    // UDP header + BTH + the ICRC, and at least the byte to flip.
    if udp_len < 8 + 12 + 4 + 1 {
        return false;
    }
    // Two bytes ending with the one to flip: a one-byte bound check
    // compiles to `>=`, which the verifier does not count as room for a byte.
    let Some(pair) = ptr_at::<[u8; 2], C>(ctx, (bth_off - 8 + udp_len - 6) & 0x3fff) else { return false };
    // SAFETY: as above.
    unsafe { (*pair)[1] = !(*pair)[1] };
    true
}
