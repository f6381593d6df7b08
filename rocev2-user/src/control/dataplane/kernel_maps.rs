//! The dataplane's maps as the control program writes and reads them:
//! routes, groups and their bucket tables, ports, egress queues, classes,
//! pins and counters, with the encoding of each entry.

use std::{borrow::BorrowMut, collections::BTreeMap, net::IpAddr, path::Path};

use aya::{
    maps::{
        lpm_trie::{Key, LpmTrie},
        Array, DevMap, DevMapHash, HashMap, MapData, PerCpuArray, PerCpuHashMap,
    },
    Ebpf,
};
use rocev2_common::{
    buckets::{even_table, BucketTable, NO_MEMBER},
    class::{ClassEntry, MAX_CLASSES},
    counters::{EgressCounter, PortCounter},
    ecn::{EcnProfile, EgressEntry, VirtualQueue},
    flowlet::FlowletEntry,
    hash::{HashMode, HashVersion},
    maps::{
        bucket_table_index, member_index, member_stat_index, names, BridgePort, DataplaneConfig, EgressCounters,
        FdbEntry, FdbKey, FlowletKey, GroupEntry, IfindexSlots, MemberEntry, MemberStats, Pin, PinEntry, PinKeyV4,
        PinKeyV6, PortCounters, PortEntry, RouteCacheEntry, RouteEntry, RouteKeyV4, RouteKeyV6, Takeover, MAPS,
        MAX_DIRECT_IFINDEX, MAX_ECN_PROFILES, MAX_EGRESS_PORTS, MAX_GROUPS, MAX_MEMBERS_PER_GROUP, MAX_PORTS,
        MEMBER_UP, POLICY_HASH,
    },
};

use crate::{
    control::config::Prefix,
    control::errors::{DataplaneError, MapResult as _},
};

/// Every map operation's result: what went wrong is a [`DataplaneError`].
type Result<T, E = DataplaneError> = std::result::Result<T, E>;

/// Opens the map pinned as `name` under `dir`, of its type `T`.
fn open_pin<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(dir: &Path, name: &str) -> anyhow::Result<T> {
    let path = dir.join(name);
    let data = MapData::from_pin(&path).map_err(|e| {
        let e = anyhow::Error::new(e);
        // A permission error is not a missing `run`: say so.
        let hint = if crate::sys::privileges::is_permission_error(&e) {
            "permission denied: run it as root".to_string()
        } else if crate::sys::bpffs::private_view() {
            format!(
                "{}: the pins of a `rocev2 run` are not visible here; run this command without `ip netns exec` (`rocev2 --netns NAME ...` enters only the network namespace)",
                crate::sys::bpffs::PRIVATE_VIEW
            )
        } else {
            not_pinned_hint(dir)
        };
        e.context(format!("cannot open pinned map {} ({hint})", path.display()))
    })?;
    let map = aya::maps::Map::from_map_data(data)
        .with_context(|| format!("pinned map {} has an unknown type", path.display()))?;
    Ok(T::try_from(map).with_context(|| format!("pinned map {} has an unexpected type", path.display()))?)
}

/// Typed handles on the maps the control plane reads and writes, owned
/// (taken out of the `Ebpf` or opened from their pins): one line each, the
/// field, its map (named in the table, `rocev2_common::maps::MAPS`, which
/// says whether and how it is pinned) and its type. Those under `optional`
/// may be missing from the pins of a run from before they existed; those
/// under `from_pins` are opened from their pin (when it exists), not taken
/// from the object (the programs keep them); `state` is the control
/// plane's own, starting at its default.
macro_rules! handles {
    (
        always { $($field:ident: $name:ident => $ty:ty,)* }
        optional { $($ofield:ident: $oname:ident => $oty:ty,)* }
        from_pins { $($pfield:ident: $pname:ident => $pty:ty,)* }
        state { $($(#[$sdoc:meta])* $sfield:ident: $sty:ty,)* }
    ) => {
        pub struct Maps {
            $($field: $ty,)*
            $($ofield: Option<$oty>,)*
            $($pfield: Option<$pty>,)*
            $($(#[$sdoc])* $sfield: $sty,)*
        }

        impl Maps {
            /// The maps `Maps` holds handles on: every map the table pins
            /// always (a test checks).
            pub const HANDLES: &[&str] = &[$(names::$name,)* $(names::$oname,)* $(names::$pname,)*];

            /// Takes the maps out of a loaded object, pinning under
            /// `pin_dir` (when given) those the table says are pinned (but
            /// those a takeover keeps, which the loader pinned already).
            pub(super) fn take(ebpf: &mut Ebpf, pin_dir: Option<&Path>) -> anyhow::Result<Self> {
                let mut take = |name: &str| -> anyhow::Result<aya::maps::Map> {
                    let map = ebpf.take_map(name).ok_or_else(|| anyhow::anyhow!("eBPF object has no map {name}"))?;
                    let pinned =
                        MAPS.iter().any(|m| m.name == name && m.pin == Pin::Always && m.takeover != Takeover::Kept);
                    if let (Some(dir), true) = (pin_dir, pinned) {
                        let path = dir.join(name);
                        map.pin(&path).with_context(|| format!("cannot pin map {name} at {}", path.display()))?;
                    }
                    Ok(map)
                };
                fn typed<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
                    map: aya::maps::Map,
                    name: &str,
                ) -> anyhow::Result<T> {
                    Ok(T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))?)
                }
                Ok(Self {
                    $($field: typed(take(names::$name)?, names::$name)?,)*
                    $($ofield: Some(typed(take(names::$oname)?, names::$oname)?),)*
                    $($pfield: match pin_dir {
                        Some(dir) if dir.join(names::$pname).exists() => Some(open_pin(dir, names::$pname)?),
                        _ => None,
                    },)*
                    $($sfield: <$sty>::default(),)*
                })
            }

            /// Opens the maps a running `rocev2 run` pinned under `dir`.
            pub fn open_pinned(dir: &Path) -> anyhow::Result<Self> {
                Ok(Self {
                    $($field: open_pin(dir, names::$name)?,)*
                    $($ofield: if dir.join(names::$oname).exists() { Some(open_pin(dir, names::$oname)?) } else { None },)*
                    $($pfield: if dir.join(names::$pname).exists() { Some(open_pin(dir, names::$pname)?) } else { None },)*
                    $($sfield: <$sty>::default(),)*
                })
            }
        }
    };
}

handles! {
    always {
        routes_v4: ROUTES_V4 => LpmTrie<MapData, RouteKeyV4, RouteEntry>,
        routes_v6: ROUTES_V6 => LpmTrie<MapData, RouteKeyV6, RouteEntry>,
        groups: GROUPS => Array<MapData, GroupEntry>,
        members: MEMBERS => Array<MapData, MemberEntry>,
        ports: PORTS => HashMap<MapData, u32, PortEntry>,
        egress_devs: EGRESS_DEVS => DevMapHash<MapData>,
        egress_devs_direct: EGRESS_DEVS_DIRECT => DevMap<MapData>,
        config: CONFIG => Array<MapData, DataplaneConfig>,
        port_counters: PORT_COUNTERS => PerCpuArray<MapData, PortCounters>,
        member_stats: MEMBER_STATS => PerCpuArray<MapData, MemberStats>,
        flowlets: FLOWLETS => HashMap<MapData, FlowletKey, FlowletEntry>,
        pins_v4: PINS_V4 => LpmTrie<MapData, PinKeyV4, PinEntry>,
        pins_v6: PINS_V6 => LpmTrie<MapData, PinKeyV6, PinEntry>,
        egress: EGRESS => HashMap<MapData, u32, EgressEntry>,
        vqueues: VQUEUES => Array<MapData, VirtualQueue>,
        ecn_profiles: ECN_PROFILES => Array<MapData, EcnProfile>,
        classes: CLASSES => Array<MapData, ClassEntry>,
        class_stats: CLASS_STATS => PerCpuArray<MapData, MemberStats>,
        egress_counters: EGRESS_COUNTERS => PerCpuArray<MapData, EgressCounters>,
        ifindex_slots: IFINDEX_SLOTS => Array<MapData, IfindexSlots>,
        egress_by_slot: EGRESS_BY_SLOT => Array<MapData, EgressEntry>,
        route_cache: ROUTE_CACHE => PerCpuArray<MapData, RouteCacheEntry>,
        buckets: BUCKETS => Array<MapData, BucketTable>,
    }
    optional {
        egress_refused: EGRESS_REFUSED => PerCpuHashMap<MapData, u32, u64>,
        fdb: FDB => HashMap<MapData, FdbKey, FdbEntry>,
        bridge_ports: BRIDGE_PORTS => Array<MapData, BridgePort>,
    }
    from_pins {
        flowlet_slots: FLOWLET_SLOTS => Array<MapData, rocev2_common::flowlet::FlowletSlot>,
    }
    state {
        /// A takeover's groups of the previous run, by slot, until each is
        /// first published (see [`InheritedGroups`]).
        inherited: InheritedGroups,
    }
}

/// Per group slot, the generation and live members (position order) a
/// previous run left: a takeover that publishes the slot with the same
/// members keeps that generation, so flowlet state stays valid.
pub type InheritedGroups = BTreeMap<u32, (u32, Vec<MemberEntry>)>;

/// Makes `ifindex` a redirect target in a pair of device maps, where the
/// programs look it up (rocev2-ebpf/src/redirect.rs): below
/// MAX_DIRECT_IFINDEX in the array map at its own index (the XDP redirect
/// is then an array index), else in the hash map. One already there is
/// left alone (every reload calls this for every member): the kernel
/// replaces a DEVMAP_HASH entry by unlinking the old node before linking
/// the new one, so a packet forwarded in between finds neither and its
/// redirect fails (seen at 1.2 Mpps: one `drop_redirect_failed` in about
/// three reloads once the control plane ran on its own CPU).
pub fn add_redirect_target<T: BorrowMut<MapData>>(
    direct: &mut DevMap<T>,
    hashed: &mut DevMapHash<T>,
    ifindex: u32,
) -> Result<()> {
    let context = || format!("cannot add ifindex {ifindex} to the device map");
    if ifindex < MAX_DIRECT_IFINDEX {
        if direct.get(ifindex, 0).is_ok_and(|v| v.if_index == ifindex) {
            return Ok(());
        }
        return direct.set(ifindex, ifindex, None, 0).with_context(context);
    }
    if hashed.get(ifindex, 0).is_ok() {
        return Ok(());
    }
    hashed.insert(ifindex, ifindex, None, 0).with_context(context)
}

/// How a group chooses members: its GROUPS entry with the fields a
/// publish sets (member count, bank, generation) left 0. The entry is the
/// one definition of what a policy holds; [`GroupPolicy::new`] is the one
/// encoding of a configured policy, for config and learned groups alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupPolicy(GroupEntry);

impl GroupPolicy {
    /// Plain hashing in `mode`.
    pub fn hash(mode: HashMode) -> Self {
        Self(GroupEntry { hash_mode: mode as u32, policy: POLICY_HASH, ..GroupEntry::default() })
    }

    /// The dataplane's encoding of a policy: the hash mode, the policy and
    /// its flowlet settings, and what `transport_aware` adds (a flowlet
    /// may end at an ACK).
    pub fn new(
        hash: HashMode,
        policy: &crate::control::config::Policy,
        transport_aware: Option<&crate::control::config::TransportAware>,
    ) -> Self {
        use crate::control::config::Policy;
        use rocev2_common::{
            flowlet::FlowletTable,
            maps::{FLOWLET_AT_BOUNDARY, FLOWLET_KEYLESS, FLOWLET_REPICK_ACKED, POLICY_FLOWLET, POLICY_PINNED},
        };
        let plain = Self::hash(hash).0;
        let repick_acked = if transport_aware.is_some_and(|t| t.repick_when_acked) { FLOWLET_REPICK_ACKED } else { 0 };
        Self(match policy {
            Policy::Hash => GroupEntry { flowlet_flags: repick_acked, ..plain },
            Policy::Pinned => GroupEntry { policy: POLICY_PINNED, flowlet_flags: repick_acked, ..plain },
            Policy::Flowlet(f) => {
                let keyless = f.table == FlowletTable::Keyless;
                GroupEntry {
                    policy: POLICY_FLOWLET,
                    flowlet_gap_ns: f.gap.as_nanos() as u64,
                    flowlet_choice: f.choice as u32,
                    flowlet_flags: if f.at_message_boundary { FLOWLET_AT_BOUNDARY } else { 0 }
                        | if keyless { FLOWLET_KEYLESS } else { 0 }
                        | repick_acked,
                    flowlet_slot_mask: if keyless { f.table_size.next_power_of_two() - 1 } else { 0 },
                    ..plain
                }
            }
        })
    }

    /// The group's entry as a publish writes it.
    fn entry(&self, member_count: u32, bank: u32, generation: u32) -> GroupEntry {
        GroupEntry { member_count, bank, generation, ..self.0 }
    }

    pub fn hash_mode(&self) -> HashMode {
        HashMode::from_u32(self.0.hash_mode).unwrap_or(HashMode::FiveTuple)
    }

    /// POLICY_HASH, POLICY_FLOWLET or POLICY_PINNED.
    pub fn policy(&self) -> u32 {
        self.0.policy
    }

    /// FLOWLET_* flags.
    pub fn flowlet_flags(&self) -> u32 {
        self.0.flowlet_flags
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
    /// Each group slot's generation and live members in a previous run's
    /// pins under `dir` (see [`InheritedGroups`]).
    pub fn read_groups(dir: &Path) -> Result<InheritedGroups> {
        let open = |name: &str| -> Result<MapData> {
            let path = dir.join(name);
            MapData::from_pin(&path).with_context(|| format!("cannot open pinned map {}", path.display()))
        };
        let groups: Array<MapData, GroupEntry> =
            Array::try_from(aya::maps::Map::Array(open(names::GROUPS)?)).context("GROUPS is not an array")?;
        let members: Array<MapData, MemberEntry> =
            Array::try_from(aya::maps::Map::Array(open(names::MEMBERS)?)).context("MEMBERS is not an array")?;
        let mut out = InheritedGroups::new();
        for slot in 0..MAX_GROUPS {
            let g = groups.get(&slot, 0).context("cannot read GROUPS")?;
            if g.generation == 0 {
                continue;
            }
            let live: Result<Vec<MemberEntry>> = (0..g.member_count.min(MAX_MEMBERS_PER_GROUP))
                .map(|p| members.get(&member_index(slot, g.bank & 1, p), 0).context("cannot read MEMBERS"))
                .collect();
            out.insert(slot, (g.generation, live?));
        }
        Ok(out)
    }

    /// Remembers a previous run's groups for their first publish.
    pub(super) fn inherit_groups(&mut self, groups: InheritedGroups) {
        self.inherited = groups;
    }

    /// The keyless flowlet slot at `index`, if the slots are pinned.
    pub fn flowlet_slot(&self, index: u32) -> Option<rocev2_common::flowlet::FlowletSlot> {
        self.flowlet_slots.as_ref()?.get(&index, 0).ok()
    }

    fn dataplane_config(&self) -> Result<DataplaneConfig> {
        self.config.get(&0, 0).context("cannot read CONFIG")
    }

    /// Reads CONFIG, applies `change` and writes it back in one write (the
    /// programs only read CONFIG, so nothing changes it in between).
    fn update_config(&mut self, change: impl FnOnce(&mut DataplaneConfig)) -> Result<()> {
        let mut config = self.dataplane_config()?;
        change(&mut config);
        self.config.set(0, config, 0).context("cannot write CONFIG")
    }

    /// Invalidates every CPU's route cache: called after each change of
    /// the route tables.
    pub(super) fn bump_route_generation(&mut self) -> Result<()> {
        self.update_config(|c| c.route_generation = c.route_generation.wrapping_add(1))
    }

    /// Invalidates every CPU's FDB cache: called after each write of FDB
    /// or BRIDGE_PORTS, so the next frame of every MAC pair reads them
    /// (and marks its source active) again.
    fn bump_fdb_generation(&mut self) -> Result<()> {
        self.update_config(|c| c.fdb_generation = c.fdb_generation.wrapping_add(1))
    }

    /// The seed and version of the flow hash, in one CONFIG write: a
    /// packet never hashes with a new seed under the old version.
    pub fn set_hash(&mut self, seed: u32, version: HashVersion) -> Result<()> {
        self.update_config(|c| (c.hash_seed, c.hash_version) = (seed, version.number()))
    }

    /// How many CPUs (CPUS entries 0..n) the spreading stage uses; 0 = off.
    pub fn set_spread_cpus(&mut self, n: u32) -> Result<()> {
        self.update_config(|c| c.spread_cpus = n)
    }

    /// Installs the priority classes, in match order.
    pub fn set_classes(&mut self, classes: &[ClassEntry]) -> Result<()> {
        if classes.len() > MAX_CLASSES as usize {
            return Err(DataplaneError::TooManyClasses { classes: classes.len(), capacity: MAX_CLASSES });
        }
        // Shrink the live count first so no packet sees a half-written list.
        self.update_config(|c| c.class_count = 0)?;
        for (i, c) in classes.iter().enumerate() {
            self.classes.set(i as u32, c, 0).context("cannot write CLASSES")?;
        }
        self.update_config(|c| c.class_count = classes.len() as u32)
    }

    pub fn set_ecn_profile(&mut self, id: u32, profile: EcnProfile) -> Result<()> {
        if id >= MAX_ECN_PROFILES {
            return Err(DataplaneError::SlotOutOfRange { what: "ECN profile", slot: id, capacity: MAX_ECN_PROFILES });
        }
        self.ecn_profiles.set(id, profile, 0).context("cannot write ECN_PROFILES")
    }

    /// Gives an egress port a virtual queue (draining at `rate_bytes_per_sec`),
    /// a default ECN profile (NO_PROFILE for none) and counters.
    pub fn set_egress(&mut self, ifindex: u32, slot: u32, rate_bytes_per_sec: u64, profile: u32) -> Result<()> {
        if slot >= MAX_EGRESS_PORTS {
            return Err(DataplaneError::SlotOutOfRange { what: "egress port", slot, capacity: MAX_EGRESS_PORTS });
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

    /// Empties a virtual queue and forgets its high-water mark (the lab
    /// does, after a measuring burst no rated link would have carried).
    pub fn empty_virtual_queue(&mut self, slot: u32) -> Result<()> {
        self.vqueues.set(slot, VirtualQueue::default(), 0).context("cannot write VQUEUES")
    }

    /// Seeds a virtual queue (tests use it to put a port at a known depth).
    #[cfg(feature = "test-hooks")]
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
        let values = self.egress_counters.get(&slot, 0).context("cannot read EGRESS_COUNTERS")?;
        Ok(values.iter().map(|block| block.get(counter)).sum())
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
        .with_context(|| format!("cannot install pin {prefix} qp {dest_qp:#x}"))?;
        tracing::debug!(
            target: "rocev2::maps",
            "pin {prefix} qp {dest_qp:#x} -> group {} position {} generation {}",
            entry.group,
            entry.position,
            entry.generation
        );
        Ok(())
    }

    pub fn remove_pin(&mut self, prefix: &Prefix, dest_qp: u32) -> Result<()> {
        match pin_key(prefix, dest_qp) {
            PinKey::V4(key) => self.pins_v4.remove(&key),
            PinKey::V6(key) => self.pins_v6.remove(&key),
        }
        .with_context(|| format!("cannot remove pin {prefix} qp {dest_qp:#x}"))?;
        tracing::debug!(target: "rocev2::maps", "pin {prefix} qp {dest_qp:#x} removed");
        Ok(())
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
            return Err(DataplaneError::SlotOutOfRange { what: "port", slot, capacity: MAX_PORTS });
        }
        let context = || format!("cannot register port ifindex {ifindex}");
        if ifindex < MAX_DIRECT_IFINDEX {
            self.update_ifindex_slots(ifindex, |s| s.port_slot = slot).with_context(context)
        } else {
            self.ports.insert(ifindex, PortEntry { slot, _reserved: 0 }, 0).with_context(context)
        }
    }

    /// Makes `ifindex` a valid redirect target ([`add_redirect_target`]).
    pub fn add_egress_dev(&mut self, ifindex: u32) -> Result<()> {
        add_redirect_target(&mut self.egress_devs_direct, &mut self.egress_devs, ifindex)
    }

    /// Route writes go through Dataplane::sync_routes, which bumps the
    /// route generation after them (the XDP route cache depends on it).
    pub(super) fn set_route(&mut self, prefix: &Prefix, target: u32) -> Result<()> {
        let value = RouteEntry { group: target };
        match *prefix {
            Prefix::V4 { addr, len } => self.routes_v4.insert(&Key::new(len.into(), addr.octets()), value, 0),
            Prefix::V6 { addr, len } => self.routes_v6.insert(&Key::new(len.into(), addr.octets()), value, 0),
        }
        .with_context(|| format!("cannot install route {prefix} (route table full?)"))?;
        tracing::debug!(target: "rocev2::maps", "route {prefix} -> {target}");
        Ok(())
    }

    pub(super) fn remove_route(&mut self, prefix: &Prefix) -> Result<()> {
        match *prefix {
            Prefix::V4 { addr, len } => self.routes_v4.remove(&Key::new(len.into(), addr.octets())),
            Prefix::V6 { addr, len } => self.routes_v6.remove(&Key::new(len.into(), addr.octets())),
        }
        .with_context(|| format!("cannot remove route {prefix}"))?;
        tracing::debug!(target: "rocev2::maps", "route {prefix} removed");
        Ok(())
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
            return Err(DataplaneError::GroupSlotOutOfRange { group, capacity: MAX_GROUPS });
        }
        if members.len() > MAX_MEMBERS_PER_GROUP as usize {
            return Err(DataplaneError::TooManyMembers { members: members.len(), capacity: MAX_MEMBERS_PER_GROUP });
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
            return Err(DataplaneError::InvalidBuckets { member: *bad, members: members.len() });
        }
        self.buckets.set(bucket_table_index(group, bank), buckets, 0).context("cannot write BUCKETS")?;
        // A takeover's first publish of a group the previous run left with
        // exactly these members keeps its generation: flowlet state of
        // that run stays valid. Other members: past that generation.
        let generation = match self.inherited.remove(&group).filter(|_| fresh) {
            Some((old, live)) if live == (0..new_count).map(entry_at).collect::<Vec<_>>() => old,
            Some((old, _)) => old.wrapping_add(1).max(1),
            None => current.generation.wrapping_add(1).max(1),
        };
        let entry = policy.entry(new_count, bank, generation);
        self.groups.set(group, entry, 0).context("cannot write GROUPS")?;
        tracing::debug!(target: "rocev2::maps", "group {group}: {new_count} members, bank {bank}, generation {generation}");
        Ok(generation)
    }

    /// Rewrites a group's live bucket table in place, keeping its members,
    /// bank and generation: for a change of bucket owners only (a
    /// transport demotion or restore, a step of a gradual return). Flowlets
    /// then keep their member until their own next boundary and pins stay
    /// valid; only new choices read the new owners. A packet reads one byte
    /// of the table, so it sees the old owner or the new one, both usable.
    /// Returns the (unchanged) generation.
    pub fn set_live_buckets(&mut self, group: u32, buckets: &BucketTable) -> Result<u32> {
        let current = self.group(group)?;
        if let Some(bad) = buckets.iter().find(|m| u32::from(**m) >= current.member_count && **m != NO_MEMBER) {
            return Err(DataplaneError::InvalidBuckets { member: *bad, members: current.member_count as usize });
        }
        self.buckets.set(bucket_table_index(group, current.bank & 1), buckets, 0).context("cannot write BUCKETS")?;
        tracing::debug!(target: "rocev2::maps", "group {group}: buckets moved in place, generation {}", current.generation);
        Ok(current.generation)
    }

    pub fn group(&self, group: u32) -> Result<GroupEntry> {
        self.groups.get(&group, 0).context("cannot read GROUPS")
    }

    /// Overwrites a group entry as is. Tests use it to put the entry in the
    /// states a packet can observe in the middle of a publish.
    #[cfg(feature = "test-hooks")]
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
    /// `forwarded` is what the egress devices took: the program counts what
    /// it redirected, the tracepoint programs what a device then refused.
    fn port_counter_sums(&self, slot: u32) -> Result<PortCounters> {
        let values = self.port_counters.get(&slot, 0).context("cannot read PORT_COUNTERS")?;
        let mut sums = values.iter().fold(PortCounters::default(), |mut acc, cpu| {
            for (sum, v) in acc.counts.iter_mut().zip(cpu.counts) {
                *sum += v;
            }
            acc
        });
        let refused = sums.get(PortCounter::DropEgressRefused);
        sums.counts[PortCounter::Forwarded as usize] = sums.get(PortCounter::Forwarded).saturating_sub(refused);
        Ok(sums)
    }

    /// Frames each egress device (by ifindex; 0 for a CPU map entry)
    /// refused after a redirect, summed over CPUs; only devices that did.
    pub fn egress_refused(&self) -> Result<BTreeMap<u32, u64>> {
        let Some(map) = &self.egress_refused else { return Ok(BTreeMap::new()) };
        let mut out = BTreeMap::new();
        for entry in map.iter() {
            let (ifindex, per_cpu) = entry.context("cannot read EGRESS_REFUSED")?;
            let frames: u64 = per_cpu.iter().sum();
            if frames > 0 {
                out.insert(ifindex, frames);
            }
        }
        Ok(out)
    }

    /// The FDB map, or why there is none.
    fn fdb(&self) -> Result<&HashMap<MapData, FdbKey, FdbEntry>> {
        self.fdb.as_ref().ok_or(DataplaneError::MissingMap { map: names::FDB, feature: "host bridge mode" })
    }

    fn fdb_mut(&mut self) -> Result<&mut HashMap<MapData, FdbKey, FdbEntry>> {
        self.fdb.as_mut().ok_or(DataplaneError::MissingMap { map: names::FDB, feature: "host bridge mode" })
    }

    /// Host bridge mode: writes one FDB entry (a new MAC, or one that moved).
    pub fn set_fdb(&mut self, key: FdbKey, entry: FdbEntry) -> Result<()> {
        self.fdb_mut()?.insert(key, entry, 0).with_context(|| {
            format!(
                "cannot write the FDB entry of {} (FDB full at {} entries?)",
                crate::sys::format_mac(&key.mac),
                rocev2_common::maps::MAX_FDB_ENTRIES
            )
        })?;
        self.bump_fdb_generation()
    }

    /// Removes an FDB entry (aged out, deleted, or its port left the bridge).
    pub fn remove_fdb(&mut self, key: &FdbKey) -> Result<()> {
        match self.fdb_mut()?.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => self.bump_fdb_generation(),
            Err(e) => {
                Err(e).with_context(|| format!("cannot remove the FDB entry of {}", crate::sys::format_mac(&key.mac)))
            }
        }
    }

    /// One FDB entry as the dataplane has it (with its activity bit).
    pub fn fdb_entry(&self, key: &FdbKey) -> Option<FdbEntry> {
        self.fdb().ok()?.get(key, 0).ok()
    }

    /// Every FDB entry, for `explain` and the tests.
    pub fn fdb_entries(&self) -> Vec<(FdbKey, FdbEntry)> {
        self.fdb().map(|fdb| fdb.iter().filter_map(Result::ok).collect()).unwrap_or_default()
    }

    /// Host bridge mode: a bridge port's state, at its port counter slot.
    pub fn set_bridge_port(&mut self, slot: u32, port: BridgePort) -> Result<()> {
        if slot == 0 || slot >= MAX_PORTS {
            return Err(DataplaneError::SlotOutOfRange { what: "bridge port", slot, capacity: MAX_PORTS });
        }
        let missing = DataplaneError::MissingMap { map: names::BRIDGE_PORTS, feature: "host bridge mode" };
        let ports = self.bridge_ports.as_mut().ok_or(missing)?;
        ports.set(slot, port, 0).context("cannot write BRIDGE_PORTS")?;
        self.bump_fdb_generation()
    }

    pub fn bridge_port(&self, slot: u32) -> Result<BridgePort> {
        let missing = DataplaneError::MissingMap { map: names::BRIDGE_PORTS, feature: "host bridge mode" };
        let ports = self.bridge_ports.as_ref().ok_or(missing)?;
        ports.get(&slot, 0).context("cannot read BRIDGE_PORTS")
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

/// Why the maps of `dir` are not there, for a reader that expected them:
/// no state file (nothing runs there: the instances that do), or a state
/// file of a run whose pins this process cannot see.
fn not_pinned_hint(dir: &Path) -> String {
    match crate::control::state::RunState::read(dir) {
        Err(e) => format!("{e:#}"),
        Ok(state) => format!(
            "the state file says `rocev2 run` pid {} uses it, but its pins are not here: was it started in another mount namespace (`ip netns exec`, a container)? Start it with `rocev2 --netns NAME run`",
            state.pid
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forwarding object defines exactly the table's maps, each of
    /// the table's type (rocev2-ebpf writes them, the table describes them).
    #[test]
    fn the_object_has_the_maps_of_the_table() {
        if crate::EBPF_OBJECT.is_empty() {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "CI=true but this build carries no eBPF object (AYA_BUILD_SKIP)");
            return;
        }
        let object = aya_obj::Object::parse(crate::EBPF_OBJECT).unwrap();
        let mut defined: Vec<(&str, u32)> = object
            .maps
            .iter()
            .filter(|(_, m)| {
                matches!(m.section_kind(), aya_obj::EbpfSectionKind::Maps | aya_obj::EbpfSectionKind::BtfMaps)
            })
            .map(|(name, m)| (name.as_str(), m.map_type()))
            .collect();
        defined.sort();
        let mut table: Vec<(&str, u32)> = MAPS.iter().map(|m| (m.name, m.kind as u32)).collect();
        table.sort();
        assert_eq!(defined, table);
    }

    /// `Maps` holds a handle on every map the table pins always, and only
    /// on those: `open_pinned` finds each, `take` pins each.
    #[test]
    fn handles_are_the_maps_pinned_always() {
        let mut pinned: Vec<&str> = MAPS.iter().filter(|m| m.pin == Pin::Always).map(|m| m.name).collect();
        let mut handles = Maps::HANDLES.to_vec();
        pinned.sort();
        handles.sort();
        assert_eq!(handles, pinned);
    }

    /// The book lists the maps a takeover starts empty as the table does.
    #[test]
    fn the_book_lists_what_a_takeover_starts_empty() {
        let fresh: Vec<String> =
            MAPS.iter().filter(|m| m.takeover == Takeover::Fresh).map(|m| format!("`{}`", m.name)).collect();
        let book = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/running.md")).unwrap();
        let flat = book.split_whitespace().collect::<Vec<_>>().join(" ");
        let listed = fresh.join(", ");
        assert!(flat.contains(&listed), "docs/src/running.md should list: {listed}");
    }

    #[test]
    fn kernel_names_find_their_entry() {
        assert_eq!(rocev2_common::maps::spec_of("MEMBER_TRANSPOR").map(|m| m.name), Some(names::MEMBER_TRANSPORT));
        assert_eq!(rocev2_common::maps::spec_of("GROUPS").map(|m| m.name), Some(names::GROUPS));
        assert!(rocev2_common::maps::spec_of("GROUP").is_none());
    }
}
