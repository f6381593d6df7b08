//! `rocev2 run`: bring the dataplane up from a config, keep it in step with
//! the kernel (neighbour MACs, link state), and take it down cleanly.

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::IpAddr,
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::programs::XdpMode as AyaXdpMode;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    config::{Attach, Config, NextHop, Policy, Prefix, XdpMode},
    dataplane::{local_routes, Dataplane, GroupPolicy, MemberSpec},
    netlink::{ensure_veth_peer_napi, Netlink, PeerNapi},
    state::{GroupState, MemberState, PortState, RunLock, RunState},
    stats::Snapshot,
};

/// How long `run` waits for a `via` neighbour at start before leaving the
/// member out (it keeps retrying afterwards).
const FIRST_RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The line `run` prints once the programs are attached and the maps are
/// filled; scripts and tests wait for it.
pub const READY_LINE: &str = "rocev2: ready";

pub struct RunOptions {
    /// Overrides `[dataplane] xdp_mode`.
    pub xdp_mode: Option<XdpMode>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// One configured member and what is currently known about it.
#[derive(Clone, Debug)]
struct MemberLive {
    dev: String,
    next_hop: NextHop,
    ifindex: u32,
    src_mac: [u8; 6],
    link_up: bool,
    dst_mac: Option<[u8; 6]>,
}

impl MemberLive {
    fn usable(&self) -> Option<MemberSpec> {
        match (self.link_up, self.dst_mac) {
            (true, Some(dst_mac)) => Some(MemberSpec { ifindex: self.ifindex, src_mac: self.src_mac, dst_mac }),
            _ => None,
        }
    }
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn next_hop_text(n: &NextHop) -> String {
    match n {
        NextHop::Via(ip) => format!("via {ip}"),
        NextHop::Mac(mac) => format!("mac {}", format_mac(mac)),
    }
}

pub async fn run(config: Config, options: RunOptions, netns: Option<String>) -> Result<Snapshot> {
    let pin_dir = config.dataplane.pin_dir.clone();
    let _lock = RunLock::acquire(&pin_dir)?;
    let netlink = Netlink::new().context("cannot open a netlink socket")?;

    // Every interface named in the config must exist before anything loads.
    let mut ports = Vec::new();
    for (i, port) in config.ports.iter().enumerate() {
        let link = netlink
            .link(&port.name)
            .await
            .map_err(|e| config.error_at(&port.loc, "name", format!("{e:#}")))?;
        ports.push(PortState { name: port.name.clone(), ifindex: link.ifindex, slot: i as u32 + 1 });
    }
    let mut groups: Vec<Vec<MemberLive>> = Vec::new();
    let mut egress = BTreeMap::new();
    for group in &config.groups {
        let mut members = Vec::new();
        for member in &group.members {
            let link = netlink
                .link(&member.dev)
                .await
                .map_err(|e| config.error_at(&member.loc, "dev", format!("{e:#}")))?;
            let dst_mac = match member.next_hop {
                NextHop::Mac(mac) => Some(mac),
                NextHop::Via(_) => None,
            };
            egress.insert(link.ifindex, link.clone());
            members.push(MemberLive {
                dev: member.dev.clone(),
                next_hop: member.next_hop,
                ifindex: link.ifindex,
                src_mac: link.mac,
                link_up: link.up,
                dst_mac,
            });
        }
        groups.push(members);
    }

    // Resolve all `via` neighbours concurrently.
    let resolutions = groups.iter().flatten().map(|m| {
        let netlink = &netlink;
        async move {
            match m.next_hop {
                NextHop::Via(ip) => Some(netlink.resolve_neighbour(m.ifindex, ip, FIRST_RESOLVE_TIMEOUT).await),
                NextHop::Mac(_) => None,
            }
        }
    });
    let resolved = futures::future::join_all(resolutions).await;
    for (member, result) in groups.iter_mut().flatten().zip(resolved) {
        match result {
            Some(Ok(mac)) => member.dst_mac = Some(mac),
            Some(Err(e)) => eprintln!(
                "rocev2: warning: member {} {}: {e:#}; left out of its group until it resolves",
                member.dev,
                next_hop_text(&member.next_hop)
            ),
            None => {}
        }
    }

    let mut egress_links = Vec::new();
    for e in &config.egress {
        let link = netlink.link(&e.dev).await.map_err(|err| config.error_at(&e.loc, "dev", format!("{err:#}")))?;
        egress_links.push(link);
    }

    let mut dataplane = Dataplane::load_with(Some(&pin_dir), config.flowlet_table_size())?;
    dataplane.maps.set_hash_seed(config.dataplane.hash_seed)?;
    for (i, profile) in config.ecn_profiles.iter().enumerate() {
        dataplane.maps.set_ecn_profile(i as u32, profile.to_map_entry())?;
    }
    for (slot, (e, link)) in config.egress.iter().zip(&egress_links).enumerate() {
        let profile = e.ecn_profile.map_or(rocev2_common::ecn::NO_PROFILE, |p| p as u32);
        dataplane.maps.set_egress(link.ifindex, slot as u32, e.rate_bytes_per_sec, profile)?;
    }
    dataplane.maps.set_classes(&config.class_entries())?;
    for port in &ports {
        dataplane.maps.set_port(port.ifindex, port.slot)?;
    }
    for link in egress.values() {
        dataplane.maps.add_egress_dev(link.ifindex)?;
        match ensure_veth_peer_napi(link) {
            Ok(PeerNapi::EnabledGro { peer_name, netns }) => println!(
                "rocev2: enabled GRO on {peer_name} (netns {netns}), the veth peer of {}, so XDP redirects into {} are delivered",
                link.name, link.name
            ),
            Ok(_) => {}
            Err(e) => eprintln!(
                "rocev2: warning: egress {} is a veth whose peer may lack NAPI; redirected frames may be dropped: {e:#}",
                link.name
            ),
        }
    }
    publish_groups(&mut dataplane, &config, &groups)?;
    let local = netlink.local_addresses().await.context("cannot list local addresses")?;
    dataplane.sync_routes(&wanted_routes(&config, &local))?;
    let mut state = RunState {
        pid: std::process::id(),
        config: config.path.clone(),
        netns: netns.clone(),
        ports: ports.clone(),
        groups: group_states(&config, &groups),
        egress: config
            .egress
            .iter()
            .enumerate()
            .map(|(slot, e)| crate::state::EgressState { name: e.dev.clone(), slot: slot as u32, rate_bytes_per_sec: e.rate_bytes_per_sec })
            .collect(),
        classes: config.classes.iter().map(|c| c.name.clone()).collect(),
    };
    state.write(&pin_dir)?;

    // Attach last, so the first packet already sees complete maps.
    let mode = match options.xdp_mode.unwrap_or(config.dataplane.xdp_mode) {
        XdpMode::Native => AyaXdpMode::Driver,
        XdpMode::Skb => AyaXdpMode::Skb,
    };
    let attach_text = match config.dataplane.attach {
        Attach::Xdp => {
            for port in &ports {
                dataplane.attach(&port.name, port.ifindex, mode)?;
            }
            format!("{} XDP", crate::dataplane::mode_name(mode))
        }
        Attach::Tc => {
            for port in &ports {
                dataplane.attach_tc(&port.name, aya::programs::TcAttachType::Ingress)?;
            }
            "tc ingress".to_string()
        }
    };
    for e in config.egress.iter().filter(|e| e.local) {
        dataplane.attach_tc(&e.dev, aya::programs::TcAttachType::Egress)?;
        println!("rocev2: classes and ECN marking for traffic this box sends on {}", e.dev);
    }
    println!(
        "rocev2: forwarding on {} ({attach_text}), {} groups, {} routes, maps pinned in {}",
        ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
        config.groups.len(),
        config.routes.len(),
        pin_dir.display()
    );
    let metrics = match options.metrics_addr {
        Some(addr) => {
            let server = crate::metrics::MetricsServer::start(addr, pin_dir.clone())
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            let place = netns.as_deref().map(|n| format!(" inside network namespace {n} (e.g. `ip netns exec {n} curl ...`)")).unwrap_or_default();
            println!("rocev2: metrics at http://{}/metrics{place}", server.local_addr());
            Some(server)
        }
        None => None,
    };
    println!("{READY_LINE}");
    std::io::stdout().flush().ok();

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut tick = tokio::time::interval(config.dataplane.neighbour_refresh);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = tick.tick() => {
                if refresh(&netlink, &mut groups).await {
                    publish_groups(&mut dataplane, &config, &groups)?;
                    state.groups = group_states(&config, &groups);
                    state.write(&pin_dir)?;
                }
                let local_now = netlink.local_addresses().await.unwrap_or_else(|_| local.clone());
                dataplane.sync_routes(&wanted_routes(&config, &local_now))?;
            }
        }
    }

    if let Some(server) = metrics {
        server.stop().ok();
    }
    let snapshot = Snapshot::collect(&dataplane.maps, &state)?;
    drop(dataplane); // detaches the programs and removes the pins
    RunState::remove(&pin_dir);
    Ok(snapshot)
}

/// Re-reads link state and neighbour MACs; true if any member changed.
async fn refresh(netlink: &Netlink, groups: &mut [Vec<MemberLive>]) -> bool {
    let mut changed = false;
    for member in groups.iter_mut().flatten() {
        let before = (member.link_up, member.dst_mac);
        if let Ok(link) = netlink.link(&member.dev).await {
            member.link_up = link.up;
            member.ifindex = link.ifindex;
            member.src_mac = link.mac;
        }
        if let NextHop::Via(ip) = member.next_hop {
            match netlink.refresh_neighbour(member.ifindex, ip).await {
                Ok(Some(mac)) => member.dst_mac = Some(mac),
                Ok(None) => member.dst_mac = None,
                Err(_) => {}
            }
        }
        if before != (member.link_up, member.dst_mac) {
            println!(
                "rocev2: member {} {} is now {}",
                member.dev,
                next_hop_text(&member.next_hop),
                if member.usable().is_some() { "usable" } else { "unusable (link down or neighbour unresolved)" }
            );
            changed = true;
        }
    }
    changed
}

/// The dataplane's view of a configured group policy.
pub fn group_policy(group: &crate::config::Group) -> GroupPolicy {
    use rocev2_common::maps::{FLOWLET_AT_BOUNDARY, POLICY_FLOWLET, POLICY_PINNED};
    match group.policy {
        Policy::Hash => GroupPolicy::hash(group.hash),
        Policy::Pinned => GroupPolicy { policy: POLICY_PINNED, ..GroupPolicy::hash(group.hash) },
        Policy::Flowlet(f) => GroupPolicy {
            policy: POLICY_FLOWLET,
            flowlet_gap_ns: f.gap.as_nanos() as u64,
            flowlet_choice: f.choice as u32,
            flowlet_flags: if f.at_message_boundary { FLOWLET_AT_BOUNDARY } else { 0 },
            ..GroupPolicy::hash(group.hash)
        },
    }
}

/// Publishes every group's usable members, then rewrites its pins for the
/// new positions (a pin to an unusable member falls back to hashing).
fn publish_groups(dataplane: &mut Dataplane, config: &Config, groups: &[Vec<MemberLive>]) -> Result<()> {
    use rocev2_common::maps::{PinEntry, PIN_MEMBER_DOWN};
    for (index, (group, members)) in config.groups.iter().zip(groups).enumerate() {
        let usable: Vec<MemberSpec> = members.iter().filter_map(MemberLive::usable).collect();
        let generation = dataplane
            .maps
            .publish_group_with(index as u32, &group_policy(group), &usable)
            .with_context(|| format!("cannot publish group {}", group.name))?;
        // Position of each configured member among the usable ones.
        let mut live_position = Vec::with_capacity(members.len());
        let mut next = 0u32;
        for m in members {
            if m.usable().is_some() {
                live_position.push(Some(next));
                next += 1;
            } else {
                live_position.push(None);
            }
        }
        for pin in config.pins.iter().filter(|p| p.group_index == index as u32) {
            let position = live_position.get(pin.member_index).copied().flatten().unwrap_or(PIN_MEMBER_DOWN);
            let entry = PinEntry { group: index as u32, position, generation, _reserved: 0 };
            dataplane.maps.set_pin(&pin.prefix, pin.qp, entry)?;
        }
    }
    Ok(())
}

fn group_states(config: &Config, groups: &[Vec<MemberLive>]) -> Vec<GroupState> {
    config
        .groups
        .iter()
        .zip(groups)
        .enumerate()
        .map(|(index, (group, members))| GroupState {
            name: group.name.clone(),
            index: index as u32,
            hash: hash_name(group.hash).to_string(),
            members: members
                .iter()
                .filter(|m| m.usable().is_some())
                .map(|m| MemberState {
                    dev: m.dev.clone(),
                    next_hop: next_hop_text(&m.next_hop),
                    mac: m.dst_mac.map(|mac| format_mac(&mac)).unwrap_or_default(),
                })
                .collect(),
        })
        .collect()
}

pub fn hash_name(mode: rocev2_common::hash::HashMode) -> &'static str {
    match mode {
        rocev2_common::hash::HashMode::FiveTuple => "five-tuple",
        rocev2_common::hash::HashMode::Qp => "qp",
    }
}

/// Configured routes plus host routes for every local address (which win:
/// traffic for the box itself is never forwarded).
fn wanted_routes(config: &Config, local: &[IpAddr]) -> BTreeMap<Prefix, u32> {
    let mut routes: BTreeMap<Prefix, u32> = config.routes.iter().map(|r| (r.prefix, r.group_index)).collect();
    routes.extend(local_routes(local));
    routes
}

/// Default pin directory path for a config (used by `stats --config`).
pub fn pin_dir_of(config: &Config) -> PathBuf {
    config.dataplane.pin_dir.clone()
}
