//! The one topology builder of every lab: the persistent ones (`lab up`,
//! single-rack and fabric), the demo's and tests' `EcmpLab`, and the
//! benchmark's. A lab is a plan (namespaces with their sysctls and
//! loopback addresses, veth pairs with MACs and addresses, then routes and
//! neighbours as `ip` commands), built in that order. Each namespace goes
//! to an owner the moment it exists: a persistent lab's record, so that
//! `lab down` (or the cleanup of a failed `up`) removes exactly what
//! exists, or a list of [`Netns`] guards that delete them when dropped.

use std::{
    fmt::Write as _,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use nix::sys::signal::Signal;

pub use crate::sys::netns::VethPlan;
use crate::{
    sys::netns::{ip, Netns},
    sys::signal_process,
};

#[derive(Clone, Debug)]
pub struct NsPlan {
    pub name: String,
    /// `key=value` sysctls, applied before any address.
    pub sysctls: Vec<String>,
    pub lo_addrs: Vec<String>,
    /// `ip` arguments (after `-n NS`) run once every link exists: routes,
    /// static neighbours.
    pub routes: Vec<Vec<String>>,
}

impl NsPlan {
    /// A namespace with [`base_sysctls`] and nothing else yet.
    pub fn new(name: &str, forward: bool) -> Self {
        Self { name: name.to_owned(), sysctls: base_sysctls(forward), lo_addrs: vec![], routes: vec![] }
    }
}

/// Who owns the namespaces a build makes, told of each as soon as it
/// exists so that a build failing halfway leaves nothing behind.
pub trait NamespaceOwner {
    fn made(&mut self, name: &str) -> Result<()>;
}

/// A lab that lives as long as its value: each namespace is deleted (with
/// whatever still runs in it) when its guard drops.
impl NamespaceOwner for Vec<Netns> {
    fn made(&mut self, name: &str) -> Result<()> {
        self.push(Netns::adopt(name));
        Ok(())
    }
}

/// No DAD, IPv6 addresses kept on link down (as on a real next hop), no
/// reverse-path filter, kernel forwarding on or off.
pub fn base_sysctls(forward: bool) -> Vec<String> {
    let f = if forward { "1" } else { "0" };
    let mut s = strs(&[
        "net.ipv6.conf.all.accept_dad=0",
        "net.ipv6.conf.default.accept_dad=0",
        "net.ipv6.conf.all.keep_addr_on_down=1",
        "net.ipv6.conf.default.keep_addr_on_down=1",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
    ]);
    s.push(format!("net.ipv4.ip_forward={f}"));
    s.push(format!("net.ipv6.conf.all.forwarding={f}"));
    s
}

pub fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `ip route add PREFIX nexthop via A dev D nexthop via ...` (or a plain
/// route for one next hop).
pub fn route_args(v6: bool, prefix: &str, hops: &[(String, String)]) -> Vec<String> {
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

pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns];
    full.extend_from_slice(args);
    ip(&full)
}

/// Makes the namespaces (sysctls, loopback addresses), the veth pairs with
/// their MACs and addresses, then every namespace's routes; `owner` gets
/// each namespace as soon as it exists.
pub fn build_topology(namespaces: &[NsPlan], links: &[VethPlan], owner: &mut impl NamespaceOwner) -> Result<()> {
    for ns in namespaces {
        ip(&["netns", "add", &ns.name]).with_context(|| format!("creating network namespace {:?}", ns.name))?;
        owner.made(&ns.name)?;
        let mut sysctl = vec!["sysctl", "-q", "-w"];
        sysctl.extend(ns.sysctls.iter().map(String::as_str));
        in_ns(&ns.name, &sysctl)?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        for a in &ns.lo_addrs {
            ip(&["-n", &ns.name, "addr", "add", a, "dev", "lo"])?;
        }
    }
    for l in links {
        l.create()?;
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

fn netns_pids(ns: &str) -> Vec<u32> {
    ip(&["netns", "pids", ns]).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Stops what runs in `ns` (SIGTERM, so a dataplane detaches and unpins;
/// SIGKILL after 5 s) and deletes it. Returns false if it was already gone.
pub fn remove_netns(ns: &str, log: &mut String) -> Result<bool> {
    if !netns_exists(ns) {
        return Ok(false);
    }
    let pids = netns_pids(ns);
    if !pids.is_empty() {
        let _ = writeln!(log, "  stopping processes in {ns}: {pids:?}");
        for &pid in &pids {
            let _ = signal_process(pid, Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !netns_pids(ns).is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        for pid in netns_pids(ns) {
            let _ = signal_process(pid, Signal::SIGKILL);
        }
    }
    ip(&["netns", "del", ns]).with_context(|| format!("deleting network namespace {ns:?}"))?;
    Ok(true)
}
