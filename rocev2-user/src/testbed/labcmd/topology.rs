//! The topology builder of the persistent labs (`lab up`, single-rack and
//! fabric): namespaces with their sysctls, veth pairs with MACs and
//! addresses, routes and neighbours as `ip` commands, built in that order
//! and recorded as they are made so that `lab down` (or the cleanup of a
//! failed `up`) removes exactly what exists.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::LabRecord;
use crate::netns::ip;

#[derive(Clone, Debug)]
pub struct VethPlan {
    pub a_ns: String,
    pub a_if: String,
    pub a_mac: [u8; 6],
    pub a_addrs: Vec<String>,
    pub b_ns: String,
    pub b_if: String,
    pub b_mac: [u8; 6],
    pub b_addrs: Vec<String>,
    /// Turn GRO on for the `b` end (it receives XDP-redirected frames from the RTSW).
    pub gro_b: bool,
}

#[derive(Clone, Debug)]
pub struct NsPlan {
    pub name: String,
    /// `key=value` sysctls, applied before any address.
    pub sysctls: Vec<String>,
    pub lo_addrs: Vec<String>,
    /// `ip` arguments (after `-n NS`) adding each route.
    pub routes: Vec<Vec<String>>,
}

/// No DAD, no reverse-path filter, kernel forwarding on or off.
pub(super) fn base_sysctls(forward: bool) -> Vec<String> {
    let f = if forward { "1" } else { "0" };
    let mut s = strs(&[
        "net.ipv6.conf.all.accept_dad=0",
        "net.ipv6.conf.default.accept_dad=0",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
    ]);
    s.push(format!("net.ipv4.ip_forward={f}"));
    s.push(format!("net.ipv6.conf.all.forwarding={f}"));
    s
}

pub(super) fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `ip route add PREFIX nexthop via A dev D nexthop via ...` (or a plain
/// route for one next hop).
pub(super) fn route_args(v6: bool, prefix: &str, hops: &[(String, String)]) -> Vec<String> {
    let mut args = if v6 { strs(&["-6", "route", "add", prefix]) } else { strs(&["route", "add", prefix]) };
    if let [(via, dev)] = hops {
        args.extend(strs(&["via", via, "dev", dev]));
    } else {
        for (via, dev) in hops {
            args.extend(strs(&["nexthop", "via", via, "dev", dev]));
        }
    }
    args
}

pub(super) fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

pub(super) fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns];
    full.extend_from_slice(args);
    ip(&full)
}

/// Makes `dir` (and records it for `lab down`) unless it exists.
pub(super) fn make_dir(dir: &Path, record: &mut LabRecord) -> Result<()> {
    if !dir.as_os_str().is_empty() && !dir.exists() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        record.dirs.push(dir.to_path_buf());
        record.write()?;
    }
    Ok(())
}

/// Writes a file `lab down` removes (recorded before it exists).
pub(super) fn write_file(path: &Path, text: &str, record: &mut LabRecord) -> Result<()> {
    record.files.push(path.to_path_buf());
    record.write()?;
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Makes the namespaces (sysctls, loopback addresses), the veth pairs with
/// their MACs and addresses, then every namespace's routes; each namespace
/// is recorded as soon as it exists.
pub(super) fn build_topology(namespaces: &[NsPlan], links: &[VethPlan], record: &mut LabRecord) -> Result<()> {
    for ns in namespaces {
        ip(&["netns", "add", &ns.name]).with_context(|| format!("creating network namespace {:?}", ns.name))?;
        record.namespaces.push(ns.name.clone());
        record.write()?;
        let mut sysctl = vec!["sysctl", "-q", "-w"];
        sysctl.extend(ns.sysctls.iter().map(String::as_str));
        in_ns(&ns.name, &sysctl)?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        for a in &ns.lo_addrs {
            ip(&["-n", &ns.name, "addr", "add", a, "dev", "lo"])?;
        }
    }
    for l in links {
        let (a_mac, b_mac) = (crate::sys::format_mac(&l.a_mac), crate::sys::format_mac(&l.b_mac));
        #[rustfmt::skip]
        ip(&[
            "-n", &l.a_ns, "link", "add", &l.a_if, "address", &a_mac, "type", "veth",
            "peer", "name", &l.b_if, "address", &b_mac, "netns", &l.b_ns,
        ])
        .with_context(|| format!("creating veth {}/{} <-> {}/{}", l.a_ns, l.a_if, l.b_ns, l.b_if))?;
        for (ns, ifname, addrs) in [(&l.a_ns, &l.a_if, &l.a_addrs), (&l.b_ns, &l.b_if, &l.b_addrs)] {
            for a in addrs {
                let mut args = vec!["-n", ns.as_str(), "addr", "add", a.as_str(), "dev", ifname.as_str()];
                if a.contains(':') {
                    args.push("nodad");
                }
                ip(&args)?;
            }
            ip(&["-n", ns, "link", "set", ifname, "up"])?;
        }
        if l.gro_b {
            // XDP_REDIRECT from the RTSW into this veth pair needs NAPI on
            // this end, or the kernel drops the frames silently.
            in_ns(&l.b_ns, &["ethtool", "-K", &l.b_if, "gro", "on"])
                .with_context(|| format!("turning GRO on for {}/{}", l.b_ns, l.b_if))?;
        }
    }
    for ns in namespaces {
        for r in &ns.routes {
            let mut args = vec!["-n", ns.name.as_str()];
            args.extend(r.iter().map(String::as_str));
            ip(&args)?;
        }
    }
    Ok(())
}

pub(super) fn netns_pids(ns: &str) -> Vec<libc::pid_t> {
    ip(&["netns", "pids", ns]).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Stops what runs in `ns` (SIGTERM, so a dataplane detaches and unpins;
/// SIGKILL after 5 s) and deletes it. Returns false if it was already gone.
pub(super) fn remove_netns(ns: &str, log: &mut String) -> Result<bool> {
    if !netns_exists(ns) {
        return Ok(false);
    }
    let pids = netns_pids(ns);
    if !pids.is_empty() {
        let _ = writeln!(log, "  stopping processes in {ns}: {pids:?}");
        for &pid in &pids {
            // SAFETY: plain kill(2) on a pid listed as inside the lab's namespace.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !netns_pids(ns).is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        for pid in netns_pids(ns) {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    ip(&["netns", "del", ns]).with_context(|| format!("deleting network namespace {ns:?}"))?;
    Ok(true)
}
