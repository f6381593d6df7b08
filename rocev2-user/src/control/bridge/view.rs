//! The mirror's model of one Linux bridge: its ports (with their STP
//! state) and its forwarding database, as netlink reports them; and what
//! the dataplane's FDB and BRIDGE_PORTS maps must hold for it ([`wanted`]).
//! Pure: the netlink messages come in as bytes, so unit tests feed it
//! messages the way the kernel sends them.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use rocev2_common::maps::{
    BridgePort, FdbEntry, FdbKey, BRIDGE_PORT_FORWARDING, FDB_KERNEL, FDB_LOCAL, FDB_PORT, FDB_UPLINK,
};
use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::{
        link::{InfoBridge, InfoData, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
        neighbour::{NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState},
        AddressFamily, RouteNetlinkMessage,
    },
};

use crate::control::config::UplinkMacs;

/// A bridge port's STP state that forwards (linux/if_bridge.h BR_STATE_*).
pub const BR_STATE_FORWARDING: u8 = 3;
// Bridge port attributes inside IFLA_PROTINFO (linux/if_link.h IFLA_BRPORT_*).
const IFLA_BRPORT_STATE: u16 = 1;
const IFLA_BRPORT_ISOLATED: u16 = 33;
const IFLA_BRPORT_LOCKED: u16 = 39;

/// The kernel's default ageing time (300 s), until the bridge says otherwise.
const DEFAULT_AGEING: Duration = Duration::from_secs(300);

/// An interface of the namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    /// IFLA_MASTER: the bridge a port belongs to (0: none).
    pub master: u32,
    /// Administratively up and with a carrier.
    pub up: bool,
    pub kind: Option<String>,
}

/// What the bridge says of one of its ports (AF_BRIDGE link messages).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortFlags {
    /// BR_STATE_*: 0 disabled, 1 listening, 2 learning, 3 forwarding, 4 blocking.
    pub stp_state: u8,
    /// An isolated port may not reach another isolated one: the kernel decides.
    pub isolated: bool,
    /// A locked port (802.1X): the kernel decides.
    pub locked: bool,
}

/// How an FDB entry came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// Learned from traffic; ages out unless frames keep arriving.
    Learned,
    /// `extern_learn` (added by a control plane, e.g. EVPN); never aged.
    ExternLearned,
    /// `static`: added by hand; never aged.
    Static,
    /// The bridge's own MAC or a port's (`permanent`): frames are for this box.
    Local,
}

/// One FDB entry: the port it names and how it came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The port's ifindex (the bridge's own for its local MAC).
    pub port: u32,
    pub kind: EntryKind,
}

/// What one netlink message changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Nothing,
    /// A link, a port or its STP state.
    Ports,
    Fdb,
}

/// One bridge as the mirror knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeView {
    pub name: String,
    /// The bridge's ifindex (0 until a link message names it).
    pub ifindex: u32,
    pub ageing: Duration,
    pub vlan_filtering: bool,
    /// Every link of the namespace, by ifindex (ports are those whose
    /// master is the bridge).
    pub links: BTreeMap<u32, Link>,
    /// Per port of the bridge, what its AF_BRIDGE messages said.
    pub ports: BTreeMap<u32, PortFlags>,
    /// The entries of VLAN 0, by MAC.
    pub fdb: BTreeMap<[u8; 6], Entry>,
    /// Entries of another VLAN (only a VLAN-aware bridge has them): not served.
    pub other_vlans: BTreeSet<([u8; 6], u16)>,
}

impl BridgeView {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            ifindex: 0,
            ageing: DEFAULT_AGEING,
            vlan_filtering: false,
            links: BTreeMap::new(),
            ports: BTreeMap::new(),
            fdb: BTreeMap::new(),
            other_vlans: BTreeSet::new(),
        }
    }

    /// The bridge's ports: (ifindex, name), by ifindex.
    pub fn port_list(&self) -> Vec<(u32, String)> {
        self.links
            .iter()
            .filter(|(i, l)| self.ifindex != 0 && l.master == self.ifindex && **i != self.ifindex)
            .map(|(i, l)| (*i, l.name.clone()))
            .collect()
    }

    /// The ifindex of the port called `name`, if it is one of the bridge's.
    pub fn port_named(&self, name: &str) -> Option<u32> {
        self.port_list().into_iter().find(|(_, n)| n == name).map(|(i, _)| i)
    }

    /// Whether rocev2 may send to and forward from this port: a port of the
    /// bridge, up, in STP forwarding state, neither isolated nor locked.
    pub fn forwarding(&self, ifindex: u32) -> bool {
        let in_bridge = self.links.get(&ifindex).is_some_and(|l| l.up && l.master == self.ifindex && self.ifindex != 0);
        let flags = self.ports.get(&ifindex).copied().unwrap_or_default();
        in_bridge && flags.stp_state == BR_STATE_FORWARDING && !flags.isolated && !flags.locked
    }

    /// Why a port is not forwarding, for the log (`None` if it is).
    pub fn why_not_forwarding(&self, ifindex: u32) -> Option<String> {
        let Some(link) = self.links.get(&ifindex) else { return Some("interface not found".into()) };
        if link.master != self.ifindex || self.ifindex == 0 {
            return Some(format!("not a port of bridge {}", self.name));
        }
        if !link.up {
            return Some("link down".into());
        }
        let flags = self.ports.get(&ifindex).copied().unwrap_or_default();
        if flags.stp_state != BR_STATE_FORWARDING {
            return Some(format!("STP state {}", stp_state_name(flags.stp_state)));
        }
        if flags.isolated {
            return Some("isolated".into());
        }
        if flags.locked {
            return Some("locked".into());
        }
        None
    }

    /// Applies one netlink message (a link or an AF_BRIDGE neighbour).
    pub fn apply(&mut self, message_type: u16, message: &[u8]) -> Changed {
        let Ok(parsed) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(message) else { return Changed::Nothing };
        let NetlinkPayload::InnerMessage(inner) = parsed.payload else { return Changed::Nothing };
        match inner {
            RouteNetlinkMessage::NewLink(m) => self.link(m, false),
            RouteNetlinkMessage::DelLink(m) => self.link(m, true),
            RouteNetlinkMessage::NewNeighbour(m) => self.neighbour(&m, false),
            RouteNetlinkMessage::DelNeighbour(m) => self.neighbour(&m, true),
            _ => {
                let _ = message_type;
                Changed::Nothing
            }
        }
    }

    fn link(&mut self, m: LinkMessage, deleted: bool) -> Changed {
        let ifindex = m.header.index;
        if m.header.interface_family == AddressFamily::Bridge {
            // The bridge's view of one of its ports (or of itself).
            if ifindex == self.ifindex {
                return Changed::Nothing;
            }
            if deleted {
                return if self.ports.remove(&ifindex).is_some() { Changed::Ports } else { Changed::Nothing };
            }
            let master = m.attributes.iter().find_map(|a| match a {
                LinkAttribute::Controller(i) => Some(*i),
                _ => None,
            });
            if self.ifindex == 0 || master != Some(self.ifindex) {
                return Changed::Nothing;
            }
            let mut flags = self.ports.get(&ifindex).copied().unwrap_or_default();
            for a in &m.attributes {
                if let LinkAttribute::ProtoInfoBridge(info) = a {
                    for nla in info {
                        let rtnetlink::packet_route::link::LinkProtoInfoBridge::Other(nla) = nla else { continue };
                        let mut value = [0u8; 1];
                        use rtnetlink::packet_core::Nla as _;
                        if nla.value_len() >= 1 {
                            let mut full = vec![0u8; nla.value_len()];
                            nla.emit_value(&mut full);
                            value[0] = full[0];
                        }
                        match nla.kind() & 0x3FFF {
                            IFLA_BRPORT_STATE => flags.stp_state = value[0],
                            IFLA_BRPORT_ISOLATED => flags.isolated = value[0] != 0,
                            IFLA_BRPORT_LOCKED => flags.locked = value[0] != 0,
                            _ => {}
                        }
                    }
                }
            }
            let before = self.ports.insert(ifindex, flags);
            return if before == Some(flags) { Changed::Nothing } else { Changed::Ports };
        }
        if deleted {
            let gone = self.links.remove(&ifindex).is_some() | self.ports.remove(&ifindex).is_some();
            return if gone { Changed::Ports } else { Changed::Nothing };
        }
        let up = m.header.flags.contains(LinkFlags::Up) && m.header.flags.contains(LinkFlags::LowerUp);
        let mut link = Link { up, ..Link::default() };
        let mut bridge_info = None;
        for a in m.attributes {
            match a {
                LinkAttribute::IfName(name) => link.name = name,
                LinkAttribute::Controller(i) => link.master = i,
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
                            LinkInfo::Data(InfoData::Bridge(b)) => bridge_info = Some(b),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if link.name == self.name && link.kind.as_deref() == Some("bridge") {
            self.ifindex = ifindex;
            for b in bridge_info.into_iter().flatten() {
                match b {
                    // In hundredths of a second.
                    InfoBridge::AgeingTime(t) => self.ageing = Duration::from_millis(u64::from(t) * 10),
                    InfoBridge::VlanFiltering(on) => self.vlan_filtering = on,
                    _ => {}
                }
            }
        }
        if link.master != self.ifindex || self.ifindex == 0 {
            // Not (or no longer) a port: forget what the bridge said of it.
            self.ports.remove(&ifindex);
        }
        let before = self.links.insert(ifindex, link.clone());
        if before.as_ref() == Some(&link) {
            Changed::Nothing
        } else {
            Changed::Ports
        }
    }

    fn neighbour(&mut self, m: &NeighbourMessage, deleted: bool) -> Changed {
        if m.header.family != AddressFamily::Bridge || self.ifindex == 0 {
            return Changed::Nothing;
        }
        let (mut mac, mut vlan, mut master) = (None, 0u16, None);
        for a in &m.attributes {
            match a {
                NeighbourAttribute::LinkLocalAddress(bytes) => mac = <[u8; 6]>::try_from(bytes.as_slice()).ok(),
                NeighbourAttribute::Vlan(v) => vlan = *v,
                NeighbourAttribute::Controller(i) => master = Some(*i),
                _ => {}
            }
        }
        // Entries of the bridge (NDA_MASTER), not a device's own address
        // lists (NTF_SELF without a master).
        let Some(mac) = mac else { return Changed::Nothing };
        if master != Some(self.ifindex) && m.header.ifindex != self.ifindex {
            return Changed::Nothing;
        }
        if m.header.flags.contains(NeighbourFlags::Own) && master.is_none() {
            return Changed::Nothing;
        }
        if vlan != 0 {
            let changed =
                if deleted { self.other_vlans.remove(&(mac, vlan)) } else { self.other_vlans.insert((mac, vlan)) };
            return if changed { Changed::Fdb } else { Changed::Nothing };
        }
        if deleted {
            // An entry that moved is announced on its new port before the
            // old one's deletion could arrive; only delete what is there.
            return match self.fdb.get(&mac) {
                Some(e) if e.port == m.header.ifindex => {
                    self.fdb.remove(&mac);
                    Changed::Fdb
                }
                _ => Changed::Nothing,
            };
        }
        let kind = if m.header.state == NeighbourState::Permanent {
            EntryKind::Local
        } else if m.header.flags.contains(NeighbourFlags::ExtLearned) {
            EntryKind::ExternLearned
        } else if m.header.state == NeighbourState::Noarp {
            EntryKind::Static
        } else {
            EntryKind::Learned
        };
        let entry = Entry { port: m.header.ifindex, kind };
        if self.fdb.insert(mac, entry) == Some(entry) {
            Changed::Nothing
        } else {
            Changed::Fdb
        }
    }
}

/// BR_STATE_* as `bridge link` prints it.
pub fn stp_state_name(state: u8) -> &'static str {
    match state {
        0 => "disabled",
        1 => "listening",
        2 => "learning",
        3 => "forwarding",
        4 => "blocking",
        _ => "unknown",
    }
}

/// One uplink group as the dataplane sees it.
pub struct UplinkSpec<'a> {
    /// The group's slot in GROUPS.
    pub slot: u32,
    /// Its ports' ifindexes (those that exist).
    pub ports: Vec<u32>,
    pub macs: &'a UplinkMacs,
}

/// What FDB and BRIDGE_PORTS must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub fdb: BTreeMap<FdbKey, FdbEntry>,
    /// By port counter slot.
    pub ports: BTreeMap<u32, BridgePort>,
}

/// The dataplane's FDB and port table for `view`, given each port's
/// counter slot (`slots`, by ifindex) and the uplink groups: the kernel's
/// entries, an uplink group's MACs in place of theirs, and every entry
/// whose port rocev2 cannot send to left to the kernel.
pub fn wanted(view: &BridgeView, slots: &BTreeMap<u32, u32>, uplinks: &[UplinkSpec]) -> Wanted {
    let mut out = Wanted::default();
    let uplink_of = |port: u32| uplinks.iter().find(|u| u.ports.contains(&port));
    for (&ifindex, &slot) in slots {
        let flags = if view.forwarding(ifindex) { BRIDGE_PORT_FORWARDING } else { 0 };
        out.ports.insert(slot, BridgePort { flags, uplink: uplink_of(ifindex).map_or(0, |u| u.slot + 1) });
    }
    let key = |mac: [u8; 6]| FdbKey { mac, vlan: 0 };
    for (&mac, entry) in &view.fdb {
        let value = match entry.kind {
            EntryKind::Local => FdbEntry { kind: FDB_LOCAL, ..FdbEntry::default() },
            _ => match (uplink_of(entry.port), slots.get(&entry.port)) {
                (Some(u), _) if *u.macs == UplinkMacs::Learned => {
                    FdbEntry { kind: FDB_UPLINK, target: u.slot, ..FdbEntry::default() }
                }
                (_, Some(&slot)) if view.forwarding(entry.port) => {
                    FdbEntry { kind: FDB_PORT, target: entry.port, port_slot: slot, active: 0 }
                }
                _ => FdbEntry { kind: FDB_KERNEL, ..FdbEntry::default() },
            },
        };
        out.fdb.insert(key(mac), value);
    }
    // Listed MACs: reachable through every port of their group, whatever
    // port the kernel learned them on (but a local MAC stays local).
    for u in uplinks {
        let UplinkMacs::Listed(macs) = u.macs else { continue };
        for &mac in macs {
            if view.fdb.get(&mac).is_some_and(|e| e.kind == EntryKind::Local) {
                continue;
            }
            out.fdb.insert(key(mac), FdbEntry { kind: FDB_UPLINK, target: u.slot, ..FdbEntry::default() });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BR: u32 = 10;
    const H1: u32 = 11;
    const U1: u32 = 12;
    const U2: u32 = 13;
    const GW: [u8; 6] = [2, 0, 0, 0, 0, 0xFE];
    const HOST: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const UP_HOST: [u8; 6] = [2, 0, 0, 0, 0, 9];

    fn view() -> BridgeView {
        let mut v = BridgeView::new("br0");
        v.ifindex = BR;
        v.links.insert(BR, Link { name: "br0".into(), master: 0, up: true, kind: Some("bridge".into()) });
        for (i, name) in [(H1, "h1"), (U1, "u1"), (U2, "u2")] {
            v.links.insert(i, Link { name: name.into(), master: BR, up: true, kind: Some("veth".into()) });
            v.ports.insert(i, PortFlags { stp_state: BR_STATE_FORWARDING, ..PortFlags::default() });
        }
        v.fdb.insert(HOST, Entry { port: H1, kind: EntryKind::Learned });
        v.fdb.insert(GW, Entry { port: U2, kind: EntryKind::Learned });
        v.fdb.insert(UP_HOST, Entry { port: U1, kind: EntryKind::Learned });
        v.fdb.insert([2, 0, 0, 0, 0, 0xBB], Entry { port: BR, kind: EntryKind::Local });
        v
    }

    fn slots() -> BTreeMap<u32, u32> {
        BTreeMap::from([(H1, 1), (U1, 2), (U2, 3)])
    }

    fn entry(w: &Wanted, mac: [u8; 6]) -> FdbEntry {
        w.fdb[&FdbKey { mac, vlan: 0 }]
    }

    #[test]
    fn learned_entries_name_their_port_and_listed_macs_their_group() {
        let macs = UplinkMacs::Listed(vec![GW]);
        let w = wanted(&view(), &slots(), &[UplinkSpec { slot: 7, ports: vec![U1, U2], macs: &macs }]);
        assert_eq!(entry(&w, HOST), FdbEntry { kind: FDB_PORT, target: H1, port_slot: 1, active: 0 });
        // The gateway was learned on u2, but it is reachable through every uplink.
        assert_eq!(entry(&w, GW).kind, FDB_UPLINK);
        assert_eq!(entry(&w, GW).target, 7);
        // Another MAC learned on an uplink stays on its port.
        assert_eq!(entry(&w, UP_HOST).kind, FDB_PORT);
        assert_eq!(entry(&w, [2, 0, 0, 0, 0, 0xBB]).kind, FDB_LOCAL);
        assert_eq!(w.ports[&1], BridgePort { flags: BRIDGE_PORT_FORWARDING, uplink: 0 });
        assert_eq!(w.ports[&2], BridgePort { flags: BRIDGE_PORT_FORWARDING, uplink: 8 });
    }

    #[test]
    fn learned_mode_serves_every_mac_of_the_groups_ports() {
        let macs = UplinkMacs::Learned;
        let w = wanted(&view(), &slots(), &[UplinkSpec { slot: 7, ports: vec![U1, U2], macs: &macs }]);
        assert_eq!(entry(&w, UP_HOST).kind, FDB_UPLINK);
        assert_eq!(entry(&w, GW).kind, FDB_UPLINK);
        assert_eq!(entry(&w, HOST).kind, FDB_PORT);
    }

    #[test]
    fn a_port_outside_forwarding_state_gets_nothing() {
        let mut v = view();
        v.ports.insert(H1, PortFlags { stp_state: 4, ..PortFlags::default() });
        let w = wanted(&v, &slots(), &[]);
        assert_eq!(entry(&w, HOST).kind, FDB_KERNEL);
        assert_eq!(w.ports[&1].flags, 0);
        assert_eq!(v.why_not_forwarding(H1).as_deref(), Some("STP state blocking"));
        v.ports.insert(H1, PortFlags { stp_state: BR_STATE_FORWARDING, isolated: true, locked: false });
        assert_eq!(entry(&wanted(&v, &slots(), &[]), HOST).kind, FDB_KERNEL);
        v.ports.insert(H1, PortFlags { stp_state: BR_STATE_FORWARDING, ..PortFlags::default() });
        v.links.get_mut(&H1).unwrap().up = false;
        assert_eq!(entry(&wanted(&v, &slots(), &[]), HOST).kind, FDB_KERNEL);
        assert_eq!(v.why_not_forwarding(H1).as_deref(), Some("link down"));
    }

    #[test]
    fn a_listed_mac_that_is_local_stays_local() {
        let macs = UplinkMacs::Listed(vec![[2, 0, 0, 0, 0, 0xBB]]);
        let w = wanted(&view(), &slots(), &[UplinkSpec { slot: 7, ports: vec![U1, U2], macs: &macs }]);
        assert_eq!(entry(&w, [2, 0, 0, 0, 0, 0xBB]).kind, FDB_LOCAL);
    }

    #[test]
    fn a_port_without_a_slot_is_left_to_the_kernel() {
        let mut s = slots();
        s.remove(&H1);
        assert_eq!(entry(&wanted(&view(), &s, &[]), HOST).kind, FDB_KERNEL);
    }
}
