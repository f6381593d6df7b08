//! The loaded dataplane: the eBPF object, its maps, and the operations the
//! control program performs on them (install routes, publish groups,
//! register ports, read counters).
//!
//! Map writes are ordered so a packet in flight never sees a half-written
//! group: members go to the idle bank first, then one group-entry update
//! switches banks.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{
        lpm_trie::{Key, LpmTrie},
        Array, CpuMap, DevMapHash, HashMap, MapData, PerCpuArray,
    },
    programs::{
        links::{FdLink, PinnedLink},
        tc,
        tc::SchedClassifierLinkId,
        xdp::XdpLink,
        SchedClassifier, TcAttachType, Xdp, XdpMode,
    },
    Ebpf, EbpfLoader,
};
use rocev2_common::{
    buckets::{even_table, BucketTable, NO_MEMBER},
    class::{ClassEntry, MAX_CLASSES},
    counters::{EgressCounter, PortCounter},
    ecn::{EcnProfile, EgressEntry, VirtualQueue},
    features::{Features, FEATURES_GLOBAL},
    flowlet::FlowletEntry,
    hash::HashMode,
    maps::{
        self, bucket_table_index, member_index, member_stat_index, names, DataplaneConfig, FlowletKey, GenRewrite,
        GroupEntry, IfindexSlots, MemberEntry, MemberStats, PinEntry, PinKeyV4, PinKeyV6, PortCounters, PortEntry,
        RouteCacheEntry, RouteEntry, RouteKeyV4, RouteKeyV6, MAX_DIRECT_IFINDEX, MAX_ECN_PROFILES, MAX_EGRESS_PORTS,
        MAX_GROUPS, MAX_MEMBERS_PER_GROUP, MAX_PORTS, MEMBER_UP, POLICY_HASH, ROUTE_LOCAL,
    },
    telemetry,
};

use crate::{config::Prefix, errors::DataplaneError};

/// Name of the forwarding program in the object.
pub const XDP_PROGRAM: &str = "rocev2_xdp";
/// The spreading stage on ports with `cpu_spread = "qp"`.
pub const XDP_SPREAD_PROGRAM: &str = "rocev2_xdp_spread";
/// The pipeline as each CPUS entry runs it.
pub const XDP_CPU_PROGRAM: &str = "rocev2_xdp_cpu";
/// Frames each CPUS entry queues (the size xdp-tools' cpumap redirect uses).
const CPU_QUEUE_FRAMES: u32 = 2048;
/// A program that passes everything (veth NAPI helper, benchmark floor).
pub const XDP_PASS_PROGRAM: &str = "rocev2_xdp_pass";
/// Sends every frame back out (XDP_TX): the live-frames traffic generator.
pub const XDP_TX_PROGRAM: &str = "rocev2_xdp_tx";
/// tc ingress forwarding (`attach = "tc"`).
pub const TC_INGRESS_PROGRAM: &str = "rocev2_tc_ingress";
/// tc egress classes + ECN for locally originated traffic.
pub const TC_EGRESS_PROGRAM: &str = "rocev2_tc_egress";

/// Typed handles on every map, owned (taken out of the `Ebpf` or opened
/// from their pins).
pub struct Maps {
    routes_v4: LpmTrie<MapData, RouteKeyV4, RouteEntry>,
    routes_v6: LpmTrie<MapData, RouteKeyV6, RouteEntry>,
    groups: Array<MapData, GroupEntry>,
    members: Array<MapData, MemberEntry>,
    ports: HashMap<MapData, u32, PortEntry>,
    egress_devs: DevMapHash<MapData>,
    config: Array<MapData, DataplaneConfig>,
    port_counters: PerCpuArray<MapData, PortCounters>,
    member_stats: PerCpuArray<MapData, MemberStats>,
    flowlets: HashMap<MapData, FlowletKey, FlowletEntry>,
    pins_v4: LpmTrie<MapData, PinKeyV4, PinEntry>,
    pins_v6: LpmTrie<MapData, PinKeyV6, PinEntry>,
    egress: HashMap<MapData, u32, EgressEntry>,
    vqueues: Array<MapData, VirtualQueue>,
    ecn_profiles: Array<MapData, EcnProfile>,
    classes: Array<MapData, ClassEntry>,
    class_stats: PerCpuArray<MapData, MemberStats>,
    egress_counters: PerCpuArray<MapData, u64>,
    gen_rewrite: Array<MapData, GenRewrite>,
    ifindex_slots: Array<MapData, IfindexSlots>,
    egress_by_slot: Array<MapData, EgressEntry>,
    route_cache: PerCpuArray<MapData, RouteCacheEntry>,
    buckets: Array<MapData, BucketTable>,
}

/// How a group chooses members (everything in GroupEntry but the members).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupPolicy {
    pub hash: HashMode,
    /// POLICY_HASH, POLICY_FLOWLET or POLICY_PINNED.
    pub policy: u32,
    pub flowlet_gap_ns: u64,
    /// A FlowletChoice as u32.
    pub flowlet_choice: u32,
    pub flowlet_flags: u32,
}

impl GroupPolicy {
    /// Plain hashing in `mode`.
    pub fn hash(mode: HashMode) -> Self {
        Self { hash: mode, policy: POLICY_HASH, flowlet_gap_ns: 0, flowlet_choice: 0, flowlet_flags: 0 }
    }
}

/// The dataplane's encoding of a group policy (config groups and learned
/// groups alike).
pub fn policy_of(hash: HashMode, policy: &crate::config::Policy) -> GroupPolicy {
    use crate::config::Policy;
    use rocev2_common::maps::{FLOWLET_AT_BOUNDARY, POLICY_FLOWLET, POLICY_PINNED};
    match policy {
        Policy::Hash => GroupPolicy::hash(hash),
        Policy::Pinned => GroupPolicy { policy: POLICY_PINNED, ..GroupPolicy::hash(hash) },
        Policy::Flowlet(f) => GroupPolicy {
            policy: POLICY_FLOWLET,
            flowlet_gap_ns: f.gap.as_nanos() as u64,
            flowlet_choice: f.choice as u32,
            flowlet_flags: if f.at_message_boundary { FLOWLET_AT_BOUNDARY } else { 0 },
            ..GroupPolicy::hash(hash)
        },
    }
}

/// A group member with everything the kernel program needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSpec {
    pub ifindex: u32,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
}

impl Maps {
    /// Takes the maps out of a loaded object, pinning each under `pin_dir`
    /// first when given.
    fn take(ebpf: &mut Ebpf, pin_dir: Option<&Path>) -> Result<Self> {
        let mut take = |name: &str| -> Result<aya::maps::Map> {
            let map = ebpf.take_map(name).with_context(|| format!("eBPF object has no map {name}"))?;
            if let Some(dir) = pin_dir {
                let path = dir.join(name);
                map.pin(&path).with_context(|| format!("cannot pin map {name} at {}", path.display()))?;
            }
            Ok(map)
        };
        fn typed<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
            map: aya::maps::Map,
            name: &str,
        ) -> Result<T> {
            T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
        }
        Ok(Self {
            routes_v4: typed(take(names::ROUTES_V4)?, names::ROUTES_V4)?,
            routes_v6: typed(take(names::ROUTES_V6)?, names::ROUTES_V6)?,
            groups: typed(take(names::GROUPS)?, names::GROUPS)?,
            members: typed(take(names::MEMBERS)?, names::MEMBERS)?,
            ports: typed(take(names::PORTS)?, names::PORTS)?,
            egress_devs: typed(take(names::EGRESS_DEVS)?, names::EGRESS_DEVS)?,
            config: typed(take(names::CONFIG)?, names::CONFIG)?,
            port_counters: typed(take(names::PORT_COUNTERS)?, names::PORT_COUNTERS)?,
            member_stats: typed(take(names::MEMBER_STATS)?, names::MEMBER_STATS)?,
            flowlets: typed(take(names::FLOWLETS)?, names::FLOWLETS)?,
            pins_v4: typed(take(names::PINS_V4)?, names::PINS_V4)?,
            pins_v6: typed(take(names::PINS_V6)?, names::PINS_V6)?,
            egress: typed(take(names::EGRESS)?, names::EGRESS)?,
            vqueues: typed(take(names::VQUEUES)?, names::VQUEUES)?,
            ecn_profiles: typed(take(names::ECN_PROFILES)?, names::ECN_PROFILES)?,
            classes: typed(take(names::CLASSES)?, names::CLASSES)?,
            class_stats: typed(take(names::CLASS_STATS)?, names::CLASS_STATS)?,
            egress_counters: typed(take(names::EGRESS_COUNTERS)?, names::EGRESS_COUNTERS)?,
            gen_rewrite: typed(take(names::GEN_REWRITE)?, names::GEN_REWRITE)?,
            ifindex_slots: typed(take(names::IFINDEX_SLOTS)?, names::IFINDEX_SLOTS)?,
            egress_by_slot: typed(take(names::EGRESS_BY_SLOT)?, names::EGRESS_BY_SLOT)?,
            route_cache: typed(take(names::ROUTE_CACHE)?, names::ROUTE_CACHE)?,
            buckets: typed(take(names::BUCKETS)?, names::BUCKETS)?,
        })
    }

    /// Opens the maps a running `rocev2 run` pinned under `dir`.
    pub fn open_pinned(dir: &Path) -> Result<Self> {
        fn open<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(dir: &Path, name: &str) -> Result<T> {
            let path = dir.join(name);
            let data = MapData::from_pin(&path).map_err(|e| {
                let e = anyhow::Error::new(e);
                // A permission error is not a missing `run`: say so.
                let hint = if crate::privileges::is_permission_error(&e) {
                    "permission denied: run it as root"
                } else {
                    "is `rocev2 run` running?"
                };
                e.context(format!("cannot open pinned map {} ({hint})", path.display()))
            })?;
            let map = aya::maps::Map::from_map_data(data)
                .with_context(|| format!("pinned map {} has an unknown type", path.display()))?;
            T::try_from(map).with_context(|| format!("pinned map {} has an unexpected type", path.display()))
        }
        Ok(Self {
            routes_v4: open(dir, names::ROUTES_V4)?,
            routes_v6: open(dir, names::ROUTES_V6)?,
            groups: open(dir, names::GROUPS)?,
            members: open(dir, names::MEMBERS)?,
            ports: open(dir, names::PORTS)?,
            egress_devs: open(dir, names::EGRESS_DEVS)?,
            config: open(dir, names::CONFIG)?,
            port_counters: open(dir, names::PORT_COUNTERS)?,
            member_stats: open(dir, names::MEMBER_STATS)?,
            flowlets: open(dir, names::FLOWLETS)?,
            pins_v4: open(dir, names::PINS_V4)?,
            pins_v6: open(dir, names::PINS_V6)?,
            egress: open(dir, names::EGRESS)?,
            vqueues: open(dir, names::VQUEUES)?,
            ecn_profiles: open(dir, names::ECN_PROFILES)?,
            classes: open(dir, names::CLASSES)?,
            class_stats: open(dir, names::CLASS_STATS)?,
            egress_counters: open(dir, names::EGRESS_COUNTERS)?,
            gen_rewrite: open(dir, names::GEN_REWRITE)?,
            ifindex_slots: open(dir, names::IFINDEX_SLOTS)?,
            egress_by_slot: open(dir, names::EGRESS_BY_SLOT)?,
            route_cache: open(dir, names::ROUTE_CACHE)?,
            buckets: open(dir, names::BUCKETS)?,
        })
    }

    fn dataplane_config(&self) -> Result<DataplaneConfig> {
        self.config.get(&0, 0).context("cannot read CONFIG")
    }

    /// Invalidates every CPU's route cache: called after each change of
    /// the route tables.
    fn bump_route_generation(&mut self) -> Result<()> {
        let config = self.dataplane_config()?;
        let config = DataplaneConfig { route_generation: config.route_generation.wrapping_add(1), ..config };
        self.config.set(0, config, 0).context("cannot write CONFIG")
    }

    pub fn set_hash_seed(&mut self, seed: u32) -> Result<()> {
        let config = DataplaneConfig { hash_seed: seed, ..self.dataplane_config()? };
        self.config.set(0, config, 0).context("cannot write CONFIG")
    }

    /// How many CPUs (CPUS entries 0..n) the spreading stage uses; 0 = off.
    pub fn set_spread_cpus(&mut self, n: u32) -> Result<()> {
        let config = DataplaneConfig { spread_cpus: n, ..self.dataplane_config()? };
        self.config.set(0, config, 0).context("cannot write CONFIG")
    }

    /// Installs the priority classes, in match order.
    pub fn set_classes(&mut self, classes: &[ClassEntry]) -> Result<()> {
        if classes.len() > MAX_CLASSES as usize {
            return Err(DataplaneError::TooManyClasses { classes: classes.len(), capacity: MAX_CLASSES }.into());
        }
        // Shrink the live count first so no packet sees a half-written list.
        let config = self.dataplane_config()?;
        self.config.set(0, DataplaneConfig { class_count: 0, ..config }, 0).context("cannot write CONFIG")?;
        for (i, c) in classes.iter().enumerate() {
            self.classes.set(i as u32, c, 0).context("cannot write CLASSES")?;
        }
        let config = DataplaneConfig { class_count: classes.len() as u32, ..config };
        self.config.set(0, config, 0).context("cannot write CONFIG")
    }

    pub fn set_ecn_profile(&mut self, id: u32, profile: EcnProfile) -> Result<()> {
        if id >= MAX_ECN_PROFILES {
            return Err(
                DataplaneError::SlotOutOfRange { what: "ECN profile", slot: id, capacity: MAX_ECN_PROFILES }.into()
            );
        }
        self.ecn_profiles.set(id, profile, 0).context("cannot write ECN_PROFILES")
    }

    /// Gives an egress port a virtual queue (draining at `rate_bytes_per_sec`),
    /// a default ECN profile (NO_PROFILE for none) and counters.
    pub fn set_egress(&mut self, ifindex: u32, slot: u32, rate_bytes_per_sec: u64, profile: u32) -> Result<()> {
        if slot >= MAX_EGRESS_PORTS {
            return Err(DataplaneError::SlotOutOfRange { what: "egress port", slot, capacity: MAX_EGRESS_PORTS }.into());
        }
        let entry = EgressEntry::new(slot, profile, rate_bytes_per_sec);
        let context = || format!("cannot configure egress ifindex {ifindex}");
        if ifindex < MAX_DIRECT_IFINDEX {
            // The queue settings first, then the index that points at them.
            self.egress_by_slot.set(slot, entry, 0).with_context(context)?;
            self.update_ifindex_slots(ifindex, |s| s.egress = slot + 1).with_context(context)
        } else {
            self.egress.insert(ifindex, entry, 0).with_context(context)
        }
    }

    /// Read-modify-write of one IFINDEX_SLOTS entry (ifindex below
    /// MAX_DIRECT_IFINDEX).
    fn update_ifindex_slots(&mut self, ifindex: u32, change: impl FnOnce(&mut IfindexSlots)) -> Result<()> {
        let mut slots = self.ifindex_slots.get(&ifindex, 0).context("cannot read IFINDEX_SLOTS")?;
        change(&mut slots);
        self.ifindex_slots.set(ifindex, slots, 0).context("cannot write IFINDEX_SLOTS")
    }

    /// Seeds a virtual queue (tests use it to put a port at a known depth).
    pub fn set_virtual_queue(&mut self, slot: u32, q: VirtualQueue) -> Result<()> {
        self.vqueues.set(slot, q, 0).context("cannot write VQUEUES")
    }

    /// Every CPU's copy of one ROUTE_CACHE slot, and the current route
    /// generation (a slot from another generation is stale).
    pub fn route_cache(&self, slot: u32) -> Result<(Vec<RouteCacheEntry>, u32)> {
        let per_cpu = self.route_cache.get(&slot, 0).context("cannot read ROUTE_CACHE")?;
        Ok((per_cpu.iter().copied().collect(), self.dataplane_config()?.route_generation))
    }

    pub fn virtual_queue(&self, slot: u32) -> Result<VirtualQueue> {
        self.vqueues.get(&slot, 0).context("cannot read VQUEUES")
    }

    pub fn egress_counter(&self, slot: u32, counter: EgressCounter) -> Result<u64> {
        let values = self
            .egress_counters
            .get(&(slot * EgressCounter::COUNT + counter as u32), 0)
            .context("cannot read EGRESS_COUNTERS")?;
        Ok(values.iter().sum())
    }

    pub fn egress_counters(&self, slot: u32) -> Result<BTreeMap<&'static str, u64>> {
        EgressCounter::ALL.iter().map(|c| Ok((c.name(), self.egress_counter(slot, *c)?))).collect()
    }

    /// Packets and bytes matched by class `index`, summed over CPUs.
    pub fn class_stats(&self, index: u32) -> Result<MemberStats> {
        let values = self.class_stats.get(&index, 0).context("cannot read CLASS_STATS")?;
        Ok(values.iter().fold(MemberStats::default(), |acc, v| MemberStats {
            packets: acc.packets + v.packets,
            bytes: acc.bytes + v.bytes,
        }))
    }

    /// Makes the generator's XDP_TX program restore these MACs and TTL in
    /// every frame it sends (live-frames mode).
    pub fn set_gen_rewrite(&mut self, dst_mac: [u8; 6], src_mac: [u8; 6], ttl: u8) -> Result<()> {
        let entry = GenRewrite { dst_mac, src_mac, ttl, enabled: 1, _reserved: [0; 2] };
        self.gen_rewrite.set(0, entry, 0).context("cannot write GEN_REWRITE")
    }

    /// Flows currently in the flowlet table.
    pub fn flowlet_entries(&self) -> usize {
        self.flowlets.keys().filter(|k| k.is_ok()).count()
    }

    /// Pins (destination prefix, DestQP) to `entry`.
    pub fn set_pin(&mut self, prefix: &Prefix, dest_qp: u32, entry: PinEntry) -> Result<()> {
        match pin_key(prefix, dest_qp) {
            PinKey::V4(key) => self.pins_v4.insert(&key, entry, 0),
            PinKey::V6(key) => self.pins_v6.insert(&key, entry, 0),
        }
        .with_context(|| format!("cannot install pin {prefix} qp {dest_qp:#x}"))
    }

    pub fn remove_pin(&mut self, prefix: &Prefix, dest_qp: u32) -> Result<()> {
        match pin_key(prefix, dest_qp) {
            PinKey::V4(key) => self.pins_v4.remove(&key),
            PinKey::V6(key) => self.pins_v6.remove(&key),
        }
        .with_context(|| format!("cannot remove pin {prefix} qp {dest_qp:#x}"))
    }

    /// Unregisters an ingress port (a reload removed it).
    pub fn remove_port(&mut self, ifindex: u32) {
        if ifindex < MAX_DIRECT_IFINDEX {
            let _ = self.update_ifindex_slots(ifindex, |s| s.port_slot = 0);
        } else {
            let _ = self.ports.remove(&ifindex);
        }
    }

    /// Removes an egress port's virtual queue configuration.
    pub fn remove_egress(&mut self, ifindex: u32) {
        if ifindex < MAX_DIRECT_IFINDEX {
            let _ = self.update_ifindex_slots(ifindex, |s| s.egress = 0);
        } else {
            let _ = self.egress.remove(&ifindex);
        }
    }

    /// Registers an ingress port and gives it a counter slot.
    pub fn set_port(&mut self, ifindex: u32, slot: u32) -> Result<()> {
        if slot == 0 || slot >= MAX_PORTS {
            return Err(DataplaneError::SlotOutOfRange { what: "port", slot, capacity: MAX_PORTS }.into());
        }
        let context = || format!("cannot register port ifindex {ifindex}");
        if ifindex < MAX_DIRECT_IFINDEX {
            self.update_ifindex_slots(ifindex, |s| s.port_slot = slot).with_context(context)
        } else {
            self.ports.insert(ifindex, PortEntry { slot, _reserved: 0 }, 0).with_context(context)
        }
    }

    /// Makes `ifindex` a valid redirect target. One already there is left
    /// alone (every reload calls this for every member): the kernel
    /// replaces a DEVMAP_HASH entry by unlinking the old node before
    /// linking the new one, so a packet forwarded in between finds neither
    /// and its redirect fails (seen at 1.2 Mpps: one `drop_redirect_failed`
    /// in about three reloads once the control plane ran on its own CPU).
    pub fn add_egress_dev(&mut self, ifindex: u32) -> Result<()> {
        if self.egress_devs.get(ifindex, 0).is_ok() {
            return Ok(());
        }
        self.egress_devs
            .insert(ifindex, ifindex, None, 0)
            .with_context(|| format!("cannot add ifindex {ifindex} to the device map"))
    }

    /// Route writes go through Dataplane::sync_routes, which bumps the
    /// route generation after them (the XDP route cache depends on it).
    fn set_route(&mut self, prefix: &Prefix, target: u32) -> Result<()> {
        let value = RouteEntry { group: target };
        match *prefix {
            Prefix::V4 { addr, len } => self.routes_v4.insert(&Key::new(len.into(), addr.octets()), value, 0),
            Prefix::V6 { addr, len } => self.routes_v6.insert(&Key::new(len.into(), addr.octets()), value, 0),
        }
        .with_context(|| format!("cannot install route {prefix} (route table full?)"))
    }

    fn remove_route(&mut self, prefix: &Prefix) -> Result<()> {
        match *prefix {
            Prefix::V4 { addr, len } => self.routes_v4.remove(&Key::new(len.into(), addr.octets())),
            Prefix::V6 { addr, len } => self.routes_v6.remove(&Key::new(len.into(), addr.octets())),
        }
        .with_context(|| format!("cannot remove route {prefix}"))
    }

    /// Publishes a hash group whose members share its buckets evenly (see
    /// [`Maps::publish_group_with`]).
    pub fn publish_group(&mut self, group: u32, mode: HashMode, members: &[MemberSpec]) -> Result<()> {
        self.publish_group_with(group, &GroupPolicy::hash(mode), members).map(|_| ())
    }

    /// Publishes a group whose members share its buckets evenly (see
    /// [`Maps::publish_group_buckets`]).
    pub fn publish_group_with(&mut self, group: u32, policy: &GroupPolicy, members: &[MemberSpec]) -> Result<u32> {
        let table = even_table(members.len() as u32);
        self.publish_group_buckets(group, policy, members, &table)
    }

    /// Publishes a group's member list: written to the idle bank, then made
    /// live with one update of the group entry, whose generation changes so
    /// flowlet and pin state of the old list is not trusted. Returns the
    /// new generation.
    ///
    /// That update is not atomic for the XDP program: the kernel copies the
    /// new entry over the live one in place while the program reads its
    /// fields one by one, so a packet in flight can see the new bank with
    /// the old member count, or the old bank with the new count. Measured:
    /// 21 packets handed to the kernel (`pass_no_member`) in 1,000 shrinks
    /// at 1.3 Mpps, before this was fixed. So every position below the
    /// larger of the two counts is kept valid in BOTH banks across the
    /// switch: the idle bank repeats the new members past their end, and
    /// the live bank's unused positions up to the new count get the new
    /// members. A torn read then still picks a usable member.
    ///
    /// `buckets` names, for each bucket, an index into `members`; it is
    /// written with the members into the idle bank.
    pub fn publish_group_buckets(
        &mut self,
        group: u32,
        policy: &GroupPolicy,
        members: &[MemberSpec],
        buckets: &BucketTable,
    ) -> Result<u32> {
        if group >= MAX_GROUPS {
            return Err(DataplaneError::GroupSlotOutOfRange { group, capacity: MAX_GROUPS }.into());
        }
        if members.len() > MAX_MEMBERS_PER_GROUP as usize {
            return Err(
                DataplaneError::TooManyMembers { members: members.len(), capacity: MAX_MEMBERS_PER_GROUP }.into()
            );
        }
        let current = self.groups.get(&group, 0).context("cannot read GROUPS")?;
        // A never-written group has member_count 0 and takes bank 0.
        let fresh = current.generation == 0;
        let live_bank = current.bank & 1;
        let live_count = if fresh { 0 } else { current.member_count.min(MAX_MEMBERS_PER_GROUP) };
        let new_count = members.len() as u32;
        // A group left without members keeps its bank: a packet that still
        // sees the old count then picks one of the old members.
        let bank = if fresh || members.is_empty() { live_bank } else { live_bank ^ 1 };
        let entry_at = |position: u32| {
            let m = &members[(position % new_count) as usize];
            MemberEntry { ifindex: m.ifindex, flags: MEMBER_UP, src_mac: m.src_mac, dst_mac: m.dst_mac }
        };
        if new_count > 0 {
            for position in 0..new_count.max(live_count) {
                self.members
                    .set(member_index(group, bank, position), entry_at(position), 0)
                    .context("cannot write MEMBERS")?;
            }
            if bank != live_bank {
                for position in live_count..new_count {
                    self.members
                        .set(member_index(group, live_bank, position), entry_at(position), 0)
                        .context("cannot write MEMBERS")?;
                }
            }
        }
        if let Some(bad) = buckets.iter().find(|m| usize::from(**m) >= members.len() && **m != NO_MEMBER) {
            bail!("bucket table names member {bad} of a group of {}", members.len());
        }
        self.buckets.set(bucket_table_index(group, bank), buckets, 0).context("cannot write BUCKETS")?;
        let generation = current.generation.wrapping_add(1).max(1);
        let entry = GroupEntry {
            member_count: new_count,
            bank,
            hash_mode: policy.hash as u32,
            policy: policy.policy,
            generation,
            flowlet_choice: policy.flowlet_choice,
            flowlet_flags: policy.flowlet_flags,
            _reserved: 0,
            flowlet_gap_ns: policy.flowlet_gap_ns,
        };
        self.groups.set(group, entry, 0).context("cannot write GROUPS")?;
        Ok(generation)
    }

    pub fn group(&self, group: u32) -> Result<GroupEntry> {
        self.groups.get(&group, 0).context("cannot read GROUPS")
    }

    /// Overwrites a group entry as is. Tests use it to put the entry in the
    /// states a packet can observe in the middle of a publish.
    pub fn set_group_entry(&mut self, group: u32, entry: GroupEntry) -> Result<()> {
        self.groups.set(group, entry, 0).context("cannot write GROUPS")
    }

    /// The route target the live tables give `addr` (longest prefix
    /// match): a group index, ROUTE_LOCAL, ROUTE_KERNEL, or `None`.
    pub fn route_target(&self, addr: IpAddr) -> Result<Option<u32>> {
        let found = match addr {
            IpAddr::V4(a) => self.routes_v4.get(&Key::new(32, a.octets()), 0),
            IpAddr::V6(a) => self.routes_v6.get(&Key::new(128, a.octets()), 0),
        };
        match found {
            Ok(entry) => Ok(Some(entry.group)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).context("cannot look up the route tables"),
        }
    }

    /// A flow's entry in the flowlet table, if it has one.
    pub fn flowlet_entry(&self, key: &FlowletKey) -> Option<FlowletEntry> {
        self.flowlets.get(key, 0).ok()
    }

    /// The live bucket table of a group.
    pub fn bucket_table(&self, group: u32) -> Result<BucketTable> {
        let entry = self.group(group)?;
        self.buckets.get(&bucket_table_index(group, entry.bank & 1), 0).context("cannot read BUCKETS")
    }

    /// Live members of a group, in position order.
    pub fn group_members(&self, group: u32) -> Result<Vec<MemberEntry>> {
        let entry = self.group(group)?;
        (0..entry.member_count.min(MAX_MEMBERS_PER_GROUP))
            .map(|p| self.members.get(&member_index(group, entry.bank & 1, p), 0).context("cannot read MEMBERS"))
            .collect()
    }

    /// Sum over CPUs of one port counter.
    pub fn port_counter(&self, slot: u32, counter: PortCounter) -> Result<u64> {
        Ok(self.port_counter_sums(slot)?.get(counter))
    }

    /// All counters of a port slot, summed over CPUs.
    pub fn port_counters(&self, slot: u32) -> Result<BTreeMap<&'static str, u64>> {
        let sums = self.port_counter_sums(slot)?;
        Ok(PortCounter::ALL.iter().map(|c| (c.name(), sums.get(*c))).collect())
    }

    /// One port counter on each CPU, in CPU order (which CPUs did the work).
    pub fn port_counter_per_cpu(&self, slot: u32, counter: PortCounter) -> Result<Vec<u64>> {
        let values = self.port_counters.get(&slot, 0).context("cannot read PORT_COUNTERS")?;
        Ok(values.iter().map(|cpu| cpu.get(counter)).collect())
    }

    /// A port slot's counter block, summed over CPUs (one map read).
    fn port_counter_sums(&self, slot: u32) -> Result<PortCounters> {
        let values = self.port_counters.get(&slot, 0).context("cannot read PORT_COUNTERS")?;
        Ok(values.iter().fold(PortCounters::default(), |mut acc, cpu| {
            for (sum, v) in acc.counts.iter_mut().zip(cpu.counts) {
                *sum += v;
            }
            acc
        }))
    }

    /// Packets and bytes sent through one group member, summed over CPUs.
    pub fn member_stats(&self, group: u32, position: u32) -> Result<MemberStats> {
        let values =
            self.member_stats.get(&member_stat_index(group, position), 0).context("cannot read MEMBER_STATS")?;
        Ok(values.iter().fold(MemberStats::default(), |acc, v| MemberStats {
            packets: acc.packets + v.packets,
            bytes: acc.bytes + v.bytes,
        }))
    }
}

/// An XDP attachment held as a bpf link pinned in the pin directory, so
/// it outlives this process on a handover and the next `rocev2 run` can
/// swap its program in atomically.
struct PinnedXdp {
    path: PathBuf,
    link: FdLink,
}

/// LPM key of a pin: the DestQP (big endian, matched in full) followed by
/// the destination prefix, so the prefix length is 32 + the address's.
enum PinKey {
    V4(Key<PinKeyV4>),
    V6(Key<PinKeyV6>),
}

fn pin_key(prefix: &Prefix, dest_qp: u32) -> PinKey {
    let q = dest_qp.to_be_bytes();
    match *prefix {
        Prefix::V4 { addr, len } => {
            let mut key = [0u8; 8];
            key[..4].copy_from_slice(&q);
            key[4..].copy_from_slice(&addr.octets());
            PinKey::V4(Key::new(32 + u32::from(len), key))
        }
        Prefix::V6 { addr, len } => {
            let mut key = [0u8; 20];
            key[..4].copy_from_slice(&q);
            key[4..].copy_from_slice(&addr.octets());
            PinKey::V6(Key::new(32 + u32::from(len), key))
        }
    }
}

/// The eBPF object loaded into the kernel, with its maps taken out.
pub struct Dataplane {
    ebpf: Ebpf,
    pub maps: Maps,
    /// What ROUTES_V4/V6 hold now, so a sync writes only the differences.
    installed_routes: BTreeMap<Prefix, u32>,
    pin_dir: Option<PathBuf>,
    /// XDP attachments by interface name.
    xdp_links: BTreeMap<String, PinnedXdp>,
    /// tc attachments by (interface, ingress?) for detaching on reload.
    tc_links: BTreeMap<(String, bool), SchedClassifierLinkId>,
    /// Set by [`Dataplane::hand_over`]: leave programs and pins in place.
    handed_over: bool,
    /// Fixed at load time (the FEATURES constant).
    features: Features,
    /// What `attach` puts on a port: the pipeline, or the spreading stage.
    ingress_program: &'static str,
}

/// Whether `pin_dir` holds XDP link pins: a previous `rocev2 run` handed
/// over (or crashed) and its programs still forward.
pub fn has_pinned_links(pin_dir: &Path) -> bool {
    std::fs::read_dir(pin_dir)
        .map(|entries| entries.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().starts_with("link-")))
        .unwrap_or(false)
}

/// File name of an XDP link pin for `ifname`.
pub fn link_pin_name(ifname: &str) -> String {
    format!("link-{ifname}")
}

impl Dataplane {
    /// Loads the object and the XDP programs (not attached yet). With a
    /// `pin_dir`, every map is pinned there (bpffs is mounted when needed,
    /// stale pins of a crashed run are replaced) so `rocev2 stats` can read
    /// them.
    pub fn load(pin_dir: Option<&Path>) -> Result<Self> {
        Self::load_with(pin_dir, maps::DEFAULT_FLOWLET_TABLE_SIZE)
    }

    /// Like [`Dataplane::load`] with the flowlet table sized to `flowlet_table_size` flows.
    pub fn load_with(pin_dir: Option<&Path>, flowlet_table_size: u32) -> Result<Self> {
        Self::load_with_features(pin_dir, flowlet_table_size, Features::ALL)
    }

    /// Like [`Dataplane::load_with`] with only `features` in the programs:
    /// the verifier removes the code of the others (see
    /// rocev2_common::features). A group, queue or class that needs a
    /// missing feature is not served until the programs are loaded again.
    /// With the telemetry feature, the QP table holds the default number
    /// of QPs.
    pub fn load_with_features(pin_dir: Option<&Path>, flowlet_table_size: u32, features: Features) -> Result<Self> {
        Self::load_with_telemetry(pin_dir, flowlet_table_size, features, telemetry::DEFAULT_QP_TABLE_SIZE)
    }

    /// Like [`Dataplane::load_with_features`] with a QP telemetry table of
    /// `telemetry_qps` entries (used only with the telemetry feature; its
    /// maps hold one entry without it).
    pub fn load_with_telemetry(
        pin_dir: Option<&Path>,
        flowlet_table_size: u32,
        features: Features,
        telemetry_qps: u32,
    ) -> Result<Self> {
        if crate::EBPF_OBJECT.is_empty() {
            bail!("this rocev2 binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; rebuild without it (cargo xtask build)");
        }
        crate::privileges::check()?;
        let telemetry_on = features.contains(Features::TELEMETRY);
        let qp_table = if telemetry_on { telemetry_qps.max(1) } else { 1 };
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(names::FLOWLETS, flowlet_table_size.max(1))
            .map_max_entries(telemetry::names::QP_TELEMETRY, qp_table)
            .map_max_entries(telemetry::names::QP_REPLIES, qp_table)
            .override_global(FEATURES_GLOBAL, &features.0, true)
            .load(crate::EBPF_OBJECT)
            .context("cannot load the eBPF object")?;
        // The tc programs are loaded (and verified, which costs CPU) only
        // when something attaches them: see `tc_program`.
        for name in [XDP_PROGRAM, XDP_PASS_PROGRAM, XDP_TX_PROGRAM] {
            let program: &mut Xdp = ebpf
                .program_mut(name)
                .with_context(|| format!("eBPF object has no program {name}"))?
                .try_into()
                .with_context(|| format!("{name} is not an XDP program"))?;
            program.load().with_context(|| format!("the kernel rejected program {name}"))?;
        }
        if let Some(dir) = pin_dir {
            crate::bpffs::prepare_pin_dir(dir)?;
        }
        let maps = Maps::take(&mut ebpf, pin_dir)?;
        if let (Some(dir), true) = (pin_dir, telemetry_on) {
            crate::qp_telemetry::pin_maps(&mut ebpf, dir)?;
        }
        Ok(Self {
            ebpf,
            maps,
            installed_routes: BTreeMap::new(),
            pin_dir: pin_dir.map(Path::to_path_buf),
            xdp_links: BTreeMap::new(),
            tc_links: BTreeMap::new(),
            handed_over: false,
            features,
            ingress_program: XDP_PROGRAM,
        })
    }

    /// The features the loaded programs carry.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Turns on the spreading stage (`cpu_spread = "qp"`): every online
    /// CPU gets a CPUS entry running the pipeline (XDP_CPU_PROGRAM), and
    /// ports attached from now on get XDP_SPREAD_PROGRAM, which hands each
    /// flow to one of them. Returns the CPUs in use.
    pub fn enable_cpu_spread(&mut self) -> Result<Vec<u32>> {
        for name in [XDP_CPU_PROGRAM, XDP_SPREAD_PROGRAM] {
            self.xdp_program(name)?.load().with_context(|| format!("the kernel rejected program {name}"))?;
        }
        let cpu_program =
            self.xdp_program(XDP_CPU_PROGRAM)?.fd()?.try_clone().context("cannot duplicate a program fd")?;
        let online = aya::util::online_cpus().map_err(|(path, e)| anyhow::anyhow!("cannot read {path}: {e}"))?;
        let map = self.ebpf.map_mut(names::CPUS).context("eBPF object has no map CPUS")?;
        let mut cpus: CpuMap<&mut MapData> = CpuMap::try_from(map).context("CPUS is not a CPU map")?;
        let mut used = Vec::new();
        for cpu in online {
            if cpu >= maps::MAX_SPREAD_CPUS {
                break;
            }
            cpus.set(cpu, CPU_QUEUE_FRAMES, Some(&cpu_program), 0)
                .with_context(|| format!("cannot add CPU {cpu} to CPUS"))?;
            used.push(cpu);
        }
        // Keys are CPU numbers: the stage hashes over 0..=highest, and a
        // flow hashed to an offline CPU is forwarded where it arrived.
        let span = used.iter().max().map_or(0, |m| m + 1);
        self.maps.set_spread_cpus(span)?;
        self.ingress_program = XDP_SPREAD_PROGRAM;
        Ok(used)
    }

    pub fn xdp_program(&mut self, name: &str) -> Result<&mut Xdp> {
        self.ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not an XDP program"))
    }

    /// Attaches the forwarding program to an ingress port. With a pin
    /// directory the attachment is a pinned bpf link; if an earlier `rocev2
    /// run` handed over (or crashed), its link is still there and this
    /// program replaces the old one in it atomically: no packet is lost.
    /// Returns true when it took over an existing attachment.
    pub fn attach(&mut self, ifname: &str, ifindex: u32, mode: XdpMode) -> Result<bool> {
        let pin_path = self.pin_dir.as_ref().map(|d| d.join(link_pin_name(ifname)));
        if let Some(path) = pin_path.as_ref().filter(|p| p.exists()) {
            let pinned = PinnedLink::from_pin(path)
                .with_context(|| format!("cannot open the pinned XDP link {}", path.display()))?;
            let old = XdpLink::try_from(FdLink::from(pinned))
                .with_context(|| format!("{} is not an XDP link", path.display()))?;
            let program = self.xdp_program(self.ingress_program)?;
            let id =
                program.attach_to_link(old).with_context(|| format!("cannot replace the XDP program on {ifname}"))?;
            let link = FdLink::try_from(program.take_link(id)?).context("XDP link is not a bpf link")?;
            self.xdp_links.insert(ifname.to_string(), PinnedXdp { path: path.clone(), link });
            return Ok(true);
        }
        let program = self.xdp_program(self.ingress_program)?;
        let id = program.attach_to_if_index(ifindex, mode).map_err(|e| {
            let hint = match mode {
                XdpMode::Driver => {
                    "; the driver may lack native XDP: set xdp_mode = \"skb\" in [dataplane] to use generic XDP"
                }
                _ => "",
            };
            anyhow::anyhow!("cannot attach XDP ({}) to {ifname}: {e}{hint}", mode_name(mode))
        })?;
        if let Some(path) = pin_path {
            let link = FdLink::try_from(program.take_link(id)?)
                .context("the kernel attached XDP without a bpf link (needs Linux 5.9+ for handover)")?;
            let pinned = link.pin(&path).with_context(|| format!("cannot pin the XDP link at {}", path.display()))?;
            self.xdp_links.insert(ifname.to_string(), PinnedXdp { path, link: FdLink::from(pinned) });
        }
        Ok(false)
    }

    /// Detaches the forwarding program from a port (a reload removed it).
    pub fn detach(&mut self, ifname: &str) {
        if let Some(att) = self.xdp_links.remove(ifname) {
            let _ = std::fs::remove_file(&att.path);
            drop(att.link);
        }
        for ingress in [true, false] {
            if let Some(id) = self.tc_links.remove(&(ifname.to_string(), ingress)) {
                let name = if ingress { TC_INGRESS_PROGRAM } else { TC_EGRESS_PROGRAM };
                if let Ok(program) = self.tc_program(name) {
                    let _ = program.detach(id);
                }
            }
        }
    }

    /// Removes XDP link pins of interfaces not in `keep` (a takeover found
    /// a port the new config no longer has): detaches those programs.
    pub fn drop_stale_links(&mut self, keep: &[String]) -> Result<Vec<String>> {
        let Some(dir) = self.pin_dir.clone() else { return Ok(Vec::new()) };
        let mut dropped = Vec::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if let Some(ifname) = name.strip_prefix("link-") {
                if !keep.iter().any(|k| k == ifname) && !self.xdp_links.contains_key(ifname) {
                    std::fs::remove_file(dir.join(&name)).ok();
                    dropped.push(ifname.to_string());
                }
            }
        }
        Ok(dropped)
    }

    /// A tc program, loaded into the kernel on first use.
    fn tc_program(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not a tc classifier"))?;
        if program.fd().is_err() {
            program.load().with_context(|| format!("the kernel rejected program {name}"))?;
        }
        Ok(program)
    }

    /// Leaves the programs attached and the maps pinned when this value is
    /// dropped, for the next `rocev2 run` to take over.
    pub fn hand_over(&mut self) {
        self.handed_over = true;
    }

    /// Installs the route set `wanted` (prefix -> group index or ROUTE_LOCAL),
    /// then removes routes that are no longer wanted: adding first means a
    /// prefix that moves to another group is never briefly unrouted.
    pub fn sync_routes(&mut self, wanted: &BTreeMap<Prefix, u32>) -> Result<()> {
        // Only new or retargeted routes are written: `run` syncs on every
        // refresh tick, and rewriting 100,000 unchanged routes each time
        // would cost a fifth of a second of CPU per tick.
        // The generation is bumped after the additions and again after the
        // removals (even when one fails part-way), so the per-CPU route
        // caches never serve a result the tables no longer give.
        let additions: Vec<(Prefix, u32)> =
            wanted.iter().filter(|(p, t)| self.installed_routes.get(p) != Some(t)).map(|(p, t)| (*p, *t)).collect();
        let added: Result<()> = additions.iter().try_for_each(|(prefix, target)| self.install_route(prefix, *target));
        if !additions.is_empty() {
            self.maps.bump_route_generation()?;
        }
        added?;
        let stale: Vec<Prefix> = self.installed_routes.keys().filter(|p| !wanted.contains_key(p)).copied().collect();
        let removed: Result<()> = stale.iter().try_for_each(|prefix| {
            self.maps.remove_route(prefix)?;
            self.installed_routes.remove(prefix);
            Ok(())
        });
        if !stale.is_empty() {
            self.maps.bump_route_generation()?;
        }
        removed
    }

    /// Writes one route. A full table is reported as
    /// [`DataplaneError::RouteTableFull`], with the numbers (the kernel
    /// says only "no space").
    fn install_route(&mut self, prefix: &Prefix, target: u32) -> Result<()> {
        if let Err(e) = self.maps.set_route(prefix, target) {
            let no_space = e
                .chain()
                .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.raw_os_error() == Some(libc::ENOSPC)));
            if !no_space {
                return Err(e);
            }
            let (v4, v6) = self.route_counts();
            let (family, installed, capacity) = match prefix {
                Prefix::V4 { .. } => ("IPv4", v4, rocev2_common::maps::MAX_ROUTES_V4),
                Prefix::V6 { .. } => ("IPv6", v6, rocev2_common::maps::MAX_ROUTES_V6),
            };
            let prefix = prefix.to_string();
            return Err(DataplaneError::RouteTableFull { family, installed, capacity, prefix }.into());
        }
        self.installed_routes.insert(*prefix, target);
        Ok(())
    }

    /// Routes installed now: (IPv4, IPv6).
    pub fn route_counts(&self) -> (usize, usize) {
        let v4 = self.installed_routes.keys().filter(|p| matches!(p, Prefix::V4 { .. })).count();
        (v4, self.installed_routes.len() - v4)
    }

    /// Applies route changes (`None` = remove), then bumps the route
    /// generation once: the incremental path for learned routes, where a
    /// full [`Dataplane::sync_routes`] over 100,000 prefixes per change
    /// would cost milliseconds.
    pub fn update_routes(&mut self, changes: &[(Prefix, Option<u32>)]) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let applied: Result<()> = changes.iter().try_for_each(|(prefix, target)| {
            match target {
                Some(t) if self.installed_routes.get(prefix) != Some(t) => self.install_route(prefix, *t)?,
                Some(_) => {}
                None => {
                    if self.installed_routes.remove(prefix).is_some() {
                        self.maps.remove_route(prefix)?;
                    }
                }
            }
            Ok(())
        });
        self.maps.bump_route_generation()?;
        applied
    }

    /// Attaches a tc program (clsact) to `ifname`: the forwarding program on
    /// ingress (`attach = "tc"`), or the local-traffic marker on egress.
    pub fn attach_tc(&mut self, ifname: &str, attach_type: TcAttachType) -> Result<()> {
        // aya attaches with TCX links where the kernel has them (6.6+) and
        // needs a clsact qdisc only on older kernels; it may exist already,
        // and a real problem shows up in attach() below.
        let _ = tc::qdisc_add_clsact(ifname);
        let ingress = matches!(attach_type, TcAttachType::Ingress);
        let name = if ingress { TC_INGRESS_PROGRAM } else { TC_EGRESS_PROGRAM };
        let program = self.tc_program(name)?;
        let id = program
            .attach(ifname, attach_type)
            .with_context(|| format!("cannot attach {name} to {ifname} (tc {attach_type:?})"))?;
        self.tc_links.insert((ifname.to_string(), ingress), id);
        Ok(())
    }

    /// Detaches the XDP links and removes every pin (the maps go away
    /// with the last reference).
    pub fn unpin(&mut self) {
        for (_, att) in std::mem::take(&mut self.xdp_links) {
            let _ = std::fs::remove_file(&att.path);
        }
        if let Some(dir) = self.pin_dir.take() {
            for name in maps::names::ALL.iter().chain(crate::qp_telemetry::PINNED) {
                let _ = std::fs::remove_file(dir.join(name));
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        if !self.handed_over {
            self.unpin();
        }
        // On a handover the link pins keep the programs attached and the
        // programs keep their maps; dropping our fds changes nothing.
    }
}

pub fn mode_name(mode: XdpMode) -> &'static str {
    match mode {
        XdpMode::Driver => "native",
        XdpMode::Skb => "skb",
        XdpMode::Hardware => "offload",
        XdpMode::Default => "default",
    }
}

/// Host routes that send traffic for the box's own addresses to the kernel.
pub fn local_routes(addrs: &[IpAddr]) -> impl Iterator<Item = (Prefix, u32)> + '_ {
    addrs.iter().map(|a| (Prefix::host(*a), ROUTE_LOCAL))
}
