//! Host bridge mode in the decision model: where the bridge program
//! (rocev2-ebpf `bridge.rs`) sends a frame, by its destination MAC's entry
//! in the mirrored FDB, in the program's order of checks; and for a MAC of
//! an uplink group, which member, by the very choice a routed group makes
//! (`choose_member` in the parent module).

use std::collections::BTreeMap;

use anyhow::Result;
use rocev2_common::maps::{BridgePort, FdbEntry, BRIDGE_PORT_FORWARDING, FDB_KERNEL, FDB_LOCAL, FDB_PORT, FDB_UPLINK};

use super::{choose_member, Explanation, Live, PacketFields, Verdict};
use crate::{
    control::config::{Config, UplinkMacs},
    control::dataplane::Maps,
    control::state::{PortState, RunState},
    sys::format_mac,
};

/// The layer-2 fields of a frame, and the port it arrives on if known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub dst_mac: [u8; 6],
    /// With `in_port`: checked as the program does (a source the FDB does
    /// not have on that port goes to the kernel bridge to be learned).
    pub src_mac: Option<[u8; 6]>,
    pub in_port: Option<String>,
}

/// What a running `rocev2 run` has in its bridge maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveBridge {
    pub fdb: BTreeMap<[u8; 6], FdbEntry>,
    /// Every port with its counter slot (routed ports too).
    pub ports: Vec<PortState>,
    /// BRIDGE_PORTS, by slot.
    pub states: BTreeMap<u32, BridgePort>,
}

/// Reads the bridge maps of the `rocev2 run` using `config`'s pin directory.
pub fn read_live_bridge(config: &Config) -> Result<LiveBridge> {
    let pin_dir = &config.dataplane.pin_dir;
    let state = RunState::read(pin_dir)?;
    let maps = Maps::open_pinned(pin_dir)?;
    let fdb = maps.fdb_entries().into_iter().filter(|(k, _)| k.vlan == 0).map(|(k, e)| (k.mac, e)).collect();
    let states = state.ports.iter().filter_map(|p| maps.bridge_port(p.slot).ok().map(|b| (p.slot, b))).collect();
    Ok(LiveBridge { fdb, ports: state.ports, states })
}

/// A frame the kernel bridge gets, with the counter that says why.
fn to_kernel(why: impl Into<String>, counter: &str) -> Verdict {
    Verdict::ToKernelBridge { why: format!("{} (counter {counter})", why.into()) }
}

/// Repeats the bridge program's decision for `frame` carrying `packet`.
pub fn explain_bridged(
    config: &Config,
    live: Option<&Live>,
    bridge: Option<&LiveBridge>,
    packet: &PacketFields,
    frame: &Frame,
) -> Explanation {
    let mut notes = Vec::new();
    let verdict = decide(config, live, bridge, packet, frame, &mut notes);
    Explanation { packet: *packet, verdict, notes }
}

fn decide(
    config: &Config,
    live: Option<&Live>,
    bridge: Option<&LiveBridge>,
    packet: &PacketFields,
    frame: &Frame,
    notes: &mut Vec<String>,
) -> Verdict {
    let mac = format_mac(&frame.dst_mac);
    if frame.dst_mac[0] & 1 != 0 {
        return to_kernel(format!("{mac} is a broadcast or multicast MAC (STP, LLDP and ARP requests among them): the kernel bridge floods or consumes it"), "pass_l2_multicast");
    }
    let Some(key) = packet.flow_key() else {
        return Verdict::Invalid(format!(
            "source {} and destination {} are of different IP families",
            packet.src, packet.dst
        ));
    };
    let slot_of = |port: &str| bridge.and_then(|b| b.ports.iter().find(|p| p.name == port)).map(|p| p.slot);
    let in_slot = frame.in_port.as_deref().and_then(slot_of);
    if let (Some(port), Some(b)) = (&frame.in_port, bridge) {
        match in_slot {
            None => notes.push(format!("{port} is not a port the running `rocev2 run` serves")),
            Some(slot) if b.states.get(&slot).is_none_or(|s| s.flags & BRIDGE_PORT_FORWARDING == 0) => {
                return to_kernel(
                    format!("{port} is not in STP forwarding state (or down, isolated or locked): every frame arriving on it goes to the kernel bridge"),
                    "pass_bridge_port_blocked",
                );
            }
            Some(_) => {}
        }
    }
    let entry = match bridge {
        Some(b) => b.fdb.get(&frame.dst_mac).copied(),
        None => {
            notes.push(
                "fdb: no live `rocev2 run` for this config: only the MACs its [[uplink_group]]s list are known".into(),
            );
            listed_uplink(config, &frame.dst_mac).map(|_| FdbEntry { kind: FDB_UPLINK, ..FdbEntry::default() })
        }
    };
    let Some(entry) = entry else {
        return to_kernel(
            format!("{mac} is not in the FDB: unknown unicast, which the kernel bridge floods"),
            "pass_bridge_unknown_unicast",
        );
    };
    if let (Some(src), Some(slot), Some(b)) = (frame.src_mac, in_slot, bridge) {
        let learned_here = match b.fdb.get(&src) {
            Some(e) if e.kind == FDB_PORT => e.port_slot == slot,
            Some(e) if e.kind == FDB_UPLINK => b.states.get(&slot).is_some_and(|s| s.uplink == e.target + 1),
            _ => false,
        };
        if !learned_here {
            return to_kernel(
                format!("the FDB does not have the source {} on this port: the kernel bridge gets the frame and learns it (or its move)", format_mac(&src)),
                "pass_bridge_learn",
            );
        }
    }
    let port_name = |ifindex: u32| {
        bridge
            .and_then(|b| b.ports.iter().find(|p| p.ifindex == ifindex))
            .map_or_else(|| format!("ifindex {ifindex}"), |p| p.name.clone())
    };
    match entry.kind {
        FDB_PORT if Some(entry.port_slot) == in_slot => to_kernel(
            format!("{mac} is on {}, the port the frame came in on: the kernel bridge drops it (unless hairpin)", port_name(entry.target)),
            "pass_bridge_same_port",
        ),
        FDB_PORT => Verdict::Bridged { fdb: format!("{mac} is on port {} (learned or static in the bridge's FDB)", port_name(entry.target)), port: port_name(entry.target) },
        FDB_LOCAL => to_kernel(format!("{mac} is one of the bridge's own MACs: the frame is for this box"), "pass_bridge_local"),
        FDB_KERNEL => to_kernel(
            format!("{mac} is on a port rocev2 does not send to (not in STP forwarding state, down, isolated or locked): the kernel bridge decides"),
            "pass_bridge_egress_blocked",
        ),
        _ => {
            let Some((group_index, listed)) = uplink_group(config, live, &entry, &frame.dst_mac) else {
                return Verdict::Invalid(format!("the FDB names group slot {} for {mac}, which the config does not have", entry.target));
            };
            let group = &config.groups[group_index];
            let fdb = if listed {
                format!("{mac} is a MAC of uplink group {} (listed in its macs: reachable through every one of its ports)", group.name)
            } else {
                format!("{mac} was learned on a port of uplink group {} (macs = \"learned\")", group.name)
            };
            match choose_member(config, live, group, group_index as u32, packet, &key, notes) {
                Some(forwarding) => Verdict::Uplink { fdb, forwarding },
                None => to_kernel(format!("{fdb}; the group has no usable member: the kernel bridge's own port for the MAC"), "pass_no_member"),
            }
        }
    }
}

/// The config index of the uplink group that lists `mac`.
fn listed_uplink(config: &Config, mac: &[u8; 6]) -> Option<usize> {
    let bridge = config.bridge.as_ref()?;
    bridge.uplinks.iter().find(|u| matches!(&u.macs, UplinkMacs::Listed(m) if m.contains(mac))).map(|u| u.group_index)
}

/// The uplink group of an FDB_UPLINK entry (by its live slot, else the
/// config's list), and whether the config lists the MAC.
fn uplink_group(config: &Config, live: Option<&Live>, entry: &FdbEntry, mac: &[u8; 6]) -> Option<(usize, bool)> {
    if let Some(i) = listed_uplink(config, mac) {
        return Some((i, true));
    }
    let name = &live?.groups.iter().find(|g| g.index == entry.target)?.name;
    config.groups.iter().position(|g| &g.name == name).map(|i| (i, false))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rocev2_common::{
        buckets::{even_table, member_for},
        hash::{member_hash, HashMode},
    };

    use super::*;

    const CONFIG: &str = r#"[dataplane]
hash_seed = 7

[bridge]
name = "br0"

[[uplink_group]]
name = "gateways"
ports = ["u1", "u2", "u3", "u4"]
macs = ["02:52:32:fe:00:01"]
"#;
    const GW: [u8; 6] = [0x02, 0x52, 0x32, 0xFE, 0, 1];
    const HOST: [u8; 6] = [0x02, 0x52, 0x32, 0x20, 0, 1];
    const OTHER: [u8; 6] = [0x02, 0x52, 0x32, 0x20, 0, 2];

    fn config() -> Config {
        Config::parse(CONFIG, Path::new("bridge.toml")).unwrap()
    }

    fn packet(qp: u32) -> PacketFields {
        PacketFields {
            src: "10.0.1.1".parse().unwrap(),
            dst: "10.1.0.1".parse().unwrap(),
            protocol: 17,
            src_port: 0xC000,
            dst_port: 4791,
            dest_qp: Some(qp),
        }
    }

    /// h1 in slot 63, u1..u4 in 62..59, everything forwarding; the host on
    /// h1, another host on u3.
    fn bridge() -> LiveBridge {
        let mut b = LiveBridge::default();
        for (i, name) in ["h1", "u1", "u2", "u3", "u4"].iter().enumerate() {
            let slot = 63 - i as u32;
            b.ports.push(PortState { name: name.to_string(), ifindex: 10 + i as u32, slot });
            let uplink = if i > 0 { 1 } else { 0 };
            b.states.insert(slot, BridgePort { flags: BRIDGE_PORT_FORWARDING, uplink });
        }
        b.fdb.insert(HOST, FdbEntry { kind: FDB_PORT, target: 10, port_slot: 63, active: 0 });
        b.fdb.insert(OTHER, FdbEntry { kind: FDB_PORT, target: 13, port_slot: 60, active: 0 });
        b.fdb.insert(GW, FdbEntry { kind: FDB_UPLINK, target: 0, port_slot: 0, active: 0 });
        b.fdb.insert([2, 0, 0, 0, 0, 0xBB], FdbEntry { kind: FDB_LOCAL, ..FdbEntry::default() });
        b
    }

    fn frame(dst: [u8; 6]) -> Frame {
        Frame { dst_mac: dst, src_mac: Some(HOST), in_port: Some("h1".into()) }
    }

    #[test]
    fn the_gateway_takes_the_member_the_groups_choice_gives() {
        let c = config();
        for qp in [0x100, 0x101, 0x102, 0xABCDEF] {
            let e = explain_bridged(&c, None, Some(&bridge()), &packet(qp), &frame(GW));
            let Verdict::Uplink { fdb, forwarding } = e.verdict else { panic!("{:?}", e.verdict) };
            assert!(fdb.contains("uplink group gateways"), "{fdb}");
            let key = packet(qp).flow_key().unwrap();
            let want = member_for(&even_table(4), member_hash(&key, HashMode::Qp, 7, c.dataplane.hash_version));
            assert_eq!(forwarding.position, want);
            assert_eq!(forwarding.member, format!("dev u{} bridge port", want + 1));
        }
        // Without a live run the listed MAC is still known.
        assert!(matches!(explain_bridged(&c, None, None, &packet(1), &frame(GW)).verdict, Verdict::Uplink { .. }));
    }

    #[test]
    fn every_other_outcome_names_its_counter() {
        let c = config();
        let b = bridge();
        let why = |f: Frame| match explain_bridged(&c, None, Some(&b), &packet(1), &f).verdict {
            Verdict::ToKernelBridge { why } => why,
            Verdict::Bridged { port, .. } => format!("bridged to {port}"),
            other => panic!("{other:?}"),
        };
        assert_eq!(why(frame(OTHER)), "bridged to u3");
        assert!(why(frame([0xFF; 6])).contains("pass_l2_multicast"));
        assert!(why(frame([2, 0, 0, 0, 0, 0x99])).contains("pass_bridge_unknown_unicast"));
        assert!(why(frame([2, 0, 0, 0, 0, 0xBB])).contains("pass_bridge_local"));
        assert!(why(Frame { src_mac: Some(OTHER), ..frame(HOST) }).contains("pass_bridge_learn"));
        assert!(why(Frame { src_mac: None, ..frame(HOST) }).contains("pass_bridge_same_port"));
        let mut blocked = b.clone();
        blocked.fdb.insert(OTHER, FdbEntry { kind: FDB_KERNEL, ..FdbEntry::default() });
        blocked.states.insert(63, BridgePort::default());
        let e = explain_bridged(&c, None, Some(&blocked), &packet(1), &frame(OTHER));
        assert!(matches!(&e.verdict, Verdict::ToKernelBridge { why } if why.contains("pass_bridge_port_blocked")));
        let e = explain_bridged(&c, None, Some(&blocked), &packet(1), &Frame { in_port: None, ..frame(OTHER) });
        assert!(matches!(&e.verdict, Verdict::ToKernelBridge { why } if why.contains("pass_bridge_egress_blocked")));
    }
}
