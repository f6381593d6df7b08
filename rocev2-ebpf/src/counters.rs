//! Per-CPU counters: no atomics needed, userspace sums the CPUs. A
//! packet's port counters are one block (PortCounters) found with one
//! lookup and added to in place.

use core::mem::MaybeUninit;

use rocev2_common::{
    counters::PortCounter,
    features::Features,
    maps::{member_stat_index, PortCounters, BRIDGE_PORT_GROUP},
};

use crate::{
    features::enabled,
    forwarded::Forward,
    maps::{CLASS_STATS, MEMBER_STATS, PORT_COUNTERS},
    parse::{Outcome, Roce},
};

pub use crate::maps::port_slot;

/// A port's counter block on this CPU.
#[inline(always)]
fn block(slot: u32) -> Option<&'static mut PortCounters> {
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    PORT_COUNTERS.get_ptr_mut(slot).map(|p| unsafe { &mut *p })
}

/// One counter outside the per-packet tally (flowlet and pin events).
#[inline(always)]
pub fn add(slot: u32, counter: PortCounter, value: u64) {
    if !enabled(Features::COUNTERS) {
        return;
    }
    if let Some(c) = block(slot) {
        c.add(counter, value);
    }
}

/// Everything a packet moves: received, and forwarded (with its member)
/// or the reason it left the fast path.
#[inline(always)]
pub fn count_packet(slot: u32, len: u64, out: &MaybeUninit<Forward>, result: Result<(), Outcome>) {
    if !enabled(Features::COUNTERS) {
        return;
    }
    let Some(c) = block(slot) else { return };
    tally(c, len, out, result);
}

/// [`count_packet`] for the bridge program: a frame bridged to the port
/// its FDB entry names (no group member) is also counted as such.
#[inline(always)]
pub fn count_bridged(slot: u32, len: u64, out: &MaybeUninit<Forward>, result: Result<(), Outcome>) {
    if !enabled(Features::COUNTERS) {
        return;
    }
    let Some(c) = block(slot) else { return };
    tally(c, len, out, result);
    if result.is_ok() {
        // SAFETY: the pipeline wrote `out` when it returned Ok.
        if unsafe { out.assume_init_ref() }.group == BRIDGE_PORT_GROUP {
            c.add(PortCounter::BridgedToPort, 1);
        }
    }
}

/// Adds one frame to a port's counter block: received, and forwarded (with
/// its member) or the reason it left the fast path.
#[inline(always)]
fn tally(c: &mut PortCounters, len: u64, out: &MaybeUninit<Forward>, result: Result<(), Outcome>) {
    c.add(PortCounter::RxPackets, 1);
    c.add(PortCounter::RxBytes, len);
    match result {
        Ok(()) => {
            // SAFETY: the pipeline wrote `out` when it returned Ok.
            let f = unsafe { out.assume_init_ref() };
            c.add(PortCounter::Forwarded, 1);
            c.add(PortCounter::ForwardedBytes, len);
            match f.roce {
                Roce::Yes { .. } => c.add(PortCounter::ForwardedRoce, 1),
                Roce::ShortBth => {
                    c.add(PortCounter::ForwardedRoce, 1);
                    c.add(PortCounter::RoceShortBth, 1);
                }
                Roce::No => {}
            }
            member_sent(f.group, f.position, len);
        }
        Err(o) => {
            if let Some(n) = c.counts.get_mut(o.counter as usize) {
                *n += 1;
            }
        }
    }
}

#[inline(always)]
fn member_sent(group: u32, position: u32, bytes: u64) {
    if let Some(ptr) = MEMBER_STATS.get_ptr_mut(member_stat_index(group, position)) {
        // SAFETY: as above.
        unsafe {
            (*ptr).packets += 1;
            (*ptr).bytes += bytes;
        }
    }
}

#[inline(always)]
pub fn class_matched(class: u32, bytes: u64) {
    if let Some(ptr) = CLASS_STATS.get_ptr_mut(class) {
        // SAFETY: per-CPU slot.
        unsafe {
            (*ptr).packets += 1;
            (*ptr).bytes += bytes;
        }
    }
}
