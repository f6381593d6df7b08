//! ECN marking against per-egress virtual queues.

use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns};
use rocev2_common::{
    class::ClassAction,
    counters::{EgressCounters, PortCounter},
    ecn::{self, EcnProfile, EgressEntry, PortState, VirtualQueue},
};

use crate::{
    args::ClassEcn,
    maps::{egress_entry, ECN_PROFILES, EGRESS_COUNTERS, VQUEUES},
    parse::{drop, Outcome},
};

/// Runs the egress port's virtual queue for a packet of `len` bytes and
/// returns the TOS/traffic-class byte to send (CE set when marked), or a
/// drop for Not-ECT traffic when the profile asks for it.
#[inline(always)]
pub fn mark(ifindex: u32, tos: u8, len: u64, class: &ClassAction, now: u64) -> Result<u8, Outcome> {
    let Some(egress) = egress_entry(ifindex) else { return Ok(tos) };
    mark_on(egress, tos, len, class, now)
}

/// The pipeline's port state: the maps and the helpers.
struct Maps;

// SAFETY: map values (EGRESS_COUNTERS is per CPU) valid for the run.
unsafe impl PortState for Maps {
    #[inline(always)]
    fn counters(&self, slot: u32) -> Option<*mut EgressCounters> {
        EGRESS_COUNTERS.get_ptr_mut(slot)
    }

    #[inline(always)]
    fn queue(&self, slot: u32) -> Option<*mut VirtualQueue> {
        VQUEUES.get_ptr_mut(slot)
    }

    #[inline(always)]
    fn profile(&self, id: u32) -> Option<&EcnProfile> {
        ECN_PROFILES.get(id)
    }

    #[inline(always)]
    fn now(&self) -> u64 {
        // SAFETY: a clock helper without arguments.
        unsafe { bpf_ktime_get_ns() }
    }

    #[inline(always)]
    fn random(&self) -> u32 {
        // SAFETY: a helper without arguments.
        unsafe { bpf_get_prandom_u32() }
    }
}

/// [`mark`] on the port's virtual queue settings, found by the caller
/// (the shared marker, [`ecn::mark_on`], on the maps).
#[inline(always)]
fn mark_on(egress: &EgressEntry, tos: u8, len: u64, class: &ClassAction, now: u64) -> Result<u8, Outcome> {
    ecn::mark_on(&Maps, egress, tos, len, class, now).map_err(|ecn::DropNotEct| drop(PortCounter::DropNotEct))
}

/// Returned by [`mark_code`] for "drop this packet".
pub const ECN_DROP: u32 = 0x100;

/// [`mark_on`] as its own BPF function with at most five arguments;
/// `now` is the packet's clock reading, 0 if not read yet. Returns the new
/// TOS byte, or ECN_DROP.
#[inline(never)]
pub fn mark_code(egress: &EgressEntry, tos: u32, len: u64, class: ClassEcn, now: u64) -> u32 {
    let action = ClassAction { flags: class.flags(), set_dscp: 0, priority: 0, profile: class.profile() };
    match ecn::mark_on(&Maps, egress, tos as u8, len, &action, now) {
        Ok(t) => u32::from(t),
        Err(ecn::DropNotEct) => ECN_DROP,
    }
}

/// The TOS byte to send after marking, or the drop. A port without a
/// virtual queue (the feature loaded, this port not configured) is found
/// here and makes no call: a BPF-to-BPF call and its return cost several
/// ns here.
#[inline(always)]
pub fn mark_forwarded(ifindex: u32, tos: u8, len: u64, class: &ClassAction, now: u64) -> Result<u8, Outcome> {
    let Some(egress) = egress_entry(ifindex) else { return Ok(tos) };
    match mark_code(egress, u32::from(tos), len, ClassEcn::new(class.flags, class.profile), now) {
        ECN_DROP => Err(drop(PortCounter::DropNotEct)),
        t => Ok(t as u8),
    }
}
