//! Host bridge mode (`[bridge]`): `rocev2 run` serves every port of a
//! Linux bridge and mirrors the bridge into the dataplane the way it
//! mirrors the kernel FIB: a dump at start, then every netlink change
//! (links and bridge ports with their STP state, AF_BRIDGE FDB entries:
//! learned, static, `extern_learn`, local; moves and ageing).
//!
//! - [`view`]: the model of one bridge and what the FDB and BRIDGE_PORTS
//!   maps must hold for it;
//! - this file: the socket, the dumps, writing the maps (only what
//!   changed), and keeping the kernel's ageing of hosts whose frames XDP
//!   forwards (the kernel bridge never sees them) in step.
//!
//! Frames XDP forwards never reach the kernel bridge, so it cannot see a
//! host is still there: the XDP program marks the FDB entry of every
//! source it forwards from (a hit bit), and every fifth of the bridge's
//! ageing time the mirror tells the kernel those entries are in use
//! (`NTF_USE`, as `bridge fdb replace ... use` does), then clears the bits.
//! A host that goes quiet ages out as it would without rocev2 (up to a
//! fifth of the ageing time later).

pub mod view;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use rocev2_common::maps::{BridgePort, FdbEntry, FDB_PORT};

use self::view::{BridgeView, Changed, EntryKind, UplinkSpec, Wanted};
pub use crate::control::state::BridgeStats;
use crate::{
    control::{
        config::{Config, NextHop},
        dataplane::Maps,
        routing::kernel::{messages, Dumper, EventSocket, RTM_GETLINK, RTM_GETNEIGH, RTNLGRP_LINK, RTNLGRP_NEIGH},
    },
    sys::netlink::{LinkInfo, Netlink},
};

/// `AF_BRIDGE`.
const AF_BRIDGE: u8 = 7;
/// The shortest and longest interval between two ageing refreshes.
const REFRESH_BOUNDS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(30));

/// The bridge mirror of a running `rocev2 run`.
pub struct BridgeMirror {
    socket: EventSocket,
    pub view: BridgeView,
    /// What FDB and BRIDGE_PORTS hold now (activity bits aside).
    installed: Wanted,
    last_refresh: Instant,
    pub stats: BridgeStats,
}

impl BridgeMirror {
    /// Subscribes to link and neighbour changes, then reads the bridge
    /// (subscribing first, so nothing that changes meanwhile is missed).
    pub fn start(name: &str) -> Result<Self> {
        let socket = EventSocket::open_groups(&[RTNLGRP_LINK, RTNLGRP_NEIGH])?;
        let mut me = Self {
            socket,
            view: BridgeView::new(name),
            installed: Wanted::default(),
            last_refresh: Instant::now(),
            stats: BridgeStats { bridge: name.to_string(), ..BridgeStats::default() },
        };
        me.resync()?;
        Ok(me)
    }

    /// Reads links, the bridge's ports and its FDB again.
    pub fn resync(&mut self) -> Result<()> {
        let mut view = BridgeView::new(&self.view.name);
        let mut dumper = Dumper::open()?;
        // ifinfomsg is 16 bytes, ndmsg 12: all links (which finds the
        // bridge), then the bridge's view of its ports, then its FDB.
        for (kind, family, header_len) in
            [(RTM_GETLINK, 0, 16), (RTM_GETLINK, AF_BRIDGE, 16), (RTM_GETNEIGH, AF_BRIDGE, 12)]
        {
            dumper
                .dump(kind, family, header_len, |message_type, message| {
                    view.apply(message_type, message);
                })
                .with_context(|| format!("cannot read bridge {} over netlink", view.name))?;
        }
        self.view = view;
        Ok(())
    }

    /// Waits for the next batch of link and neighbour messages and applies
    /// them; says whether anything changed.
    pub async fn next_batch(&mut self) -> Result<bool> {
        let batch = self.socket.receive().await;
        self.absorb(batch)
    }

    /// Applies the messages waiting now, without waiting; says whether
    /// anything changed.
    pub fn absorb_pending(&mut self) -> Result<bool> {
        let batch = self.socket.ready_now();
        self.absorb(batch)
    }

    fn absorb(&mut self, batch: std::io::Result<Vec<Vec<u8>>>) -> Result<bool> {
        let mut changed = false;
        match batch {
            Ok(datagrams) => {
                for datagram in &datagrams {
                    for (message_type, message) in messages(datagram) {
                        self.stats.messages += 1;
                        changed |= self.view.apply(message_type, message) != Changed::Nothing;
                    }
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                tracing::warn!("the kernel's bridge events overflowed the socket; reading the bridge again");
                self.stats.resyncs += 1;
                self.resync()?;
                changed = true;
            }
            Err(e) => return Err(e).context("cannot read bridge events"),
        }
        Ok(changed)
    }

    /// Checks what `rocev2 run` needs of the bridge at start: that it
    /// exists, is a bridge, and filters no VLANs.
    pub fn check_bridge(&self) -> Result<()> {
        if self.view.ifindex == 0 {
            bail!("no bridge named {}", self.view.name);
        }
        if self.view.vlan_filtering {
            bail!(
                "bridge {} has VLAN filtering on; rocev2's bridge mode serves bridges without it (FDB entries of VLAN 0): turn it off (`ip link set {} type bridge vlan_filtering 0`)",
                self.view.name,
                self.view.name
            );
        }
        Ok(())
    }

    /// Writes what changed into FDB and BRIDGE_PORTS. Ports first when one
    /// starts forwarding (an entry may then point at it), last when one
    /// stops (no entry points at it any more by then).
    pub fn sync(&mut self, maps: &mut Maps, slots: &BTreeMap<u32, u32>, uplinks: &[UplinkSpec]) -> Result<()> {
        let wanted = view::wanted(&self.view, slots, uplinks);
        let ports_changed = |installed: &BTreeMap<u32, BridgePort>, up: bool| {
            wanted
                .ports
                .iter()
                .filter(|(slot, port)| installed.get(slot) != Some(port) && (port.flags != 0) == up)
                .map(|(s, p)| (*s, *p))
                .collect::<Vec<_>>()
        };
        for (slot, port) in ports_changed(&self.installed.ports, true) {
            maps.set_bridge_port(slot, port)?;
        }
        for (key, entry) in &wanted.fdb {
            if self.installed.fdb.get(key) != Some(entry) {
                maps.set_fdb(*key, *entry)?;
            }
        }
        for key in self.installed.fdb.keys().filter(|k| !wanted.fdb.contains_key(k)) {
            maps.remove_fdb(key)?;
        }
        for (slot, port) in ports_changed(&self.installed.ports, false) {
            maps.set_bridge_port(slot, port)?;
        }
        for slot in self.installed.ports.keys().filter(|s| !wanted.ports.contains_key(s)) {
            maps.set_bridge_port(*slot, BridgePort::default())?;
        }
        self.installed = wanted;
        self.count();
        Ok(())
    }

    fn count(&mut self) {
        use rocev2_common::maps::{FDB_KERNEL, FDB_LOCAL, FDB_UPLINK};
        let s = &mut self.stats;
        let of = |kind| self.installed.fdb.values().filter(|e| e.kind == kind).count();
        (s.fdb_port, s.fdb_uplink, s.fdb_local, s.fdb_kernel) =
            (of(FDB_PORT), of(FDB_UPLINK), of(FDB_LOCAL), of(FDB_KERNEL));
        let ports = self.view.port_list();
        s.ports = ports.len();
        s.forwarding = ports.iter().filter(|(i, _)| self.view.forwarding(*i)).count();
        s.other_vlans = self.view.other_vlans.len();
        s.ageing_s = self.view.ageing.as_secs();
    }

    /// How often the kernel's ageing of active hosts is refreshed.
    fn refresh_interval(&self) -> Duration {
        (self.view.ageing / 5).clamp(REFRESH_BOUNDS.0, REFRESH_BOUNDS.1)
    }

    /// When due: tells the kernel bridge which learned entries XDP
    /// forwarded frames from since the last time (their hit bits), so it
    /// does not age out hosts that are busy but never seen by it.
    /// Says whether it refreshed any (the counts changed).
    pub async fn refresh_ageing(&mut self, netlink: &Netlink, maps: &mut Maps) -> Result<bool> {
        if self.last_refresh.elapsed() < self.refresh_interval() {
            return Ok(false);
        }
        self.last_refresh = Instant::now();
        let before = self.stats.ageing_refreshes;
        for (key, installed) in &self.installed.fdb {
            let learned = self.view.fdb.get(&key.mac).is_some_and(|e| e.kind == EntryKind::Learned);
            if installed.kind != FDB_PORT || !learned {
                continue;
            }
            let Some(live) = maps.fdb_entry(key) else { continue };
            if live.active == 0 {
                continue;
            }
            match netlink.refresh_fdb(installed.target, &key.mac).await {
                Ok(()) => self.stats.ageing_refreshes += 1,
                // The port may have just left or stopped forwarding; the
                // event that says so is on its way.
                Err(e) => {
                    tracing::debug!("cannot refresh the FDB entry of {}: {e:#}", crate::sys::format_mac(&key.mac))
                }
            }
            maps.set_fdb(*key, FdbEntry { active: 0, ..*installed })?;
        }
        Ok(self.stats.ageing_refreshes != before)
    }

    /// The uplink groups' ports as ifindexes (ports not in the bridge left out).
    pub fn port_ifindexes(&self, names: &[String]) -> Vec<u32> {
        names.iter().filter_map(|n| self.view.port_named(n)).collect()
    }
}

/// What a config that names a bond or VLAN device should know when the
/// device is missing: this box may not be able to make one.
pub fn missing_device_hint(name: &str) -> &'static str {
    let looks_vlan = name.rsplit_once('.').is_some_and(|(_, id)| id.parse::<u16>().is_ok());
    if looks_vlan {
        "; a VLAN device (NAME.ID) must exist before rocev2 starts, and this kernel may lack 802.1Q (`ip link add link eth0 name eth0.100 type vlan id 100` says so)"
    } else if name.starts_with("bond") || name.starts_with("team") {
        "; a bond must exist before rocev2 starts, and this kernel may lack bonding (`ip link add bond0 type bond` says so)"
    } else {
        ""
    }
}

/// What `run` and `check` verify of a `[bridge]` config on this box: the
/// bridge exists and is one; no `[[port]]` and no `[[group]]` next hop is
/// one of its ports (those are served at layer 2); every uplink group
/// port is one of its ports.
/// `ports` and `members` are the links of the config's `[[port]]`s and
/// group members, in config order.
pub async fn check_links(
    netlink: &Netlink,
    config: &Config,
    ports: &[LinkInfo],
    members: &[Vec<LinkInfo>],
) -> Result<()> {
    let Some(bridge) = &config.bridge else { return Ok(()) };
    let hint = crate::sys::netns::interface_hint();
    let link = netlink.link(&bridge.name).await.map_err(|e| {
        config.error_at(&bridge.loc, "", format!("{e:#}{hint}; make it with `ip link add {} type bridge`", bridge.name))
    })?;
    if link.kind.as_deref() != Some("bridge") {
        let kind = link.kind.as_deref().unwrap_or("a physical interface");
        return Err(config
            .error_at(&bridge.loc, "", format!("{} is not a Linux bridge (it is {kind}); [bridge] follows a bridge made with `ip link add NAME type bridge`", bridge.name))
            .into());
    }
    for (port, l) in config.ports.iter().zip(ports) {
        if l.ifindex == link.ifindex || l.master == Some(link.ifindex) {
            return Err(config
                .error_at(&port.loc, "", format!("{} is {} bridge {}, which [bridge] serves at layer 2; remove this [[port]] (a box may route on other ports)", port.name, if l.ifindex == link.ifindex { "the" } else { "a port of" }, bridge.name))
                .into());
        }
    }
    for (group, list) in config.groups.iter().zip(members) {
        for (member, l) in group.members.iter().zip(list) {
            let in_bridge = l.master == Some(link.ifindex);
            if member.next_hop == NextHop::BridgePort && !in_bridge {
                return Err(config
                    .error_at(&member.loc, "", format!("{} is not a port of bridge {}; add it (`ip link set {} master {}`) or take it out of the uplink group", member.dev, bridge.name, member.dev, bridge.name))
                    .into());
            }
            if member.next_hop != NextHop::BridgePort && (in_bridge || l.ifindex == link.ifindex) {
                return Err(config
                    .error_at(&member.loc, "dev", format!("{} is a port of bridge {} (or the bridge itself): routed traffic cannot leave by it behind the bridge's back; serve those ports with an [[uplink_group]]", member.dev, bridge.name))
                    .into());
            }
        }
    }
    Ok(())
}
