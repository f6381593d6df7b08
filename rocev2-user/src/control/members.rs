//! The configured members of `rocev2 run`'s groups and what is known
//! about each: link state, the neighbour's MAC, its place among the usable
//! members; with the one log line per change of usability.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::{
    control::config::NextHop,
    control::dataplane::MemberSpec,
    sys::format_mac,
    sys::netlink::{LinkInfo, Netlink},
};

/// How long `run` waits for a `via` neighbour at start before leaving the
/// member out (it keeps retrying afterwards).
pub(crate) const FIRST_RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// One configured member and what is currently known about it.
#[derive(Clone, Debug)]
pub(crate) struct MemberLive {
    /// Where the member is in the config file, for warnings.
    pub(crate) place: String,
    pub(crate) dev: String,
    pub(crate) next_hop: NextHop,
    pub(crate) ifindex: u32,
    pub(crate) src_mac: [u8; 6],
    /// Administratively up and with a carrier.
    pub(crate) link_up: bool,
    pub(crate) dst_mac: Option<[u8; 6]>,
    /// A bridge port (an uplink group's member): a port of the bridge in
    /// STP forwarding state, as the bridge mirror last saw it. Always true
    /// for next hops.
    pub(crate) forwarding: bool,
}

impl MemberLive {
    pub(crate) fn usable(&self) -> Option<MemberSpec> {
        let dst_mac = match self.next_hop {
            // The bridge program writes no MAC.
            NextHop::BridgePort => Some([0; 6]),
            _ => self.dst_mac,
        };
        match (self.link_up && self.forwarding, dst_mac) {
            (true, Some(dst_mac)) => Some(MemberSpec { ifindex: self.ifindex, src_mac: self.src_mac, dst_mac }),
            _ => None,
        }
    }

    pub(crate) fn from_link(place: String, dev: &str, next_hop: NextHop, link: &LinkInfo) -> Self {
        Self {
            place,
            dev: dev.to_string(),
            next_hop,
            ifindex: link.ifindex,
            src_mac: link.mac,
            link_up: link.up && link.carrier,
            dst_mac: match next_hop {
                NextHop::Mac(mac) => Some(mac),
                NextHop::Via(_) | NextHop::BridgePort => None,
            },
            // A bridge port waits for the bridge mirror to say so.
            forwarding: next_hop != NextHop::BridgePort,
        }
    }
}

pub(crate) fn next_hop_text(n: &NextHop) -> String {
    match n {
        NextHop::Via(ip) => format!("via {ip}"),
        NextHop::Mac(mac) => format!("mac {}", format_mac(mac)),
        NextHop::BridgePort => "bridge port".to_string(),
    }
}

/// A next hop as a log field: the address, the static MAC, or "bridge
/// port" (an uplink group's member, reached through the bridge).
fn next_hop_field(n: &NextHop) -> String {
    match n {
        NextHop::Via(ip) => ip.to_string(),
        NextHop::Mac(mac) => format_mac(mac),
        NextHop::BridgePort => "bridge port".to_string(),
    }
}

/// Each configured member's position among the usable ones (its place in
/// the dataplane's member list and counters), `None` if not usable.
pub(crate) fn live_positions(members: &[MemberLive]) -> Vec<Option<u32>> {
    crate::control::groups::positions(members.iter().map(|m| m.usable().is_some()))
}

/// One line per change of a member's usability: a warning naming group,
/// member and reason when it leaves its group, info when it rejoins or its
/// neighbour's MAC changes.
pub(crate) fn log_member_change(group: &str, member: &MemberLive, was_usable: bool, link_down: Option<&str>) {
    let name = format!("{} {}", member.dev, next_hop_text(&member.next_hop));
    // As fields: the device and the next hop (an address or a static MAC) apart.
    let (dev, next_hop) = (member.dev.as_str(), next_hop_field(&member.next_hop));
    match (was_usable, member.usable().is_some()) {
        (true, false) => {
            let reason = match (link_down, member.next_hop) {
                (Some(reason), _) => reason.to_string(),
                (None, NextHop::Via(ip)) => format!("neighbour {ip} does not answer"),
                (None, NextHop::Mac(_)) => "unusable".to_string(),
                (None, NextHop::BridgePort) => "not a port of the bridge in STP forwarding state".to_string(),
            };
            tracing::warn!(group, member = dev, next_hop, reason, "member {name} left group {group}: {reason}");
        }
        (false, true) => tracing::info!(group, member = dev, next_hop, "member {name} rejoined group {group}"),
        (true, true) => tracing::info!(
            group,
            member = dev,
            next_hop,
            mac = %member.dst_mac.map(|m| format_mac(&m)).unwrap_or_default(),
            "member {name} of group {group}: neighbour MAC changed to {}",
            member.dst_mac.map(|m| format_mac(&m)).unwrap_or_default()
        ),
        (false, false) => {
            tracing::debug!(group, member = name.as_str(), "member {name} of group {group} still unusable")
        }
    }
}

/// Resolves, concurrently, every `via` member without a MAC yet whose
/// link is up. One whose link is down could not answer: it is not usable
/// anyway, and the link poll resolves it once its link comes back (without
/// that, a reload while a link is down waited the whole timeout).
pub(crate) async fn resolve_new_neighbours(netlink: &Netlink, members: &mut BTreeMap<String, Vec<MemberLive>>) {
    let todo: Vec<&mut MemberLive> = members
        .values_mut()
        .flatten()
        .filter(|m| m.dst_mac.is_none() && m.link_up && matches!(m.next_hop, NextHop::Via(_)))
        .collect();
    let started = Instant::now();
    let results = futures::future::join_all(todo.iter().map(|m| {
        let NextHop::Via(ip) = m.next_hop else { unreachable!("filtered above") };
        netlink.resolve_neighbour(m.ifindex, ip, FIRST_RESOLVE_TIMEOUT)
    }))
    .await;
    for (member, result) in todo.into_iter().zip(results) {
        match result {
            Ok(mac) => member.dst_mac = Some(mac),
            Err(e) => tracing::warn!(
                "{}.via: member {} {}: {e:#} (after {:.1} s); left out of its group until it answers: check the address, or use `mac = ...` for a static neighbour",
                member.place,
                member.dev,
                next_hop_text(&member.next_hop),
                started.elapsed().as_secs_f64()
            ),
        }
    }
}
