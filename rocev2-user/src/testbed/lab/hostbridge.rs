//! `rocev2 lab up --host-bridge`: a host bridge lab.
//!
//! ```text
//!  [<name>-h1] eth0 --- h1 [<name>-bridge]  u1 --- gw [<name>-rtsw1] dst --- r1 [<name>-dst]
//!  [<name>-h2] eth0 --- h2   br0 (Linux)    u2 --- gw [<name>-rtsw2] dst --- r2   lo: 10.1.0.1
//!                            rocev2 bridge  u3 --- gw [<name>-rtsw3] ...             fd01::1
//!                            mode           u4 --- gw [<name>-rtsw4] ...
//! ```
//! The hosts share one subnet (host i: 10.0.1.i/24, fd00:1::i/64) behind the
//! bridge box, whose bridge `br0` joins their ports and the uplinks. Every
//! rack switch's `gw` has the same anycast gateway MAC and address
//! (10.0.1.254, fd00:1::fe), knows the hosts (static neighbours, as an EVPN
//! fabric would sync them) and routes the destination's prefixes to it;
//! the destination routes the way back through rack switch 1. rocev2's
//! config serves `br0` with one uplink group over the uplinks whose MAC is
//! the gateway's.

use std::{
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::{
    base_sysctls, fabric::LabStatsArgs, strs, validate_name, LabKind, LabPlan, LabRecord, LabUpArgs, NsPlan, VethPlan,
    DEST_PREFIX_V4, DEST_PREFIX_V6, DEST_V4, DEST_V6, MAX_PORTS, RUN_DIR,
};
use crate::render::{share_bar, Align, Table};

/// The anycast gateway every rack switch answers as.
pub const GATEWAY_MAC: [u8; 6] = [0x02, 0x52, 0x32, 0xFE, 0x00, 0x01];
pub const GATEWAY_V4: &str = "10.0.1.254";
pub const GATEWAY_V6: &str = "fd00:1::fe";
/// The bridge in the bridge box.
pub const BRIDGE: &str = "br0";
/// The uplink group in the bridge box's config.
pub const UPLINK_GROUP: &str = "gateways";
const MAX_UPLINKS: u32 = 32;

/// Host `i`'s MAC and addresses.
pub fn host_mac(i: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x20, 0x00, i as u8]
}
pub fn host_v4(i: u32) -> String {
    format!("10.0.1.{i}")
}
pub fn host_v6(i: u32) -> String {
    format!("fd00:1::{i:x}")
}
/// The bridge box's port toward host `i` and toward rack switch `k`.
fn host_port_mac(i: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x10, 0x00, i as u8]
}
fn uplink_port_mac(k: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x11, 0x00, k as u8]
}
fn rtsw_dst_mac(k: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x13, 0x00, k as u8]
}
fn dst_rtsw_mac(k: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x14, 0x00, k as u8]
}

pub fn plan(args: &LabUpArgs) -> Result<LabPlan> {
    let name = args.name.as_str();
    validate_name(name)?;
    let (hosts, uplinks) = (args.hosts, args.uplinks);
    if !(1..=200).contains(&hosts) {
        bail!("--hosts must be 1..=200 for a host bridge lab (one subnet), not {hosts}");
    }
    if !(2..=MAX_UPLINKS).contains(&uplinks) {
        bail!("--uplinks must be 2..={MAX_UPLINKS} (an uplink group needs two ports), not {uplinks}");
    }
    if hosts + uplinks > MAX_PORTS {
        bail!(
            "{hosts} hosts + {uplinks} uplinks = {} bridge ports, more than the dataplane's {MAX_PORTS}",
            hosts + uplinks
        );
    }
    let fam = args.family;
    let ns = |suffix: &str| format!("{name}-{suffix}");
    let (bridge_ns, dst) = (ns("bridge"), ns("dst"));
    let mut namespaces = Vec::new();
    let mut veths = Vec::new();
    // The bridge box: br0 made and its ports enslaved once every link exists.
    let mut bridge_cmds =
        vec![strs(&["link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "mcast_snooping", "0"])];

    for i in 1..=hosts {
        let h = ns(&format!("h{i}"));
        let mut r = Vec::new();
        if fam.v4() {
            r.push(strs(&["route", "add", "default", "via", GATEWAY_V4, "dev", "eth0"]));
        }
        if fam.v6() {
            r.push(strs(&["-6", "route", "add", "default", "via", GATEWAY_V6, "dev", "eth0"]));
        }
        namespaces.push(NsPlan { name: h.clone(), sysctls: quiet_sysctls(false), lo_addrs: vec![], routes: r });
        veths.push(VethPlan {
            a_ns: bridge_ns.clone(),
            a_if: format!("h{i}"),
            a_mac: host_port_mac(i),
            a_addrs: vec![],
            b_ns: h,
            b_if: "eth0".into(),
            b_mac: host_mac(i),
            b_addrs: fam.pick(vec![format!("{}/24", host_v4(i))], vec![format!("{}/64", host_v6(i))]),
            gro_b: true,
        });
        bridge_cmds.push(strs(&["link", "set", &format!("h{i}"), "master", BRIDGE]));
    }
    let mut ports = Vec::new();
    for k in 1..=uplinks {
        let t = ns(&format!("rtsw{k}"));
        veths.push(VethPlan {
            a_ns: bridge_ns.clone(),
            a_if: format!("u{k}"),
            a_mac: uplink_port_mac(k),
            a_addrs: vec![],
            b_ns: t.clone(),
            b_if: "gw".into(),
            b_mac: GATEWAY_MAC,
            b_addrs: fam.pick(vec![format!("{GATEWAY_V4}/24")], vec![format!("{GATEWAY_V6}/64")]),
            gro_b: true,
        });
        veths.push(VethPlan {
            a_ns: t.clone(),
            a_if: "dst".into(),
            a_mac: rtsw_dst_mac(k),
            a_addrs: fam.pick(vec![format!("10.200.{k}.1/24")], vec![format!("fdc8:{k}::1/64")]),
            b_ns: dst.clone(),
            b_if: format!("r{k}"),
            b_mac: dst_rtsw_mac(k),
            b_addrs: fam.pick(vec![format!("10.200.{k}.2/24")], vec![format!("fdc8:{k}::2/64")]),
            gro_b: false,
        });
        bridge_cmds.push(strs(&["link", "set", &format!("u{k}"), "master", BRIDGE]));
        ports.push(format!("\"u{k}\""));
        // The rack switch: routes the destination onward and knows every
        // host's MAC (an anycast gateway's ARP replies would reach one
        // rack switch only).
        let mut r = Vec::new();
        let mac = |i| crate::sys::format_mac(&host_mac(i));
        for i in 1..=hosts {
            if fam.v4() {
                r.push(strs(&["neigh", "add", &host_v4(i), "lladdr", &mac(i), "dev", "gw", "nud", "permanent"]));
            }
            if fam.v6() {
                r.push(strs(&["neigh", "add", &host_v6(i), "lladdr", &mac(i), "dev", "gw", "nud", "permanent"]));
            }
        }
        if fam.v4() {
            r.push(strs(&["route", "add", DEST_PREFIX_V4, "via", &format!("10.200.{k}.2"), "dev", "dst"]));
        }
        if fam.v6() {
            r.push(strs(&["-6", "route", "add", DEST_PREFIX_V6, "via", &format!("fdc8:{k}::2"), "dev", "dst"]));
        }
        namespaces.push(NsPlan { name: t, sysctls: quiet_sysctls(true), lo_addrs: vec![], routes: r });
    }
    bridge_cmds.push(strs(&["link", "set", BRIDGE, "up"]));
    namespaces.insert(
        0,
        NsPlan { name: bridge_ns.clone(), sysctls: layer2_sysctls(), lo_addrs: vec![], routes: bridge_cmds },
    );
    // The destination: its addresses on lo, the way back through rack switch 1.
    let mut r = Vec::new();
    if fam.v4() {
        r.push(strs(&["route", "add", "10.0.1.0/24", "via", "10.200.1.1", "dev", "r1"]));
    }
    if fam.v6() {
        r.push(strs(&["-6", "route", "add", "fd00:1::/64", "via", "fdc8:1::1", "dev", "r1"]));
    }
    // The destination answers each burst of RoCE frames with a port
    // unreachable (no RDMA stack listens), back through rack switch 1:
    // what teaches the bridge the gateway there, and traffic back to the
    // host. Without the per-peer limit (one a second), every burst gets
    // its answer, however soon it follows the last.
    let mut dst_sysctls = base_sysctls(false);
    dst_sysctls.extend(["net.ipv4.icmp_ratelimit=0".to_string(), "net.ipv6.icmp.ratelimit=0".to_string()]);
    namespaces.push(NsPlan {
        name: dst,
        sysctls: dst_sysctls,
        lo_addrs: fam.pick(vec![format!("{DEST_V4}/32")], vec![format!("{DEST_V6}/128")]),
        routes: r,
    });

    let pin_dir = crate::sys::paths::pin_dir_named(name);
    let config_path =
        args.config_out.clone().unwrap_or_else(|| Path::new(RUN_DIR).join(format!("lab-{name}")).join("bridge.toml"));
    let text = format!(
        "# Written by `rocev2 lab up --host-bridge --name {name}` for namespace {bridge_ns}.\n\
         # Run it with: rocev2 --netns {bridge_ns} run --config {cfg}\n\
         [dataplane]\nhash = \"{hash}\"\nhash_seed = 0\nhash_version = {version}\nxdp_mode = \"native\"\npin_dir = \"{pin}\"\n\n\
         # Every port of the bridge is served; frames leave as they came.\n[bridge]\nname = \"{BRIDGE}\"\n\n\
         # The rack switches all answer as the anycast gateway: its MAC is reachable through every uplink.\n\
         [[uplink_group]]\nname = \"{UPLINK_GROUP}\"\nports = [{ports}]\nmacs = [\"{gw}\"]\n",
        cfg = config_path.display(),
        hash = args.hash,
        version = args.hash_version,
        pin = pin_dir.display(),
        ports = ports.join(", "),
        gw = crate::sys::format_mac(&GATEWAY_MAC),
    );
    Ok(LabPlan {
        name: name.to_owned(),
        family: fam,
        namespaces,
        links: veths,
        config_path,
        config_text: text,
        pin_dir,
        bgp: Vec::new(),
        kind: LabKind::HostBridge,
    })
}

/// [`base_sysctls`] for the hosts and rack switches, with IPv6's start-up
/// chatter, which the bridge floods over every uplink, over quickly: no
/// router solicitations (three, 4 s apart), MLD reports repeated after
/// 10 ms rather than up to 1 s. So `settle` sees it end, and the first
/// `lab stats` counts the traffic, not the chatter.
fn quiet_sysctls(forward: bool) -> Vec<String> {
    let mut s = base_sysctls(forward);
    for scope in ["all", "default"] {
        s.push(format!("net.ipv6.conf.{scope}.router_solicitations=0"));
        s.push(format!("net.ipv6.conf.{scope}.mldv1_unsolicited_report_interval=10"));
        s.push(format!("net.ipv6.conf.{scope}.mldv2_unsolicited_report_interval=10"));
    }
    s
}

/// The bridge box works at layer 2 only: no IPv6 of its own on the
/// bridge or its ports (nothing of its own to announce or solicit).
fn layer2_sysctls() -> Vec<String> {
    let mut s = base_sysctls(false);
    s.extend(["net.ipv6.conf.all.disable_ipv6=1".to_string(), "net.ipv6.conf.default.disable_ipv6=1".to_string()]);
    s
}

/// What `lab down` and `lab stats` need of a host bridge lab.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostBridgeRecord {
    pub uplinks: u32,
    /// Each rack switch's received-frame counter at the last `lab stats`
    /// (or when `lab up` finished), so the next one shows what came since.
    pub last: Vec<u64>,
}

/// Frames rack switch `k`'s `gw` has received (the kernel counts the
/// kernel bridge's frames and XDP's alike).
fn received(lab: &str, k: u32) -> Result<u64> {
    let ns = format!("{lab}-rtsw{k}");
    Ok(crate::sys::netns::device_counts(&ns, "gw")?.rx.packets)
}

fn all_received(lab: &str, uplinks: u32) -> Result<Vec<u64>> {
    (1..=uplinks).map(|k| received(lab, k)).collect()
}

/// The last step of `lab up`: lets the rack switches' own start-up
/// chatter (IPv6 announcements, each teaching the bridge the gateway's MAC
/// on its own port) pass, then sends one frame from host 1 to the
/// destination, whose answer comes back through rack switch 1: the kernel
/// bridge then has the gateway on u1, as after any first exchange. Then
/// `lab stats` starts counting.
pub fn settle(plan: &LabPlan, record: &mut LabRecord) -> Result<()> {
    let uplinks = plan.links.iter().filter(|l| l.b_if == "gw").count() as u32;
    let name = &plan.name;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = all_received(name, uplinks)?;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(1) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        let now = all_received(name, uplinks)?;
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    if plan.family.v4() {
        let frame = crate::tools::packet::build_roce_frame(&crate::tools::packet::RoceFrameSpec {
            src_mac: host_mac(1),
            dst_mac: GATEWAY_MAC,
            vlan: None,
            src_ip: host_v4(1).parse()?,
            dst_ip: DEST_V4.parse()?,
            ttl: 64,
            dscp: 26,
            ecn: 2,
            src_port: 0xC000,
            bth: rocev2_common::bth::Bth::new(rocev2_common::bth::opcode::SEND_ONLY, 1, 0),
            payload_len: 0,
        });
        crate::sys::netns::in_netns(&format!("{name}-h1"), move || {
            crate::sys::rawsock::PacketSocket::open("eth0")?.send(&frame)?;
            Ok(())
        })?;
        thread::sleep(Duration::from_millis(200));
    }
    record.host_bridge = Some(HostBridgeRecord { uplinks, last: all_received(name, uplinks)? });
    record.write()
}

/// `rocev2 lab stats` of a host bridge lab: the frames each rack switch
/// received from the bridge box since the last `lab stats` (the first
/// time: since `lab up`), which uplink carried how much.
pub fn stats(args: &LabStatsArgs) -> Result<()> {
    let mut record = LabRecord::read(&args.name)?;
    let Some(hb) = record.host_bridge.clone() else { bail!("lab {:?} is not a host bridge lab", args.name) };
    let now = all_received(&args.name, hb.uplinks)?;
    let frames: Vec<u64> =
        now.iter().zip(hb.last.iter().chain(std::iter::repeat(&0))).map(|(n, l)| n - l.min(n)).collect();
    record.host_bridge = Some(HostBridgeRecord { last: now, ..hb });
    record.write()?;
    if args.json {
        let uplinks: Vec<serde_json::Value> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| serde_json::json!({ "port": format!("u{}", i + 1), "rack_switch": format!("{}-rtsw{}", args.name, i + 1), "frames": f }))
            .collect();
        println!("{}", serde_json::json!({ "uplinks": uplinks }));
        return Ok(());
    }
    print!("{}", render_stats(&args.name, &frames));
    Ok(())
}

fn render_stats(lab: &str, frames: &[u64]) -> String {
    let total: u64 = frames.iter().sum();
    let mut table = Table::new(&[
        ("UPLINK", Align::Left),
        ("RACK SWITCH", Align::Left),
        ("FRAMES", Align::Right),
        ("SHARE", Align::Right),
        ("", Align::Left),
    ]);
    for (i, f) in frames.iter().enumerate() {
        let share = if total == 0 { 0.0 } else { *f as f64 / total as f64 };
        table.row([
            format!("u{}", i + 1),
            format!("{lab}-rtsw{}", i + 1),
            f.to_string(),
            format!("{:.1}%", 100.0 * share),
            share_bar(share),
        ]);
    }
    let used = frames.iter().filter(|f| **f > 0).count();
    format!(
        "{}{total} frames from the bridge box to the rack switches since the last `lab stats`; {used} of {} uplinks used
",
        table.render(),
        frames.len()
    )
}

/// What `lab up` prints after the namespaces.
pub fn about(plan: &LabPlan) -> String {
    let name = &plan.name;
    format!(
        "The bridge box ({name}-bridge) bridges the hosts and the uplinks in the kernel ({BRIDGE}); it has learned the gateway {} on u1, the way the destination answers. With rocev2 running on it, frames to the gateway take an uplink chosen per QP.\n",
        crate::sys::format_mac(&GATEWAY_MAC)
    )
}

/// The commands to try the lab, one per line.
pub fn next_commands(plan: &LabPlan) -> String {
    let name = &plan.name;
    let (src, dst) = if plan.family.v4() { (host_v4(1), DEST_V4) } else { (host_v6(1), DEST_V6) };
    let cfg = plan.config_path.display();
    format!(
        "  rocev2 --netns {name}-bridge run --config {cfg}\n\
         \x20 rocev2 --netns {name}-h1 gen --dev eth0 --dst-mac {mac} --src {src} --dst {dst} --qps 64 --sport fixed\n\
         \x20 rocev2 lab stats --name {name}\n\
         \x20 rocev2 stats --config {cfg}\n\
         \x20 rocev2 lab down --name {name}\n",
        mac = crate::sys::format_mac(&GATEWAY_MAC),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::config::{Config, NextHop, UplinkMacs};

    #[test]
    fn the_plan_is_hosts_a_bridge_box_rack_switches_and_a_destination() {
        let mut args = super::super::tests_args("hb");
        args.host_bridge = true;
        args.hosts = 1;
        let plan = plan(&args).unwrap();
        let names: Vec<&str> = plan.namespaces.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["hb-bridge", "hb-h1", "hb-rtsw1", "hb-rtsw2", "hb-rtsw3", "hb-rtsw4", "hb-dst"]);
        let config =
            Config::parse(&plan.config_text, &plan.config_path).unwrap_or_else(|e| panic!("{e}\n{}", plan.config_text));
        let bridge = config.bridge.as_ref().unwrap();
        assert_eq!(bridge.name, "br0");
        assert_eq!(bridge.uplinks[0].macs, UplinkMacs::Listed(vec![GATEWAY_MAC]));
        let group = &config.groups[bridge.uplinks[0].group_index];
        assert_eq!(group.members.iter().map(|m| m.dev.as_str()).collect::<Vec<_>>(), ["u1", "u2", "u3", "u4"]);
        assert!(group.members.iter().all(|m| m.next_hop == NextHop::BridgePort));
        // Every rack switch answers as the one gateway.
        let gateways: Vec<_> = plan.links.iter().filter(|l| l.b_if == "gw").map(|l| l.b_mac).collect();
        assert_eq!(gateways, [GATEWAY_MAC; 4]);
        assert!(next_commands(&plan).contains("--dst-mac 02:52:32:fe:00:01 --src 10.0.1.1 --dst 10.1.0.1"));
        args.uplinks = 1;
        assert!(plan_err(&args).contains("--uplinks"));
    }

    fn plan_err(args: &LabUpArgs) -> String {
        plan(args).unwrap_err().to_string()
    }
}
