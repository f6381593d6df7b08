//! Map names, sizes and value types shared by the eBPF program and userspace.

use crate::counters::PortCounter;
pub use crate::counters::{EgressCounters, PortCounters};

/// Entries of the lab fault injector's drop table.
pub const MAX_FAULTS: u32 = 1024;

/// A fault table value: this bit set corrupts the packet (flips its last
/// byte before the ICRC) instead of dropping it; the bits below count the
/// times still to come.
pub const FAULT_CORRUPT: u32 = 1 << 31;
pub const FAULT_COUNT_MASK: u32 = FAULT_CORRUPT - 1;

/// Key of the fault injector's drop table: DestQP and PSN.
pub const fn fault_key(dest_qp: u32, psn: u32) -> u64 {
    ((dest_qp as u64) << 32) | psn as u64
}

/// How `rocev2 run` pins a map under its `pin_dir`, where `stats`, `top`,
/// `trace`, `explain` and the next run find it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pin {
    Always,
    /// Only with per-QP telemetry on (`telemetry_qps`).
    WithTelemetry,
    /// Never: per-packet scratch, or program references that live with
    /// the programs.
    Never,
}

/// What becomes of a map's contents when a new `rocev2 run` takes over
/// from one that handed over (SIGUSR1, `rocev2 upgrade`) or crashed: the
/// new run makes every map afresh and replaces the old pins, then swaps
/// its programs into the pinned links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// Written again from the config and the kernel before the new
    /// programs take over: nothing is lost.
    Refilled,
    /// Starts empty: counters from zero, flows and QPs are seen anew.
    Fresh,
    /// The very same map goes on in the new run (the loader pins it and
    /// the new programs use the pinned one), when the new config sizes it
    /// the same; else it starts empty.
    Kept,
    /// Holds nothing across packets.
    Scratch,
}

/// A BPF map type, numbered as the kernel's `bpf_map_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum MapKind {
    HashMap = 1,
    Array = 2,
    PerCpuHashMap = 5,
    PerCpuArray = 6,
    LruHashMap = 9,
    LpmTrie = 11,
    DevMap = 14,
    CpuMap = 16,
    DevMapHash = 25,
    RingBuf = 27,
}

/// One map of the forwarding object (the one `rocev2 run` loads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub name: &'static str,
    pub kind: MapKind,
    pub pin: Pin,
    pub takeover: Takeover,
    /// What it holds and what sizes it, in a few words (the benchmark's
    /// memory report names the largest maps with it).
    pub holds: &'static str,
}

/// The table of the forwarding object's maps: the one list their names,
/// types, pins, takeover behaviour and memory report come from (the
/// programs define them in rocev2-ebpf; a test checks the object against
/// this table, name and type).
macro_rules! maps {
    (
        forwarding { $($name:ident: $kind:ident, pin $pin:ident, $takeover:ident, $holds:literal;)* }
        others { $($(#[$doc:meta])* $other:ident;)* }
    ) => {
        /// Map names as they appear in the object files and under the pin
        /// directory.
        pub mod names {
            $(pub const $name: &str = stringify!($name);)*
            $($(#[$doc])* pub const $other: &str = stringify!($other);)*
        }

        /// Every map of the forwarding object.
        pub const MAPS: &[MapSpec] = &[$(MapSpec {
            name: names::$name,
            kind: MapKind::$kind,
            pin: Pin::$pin,
            takeover: Takeover::$takeover,
            holds: $holds,
        },)*];
    };
}

maps! {
    forwarding {
        ROUTES_V4: LpmTrie, pin Always, Refilled, "IPv4 routes (MAX_ROUTES_V4)";
        ROUTES_V6: LpmTrie, pin Always, Refilled, "IPv6 routes (MAX_ROUTES_V6)";
        ROUTE_CACHE: PerCpuArray, pin Always, Fresh, "recent route lookups per CPU (ROUTE_CACHE_SLOTS)";
        GROUPS: Array, pin Always, Refilled, "group entries: policy, bank, generation (MAX_GROUPS)";
        MEMBERS: Array, pin Always, Refilled, "members of both banks of every group";
        BUCKETS: Array, pin Always, Refilled, "bucket tables of both banks of every group";
        PORTS: HashMap, pin Always, Refilled, "ingress ports with an ifindex of 16,384 or more";
        EGRESS_DEVS: DevMapHash, pin Always, Refilled, "redirect targets with an ifindex of 16,384 or more";
        EGRESS_DEVS_DIRECT: DevMap, pin Always, Refilled, "redirect targets by ifindex (MAX_DIRECT_IFINDEX)";
        CONFIG: Array, pin Always, Refilled, "the hash seed, route generation and spreading";
        PORT_COUNTERS: PerCpuArray, pin Always, Fresh, "every port's counters per CPU";
        MEMBER_STATS: PerCpuArray, pin Always, Fresh, "every member's packets and bytes per CPU";
        FLOWLETS: LruHashMap, pin Always, Kept, "keyed flowlet state per flow (flowlet_table_size)";
        FLOWLET_SLOTS: Array, pin Always, Kept, "keyless flowlet slots (flowlet_table_size)";
        FLOWLET_SCRATCH: PerCpuArray, pin Never, Scratch, "a packet's flowlet step";
        FLOW_KEY: PerCpuArray, pin Never, Scratch, "a packet's flow key";
        PINS_V4: LpmTrie, pin Always, Refilled, "IPv4 pins (MAX_PINS)";
        PINS_V6: LpmTrie, pin Always, Refilled, "IPv6 pins (MAX_PINS)";
        EGRESS: HashMap, pin Always, Refilled, "egress queues of ports with an ifindex of 16,384 or more";
        EGRESS_BY_SLOT: Array, pin Always, Refilled, "egress queue settings by slot (MAX_EGRESS_PORTS)";
        IFINDEX_SLOTS: Array, pin Always, Refilled, "port and egress slots by ifindex (MAX_DIRECT_IFINDEX)";
        VQUEUES: Array, pin Always, Fresh, "virtual queue depths (MAX_EGRESS_PORTS)";
        ECN_PROFILES: Array, pin Always, Refilled, "ECN marking profiles (MAX_ECN_PROFILES)";
        CLASSES: Array, pin Always, Refilled, "priority classes (MAX_CLASSES)";
        CLASS_STATS: PerCpuArray, pin Always, Fresh, "every class's packets and bytes per CPU";
        EGRESS_COUNTERS: PerCpuArray, pin Always, Fresh, "every egress port's counters per CPU";
        EGRESS_REFUSED: PerCpuHashMap, pin Always, Fresh, "frames an egress device refused after a redirect, by ifindex";
        CPUS: CpuMap, pin Never, Scratch, "the CPUs `cpu_spread` hands packets to";
        QP_TELEMETRY: Array, pin WithTelemetry, Fresh, "per-QP transport telemetry (twice telemetry_qps, a power of two)";
        QP_REPLIES: LruHashMap, pin WithTelemetry, Fresh, "replies to the data QP they answer (telemetry_qps)";
        MEMBER_TRANSPORT: PerCpuArray, pin WithTelemetry, Fresh, "every member's transport sums per CPU";
        TRACE_FILTER: Array, pin WithTelemetry, Fresh, "what `rocev2 trace` follows";
        TRACE_EVENTS: RingBuf, pin WithTelemetry, Fresh, "`rocev2 trace`'s events";
        TELEMETRY_SCRATCH: PerCpuArray, pin Never, Scratch, "a packet's telemetry step";
        FDB: HashMap, pin Always, Refilled, "host bridge mode: the mirrored forwarding database (MAX_FDB_ENTRIES)";
        BRIDGE_PORTS: Array, pin Always, Refilled, "host bridge mode: the bridge's ports and their STP state (MAX_PORTS)";
        FDB_CACHE: PerCpuArray, pin Never, Fresh, "host bridge mode: recent FDB decisions per CPU (FDB_CACHE_SLOTS); nothing outside the programs reads it";
    }
    others {
        /// The tools object's maps (rocev2-tools; never pinned).
        GEN_REWRITE;
        FAULT_DROPS;
    }
}

/// The table's entry for a map of the forwarding object as the kernel
/// names it (it keeps the first 15 characters of a name).
pub fn spec_of(kernel_name: &str) -> Option<&'static MapSpec> {
    const KEPT: usize = 15;
    MAPS.iter().find(|m| m.name == kernel_name || (kernel_name.len() == KEPT && m.name.starts_with(kernel_name)))
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
/// Entries of BUCKETS: one bucket table per group and bank.
pub const BUCKET_TABLES: u32 = MAX_GROUPS * MEMBER_BANKS;
/// Port slots for counters; slot 0 collects frames from interfaces the
/// control program did not register (should stay at zero).
pub const MAX_PORTS: u32 = 64;
/// Entries of CPUS: the CPUs the spreading stage can use.
pub const MAX_SPREAD_CPUS: u32 = 64;
/// Entries of PORT_COUNTERS: one [`PortCounters`] block per port slot.
pub const PORT_COUNTER_ENTRIES: u32 = MAX_PORTS;
pub const MEMBER_STAT_ENTRIES: u32 = MAX_GROUPS * MAX_MEMBERS_PER_GROUP;
pub const MAX_EGRESS_DEVS: u32 = 1024;
/// Egress ports with a virtual queue and egress counters.
pub const MAX_EGRESS_PORTS: u32 = 64;
/// Entries of EGRESS_COUNTERS: one [`EgressCounters`] block per egress slot.
pub const EGRESS_COUNTER_ENTRIES: u32 = MAX_EGRESS_PORTS;
pub const MAX_ECN_PROFILES: u32 = 16;
/// Interfaces with an ifindex below this are found per packet by array
/// index (IFINDEX_SLOTS); the rare larger ifindex (a host that has created
/// many interfaces) by the PORTS and EGRESS hash maps, about 20 ns slower.
pub const MAX_DIRECT_IFINDEX: u32 = 16_384;
/// Default size of the flowlet LRU table (set at load time from the config).
pub const DEFAULT_FLOWLET_TABLE_SIZE: u32 = 65_536;
pub const MAX_PINS: u32 = 65_536;

/// Route target that means "one of this box's own addresses": hand to the kernel.
pub const ROUTE_LOCAL: u32 = u32::MAX;

/// Route target that means "the kernel serves this prefix" (a learned
/// route rocev2 cannot or should not forward itself).
pub const ROUTE_KERNEL: u32 = u32::MAX - 2;

/// Slots per CPU of the destination cache in front of the route tries.
pub const ROUTE_CACHE_SLOTS: u32 = 256;
/// A cached "no route" (distinct from ROUTE_LOCAL and every group index).
pub const CACHED_NO_ROUTE: u32 = u32::MAX - 1;

/// One slot of ROUTE_CACHE: the route lookup result for one destination,
/// valid while CONFIG's route_generation still equals `route_generation`.
/// An LPM trie lookup costs tens of ns (more with 100,000 routes, whose
/// nodes are cache misses) and a rack's RoCE traffic goes to few
/// destinations, so most packets skip it. Direct-mapped: a destination
/// that collides simply replaces the slot, so random destinations cost one
/// failed compare, never memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteCacheEntry {
    /// The destination address words as FlowKey stores them (IPv4: word 0).
    pub dst: [u32; 4],
    pub route_generation: u32,
    /// 4 or 6; 0 = empty.
    pub family: u32,
    /// Group index, ROUTE_LOCAL or CACHED_NO_ROUTE.
    pub target: u32,
    pub _pad: u32,
}

/// The cache slot of a destination (Fibonacci hashing of the folded words).
#[inline(always)]
pub fn route_cache_slot(dst: &[u32; 4]) -> u32 {
    (dst[0] ^ dst[1] ^ dst[2] ^ dst[3]).wrapping_mul(0x9E37_79B1) >> 24
}

impl RouteCacheEntry {
    /// The route target of `dst` (family 4 or 6): this slot's when it
    /// holds `dst` from route generation `generation`, else `lookup`'s
    /// (the LPM trie; [`CACHED_NO_ROUTE`] for none), which then fills the
    /// slot. The pipeline's per-CPU cache and the bench's primitive of it.
    #[inline(always)]
    pub fn cached_target(
        &mut self,
        family: u32,
        generation: u32,
        dst: &[u32; 4],
        lookup: impl FnOnce() -> Option<u32>,
    ) -> u32 {
        if self.family == family && self.route_generation == generation && self.dst == *dst {
            return self.target;
        }
        let target = lookup().unwrap_or(CACHED_NO_ROUTE);
        self.dst = *dst;
        self.route_generation = generation;
        self.family = family;
        self.target = target;
        target
    }
}

/// What a route target tells the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteTarget {
    Group(u32),
    /// No route ([`CACHED_NO_ROUTE`]).
    NoRoute,
    /// One of this box's own addresses ([`ROUTE_LOCAL`]).
    Local,
    /// A prefix the kernel serves ([`ROUTE_KERNEL`]).
    Kernel,
}

/// A route target (a ROUTES_V4/V6 value or a cached one) by what it means.
#[inline(always)]
pub fn route_target(target: u32) -> RouteTarget {
    match target {
        CACHED_NO_ROUTE => RouteTarget::NoRoute,
        ROUTE_LOCAL => RouteTarget::Local,
        ROUTE_KERNEL => RouteTarget::Kernel,
        group => RouteTarget::Group(group),
    }
}

/// Index into MEMBERS for member `position` of `group` in `bank`.
#[inline(always)]
pub const fn member_index(group: u32, bank: u32, position: u32) -> u32 {
    (group * MEMBER_BANKS + bank) * MAX_MEMBERS_PER_GROUP + position
}

/// Index into BUCKETS: the bucket table of `group` in `bank` (each bank
/// of members has its own table, published with it).
#[inline(always)]
pub const fn bucket_table_index(group: u32, bank: u32) -> u32 {
    group * MEMBER_BANKS + bank
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

/// Group policies: how a member is chosen.
pub const POLICY_HASH: u32 = 0;
/// Flowlet switching: a flow moves only after an idle gap.
pub const POLICY_FLOWLET: u32 = 1;
/// Pinned paths per (destination, DestQP), hashing (`qp`) otherwise.
pub const POLICY_PINNED: u32 = 2;

/// Flowlet flag: move a flow only right after a packet that ended a message.
pub const FLOWLET_AT_BOUNDARY: u32 = 1;
/// Flowlet flag: an ACK of a QP's highest data PSN (nothing in flight) ends
/// the flow's flowlet, so its next packet may move without an idle gap
/// (`transport_aware = { repick = "idle-or-acked" }`).
pub const FLOWLET_REPICK_ACKED: u32 = 2;
/// Flowlet flag: the group keeps flowlet state in the keyless slot array
/// (FLOWLET_SLOTS, indexed by a hash of the flow masked with
/// `flowlet_slot_mask`) instead of the keyed LRU table.
pub const FLOWLET_KEYLESS: u32 = 4;
/// Default slot count of a keyless flowlet table.
pub const DEFAULT_FLOWLET_SLOTS: u32 = 4096;
/// Largest keyless flowlet table (slots).
pub const MAX_FLOWLET_SLOTS: u32 = 1 << 20;

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
    /// POLICY_HASH, POLICY_FLOWLET or POLICY_PINNED.
    pub policy: u32,
    /// Changes with every publish; flowlet and pin state from an older
    /// generation is not trusted (positions may name other members now).
    pub generation: u32,
    /// A [`crate::flowlet::FlowletChoice`] as u32.
    pub flowlet_choice: u32,
    pub flowlet_flags: u32,
    /// Keyless groups: slot count - 1 (a power of two minus one).
    pub flowlet_slot_mask: u32,
    pub flowlet_gap_ns: u64,
}

impl GroupEntry {
    /// Whether the pipeline may choose among its members: some, and no
    /// more than a group holds (a half-published entry is neither).
    #[inline(always)]
    pub fn usable(&self) -> bool {
        self.member_count != 0 && self.member_count <= MAX_MEMBERS_PER_GROUP
    }

    /// The group's flowlet settings, as a packet's decision reads them
    /// (the keyed and keyless tables alike).
    #[inline(always)]
    pub fn flowlet_rules(&self) -> crate::flowlet::FlowletRules {
        crate::flowlet::FlowletRules {
            gap_ns: self.flowlet_gap_ns,
            generation: self.generation,
            member_count: self.member_count,
            require_boundary: self.flowlet_flags & FLOWLET_AT_BOUNDARY != 0,
        }
    }
}

/// Key of FLOWLETS: the flow (five-tuple + DestQP) within its group.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowletKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub ports: u32,
    /// Protocol in the top byte, DestQP in the low 24 bits.
    pub proto_qp: u32,
    pub group: u32,
}

impl FlowletKey {
    #[inline(always)]
    pub fn new(k: &crate::hash::FlowKey, group: u32) -> Self {
        Self {
            src: k.src,
            dst: k.dst,
            ports: crate::hash::ports_word(k),
            proto_qp: crate::hash::protocol_qp_word(k.protocol, k.dest_qp),
            group,
        }
    }
}

/// LPM key data of PINS_V4: DestQP (big endian, matched in full) then the
/// destination address, so prefix length = 32 + address prefix length.
pub type PinKeyV4 = [u8; 8];
pub type PinKeyV6 = [u8; 20];

/// Value of PINS_V4 / PINS_V6.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinEntry {
    pub group: u32,
    /// Live position of the pinned member; PIN_MEMBER_DOWN when it is not usable.
    pub position: u32,
    /// Group generation the position belongs to.
    pub generation: u32,
    pub _reserved: u32,
}

pub const PIN_MEMBER_DOWN: u32 = u32::MAX;

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

impl MemberEntry {
    /// Whether the member may be chosen ([`MEMBER_UP`]).
    #[inline(always)]
    pub fn up(&self) -> bool {
        self.flags & MEMBER_UP != 0
    }
}

/// Value of PORTS, keyed by ingress ifindex.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortEntry {
    /// Counter slot, 1..MAX_PORTS.
    pub slot: u32,
    pub _reserved: u32,
}

/// Value of IFINDEX_SLOTS, indexed by ifindex: where an interface's port
/// counters and egress queue live.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfindexSlots {
    /// Port counter slot as in PortEntry; 0 = not a registered port.
    pub port_slot: u32,
    /// Egress slot + 1 (index into EGRESS_BY_SLOT); 0 = no virtual queue.
    pub egress: u32,
}

/// Value of `CONFIG[0]`: settings the control program may change at run time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataplaneConfig {
    pub hash_seed: u32,
    /// Live entries of CLASSES, in match order.
    pub class_count: u32,
    /// Bumped by the control program after every route table change; a
    /// ROUTE_CACHE slot from an older generation is ignored.
    pub route_generation: u32,
    /// CPUs in CPUS that the spreading stage (`cpu_spread`) hands flows
    /// to; 0 when it is off.
    pub spread_cpus: u32,
    /// The [`crate::hash::HashVersion`] number groups and the spreading
    /// stage hash with; read by [`crate::hash::HashVersion::from_config`]
    /// (0, a CONFIG that never set it, is version 1).
    pub hash_version: u32,
    /// Bumped by the control program after every change of FDB or
    /// BRIDGE_PORTS (and after it clears FDB activity bits); an FDB_CACHE
    /// slot from an older generation is ignored.
    pub fdb_generation: u32,
}

/// Entries FDB holds at most (allocated as they are added).
pub const MAX_FDB_ENTRIES: u32 = 65_536;

/// FDB entry kinds: where a frame to this MAC goes.
/// To the one bridge port the kernel's FDB names (`target` = its ifindex).
pub const FDB_PORT: u32 = 1;
/// To a member of an uplink group (`target` = the group's slot): a MAC
/// reachable through every port of the group.
pub const FDB_UPLINK: u32 = 2;
/// One of the bridge's own MACs (or a port's): the frame is for this box.
pub const FDB_LOCAL: u32 = 3;
/// A MAC the kernel bridge knows on a port rocev2 does not send to (not in
/// STP forwarding state, down, isolated or locked): the kernel decides.
pub const FDB_KERNEL: u32 = 4;

/// Key of FDB: a MAC address and its VLAN. Without VLAN filtering (all
/// this kernel's bridge offers) every entry and every lookup uses VLAN 0;
/// a VLAN-aware bridge would key by the frame's VID (or the port's PVID).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FdbKey {
    pub mac: [u8; 6],
    pub vlan: u16,
}

/// Value of FDB.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdbEntry {
    /// FDB_PORT, FDB_UPLINK, FDB_LOCAL or FDB_KERNEL.
    pub kind: u32,
    /// FDB_PORT: the port's ifindex; FDB_UPLINK: the uplink group's slot.
    pub target: u32,
    /// FDB_PORT: the port's counter slot. A frame *from* this MAC must
    /// arrive on that slot (else the kernel sees it and learns the move).
    pub port_slot: u32,
    /// Set by the XDP program when a frame from this MAC arrives on its
    /// port (the first such frame of each FDB_CACHE generation: clearing
    /// the bits bumps it); the control program refreshes the kernel's ageing of such
    /// entries (frames forwarded in XDP never reach the kernel bridge) and
    /// clears it. A hit bit, as switch ASICs keep for their FDBs.
    pub active: u32,
}

/// BRIDGE_PORTS flag: the port is in STP forwarding state, up, and
/// served by rocev2.
pub const BRIDGE_PORT_FORWARDING: u32 = 1;

/// Value of BRIDGE_PORTS, indexed by port counter slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BridgePort {
    pub flags: u32,
    /// The slot + 1 of the uplink group this port belongs to (0: none). A
    /// frame from one of that group's MACs may arrive on any of its ports.
    pub uplink: u32,
}

/// Slots per CPU of the cache in front of the bridge program's two FDB
/// lookups.
pub const FDB_CACHE_SLOTS: u32 = 256;

/// One slot of FDB_CACHE: where a frame from `src` to `dst` arriving on
/// port slot `port_slot` goes (an FDB entry's kind and target, once the
/// source was found learned there), valid while CONFIG's fdb_generation
/// still equals `fdb_generation`. The FDB is a hash map: its two lookups
/// per frame (destination, then source) cost more than the whole member
/// choice, and a bridge port's traffic is between few MAC pairs.
/// Direct-mapped as ROUTE_CACHE: a colliding pair replaces the slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdbCacheEntry {
    /// The frame's first 12 bytes (destination, then source MAC) as three
    /// words ([`frame_mac_words`]), so a hit is three word compares.
    pub macs: [u32; 3],
    pub port_slot: u32,
    pub fdb_generation: u32,
    /// FDB_PORT or FDB_UPLINK; 0 = empty.
    pub kind: u32,
    /// As FdbEntry's target.
    pub target: u32,
}

/// A frame's destination and source MACs as the three little-endian words
/// its first 12 bytes hold (what the bridge program loads: three word
/// loads instead of twelve byte loads).
#[inline(always)]
pub fn frame_mac_words(dst: &[u8; 6], src: &[u8; 6]) -> [u32; 3] {
    [
        u32::from_le_bytes([dst[0], dst[1], dst[2], dst[3]]),
        u32::from_le_bytes([dst[4], dst[5], src[0], src[1]]),
        u32::from_le_bytes([src[2], src[3], src[4], src[5]]),
    ]
}

/// The FDB keys (VLAN 0) of the destination and the source MAC of a
/// frame's [`frame_mac_words`], as the little-endian u64 an [`FdbKey`] is.
#[inline(always)]
pub fn fdb_key_words(macs: &[u32; 3]) -> (u64, u64) {
    let dst = u64::from(macs[0]) | (u64::from(macs[1] & 0xFFFF) << 32);
    let src = u64::from(macs[1] >> 16) | (u64::from(macs[2]) << 16);
    (dst, src)
}

/// The FDB_CACHE slot of a frame (Fibonacci hashing of the folded MACs'
/// low four bytes and the ingress port slot), from its [`frame_mac_words`].
#[inline(always)]
pub fn fdb_cache_slot(macs: &[u32; 3], port_slot: u32) -> u32 {
    let dst_low = (macs[0] >> 16) | (macs[1] << 16);
    let src_low = macs[2];
    (dst_low ^ src_low.rotate_left(16) ^ port_slot).wrapping_mul(0x9E37_79B1) >> 24
}

/// The `group` of a frame bridged to the one port its FDB entry names:
/// past every group slot, so per-member counters and telemetry sums (whose
/// maps are indexed by group) leave it out.
pub const BRIDGE_PORT_GROUP: u32 = MAX_GROUPS;

/// Value of `GEN_REWRITE[0]`: what the traffic generator's XDP_TX program
/// restores in every frame before sending it. Live frames come from a page
/// pool that the kernel recycles as is, so without this a frame's second
/// trip would carry the MACs and TTL a forwarder wrote on its first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenRewrite {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    /// IPv4 TTL / IPv6 hop limit to send with.
    pub ttl: u8,
    /// 0: leave frames alone.
    pub enabled: u8,
    pub _reserved: [u8; 2],
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
    assert!(core::mem::size_of::<GroupEntry>() == 40);
    assert!(core::mem::size_of::<FlowletKey>() == 44);
    assert!(core::mem::size_of::<PinEntry>() == 16);
    assert!(core::mem::size_of::<GenRewrite>() == 16);
    assert!(core::mem::size_of::<MemberEntry>() == 20);
    assert!(core::mem::size_of::<PortEntry>() == 8);
    assert!(core::mem::size_of::<IfindexSlots>() == 8);
    assert!(core::mem::size_of::<DataplaneConfig>() == 24);
    assert!(core::mem::size_of::<RouteCacheEntry>() == 32);
    assert!(ROUTE_CACHE_SLOTS == 256, "route_cache_slot keeps 8 bits");
    assert!(core::mem::size_of::<MemberStats>() == 16);
    assert!(core::mem::size_of::<FdbKey>() == 8);
    assert!(core::mem::size_of::<FdbEntry>() == 16);
    assert!(core::mem::size_of::<BridgePort>() == 8);
    assert!(core::mem::size_of::<FdbCacheEntry>() == 28);
    assert!(FDB_CACHE_SLOTS == 256, "fdb_cache_slot keeps 8 bits");
    assert!(member_stat_index(BRIDGE_PORT_GROUP, 0) >= MEMBER_STAT_ENTRIES);
    assert!(core::mem::size_of::<PortCounters>() == 8 * PortCounter::COUNT as usize);
    assert!(core::mem::size_of::<EgressCounters>() == 8 * crate::counters::EgressCounter::COUNT as usize);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for RouteEntry {}
    unsafe impl aya::Pod for GroupEntry {}
    unsafe impl aya::Pod for MemberEntry {}
    unsafe impl aya::Pod for PortEntry {}
    unsafe impl aya::Pod for IfindexSlots {}
    unsafe impl aya::Pod for DataplaneConfig {}
    unsafe impl aya::Pod for RouteCacheEntry {}
    unsafe impl aya::Pod for MemberStats {}
    unsafe impl aya::Pod for PortCounters {}
    unsafe impl aya::Pod for EgressCounters {}
    unsafe impl aya::Pod for FlowletKey {}
    unsafe impl aya::Pod for PinEntry {}
    unsafe impl aya::Pod for GenRewrite {}
    unsafe impl aya::Pod for FdbKey {}
    unsafe impl aya::Pod for FdbEntry {}
    unsafe impl aya::Pod for BridgePort {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot answers only for its family, address and route generation;
    /// a miss asks the trie once and fills the slot.
    #[test]
    fn route_cache_slot_hits_only_its_own_destination_and_generation() {
        let mut slot = RouteCacheEntry::default();
        let dst = [0x0100_000A, 0, 0, 0];
        let mut asked = 0;
        let mut trie = |t: Option<u32>| {
            asked += 1;
            t
        };
        assert_eq!(slot.cached_target(4, 7, &dst, || trie(Some(3))), 3);
        assert_eq!(slot.cached_target(4, 7, &dst, || trie(Some(9))), 3, "a hit");
        assert_eq!(slot.cached_target(6, 7, &dst, || trie(None)), CACHED_NO_ROUTE, "another family");
        assert_eq!(slot.cached_target(6, 8, &dst, || trie(Some(5))), 5, "a newer generation");
        assert_eq!(slot.cached_target(6, 8, &[0x0200_000A, 0, 0, 0], || trie(Some(ROUTE_LOCAL))), ROUTE_LOCAL);
        assert_eq!(asked, 4);
        assert_eq!(route_target(ROUTE_LOCAL), RouteTarget::Local);
        assert_eq!(route_target(ROUTE_KERNEL), RouteTarget::Kernel);
        assert_eq!(route_target(CACHED_NO_ROUTE), RouteTarget::NoRoute);
        assert_eq!(route_target(0), RouteTarget::Group(0));
    }

    /// The bridge program's word forms of a frame's MACs mean the FDB keys
    /// and the cache slot they replaced (byte arrays, VLAN 0).
    #[test]
    fn fdb_words_match_the_byte_forms() {
        let dst = [0x02, 0x42, 0x0A, 0x00, 0x00, 0x01];
        let src = [0x02, 0x00, 0x00, 0x00, 0x00, 0x22];
        let macs = frame_mac_words(&dst, &src);
        let mut frame = [0u8; 12];
        frame[..6].copy_from_slice(&dst);
        frame[6..].copy_from_slice(&src);
        let word = |i: usize| u32::from_le_bytes([frame[i], frame[i + 1], frame[i + 2], frame[i + 3]]);
        assert_eq!(macs, [word(0), word(4), word(8)]);
        let key = |k: FdbKey| {
            let mut b = [0u8; 8];
            b[..6].copy_from_slice(&k.mac);
            b[6..].copy_from_slice(&k.vlan.to_le_bytes());
            u64::from_le_bytes(b)
        };
        let (d, s) = fdb_key_words(&macs);
        assert_eq!(d, key(FdbKey { mac: dst, vlan: 0 }));
        assert_eq!(s, key(FdbKey { mac: src, vlan: 0 }));
        let low = |m: &[u8; 6]| u32::from_le_bytes([m[2], m[3], m[4], m[5]]);
        for slot in [0, 1, 7, 255] {
            let bytes = (low(&dst) ^ low(&src).rotate_left(16) ^ slot).wrapping_mul(0x9E37_79B1) >> 24;
            assert_eq!(fdb_cache_slot(&macs, slot), bytes);
        }
    }
}
