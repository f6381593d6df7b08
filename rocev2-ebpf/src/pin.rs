//! Pinned paths: the pin table maps (DestQP, destination) to a member
//! position, valid while the group's generation is unchanged.

use aya_ebpf::maps::lpm_trie::Key;
use rocev2_common::maps::{PIN_MEMBER_DOWN, POLICY_PINNED};

use crate::{
    maps::{GROUPS, PINS_V4, PINS_V6},
    parse::{Roce, L4},
};

/// Returned in place of a position when there is no valid pin.
pub const NO_PIN: u32 = u32::MAX;

/// The pinned position for an IPv4 RoCE packet of `group_id`, or NO_PIN.
/// Only `pinned` groups look pins up: the pin table is an LPM search every
/// other packet skips.
#[inline(always)]
pub fn pinned_v4(dst: [u8; 4], l4: &L4, group_id: u32) -> u32 {
    let Roce::Yes { .. } = l4.roce else { return NO_PIN };
    if !is_pinned(group_id) {
        return NO_PIN;
    }
    lookup_v4(u32::from_ne_bytes(dst), l4.dest_qp, group_id)
}

/// [`pinned_v4`] for IPv6.
#[inline(always)]
pub fn pinned_v6(dst: &[u8; 16], l4: &L4, group_id: u32) -> u32 {
    let Roce::Yes { .. } = l4.roce else { return NO_PIN };
    if !is_pinned(group_id) {
        return NO_PIN;
    }
    lookup_v6(dst, l4.dest_qp, group_id)
}

#[inline(always)]
fn is_pinned(group_id: u32) -> bool {
    GROUPS.get(group_id).is_some_and(|g| g.policy == POLICY_PINNED)
}

/// Its own BPF function, like [`lookup_v6`]: keeps map-value pointers out
/// of the caller's frame.
#[inline(never)]
fn lookup_v4(dst: u32, dest_qp: u32, group_id: u32) -> u32 {
    let q = dest_qp.to_be_bytes();
    let d = dst.to_ne_bytes();
    let key = [q[0], q[1], q[2], q[3], d[0], d[1], d[2], d[3]];
    let Some(pin) = PINS_V4.get(Key::new(64, key)) else { return NO_PIN };
    valid(pin.group, pin.position, pin.generation, group_id)
}

/// Its own BPF function: the 24-byte LPM key would not fit the IPv6 frame.
#[inline(never)]
fn lookup_v6(dst: &[u8; 16], dest_qp: u32, group_id: u32) -> u32 {
    let mut key = [0u8; 20];
    key[0..4].copy_from_slice(&dest_qp.to_be_bytes());
    key[4..20].copy_from_slice(dst);
    let Some(pin) = PINS_V6.get(Key::new(160, key)) else { return NO_PIN };
    valid(pin.group, pin.position, pin.generation, group_id)
}

#[inline(always)]
fn valid(pin_group: u32, position: u32, generation: u32, group_id: u32) -> u32 {
    let Some(group) = GROUPS.get(group_id) else { return NO_PIN };
    if pin_group != group_id || position == PIN_MEMBER_DOWN || generation != group.generation {
        return NO_PIN;
    }
    position
}
