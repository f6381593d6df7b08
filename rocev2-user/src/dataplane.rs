//! The loaded dataplane: the eBPF object, its maps, and the operations the
//! control program performs on them (install routes, publish groups,
//! register ports, read counters).
//!
//! Map writes are ordered so a packet in flight never sees a half-written
//! group: members go to the idle bank first, then one group-entry update
//! switches banks.

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{
        lpm_trie::{Key, LpmTrie},
        Array, DevMapHash, HashMap, MapData, PerCpuArray,
    },
    programs::{Xdp, XdpMode},
    Ebpf, EbpfLoader,
};
use rocev2_common::{
    counters::PortCounter,
    hash::HashMode,
    maps::{
        self, member_index, member_stat_index, names, port_counter_index, DataplaneConfig,
        GroupEntry, MemberEntry, MemberStats, PortEntry, RouteEntry, RouteKeyV4, RouteKeyV6,
        MAX_GROUPS, MAX_MEMBERS_PER_GROUP, MAX_PORTS, MEMBER_UP, ROUTE_LOCAL,
    },
};

use crate::config::Prefix;

/// Name of the forwarding program in the object.
pub const XDP_PROGRAM: &str = "rocev2_xdp";
/// A program that passes everything (veth NAPI helper, benchmark floor).
pub const XDP_PASS_PROGRAM: &str = "rocev2_xdp_pass";
/// Sends every frame back out (XDP_TX): the live-frames traffic generator.
pub const XDP_TX_PROGRAM: &str = "rocev2_xdp_tx";

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
    port_counters: PerCpuArray<MapData, u64>,
    member_stats: PerCpuArray<MapData, MemberStats>,
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
        fn typed<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(map: aya::maps::Map, name: &str) -> Result<T> {
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
        })
    }

    /// Opens the maps a running `rocev2 run` pinned under `dir`.
    pub fn open_pinned(dir: &Path) -> Result<Self> {
        fn open<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
            dir: &Path,
            name: &str,
        ) -> Result<T> {
            let path = dir.join(name);
            let data = MapData::from_pin(&path).with_context(|| {
                format!("cannot open pinned map {} (is `rocev2 run` running?)", path.display())
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
        })
    }

    pub fn set_hash_seed(&mut self, seed: u32) -> Result<()> {
        self.config
            .set(0, DataplaneConfig { hash_seed: seed, _reserved: 0 }, 0)
            .context("cannot write CONFIG")
    }

    /// Registers an ingress port and gives it a counter slot.
    pub fn set_port(&mut self, ifindex: u32, slot: u32) -> Result<()> {
        if slot == 0 || slot >= MAX_PORTS {
            bail!("port slot {slot} out of range 1..{MAX_PORTS}");
        }
        self.ports
            .insert(ifindex, PortEntry { slot, _reserved: 0 }, 0)
            .with_context(|| format!("cannot register port ifindex {ifindex}"))
    }

    /// Makes `ifindex` a valid redirect target.
    pub fn add_egress_dev(&mut self, ifindex: u32) -> Result<()> {
        self.egress_devs
            .insert(ifindex, ifindex, None, 0)
            .with_context(|| format!("cannot add ifindex {ifindex} to the device map"))
    }

    pub fn set_route(&mut self, prefix: &Prefix, target: u32) -> Result<()> {
        let value = RouteEntry { group: target };
        match *prefix {
            Prefix::V4 { addr, len } => self.routes_v4.insert(&Key::new(len.into(), addr.octets()), value, 0),
            Prefix::V6 { addr, len } => self.routes_v6.insert(&Key::new(len.into(), addr.octets()), value, 0),
        }
        .with_context(|| format!("cannot install route {prefix} (route table full?)"))
    }

    pub fn remove_route(&mut self, prefix: &Prefix) -> Result<()> {
        match *prefix {
            Prefix::V4 { addr, len } => self.routes_v4.remove(&Key::new(len.into(), addr.octets())),
            Prefix::V6 { addr, len } => self.routes_v6.remove(&Key::new(len.into(), addr.octets())),
        }
        .with_context(|| format!("cannot remove route {prefix}"))
    }

    /// Publishes a group's member list: written to the idle bank, then made
    /// live with one update of the group entry.
    pub fn publish_group(&mut self, group: u32, mode: HashMode, members: &[MemberSpec]) -> Result<()> {
        if group >= MAX_GROUPS {
            bail!("group index {group} out of range (max {MAX_GROUPS})");
        }
        if members.len() > MAX_MEMBERS_PER_GROUP as usize {
            bail!("group has {} members, more than {MAX_MEMBERS_PER_GROUP}", members.len());
        }
        let current = self.groups.get(&group, 0).context("cannot read GROUPS")?;
        // A never-written group has member_count 0 and may take either bank.
        let bank = if current.member_count == 0 && current.hash_mode == 0 && current.bank == 0 {
            0
        } else {
            (current.bank + 1) & 1
        };
        for (position, m) in members.iter().enumerate() {
            let entry = MemberEntry { ifindex: m.ifindex, flags: MEMBER_UP, src_mac: m.src_mac, dst_mac: m.dst_mac };
            self.members
                .set(member_index(group, bank, position as u32), entry, 0)
                .context("cannot write MEMBERS")?;
        }
        let entry = GroupEntry { member_count: members.len() as u32, bank, hash_mode: mode as u32, _reserved: 0 };
        self.groups.set(group, entry, 0).context("cannot write GROUPS")
    }

    pub fn group(&self, group: u32) -> Result<GroupEntry> {
        self.groups.get(&group, 0).context("cannot read GROUPS")
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
        let values = self
            .port_counters
            .get(&port_counter_index(slot, counter), 0)
            .context("cannot read PORT_COUNTERS")?;
        Ok(values.iter().sum())
    }

    /// All counters of a port slot, summed over CPUs.
    pub fn port_counters(&self, slot: u32) -> Result<BTreeMap<&'static str, u64>> {
        PortCounter::ALL
            .iter()
            .map(|c| Ok((c.name(), self.port_counter(slot, *c)?)))
            .collect()
    }

    /// Packets and bytes sent through one group member, summed over CPUs.
    pub fn member_stats(&self, group: u32, position: u32) -> Result<MemberStats> {
        let values = self
            .member_stats
            .get(&member_stat_index(group, position), 0)
            .context("cannot read MEMBER_STATS")?;
        Ok(values.iter().fold(MemberStats::default(), |acc, v| MemberStats {
            packets: acc.packets + v.packets,
            bytes: acc.bytes + v.bytes,
        }))
    }
}

/// The eBPF object loaded into the kernel, with its maps taken out.
pub struct Dataplane {
    ebpf: Ebpf,
    pub maps: Maps,
    installed_routes: HashSet<Prefix>,
    pin_dir: Option<PathBuf>,
}

impl Dataplane {
    /// Loads the object and the XDP programs (not attached yet). With a
    /// `pin_dir`, every map is pinned there (bpffs is mounted when needed,
    /// stale pins of a crashed run are replaced) so `rocev2 stats` can read
    /// them.
    pub fn load(pin_dir: Option<&Path>) -> Result<Self> {
        if crate::EBPF_OBJECT.is_empty() {
            bail!("this rocev2 binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; rebuild without it (cargo xtask build)");
        }
        crate::privileges::check()?;
        let mut ebpf = EbpfLoader::new().load(crate::EBPF_OBJECT).context("cannot load the eBPF object")?;
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
        Ok(Self { ebpf, maps, installed_routes: HashSet::new(), pin_dir: pin_dir.map(Path::to_path_buf) })
    }

    pub fn xdp_program(&mut self, name: &str) -> Result<&mut Xdp> {
        self.ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not an XDP program"))
    }

    /// Attaches the forwarding program to an ingress port.
    pub fn attach(&mut self, ifname: &str, ifindex: u32, mode: XdpMode) -> Result<()> {
        let program = self.xdp_program(XDP_PROGRAM)?;
        program.attach_to_if_index(ifindex, mode).map_err(|e| {
            let hint = match mode {
                XdpMode::Driver => "; the driver may lack native XDP: set xdp_mode = \"skb\" in [dataplane] to use generic XDP",
                _ => "",
            };
            anyhow::anyhow!("cannot attach XDP ({}) to {ifname}: {e}{hint}", mode_name(mode))
        })?;
        Ok(())
    }

    /// Installs the route set `wanted` (prefix -> group index or ROUTE_LOCAL),
    /// then removes routes that are no longer wanted.
    pub fn sync_routes(&mut self, wanted: &BTreeMap<Prefix, u32>) -> Result<()> {
        for (prefix, target) in wanted {
            self.maps.set_route(prefix, *target)?;
        }
        let stale: Vec<Prefix> = self.installed_routes.iter().filter(|p| !wanted.contains_key(p)).copied().collect();
        for prefix in stale {
            self.maps.remove_route(&prefix)?;
        }
        self.installed_routes = wanted.keys().copied().collect();
        Ok(())
    }

    /// Removes the pins (the maps go away with the last reference).
    pub fn unpin(&mut self) {
        if let Some(dir) = self.pin_dir.take() {
            for name in maps::names::ALL {
                let _ = std::fs::remove_file(dir.join(name));
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.unpin();
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
