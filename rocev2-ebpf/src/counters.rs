//! Per-CPU counters: no atomics needed, userspace sums the CPUs.

use rocev2_common::{
    counters::{EgressCounter, PortCounter},
    maps::{member_stat_index, port_counter_index},
};

use crate::maps::{CLASS_STATS, EGRESS_COUNTERS, MEMBER_STATS, PORT_COUNTERS};

pub use crate::maps::port_slot;

#[inline(always)]
pub fn add(slot: u32, counter: PortCounter, value: u64) {
    if let Some(ptr) = PORT_COUNTERS.get_ptr_mut(port_counter_index(slot, counter)) {
        // SAFETY: per-CPU slot, only this CPU writes it while we run.
        unsafe { *ptr += value };
    }
}

#[inline(always)]
pub fn member_sent(group: u32, position: u32, bytes: u64) {
    if let Some(ptr) = MEMBER_STATS.get_ptr_mut(member_stat_index(group, position)) {
        // SAFETY: as above.
        unsafe {
            (*ptr).packets += 1;
            (*ptr).bytes += bytes;
        }
    }
}

#[inline(always)]
pub fn egress_add(slot: u32, counter: EgressCounter, value: u64) {
    if let Some(ptr) = EGRESS_COUNTERS.get_ptr_mut(slot * EgressCounter::COUNT + counter as u32) {
        // SAFETY: per-CPU slot.
        unsafe { *ptr += value };
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
