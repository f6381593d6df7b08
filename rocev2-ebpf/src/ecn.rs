//! ECN marking against per-egress virtual queues.

use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns};
use rocev2_common::{
    class::{ClassAction, CLASS_ECN_EXEMPT, CLASS_ECN_PROFILE},
    counters::{EgressCounter, PortCounter},
    ecn::{self, Congestion, EgressEntry, NO_PROFILE, PROFILE_DROP_NOT_ECT},
};

use crate::{
    args::ClassEcn,
    counters::EgressTally,
    maps::{egress_entry, ECN_PROFILES, VQUEUES},
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

/// [`mark`] on the port's virtual queue settings, found by the caller.
#[inline(always)]
fn mark_on(egress: &EgressEntry, tos: u8, len: u64, class: &ClassAction, now: u64) -> Result<u8, Outcome> {
    let egress = *egress;
    let mut tally = EgressTally::of(egress.slot);
    tally.add(EgressCounter::TxPackets, 1);
    tally.add(EgressCounter::TxBytes, len);
    let Some(q) = VQUEUES.get_ptr_mut(egress.slot) else { return Ok(tos) };
    // Read the clock once per packet: the flowlet choice may have already.
    let now = if now == 0 { unsafe { bpf_ktime_get_ns() } } else { now };
    // SAFETY: valid map value; concurrent CPUs may race (see ecn.rs).
    let depth = unsafe {
        let next = ecn::enqueue(&*q, now, len, &egress.drain);
        *q = next;
        next.depth_bytes
    };
    if class.flags & CLASS_ECN_EXEMPT != 0 {
        tally.add(EgressCounter::Exempt, 1);
        return Ok(tos);
    }
    let profile_id = if class.flags & CLASS_ECN_PROFILE != 0 { class.profile } else { egress.profile };
    if profile_id == NO_PROFILE {
        return Ok(tos);
    }
    let Some(profile) = ECN_PROFILES.get(profile_id) else { return Ok(tos) };
    let congestion = ecn::congestion(depth, profile);
    if ecn::is_ect(tos) {
        tally.add(EgressCounter::EctSeen, 1);
        // A random number only where the probability needs one (a helper
        // call per packet otherwise).
        let random = match congestion {
            Congestion::Probabilistic(_) => unsafe { bpf_get_prandom_u32() },
            _ => 0,
        };
        if ecn::should_mark(congestion, random) {
            tally.add(EgressCounter::Marked, 1);
            return Ok(ecn::with_ce(tos));
        }
    } else if tos & 3 == ecn::NOT_ECT && congestion != Congestion::None {
        tally.add(EgressCounter::NotEctOverThreshold, 1);
        if congestion == Congestion::Full && profile.flags & PROFILE_DROP_NOT_ECT != 0 {
            return Err(drop(PortCounter::DropNotEct));
        }
    }
    Ok(tos)
}

/// Returned by [`mark_code`] for "drop this packet".
pub const ECN_DROP: u32 = 0x100;

/// [`mark_on`] as its own BPF function with at most five arguments;
/// `now` is the packet's clock reading, 0 if not read yet. Returns the new
/// TOS byte, or ECN_DROP.
#[inline(never)]
pub fn mark_code(egress: &EgressEntry, tos: u32, len: u64, class: ClassEcn, now: u64) -> u32 {
    let action = ClassAction { flags: class.flags(), set_dscp: 0, priority: 0, profile: class.profile() };
    match mark_on(egress, tos as u8, len, &action, now) {
        Ok(t) => u32::from(t),
        Err(_) => ECN_DROP,
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
