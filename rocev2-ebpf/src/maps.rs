//! Every map the programs use. Names, sizes and value types come from
//! rocev2_common::maps so userspace sees exactly the same layout.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, CpuMap, DevMap, DevMapHash, HashMap, LpmTrie, LruHashMap, PerCpuArray},
};
use rocev2_common::{
    class::{ClassEntry, MAX_CLASSES},
    ecn::{EcnProfile, EgressEntry, VirtualQueue},
    flowlet::{FlowletEntry, FlowletSlot},
    hash::FlowKey,
    maps::*,
};

#[map]
pub static ROUTES_V4: LpmTrie<RouteKeyV4, RouteEntry> = LpmTrie::with_max_entries(MAX_ROUTES_V4, 0);

#[map]
pub static ROUTES_V6: LpmTrie<RouteKeyV6, RouteEntry> = LpmTrie::with_max_entries(MAX_ROUTES_V6, 0);

/// Per-CPU destination cache in front of ROUTES_V4/ROUTES_V6 (see
/// RouteCacheEntry); per CPU so it needs no locking.
#[map]
pub static ROUTE_CACHE: PerCpuArray<RouteCacheEntry> = PerCpuArray::with_max_entries(ROUTE_CACHE_SLOTS, 0);

#[map]
pub static GROUPS: Array<GroupEntry> = Array::with_max_entries(MAX_GROUPS, 0);

#[map]
pub static MEMBERS: Array<MemberEntry> = Array::with_max_entries(MAX_MEMBERS, 0);

/// Bucket tables (rocev2_common::buckets): the flow hash picks a bucket,
/// the bucket names the member position.
#[map]
pub static BUCKETS: Array<rocev2_common::buckets::BucketTable> = Array::with_max_entries(BUCKET_TABLES, 0);

/// Ports with an ifindex of MAX_DIRECT_IFINDEX or more (see port_slot).
#[map]
pub static PORTS: HashMap<u32, PortEntry> = HashMap::with_max_entries(MAX_PORTS, 0);

/// Redirect targets by ifindex (see redirect.rs): below
/// MAX_DIRECT_IFINDEX in EGRESS_DEVS_DIRECT, the others here.
#[map]
pub static EGRESS_DEVS: DevMapHash = DevMapHash::with_max_entries(MAX_EGRESS_DEVS, 0);

#[map]
pub static EGRESS_DEVS_DIRECT: DevMap = DevMap::with_max_entries(MAX_DIRECT_IFINDEX, 0);

#[map]
pub static CONFIG: Array<DataplaneConfig> = Array::with_max_entries(1, 0);

#[map]
pub static PORT_COUNTERS: PerCpuArray<PortCounters> = PerCpuArray::with_max_entries(PORT_COUNTER_ENTRIES, 0);

#[map]
pub static MEMBER_STATS: PerCpuArray<MemberStats> = PerCpuArray::with_max_entries(MEMBER_STAT_ENTRIES, 0);

/// Per-flow flowlet state; LRU so a full table evicts the stalest flows
/// instead of refusing new ones. Its size is set at load time.
#[map]
pub static FLOWLETS: LruHashMap<FlowletKey, FlowletEntry> = LruHashMap::with_max_entries(DEFAULT_FLOWLET_TABLE_SIZE, 0);

#[map]
pub static PINS_V4: LpmTrie<PinKeyV4, PinEntry> = LpmTrie::with_max_entries(MAX_PINS, 0);

#[map]
pub static PINS_V6: LpmTrie<PinKeyV6, PinEntry> = LpmTrie::with_max_entries(MAX_PINS, 0);

/// Egress ports with an ifindex of MAX_DIRECT_IFINDEX or more; the others
/// are in EGRESS_BY_SLOT through IFINDEX_SLOTS.
#[map]
pub static EGRESS: HashMap<u32, EgressEntry> = HashMap::with_max_entries(MAX_EGRESS_PORTS, 0);

#[map]
pub static EGRESS_BY_SLOT: Array<EgressEntry> = Array::with_max_entries(MAX_EGRESS_PORTS, 0);

/// Port and egress slots by ifindex: an array index per packet instead of
/// two hash lookups.
#[map]
pub static IFINDEX_SLOTS: Array<IfindexSlots> = Array::with_max_entries(MAX_DIRECT_IFINDEX, 0);

/// Counter slot of the ingress port; 0 for ports the control program did
/// not register.
#[inline(always)]
pub fn port_slot(ifindex: u32) -> u32 {
    if ifindex < MAX_DIRECT_IFINDEX {
        return IFINDEX_SLOTS.get(ifindex).map_or(0, |s| s.port_slot);
    }
    // SAFETY: the value is only read, and entries are plain data.
    unsafe { PORTS.get(ifindex) }.map_or(0, |p| p.slot)
}

/// The egress port's virtual queue settings, if it has one.
#[inline(always)]
pub fn egress_entry(ifindex: u32) -> Option<&'static EgressEntry> {
    if ifindex < MAX_DIRECT_IFINDEX {
        let slot = IFINDEX_SLOTS.get(ifindex)?.egress;
        return if slot == 0 { None } else { EGRESS_BY_SLOT.get(slot - 1) };
    }
    // SAFETY: as above.
    unsafe { EGRESS.get(ifindex) }
}

/// Shared across CPUs on purpose: one virtual queue per egress port.
#[map]
pub static VQUEUES: Array<VirtualQueue> = Array::with_max_entries(MAX_EGRESS_PORTS, 0);

#[map]
pub static ECN_PROFILES: Array<EcnProfile> = Array::with_max_entries(MAX_ECN_PROFILES, 0);

#[map]
pub static CLASSES: Array<ClassEntry> = Array::with_max_entries(MAX_CLASSES, 0);

#[map]
pub static CLASS_STATS: PerCpuArray<MemberStats> = PerCpuArray::with_max_entries(MAX_CLASSES, 0);

#[map]
pub static EGRESS_COUNTERS: PerCpuArray<EgressCounters> = PerCpuArray::with_max_entries(EGRESS_COUNTER_ENTRIES, 0);

/// Per-CPU scratch space for the flowlet table's key and new entry: they
/// would not fit the 512-byte BPF stack next to the rest of the pipeline.
#[repr(C)]
pub struct FlowletScratch {
    pub key: FlowletKey,
    pub _pad: u32,
    pub entry: FlowletEntry,
}

/// Keyless flowlet tables: one slot array shared by every keyless group
/// (each group indexes it with its own mask and a group-seeded hash).
/// Sized at load to the largest keyless table.
#[map]
pub static FLOWLET_SLOTS: Array<FlowletSlot> = Array::with_max_entries(1, 0);

#[map]
pub static FLOWLET_SCRATCH: PerCpuArray<FlowletScratch> = PerCpuArray::with_max_entries(1, 0);

/// The packet's flow key, built here rather than on the stack: the
/// forwarding call chain runs close to the verifier's 512 bytes, and the
/// key's 44 bytes are better spent on the member choice's frame. Per CPU:
/// one program run at a time uses it.
#[map]
pub static FLOW_KEY: PerCpuArray<FlowKey> = PerCpuArray::with_max_entries(1, 0);

/// CPUs the spreading stage (`cpu_spread`) hands flows to; each entry
/// runs `rocev2_xdp_cpu` on its CPU.
#[map]
pub static CPUS: CpuMap = CpuMap::with_max_entries(MAX_SPREAD_CPUS, 0);

/// Host bridge mode: the Linux bridge's forwarding database as the control
/// program mirrors it (learned, static and local entries, plus the MACs of
/// uplink groups). Not preallocated: a box without a `[bridge]` pays no
/// memory for it, and the program only reads and marks existing entries.
#[map]
pub static FDB: HashMap<FdbKey, FdbEntry> = HashMap::with_max_entries(MAX_FDB_ENTRIES, BPF_F_NO_PREALLOC);

/// Host bridge mode: each bridge port's STP state and uplink group, by
/// port counter slot (the slot the packet's counters use anyway).
#[map]
pub static BRIDGE_PORTS: Array<BridgePort> = Array::with_max_entries(MAX_PORTS, 0);

/// Host bridge mode: per-CPU cache in front of the two FDB lookups of a
/// frame (see FdbCacheEntry); per CPU so it needs no locking.
#[map]
pub static FDB_CACHE: PerCpuArray<FdbCacheEntry> = PerCpuArray::with_max_entries(FDB_CACHE_SLOTS, 0);
