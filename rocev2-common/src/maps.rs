//! Map names, sizes and value types shared by the eBPF program and userspace.

use crate::counters::PortCounter;

/// Map names as they appear in the object file and under the pin directory.
pub mod names {
    pub const ROUTES_V4: &str = "ROUTES_V4";
    pub const ROUTES_V6: &str = "ROUTES_V6";
    pub const GROUPS: &str = "GROUPS";
    pub const MEMBERS: &str = "MEMBERS";
    pub const PORTS: &str = "PORTS";
    pub const EGRESS_DEVS: &str = "EGRESS_DEVS";
    pub const CONFIG: &str = "CONFIG";
    pub const PORT_COUNTERS: &str = "PORT_COUNTERS";
    pub const MEMBER_STATS: &str = "MEMBER_STATS";
    /// Every map, for pinning and for `rocev2 stats`.
    pub const ALL: &[&str] = &[
        ROUTES_V4,
        ROUTES_V6,
        GROUPS,
        MEMBERS,
        PORTS,
        EGRESS_DEVS,
        CONFIG,
        PORT_COUNTERS,
        MEMBER_STATS,
    ];
}

/// Where `rocev2 run` pins its maps so `rocev2 stats` can read them.
pub const PIN_DIR: &str = "/sys/fs/bpf/rocev2";

pub const MAX_ROUTES_V4: u32 = 131_072;
pub const MAX_ROUTES_V6: u32 = 131_072;
pub const MAX_GROUPS: u32 = 256;
pub const MAX_MEMBERS_PER_GROUP: u32 = 128;
/// Two banks per group so a membership change is written to the idle bank
/// and published with one group-entry update.
pub const MEMBER_BANKS: u32 = 2;
pub const MAX_MEMBERS: u32 = MAX_GROUPS * MAX_MEMBERS_PER_GROUP * MEMBER_BANKS;
/// Port slots for counters; slot 0 collects frames from interfaces the
/// control program did not register (should stay at zero).
pub const MAX_PORTS: u32 = 64;
pub const PORT_COUNTER_ENTRIES: u32 = MAX_PORTS * PortCounter::COUNT;
pub const MEMBER_STAT_ENTRIES: u32 = MAX_GROUPS * MAX_MEMBERS_PER_GROUP;
pub const MAX_EGRESS_DEVS: u32 = 1024;

/// Route target that means "one of this box's own addresses": hand to the kernel.
pub const ROUTE_LOCAL: u32 = u32::MAX;

/// Index into PORT_COUNTERS for `counter` on port `slot`.
#[inline(always)]
pub const fn port_counter_index(slot: u32, counter: PortCounter) -> u32 {
    slot * PortCounter::COUNT + counter as u32
}

/// Index into MEMBERS for member `position` of `group` in `bank`.
#[inline(always)]
pub const fn member_index(group: u32, bank: u32, position: u32) -> u32 {
    (group * MEMBER_BANKS + bank) * MAX_MEMBERS_PER_GROUP + position
}

/// Index into MEMBER_STATS: stable across bank switches.
#[inline(always)]
pub const fn member_stat_index(group: u32, position: u32) -> u32 {
    group * MAX_MEMBERS_PER_GROUP + position
}

/// LPM trie key data (the prefix length travels in aya's `Key` wrapper).
pub type RouteKeyV4 = [u8; 4];
pub type RouteKeyV6 = [u8; 16];

/// Value of ROUTES_V4 / ROUTES_V6: a group index, or [`ROUTE_LOCAL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteEntry {
    pub group: u32,
}

/// Value of GROUPS, indexed by group number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupEntry {
    /// Members in the active bank; 0 means the group is unusable.
    pub member_count: u32,
    /// Which of the two member banks is live.
    pub bank: u32,
    /// A [`crate::hash::HashMode`] as u32.
    pub hash_mode: u32,
    pub _reserved: u32,
}

/// Member flag: the member may be chosen.
pub const MEMBER_UP: u32 = 1;

/// Value of MEMBERS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberEntry {
    /// Egress interface; also the EGRESS_DEVS key.
    pub ifindex: u32,
    pub flags: u32,
    /// Source MAC written on egress (the egress port's own address).
    pub src_mac: [u8; 6],
    /// Destination MAC: the next hop's address.
    pub dst_mac: [u8; 6],
}

/// Value of PORTS, keyed by ingress ifindex.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortEntry {
    /// Counter slot, 1..MAX_PORTS.
    pub slot: u32,
    pub _reserved: u32,
}

/// Value of CONFIG[0]: settings the control program may change at run time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataplaneConfig {
    pub hash_seed: u32,
    pub _reserved: u32,
}

/// Value of MEMBER_STATS (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub packets: u64,
    pub bytes: u64,
}

const _: () = {
    assert!(core::mem::size_of::<RouteEntry>() == 4);
    assert!(core::mem::size_of::<GroupEntry>() == 16);
    assert!(core::mem::size_of::<MemberEntry>() == 20);
    assert!(core::mem::size_of::<PortEntry>() == 8);
    assert!(core::mem::size_of::<DataplaneConfig>() == 8);
    assert!(core::mem::size_of::<MemberStats>() == 16);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for RouteEntry {}
    unsafe impl aya::Pod for GroupEntry {}
    unsafe impl aya::Pod for MemberEntry {}
    unsafe impl aya::Pod for PortEntry {}
    unsafe impl aya::Pod for DataplaneConfig {}
    unsafe impl aya::Pod for MemberStats {}
}
