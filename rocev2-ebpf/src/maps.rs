//! Every map the programs use. Names, sizes and value types come from
//! rocev2_common::maps so userspace sees exactly the same layout.

use aya_ebpf::{
    macros::map,
    maps::{Array, DevMapHash, HashMap, LpmTrie, PerCpuArray},
};
use rocev2_common::maps::*;

#[map]
pub static ROUTES_V4: LpmTrie<RouteKeyV4, RouteEntry> = LpmTrie::with_max_entries(MAX_ROUTES_V4, 0);

#[map]
pub static ROUTES_V6: LpmTrie<RouteKeyV6, RouteEntry> = LpmTrie::with_max_entries(MAX_ROUTES_V6, 0);

#[map]
pub static GROUPS: Array<GroupEntry> = Array::with_max_entries(MAX_GROUPS, 0);

#[map]
pub static MEMBERS: Array<MemberEntry> = Array::with_max_entries(MAX_MEMBERS, 0);

#[map]
pub static PORTS: HashMap<u32, PortEntry> = HashMap::with_max_entries(MAX_PORTS, 0);

#[map]
pub static EGRESS_DEVS: DevMapHash = DevMapHash::with_max_entries(MAX_EGRESS_DEVS, 0);

#[map]
pub static CONFIG: Array<DataplaneConfig> = Array::with_max_entries(1, 0);

#[map]
pub static PORT_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PORT_COUNTER_ENTRIES, 0);

#[map]
pub static MEMBER_STATS: PerCpuArray<MemberStats> =
    PerCpuArray::with_max_entries(MEMBER_STAT_ENTRIES, 0);
