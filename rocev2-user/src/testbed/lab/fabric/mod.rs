//! `rocev2 lab up --racks N`: a two-tier Clos fabric in namespaces with
//! `rocev2 run` on every switch (the shape, names and addresses are
//! [`crate::tools::fabric::Fabric`]'s).
//!
//! Every leaf (RTSW) and spine (CTSW) is a namespace with its own config,
//! pin directory and log under `/run/rocev2/lab-<name>/`; the lab starts the
//! dataplanes, waits for each one's ready line and records their pids.
//! Routing is either generated (`--routing static`: `[[route]]`s in every
//! config plus the same routes in the kernel) or BGP (`--routing bgp`: FRR
//! on every switch, eBGP over every link, one ASN per leaf and one for the
//! spine tier as RFC 7938 suggests; the dataplanes follow the kernel table
//! zebra fills). With BGP the dataplanes start once the fabric has
//! converged, so every learned group is filled in one go, in next-hop
//! order, as the simulator assumes. Every switch also forwards in the
//! kernel, for what the dataplane leaves to it (ARP, BGP, ICMP).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use self::balance::Balance;
use super::{
    base_sysctls, bgp, build_topology, make_dir, netns_exists, rdma_hosts, record_path, route_args, strs, write_file,
    LabRecord, LabRouting, LabUpArgs, NsPlan, VethPlan, RUN_DIR,
};
use crate::{
    render::{Align, Table},
    testbed::{frr::bgp_config, guest::GuestSpec},
    tools::fabric::{Fabric, SeedPlan, Switch},
};

pub mod balance;
pub mod collective;
pub mod links;
pub mod scorecard;
pub mod te;
mod traffic;
mod view;

pub use collective::{collective, CollectiveReport, LabCollectiveArgs};
pub use traffic::{traffic, LabTrafficArgs, TrafficOutcome};
pub use view::{link_loads, port_sums, stats, LabStatsArgs};

/// ASN of leaf r is LEAF_ASN + r; the spines of zone z share SPINE_ASN +
/// z - 1 and the aggregation tier AGG_ASN (RFC 7938: a tier, or a cluster's
/// tier, shares one ASN, so no path goes down and up again through it).
pub const LEAF_ASN: u32 = 65000;
pub const SPINE_ASN: u32 = 65100;
pub const AGG_ASN: u32 = 65200;
/// How long a dataplane may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One switch's dataplane as started by `lab up`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SwitchRecord {
    pub switch: Switch,
    pub netns: String,
    pub config: PathBuf,
    pub pin_dir: PathBuf,
    pub log: PathBuf,
    pub pid: Option<u32>,
}

/// Everything `lab up --racks` will make, computed without touching the system.
pub struct FabricPlan {
    pub name: String,
    pub fabric: Fabric,
    pub routing: LabRouting,
    pub dir: PathBuf,
    pub namespaces: Vec<NsPlan>,
    pub links: Vec<VethPlan>,
    /// Per switch: its record and config text.
    pub switches: Vec<(SwitchRecord, String)>,
    pub bgp: Vec<bgp::BgpSpeaker>,
    /// Rated links (`--link-rate`): their settings and the wire namespace's
    /// bridges and queues.
    pub rated: Option<links::LinkSettings>,
    /// Wired links (`--wires`, or rated ones): the wire namespace's bridges
    /// (and queues, when rated).
    pub wires: Option<links::WirePlan>,
    /// `--rdma-hosts`: one virtual machine per host.
    pub guests: Vec<GuestSpec>,
}

pub fn switch_ns(name: &str, s: Switch) -> String {
    format!("{name}-{s}")
}

pub fn host_ns(name: &str, r: u32, i: u32) -> String {
    format!("{name}-r{r}h{i}")
}

impl FabricPlan {
    pub fn new(args: &LabUpArgs, racks: u32) -> Result<Self> {
        let name = args.name.clone();
        super::validate_name(&name)?;
        let hash = args.hash;
        let fabric = Fabric {
            racks,
            hosts: args.hosts,
            spines: args.spines,
            links: args.links_per_spine,
            v4: args.family.v4(),
            v6: args.family.v6(),
            hash,
            hash_version: args.hash_version,
            seeds: args.seed,
            zones: args.zones,
            aggs: crate::tools::fabric::aggs_for(args.zones, args.aggs)?,
        };
        fabric.validate()?;
        let settings = links::LinkSettings::from_args(&args.links)?;
        if args.rdma.enabled && settings.is_some() {
            bail!("--rdma-hosts and --link-rate do not combine yet: rated links are measured and driven from namespace hosts");
        }
        if args.config_out.is_some() {
            bail!("--config-out is for the single-rack lab; a fabric writes one config per switch under {RUN_DIR}/lab-{name}/");
        }
        let dir = Path::new(RUN_DIR).join(format!("lab-{name}"));
        let f = &fabric;
        let pick = |v4: String, v6: String| -> Vec<String> {
            let mut out = Vec::new();
            if f.v4 {
                out.push(v4);
            }
            if f.v6 {
                out.push(v6);
            }
            out
        };
        let mut namespaces = Vec::new();
        let mut links = Vec::new();
        // Who sends from each end of each link (for rated links).
        let mut senders: Vec<(links::Sender, links::Sender)> = Vec::new();
        let bgp_mode = args.routing == LabRouting::Bgp;

        // Switch namespaces first (forwarding on), then the hosts.
        for s in f.switches() {
            namespaces.push(NsPlan {
                name: switch_ns(&name, s),
                sysctls: base_sysctls(true),
                lo_addrs: vec![],
                routes: vec![],
            });
        }
        let mut guests = Vec::new();
        for r in 1..=f.racks {
            let leaf = switch_ns(&name, Switch::Leaf(r));
            for i in 1..=f.hosts {
                let h = host_ns(&name, r, i);
                let (v4, v6) = (Fabric::host_v4(r, i), Fabric::host_v6(r, i));
                if args.rdma.enabled {
                    // The guest takes the host's addresses; its namespace bridges.
                    guests.push(rdma_hosts::guest_spec(&h, &dir, f, r, i, args.rdma.guest_memory));
                    namespaces.push(NsPlan {
                        name: h.clone(),
                        sysctls: rdma_hosts::host_side_sysctls(),
                        lo_addrs: vec![],
                        routes: rdma_hosts::host_side_commands(),
                    });
                    links.push(VethPlan {
                        a_ns: leaf.clone(),
                        a_if: Fabric::host_port(i),
                        a_mac: Fabric::leaf_host_mac(r, i),
                        a_addrs: pick(format!("10.{r}.{i}.254/24"), format!("fd00:{r}:{i}::fe/64")),
                        b_ns: h,
                        b_if: "eth0".into(),
                        b_mac: Fabric::host_mac(r, i),
                        b_addrs: vec![],
                        gro_b: true,
                    });
                    senders.push((links::Sender::Switch(Switch::Leaf(r)), links::Sender::Host(r, i)));
                    continue;
                }
                let mut routes = Vec::new();
                if f.v4 {
                    routes.push(strs(&["route", "add", "default", "via", &format!("10.{r}.{i}.254"), "dev", "eth0"]));
                }
                if f.v6 {
                    routes.push(strs(&[
                        "-6",
                        "route",
                        "add",
                        "default",
                        "via",
                        &format!("fd00:{r}:{i}::fe"),
                        "dev",
                        "eth0",
                    ]));
                }
                namespaces.push(NsPlan { name: h.clone(), sysctls: base_sysctls(false), lo_addrs: vec![], routes });
                links.push(VethPlan {
                    a_ns: leaf.clone(),
                    a_if: Fabric::host_port(i),
                    a_mac: Fabric::leaf_host_mac(r, i),
                    a_addrs: pick(format!("10.{r}.{i}.254/24"), format!("fd00:{r}:{i}::fe/64")),
                    b_ns: h,
                    b_if: "eth0".into(),
                    b_mac: Fabric::host_mac(r, i),
                    b_addrs: pick(format!("{v4}/24"), format!("{v6}/64")),
                    gro_b: true,
                });
                senders.push((links::Sender::Switch(Switch::Leaf(r)), links::Sender::Host(r, i)));
            }
            // Uplinks in group member order, so interface indexes (and so the
            // kernel's sorted next hops under BGP) follow it too.
            for (j, k) in f.uplinks(r) {
                let ((l4, s4), (l6, s6)) = (Fabric::fabric_v4(r, j, k), Fabric::fabric_v6(r, j, k));
                links.push(VethPlan {
                    a_ns: leaf.clone(),
                    a_if: Fabric::uplink_port(j, k),
                    a_mac: Fabric::leaf_uplink_mac(r, j, k),
                    a_addrs: pick(format!("{l4}/24"), format!("{l6}/64")),
                    b_ns: switch_ns(&name, Switch::Spine(j)),
                    b_if: Fabric::downlink_port(r, k),
                    b_mac: Fabric::spine_downlink_mac(r, j, k),
                    b_addrs: pick(format!("{s4}/24"), format!("{s6}/64")),
                    // Both ends run XDP, which gives each the NAPI a redirect needs.
                    gro_b: false,
                });
                senders.push((links::Sender::Switch(Switch::Leaf(r)), links::Sender::Switch(Switch::Spine(j))));
            }
        }
        // Spine-aggregation links, in the order of the spines' "aggs" groups
        // and of the aggregation switches' zone groups.
        for j in 1..=f.spines {
            for a in 1..=f.aggs {
                let ((s4, a4), (s6, a6)) = (Fabric::agg_v4(j, a), Fabric::agg_v6(j, a));
                links.push(VethPlan {
                    a_ns: switch_ns(&name, Switch::Spine(j)),
                    a_if: Fabric::agg_port(a),
                    a_mac: Fabric::spine_agg_mac(j, a),
                    a_addrs: pick(format!("{s4}/24"), format!("{s6}/64")),
                    b_ns: switch_ns(&name, Switch::Agg(a)),
                    b_if: Fabric::spine_port(j),
                    b_mac: Fabric::agg_spine_mac(j, a),
                    b_addrs: pick(format!("{a4}/24"), format!("{a6}/64")),
                    gro_b: false,
                });
                senders.push((links::Sender::Switch(Switch::Spine(j)), links::Sender::Switch(Switch::Agg(a))));
            }
        }

        let mut switches = Vec::new();
        for s in f.switches() {
            let ns = switch_ns(&name, s);
            let config = dir.join(format!("{s}.toml"));
            let pin_dir = crate::sys::paths::pin_dir_named(&ns);
            let balance = Balance::Hash { hash };
            let mut text =
                switch_config(f, s, &ns, &config, &pin_dir, bgp_mode, &balance, args.rdma.enabled || args.telemetry);
            if let Some(settings) = &settings {
                let ports: Vec<String> = f.ports(s).into_iter().map(|(p, _)| p).collect();
                text.push_str(&links::switch_config(settings, s, &ports));
            }
            if !bgp_mode {
                let plan = namespaces.iter_mut().find(|n| n.name == ns).expect("switch namespace planned");
                plan.routes = kernel_routes(f, s);
            }
            let log = dir.join(format!("{s}.log"));
            switches.push((SwitchRecord { switch: s, netns: ns, config, pin_dir, log, pid: None }, text));
        }
        // Every switch knows its neighbours' MACs from the start (global and
        // IPv6 link-local, which BGP puts in IPv6 next hops), so each group
        // has all its members usable when the dataplane first fills it.
        let switch_names: Vec<String> = f.switches().into_iter().map(|s| switch_ns(&name, s)).collect();
        for l in &links {
            let ends = [(&l.a_ns, &l.a_if, &l.b_addrs, l.b_mac), (&l.b_ns, &l.b_if, &l.a_addrs, l.a_mac)];
            for (ns, dev, peer_addrs, peer_mac) in ends {
                let Some(plan) = namespaces.iter_mut().find(|n| &n.name == ns && switch_names.contains(ns)) else {
                    continue;
                };
                let mac = crate::sys::format_mac(&peer_mac);
                let mut addrs: Vec<String> =
                    peer_addrs.iter().map(|a| a.split('/').next().unwrap_or(a).to_owned()).collect();
                if f.v6 {
                    addrs.push(link_local(peer_mac));
                }
                for a in addrs {
                    plan.routes.push(strs(&["neigh", "replace", &a, "lladdr", &mac, "dev", dev, "nud", "permanent"]));
                }
            }
        }
        if args.unnumbered && !bgp_mode {
            bail!("--unnumbered is a kind of BGP session: add --routing bgp");
        }
        let bgp = if bgp_mode { speakers(&name, f, args.unnumbered) } else { Vec::new() };
        // Rated links: every link through the wire namespace (neighbours
        // above are the link's far ends, which the wire does not change).
        let (links, wires) = if settings.is_some() || args.links.wires {
            let mut wires = links::WirePlan::new(&name);
            namespaces.push(NsPlan {
                name: wires.netns.clone(),
                sysctls: links::wire_sysctls(),
                lo_addrs: vec![],
                routes: vec![],
            });
            let through: Vec<VethPlan> =
                links.into_iter().zip(senders).flat_map(|(l, (a, b))| wires.add(l, a, b, settings.as_ref())).collect();
            (through, Some(wires))
        } else {
            (links, None)
        };
        Ok(Self {
            name,
            fabric,
            routing: args.routing,
            dir,
            namespaces,
            links,
            switches,
            bgp,
            rated: settings,
            wires,
            guests,
        })
    }
}

/// The IPv6 link-local address the kernel gives an interface with `mac` (EUI-64).
fn link_local(mac: [u8; 6]) -> String {
    let w = |a: u8, b: u8| u16::from_be_bytes([a, b]);
    let words = [w(mac[0] ^ 2, mac[1]), w(mac[2], 0xff), w(0xfe, mac[3]), w(mac[4], mac[5])];
    std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, words[0], words[1], words[2], words[3]).to_string()
}

/// The `[[port]]`s, groups and routes of one switch.
/// The config of switch `s`: ports, groups and routes, spreading traffic
/// as `balance` says; `telemetry`: per-QP telemetry on (`rocev2 top`,
/// `trace`), for the real QPs of RDMA hosts.
#[allow(
    clippy::too_many_arguments,
    reason = "one switch's identity, paths and the three lab-wide choices it depends on"
)]
pub fn switch_config(
    f: &Fabric,
    s: Switch,
    ns: &str,
    path: &Path,
    pin_dir: &Path,
    bgp: bool,
    balance: &Balance,
    telemetry: bool,
) -> String {
    let mut t = format!(
        "# Written by `rocev2 lab up` for {s} (namespace {ns}); load balancing: {mode}.\n\
         # Its dataplane: rocev2 --netns {ns} run --config {cfg}\n\
         [dataplane]\nhash = \"{hash}\"\nhash_seed = {seed}\nhash_version = {version}\nxdp_mode = \"native\"\npin_dir = \"{pin}\"\nneighbour_refresh_ms = 1000\n{extra}",
        mode = balance.label(),
        cfg = path.display(),
        hash = balance.hash().name(),
        seed = f.seed_setting(),
        version = f.hash_version,
        pin = pin_dir.display(),
        extra = balance.dataplane_lines(),
    );
    if telemetry && !t.contains("telemetry_qps") {
        let _ = writeln!(t, "telemetry_qps = {}", balance::TELEMETRY_QPS);
    }
    for (port, _) in f.ports(s) {
        let _ = write!(t, "\n[[port]]\nname = \"{port}\"\n");
    }
    if bgp {
        t.push_str(
            "\n# Routes between racks come from BGP (FRR) through the kernel table.\n[routing]\nsource = \"kernel\"\n",
        );
    }
    let via = |v4: &str, v6: &str| if f.v4 { v4.to_owned() } else { v6.to_owned() };
    let route = |t: &mut String, prefix: &str, group: &str| {
        let _ = write!(t, "\n[[route]]\nprefix = \"{prefix}\"\ngroup = \"{group}\"\n");
    };
    match s {
        Switch::Leaf(r) => {
            // The rack's own hosts: one group each (BGP or not).
            for i in 1..=f.hosts {
                let member = via(&Fabric::host_v4(r, i).to_string(), &Fabric::host_v6(r, i).to_string());
                let _ = write!(
                    t,
                    "\n[[group]]\nname = \"host{i}\"\nmembers = [{{ dev = \"h{i}\", via = \"{member}\" }}]\n"
                );
                if f.v4 {
                    route(&mut t, &format!("10.{r}.{i}.0/24"), &format!("host{i}"));
                }
                if f.v6 {
                    route(&mut t, &format!("fd00:{r}:{i}::/64"), &format!("host{i}"));
                }
            }
            if !bgp {
                let _ = write!(
                    t,
                    "\n[[group]]\nname = \"spines\"\n{}members = [\n",
                    balance.group_lines(f.zone_spines() * f.links)
                );
                for (j, k) in f.uplinks(r) {
                    let ((_, s4), (_, s6)) = (Fabric::fabric_v4(r, j, k), Fabric::fabric_v6(r, j, k));
                    let _ =
                        writeln!(t, "  {{ dev = \"{}\", via = \"{}\" }},", Fabric::uplink_port(j, k), via(&s4, &s6));
                }
                t.push_str("]\n");
                for other in (1..=f.racks).filter(|&o| o != r) {
                    if f.v4 {
                        route(&mut t, &Fabric::rack_prefix_v4(other), "spines");
                    }
                    if f.v6 {
                        route(&mut t, &Fabric::rack_prefix_v6(other), "spines");
                    }
                }
            }
        }
        Switch::Spine(j) if !bgp => {
            let zone = f.zone_of_spine(j);
            if f.aggs > 0 {
                let _ = write!(t, "\n[[group]]\nname = \"aggs\"\n{}members = [\n", balance.group_lines(f.aggs));
                for a in 1..=f.aggs {
                    let (a4, a6) = (Fabric::agg_v4(j, a).1, Fabric::agg_v6(j, a).1);
                    let _ = writeln!(t, "  {{ dev = \"{}\", via = \"{}\" }},", Fabric::agg_port(a), via(&a4, &a6));
                }
                t.push_str("]\n");
                for r in (1..=f.racks).filter(|&r| f.zone_of_rack(r) != zone) {
                    if f.v4 {
                        route(&mut t, &Fabric::rack_prefix_v4(r), "aggs");
                    }
                    if f.v6 {
                        route(&mut t, &Fabric::rack_prefix_v6(r), "aggs");
                    }
                }
            }
            for r in f.racks_of_zone(zone) {
                let _ = write!(t, "\n[[group]]\nname = \"rack{r}\"\n{}members = [\n", balance.group_lines(f.links));
                for k in 1..=f.links {
                    let ((l4, _), (l6, _)) = (Fabric::fabric_v4(r, j, k), Fabric::fabric_v6(r, j, k));
                    let _ =
                        writeln!(t, "  {{ dev = \"{}\", via = \"{}\" }},", Fabric::downlink_port(r, k), via(&l4, &l6));
                }
                t.push_str("]\n");
                if f.v4 {
                    route(&mut t, &Fabric::rack_prefix_v4(r), &format!("rack{r}"));
                }
                if f.v6 {
                    route(&mut t, &Fabric::rack_prefix_v6(r), &format!("rack{r}"));
                }
            }
        }
        Switch::Agg(a) if !bgp => {
            for z in 1..=f.zones {
                let _ =
                    write!(t, "\n[[group]]\nname = \"zone{z}\"\n{}members = [\n", balance.group_lines(f.zone_spines()));
                for j in f.spines_of_zone(z) {
                    let (s4, s6) = (Fabric::agg_v4(j, a).0, Fabric::agg_v6(j, a).0);
                    let _ = writeln!(t, "  {{ dev = \"{}\", via = \"{}\" }},", Fabric::spine_port(j), via(&s4, &s6));
                }
                t.push_str("]\n");
                for r in f.racks_of_zone(z) {
                    if f.v4 {
                        route(&mut t, &Fabric::rack_prefix_v4(r), &format!("zone{z}"));
                    }
                    if f.v6 {
                        route(&mut t, &Fabric::rack_prefix_v6(r), &format!("zone{z}"));
                    }
                }
            }
        }
        Switch::Spine(_) | Switch::Agg(_) => {}
    }
    t.push_str(&balance.extra(f, s));
    t
}

/// `--routing static`: the kernel gets the same routes as the dataplane,
/// for what the dataplane passes to it (ICMP, non-RoCE traffic).
fn kernel_routes(f: &Fabric, s: Switch) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut add = |prefix4: String, prefix6: String, hops: Vec<(String, String, String)>| {
        if f.v4 {
            out.push(route_args(
                false,
                &prefix4,
                &hops.iter().map(|(a, _, d)| (a.clone(), d.clone())).collect::<Vec<_>>(),
            ));
        }
        if f.v6 {
            out.push(route_args(
                true,
                &prefix6,
                &hops.iter().map(|(_, a, d)| (a.clone(), d.clone())).collect::<Vec<_>>(),
            ));
        }
    };
    match s {
        Switch::Leaf(r) => {
            for other in (1..=f.racks).filter(|&o| o != r) {
                let hops = f
                    .uplinks(r)
                    .into_iter()
                    .map(|(j, k)| {
                        (Fabric::fabric_v4(r, j, k).1, Fabric::fabric_v6(r, j, k).1, Fabric::uplink_port(j, k))
                    })
                    .collect();
                add(Fabric::rack_prefix_v4(other), Fabric::rack_prefix_v6(other), hops);
            }
        }
        Switch::Spine(j) => {
            let zone = f.zone_of_spine(j);
            for r in (1..=f.racks).filter(|&r| f.zone_of_rack(r) != zone) {
                let hops = (1..=f.aggs)
                    .map(|a| (Fabric::agg_v4(j, a).1, Fabric::agg_v6(j, a).1, Fabric::agg_port(a)))
                    .collect();
                add(Fabric::rack_prefix_v4(r), Fabric::rack_prefix_v6(r), hops);
            }
            for r in f.racks_of_zone(zone) {
                let hops = (1..=f.links)
                    .map(|k| (Fabric::fabric_v4(r, j, k).0, Fabric::fabric_v6(r, j, k).0, Fabric::downlink_port(r, k)))
                    .collect();
                add(Fabric::rack_prefix_v4(r), Fabric::rack_prefix_v6(r), hops);
            }
        }
        Switch::Agg(a) => {
            for r in 1..=f.racks {
                let hops = f
                    .spines_of_zone(f.zone_of_rack(r))
                    .map(|j| (Fabric::agg_v4(j, a).0, Fabric::agg_v6(j, a).0, Fabric::spine_port(j)))
                    .collect();
                add(Fabric::rack_prefix_v4(r), Fabric::rack_prefix_v6(r), hops);
            }
        }
    }
    out
}

/// Every switch's frr.conf: leaves advertise their rack's prefixes.
fn speakers(name: &str, f: &Fabric, unnumbered: bool) -> Vec<bgp::BgpSpeaker> {
    let mut out = Vec::new();
    for s in f.switches() {
        let mut peers = Vec::new();
        // Unnumbered: one session per port to another switch, whatever its ASN.
        let unnumbered_peers: Vec<(String, String)> = f
            .ports(s)
            .into_iter()
            .filter(|(port, _)| !(matches!(s, Switch::Leaf(_)) && port.starts_with('h')))
            .map(|(port, _)| (port, "external".to_owned()))
            .collect();
        let mut networks = Vec::new();
        let (asn, router_id) = match s {
            Switch::Leaf(r) => {
                let spine_asn = (SPINE_ASN + f.zone_of_rack(r) - 1).to_string();
                for (j, k) in f.uplinks(r) {
                    if f.v4 {
                        peers.push((Fabric::fabric_v4(r, j, k).1, spine_asn.clone()));
                    }
                    if f.v6 {
                        peers.push((Fabric::fabric_v6(r, j, k).1, spine_asn.clone()));
                    }
                }
                if f.v4 {
                    networks.push(Fabric::rack_prefix_v4(r));
                }
                if f.v6 {
                    networks.push(Fabric::rack_prefix_v6(r));
                }
                (LEAF_ASN + r, format!("10.255.1.{r}"))
            }
            Switch::Spine(j) => {
                for a in 1..=f.aggs {
                    if f.v4 {
                        peers.push((Fabric::agg_v4(j, a).1, AGG_ASN.to_string()));
                    }
                    if f.v6 {
                        peers.push((Fabric::agg_v6(j, a).1, AGG_ASN.to_string()));
                    }
                }
                for r in f.racks_of_zone(f.zone_of_spine(j)) {
                    for k in 1..=f.links {
                        if f.v4 {
                            peers.push((Fabric::fabric_v4(r, j, k).0, (LEAF_ASN + r).to_string()));
                        }
                        if f.v6 {
                            peers.push((Fabric::fabric_v6(r, j, k).0, (LEAF_ASN + r).to_string()));
                        }
                    }
                }
                (SPINE_ASN + f.zone_of_spine(j) - 1, format!("10.255.2.{j}"))
            }
            Switch::Agg(a) => {
                for j in 1..=f.spines {
                    let asn = (SPINE_ASN + f.zone_of_spine(j) - 1).to_string();
                    if f.v4 {
                        peers.push((Fabric::agg_v4(j, a).0, asn.clone()));
                    }
                    if f.v6 {
                        peers.push((Fabric::agg_v6(j, a).0, asn));
                    }
                }
                (AGG_ASN, format!("10.255.3.{a}"))
            }
        };
        if unnumbered {
            peers = unnumbered_peers;
        }
        let networks: Vec<&str> = networks.iter().map(String::as_str).collect();
        out.push(bgp::BgpSpeaker { netns: switch_ns(name, s), config: bgp_config(asn, &router_id, &peers, &networks) });
    }
    out
}

/// Builds the fabric, starts FRR (with BGP) and every dataplane; returns the text to print.
pub fn up(args: &LabUpArgs, racks: u32) -> Result<String> {
    let started = Instant::now();
    let plan = FabricPlan::new(args, racks)?;
    let name = &plan.name;
    if record_path(name).exists() {
        bail!("a lab named {name:?} already exists; remove it first with `rocev2 lab down --name {name}`");
    }
    if let Some(ns) = plan.namespaces.iter().find(|n| netns_exists(&n.name)) {
        bail!("network namespace {:?} already exists but belongs to no lab record; pick another --name", ns.name);
    }
    // The guests' tree first (built once; minutes): a failure
    // there leaves nothing to clean up.
    let tree = if args.rdma.enabled { Some(rdma_hosts::tree(&args.rdma)?) } else { None };
    let mut record = LabRecord { name: name.clone(), fabric: Some(plan.fabric.clone()), ..Default::default() };
    record.write()?;
    let result = build(&plan, &mut record, tree.as_deref());
    let lines = match result {
        Ok(lines) => lines,
        Err(e) => {
            if let Err(cleanup) = super::remove(&record) {
                eprintln!("rocev2: warning: cleaning up the half-built lab: {cleanup:#}");
            }
            return Err(e.context(format!("building lab {name:?} failed; removed what was made")));
        }
    };
    let f = &plan.fabric;
    let mut out = format!(
        "Fabric {name:?} is up in {:.1} s: {} racks x {} hosts, {} spines, {} link(s) per leaf-spine pair{}, {} routing, hash {}, seeds {}\n",
        started.elapsed().as_secs_f64(),
        f.racks,
        f.hosts,
        f.spines,
        f.links,
        if f.zones > 1 { format!(", {} zones joined by {} aggregation switches", f.zones, f.aggs) } else { String::new() },
        if plan.routing == LabRouting::Bgp { "BGP" } else { "static" },
        f.hash.name(),
        if f.seeds == SeedPlan::Same { "same" } else { "auto" },
    );
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    let mut table = Table::new(&[
        ("SWITCH", Align::Left),
        ("NAMESPACE", Align::Left),
        ("ROCEV2 PID", Align::Right),
        ("CONFIG", Align::Left),
        ("LOG", Align::Left),
    ])
    .indent(2);
    for s in &record.switches {
        table.row([
            s.switch.to_string(),
            s.netns.clone(),
            s.pid.map_or("-".into(), |p| p.to_string()),
            s.config.display().to_string(),
            s.log.display().to_string(),
        ]);
    }
    out.push_str(&table.render());
    // The hosts' addresses, of the families the lab has.
    let addrs = match (f.v4, f.v6) {
        (true, true) => "10.<rack>.<host>.1, fd00:<rack>:<host>::1",
        (true, false) => "10.<rack>.<host>.1",
        _ => "fd00:<rack>:<host>::1",
    };
    if record.guests.is_empty() {
        let _ = writeln!(
            out,
            "  hosts: {}-r<rack>h<host> ({addrs})\nNext:\n  rocev2 lab traffic --name {name} --pattern ring --qps 8 --messages 16\n  rocev2 lab stats --name {name}\n  rocev2 lab status --name {name}\n  rocev2 lab down --name {name}",
            name
        );
    } else {
        let _ = writeln!(
            out,
            "RDMA hosts: virtual machines r<rack>h<host> ({addrs}) with Soft-RoCE rxe0, bridged in namespaces {name}-r<rack>h<host>:"
        );
        out.push_str(&rdma_hosts::guests_table(&record.guests));
        let (server, client) = ("r2h1", "r1h1");
        let _ = writeln!(
            out,
            "Next:\n  rocev2 lab exec --name {name} {server} -- ib_write_bw -R -u 18 -q 8\n  rocev2 lab exec --name {name} {client} -- ib_write_bw -R -u 18 -q 8 {}\n  rocev2 lab stats --name {name}\n  rocev2 lab status --name {name}\n  rocev2 lab down --name {name}",
            Fabric::host_addr(2, 1, !f.v4)
        );
    }
    Ok(out)
}

/// Builds everything (and boots the guests of `--rdma-hosts` from `tree`);
/// returns the lines to print about BGP and the links.
fn build(plan: &FabricPlan, record: &mut LabRecord, tree: Option<&Path>) -> Result<Vec<String>> {
    build_topology(&plan.namespaces, &plan.links, record)?;
    if let Some(wires) = &plan.wires {
        links::join_wires(wires)?;
    }
    make_dir(&plan.dir, record)?;
    for (s, text) in &plan.switches {
        write_file(&s.config, text, record)?;
        record.files.push(s.log.clone());
        record.switches.push(s.clone());
    }
    record.write()?;
    let bgp_line = if plan.bgp.is_empty() {
        None
    } else {
        for s in &plan.bgp {
            record.frr_dirs.push(bgp::state_dir(&plan.dir, &s.netns));
        }
        record.write()?;
        Some(start_bgp(plan)?)
    };
    start_dataplanes(record)?;
    let mut lines: Vec<String> = bgp_line.into_iter().collect();
    if let (Some(settings), Some(wires)) = (&plan.rated, &plan.wires) {
        lines.extend(rate_links(plan, settings, wires, record)?);
    }
    if let Some(tree) = tree {
        rdma_hosts::start_guests(&plan.guests, tree, record)?;
    }
    Ok(lines)
}

/// Measures what one path carries (the links are not shaped yet), refuses
/// a rate above it, then sets up every link's queue.
fn rate_links(
    plan: &FabricPlan,
    settings: &links::LinkSettings,
    wires: &links::WirePlan,
    record: &mut LabRecord,
) -> Result<Vec<String>> {
    let f = &plan.fabric;
    let hosts = f.racks * f.hosts;
    // One host has no path to measure (and nothing to send to).
    let measured = if hosts > 1 {
        let path_fps = links::measure_path(&plan.name, f)?;
        let capacity = links::Capacity { path_fps, needed_fps: links::needed_fps(settings, hosts) };
        Some((capacity.check(settings, hosts)?, capacity))
    } else {
        None
    };
    let marks_at_setup = links::marks_at_setup(&wires.queues, &record.switches)?;
    links::reset_virtual_queues(&record.switches)?;
    links::install_queues(&wires.queues, settings.rate_bps)?;
    record.rated = Some(links::RatedLinks {
        settings: *settings,
        wire_netns: wires.netns.clone(),
        queues: wires.queues.clone(),
        measured_path_fps: measured.as_ref().map(|(_, c)| c.path_fps),
        marks_at_setup,
    });
    record.write()?;
    let mut lines = vec![format!(
        "Links: {} through {} ({} queues){}",
        settings.describe(),
        wires.netns,
        wires.queues.len(),
        match &measured {
            Some((_, c)) => format!(
                "; one path carried {:.0} frames/s unshaped (those frames are in the counters), the fabric needs at most {:.0}",
                c.path_fps, c.needed_fps
            ),
            None => String::new(),
        }
    )];
    let warning = measured.and_then(|(w, _)| w);
    lines.extend(warning);
    Ok(lines)
}

/// Starts FRR everywhere and waits until every leaf has all its paths to
/// every other rack and every spine its paths to every rack.
fn start_bgp(plan: &FabricPlan) -> Result<String> {
    let started = Instant::now();
    for s in &plan.bgp {
        // Links of a fabric fail (`lab link`, the soak): see ZEBRA_NO_KERNEL_NEXTHOPS.
        crate::testbed::frr::Frr::start_with(
            &s.netns,
            &bgp::state_dir(&plan.dir, &s.netns),
            &s.config,
            crate::testbed::frr::ZEBRA_NO_KERNEL_NEXTHOPS,
        )?
        .detach();
    }
    let f = &plan.fabric;
    let deadline = started + Duration::from_secs(90);
    for s in f.switches() {
        let ns = switch_ns(&plan.name, s);
        // Paths each switch must have to each rack before the dataplanes start.
        let wanted: Vec<(u32, usize)> = (1..=f.racks)
            .filter_map(|r| match s {
                Switch::Leaf(own) if own == r => None,
                Switch::Leaf(_) => Some((r, (f.zone_spines() * f.links) as usize)),
                Switch::Spine(j) if f.zone_of_spine(j) == f.zone_of_rack(r) => Some((r, f.links as usize)),
                Switch::Spine(_) => Some((r, f.aggs as usize)),
                Switch::Agg(_) => Some((r, f.zone_spines() as usize)),
            })
            .collect();
        for (r, paths) in wanted {
            let mut prefixes = Vec::new();
            if f.v4 {
                prefixes.push(Fabric::rack_prefix_v4(r));
            }
            if f.v6 {
                prefixes.push(Fabric::rack_prefix_v6(r));
            }
            for prefix in prefixes {
                bgp::wait_paths(&ns, &prefix, paths, deadline)?;
            }
        }
    }
    Ok(format!(
        "BGP converged in {:.1} s: {} speakers, every leaf has {} paths to every other rack",
        started.elapsed().as_secs_f64(),
        plan.bgp.len(),
        f.zone_spines() * f.links
    ))
}

/// Rewrites every switch's config for `balance` and applies it: with
/// `restart`, every dataplane stops and starts again (a mode may need
/// program features the running ones were loaded without); without, each
/// reloads its config (enough when only pins change). Returns how long
/// applying took.
pub fn apply_balance(record: &mut LabRecord, balance: &Balance, restart: bool) -> Result<Duration> {
    let Some(f) = record.fabric.clone() else {
        bail!(
            "lab {:?} is not a fabric; the load-balancing modes and TE need one (`lab up --racks N --routing static`)",
            record.name
        )
    };
    if !record.frr_dirs.is_empty() {
        bail!(
            "lab {:?} routes with BGP: its groups are learned from the kernel, so the load-balancing modes (which rewrite the generated groups and routes) need a lab with --routing static",
            record.name
        );
    }
    let started = Instant::now();
    for s in &record.switches {
        // Telemetry stays on where `lab up` turned it on (RDMA hosts, --telemetry).
        let telemetry = !record.guests.is_empty()
            || std::fs::read_to_string(&s.config).is_ok_and(|t| t.contains("\ntelemetry_qps = "));
        let mut text = switch_config(&f, s.switch, &s.netns, &s.config, &s.pin_dir, false, balance, telemetry);
        if let Some(rated) = &record.rated {
            let ports: Vec<String> = f.ports(s.switch).into_iter().map(|(p, _)| p).collect();
            text.push_str(&links::switch_config(&rated.settings, s.switch, &ports));
        }
        crate::control::config::Config::parse(&text, &s.config)
            .with_context(|| format!("the {} config for {}", balance.label(), s.switch))?;
        fs::write(&s.config, text).with_context(|| format!("cannot write {}", s.config.display()))?;
    }
    if restart {
        stop_dataplanes(record)?;
        start_dataplanes(record)?;
    } else {
        for s in &record.switches {
            crate::control::run::request_reload(&s.pin_dir, Duration::from_secs(20))
                .with_context(|| format!("reloading the dataplane of {}", s.switch))?;
        }
    }
    let mut fabric = f;
    fabric.hash = balance.hash();
    record.fabric = Some(fabric);
    record.balance = Some(balance.clone());
    record.write()?;
    Ok(started.elapsed())
}

/// Stops every switch's dataplane (SIGTERM: it detaches and unpins) and
/// waits until each has exited.
fn stop_dataplanes(record: &mut LabRecord) -> Result<()> {
    for s in &record.switches {
        if let Some(pid) = s.pid.filter(|&p| crate::sys::process_alive(p)) {
            let _ = crate::sys::signal_process(pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for s in record.switches.iter_mut() {
        if let Some(pid) = s.pid {
            while crate::sys::process_alive(pid) {
                if Instant::now() > deadline {
                    bail!("the dataplane of {} (pid {pid}) did not stop within 20 s of SIGTERM", s.switch);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        s.pid = None;
    }
    record.write()
}

/// Starts `rocev2 run` on every switch (output to its log), then waits
/// for each one's ready line.
fn start_dataplanes(record: &mut LabRecord) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the rocev2 binary")?;
    let mut children = Vec::new();
    for s in record.switches.iter_mut() {
        let log = fs::File::create(&s.log).with_context(|| format!("cannot create {}", s.log.display()))?;
        let mut cmd = Command::new(&exe);
        cmd.args(["--netns", &s.netns, "run", "--config"]).arg(&s.config);
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        // Its own process group: a Ctrl-C meant for a later command does not reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().with_context(|| format!("cannot start the dataplane of {}", s.switch))?;
        s.pid = Some(child.id());
        children.push(child);
    }
    record.write()?;
    let deadline = Instant::now() + READY_TIMEOUT;
    for (s, child) in record.switches.iter().zip(children.iter_mut()) {
        loop {
            let log = fs::read_to_string(&s.log).unwrap_or_default();
            if log.lines().any(|l| l.trim() == crate::control::run::READY_LINE) {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                bail!("the dataplane of {} ({}) exited ({status}):\n{log}", s.switch, s.netns);
            }
            if Instant::now() > deadline {
                bail!("the dataplane of {} did not get ready within {READY_TIMEOUT:?}:\n{log}", s.switch);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// The last line a dataplane logged, shortened for a table cell.
fn last_line(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    // Its own last word ("rocev2: stopped; ...", "rocev2: error: ..."), else the last line.
    let mut lines = text.lines().rev().filter(|l| !l.trim().is_empty());
    let line = lines.clone().find(|l| l.starts_with("rocev2:")).or_else(|| lines.next()).unwrap_or("(empty log)");
    line.chars().take(60).collect()
}

/// `lab status` of a fabric: each switch's dataplane state and counters.
pub fn status(record: &LabRecord, fabric: &Fabric) -> Result<String> {
    let mut table = Table::new(&[
        ("SWITCH", Align::Left),
        ("NAMESPACE", Align::Left),
        ("DATAPLANE", Align::Left),
        ("FORWARDED", Align::Right),
        ("BYTES", Align::Right),
        ("TO KERNEL", Align::Right),
        ("DROPPED", Align::Right),
        ("LOG", Align::Left),
    ]);
    for s in &record.switches {
        let running = s.pid.is_some_and(crate::sys::process_alive) && netns_exists(&s.netns);
        let counters = view::port_totals(&s.pin_dir).ok();
        let state = match (running, &counters) {
            (true, Some(_)) => format!("running (pid {})", s.pid.unwrap_or_default()),
            (true, None) => "starting".into(),
            // A killed dataplane's programs stay attached (for the next run to take over).
            (false, _) => format!("stopped: {}", last_line(&s.log)),
        };
        let get = |k: &str| counters.as_ref().map_or("-".into(), |c| c.get(k).copied().unwrap_or(0).to_string());
        table.row([
            s.switch.to_string(),
            s.netns.clone(),
            state,
            get("forwarded"),
            get("forwarded_bytes"),
            get("to_kernel"),
            get("dropped"),
            s.log.display().to_string(),
        ]);
    }
    let hosts = (1..=fabric.racks)
        .flat_map(|r| (1..=fabric.hosts).map(move |i| (r, i)))
        .filter(|(r, i)| !netns_exists(&host_ns(&record.name, *r, *i)))
        .count();
    Ok(format!(
        "Fabric {:?}: {} racks x {} hosts, {} spines x {} link(s), hash {}, seeds {}; {} of {} host namespaces missing\n{}",
        record.name,
        fabric.racks,
        fabric.hosts,
        fabric.spines,
        fabric.links,
        fabric.hash.name(),
        crate::tools::fabric::flag(fabric.seeds),
        hosts,
        fabric.racks * fabric.hosts,
        table.render()
    ))
}
