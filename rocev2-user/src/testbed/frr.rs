//! FRR (zebra + bgpd) as a real routing daemon in a lab namespace: the
//! `rocev2 lab up --routing bgp` switches and the kernel-routes tests.
//!
//! Each instance gets its own state directory (pid files, the zserv and
//! vty sockets), so any number of them run side by side, one per network
//! namespace. Dropping the handle stops both daemons and removes the
//! directory; the namespace's own drop kills anything left.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

const ZEBRA: &str = "/usr/lib/frr/zebra";

/// zebra.conf that makes zebra install routes with their next hops inline
/// instead of on kernel nexthop objects (`ip nexthop`).
///
/// When a port loses carrier, the kernel removes the nexthop objects on it
/// and shrinks the groups that hold them without telling anyone (no
/// netlink message); a group left empty takes its routes with it. zebra
/// 8.4 (FRR 8.4.4, what the labs run) does not notice: once the port is
/// back it believes its routes and groups are installed as it last wrote
/// them, and the kernel keeps a path fewer, or no route at all, until BGP
/// happens to change that prefix again. The churn soak saw leaves without
/// a route to other racks for minutes after link cuts. Inline next hops
/// stay in the route (marked `linkdown` while the port is down), so zebra
/// and the kernel agree.
pub const ZEBRA_NO_KERNEL_NEXTHOPS: &str = "no zebra nexthop kernel enable\n";
const BGPD: &str = "/usr/lib/frr/bgpd";

/// zebra's option to change an IPv6 route in place (RTM_NEWROUTE with
/// NLM_F_REPLACE), as it always does IPv4 routes. Without it zebra 8.4
/// deletes the route and adds it anew at every change of its paths (a
/// spine withdrawing or coming back): between the two the kernel has no
/// route, and `rocev2`'s mirror, which may read the delete before the add,
/// takes the prefix out of the dataplane meanwhile.
pub const ZEBRA_V6_REPLACE: &str = "--v6-rr-semantics";

/// zebra and bgpd running in one namespace.
pub struct Frr {
    netns: String,
    dir: PathBuf,
    /// Stop the daemons when this handle is dropped (tests); a lab leaves
    /// them running ([`Frr::detach`]) and `lab down` ends them.
    owned: bool,
}

impl Frr {
    /// Starts zebra, then bgpd with `bgp_config` (frr.conf syntax), inside
    /// namespace `netns`.
    pub fn start(netns: &str, bgp_config: &str) -> Result<Self> {
        Self::start_in(netns, &PathBuf::from(format!("/tmp/rocev2-frr-{netns}")), bgp_config)
    }

    /// Like [`Frr::start`] with the state directory `dir`.
    pub fn start_in(netns: &str, dir: &Path, bgp_config: &str) -> Result<Self> {
        Self::start_with(netns, dir, bgp_config, "")
    }

    /// Like [`Frr::start_in`], zebra reading `zebra_config` (zebra.conf
    /// syntax; [`ZEBRA_NO_KERNEL_NEXTHOPS`] for a fabric whose links fail).
    /// A restart ([`Frr::restart_after`]) keeps both configs.
    pub fn start_with(netns: &str, dir: &Path, bgp_config: &str, zebra_config: &str) -> Result<Self> {
        for daemon in [ZEBRA, BGPD] {
            if !Path::new(daemon).exists() {
                bail!("{daemon} is missing: install FRR (`cargo xtask setup` does: Debian package frr)");
            }
        }
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let frr = Self { netns: netns.to_string(), dir: dir.to_path_buf(), owned: true };
        // The daemons drop to user frr and must write their sockets here.
        std::fs::set_permissions(&frr.dir, std::fs::Permissions::from_mode(0o777))?;
        chown_frr(&frr.dir)?;
        let conf = frr.dir.join("frr.conf");
        std::fs::write(&conf, bgp_config)?;
        chown_frr(&conf)?;
        let zebra_conf = frr.dir.join("zebra.conf");
        std::fs::write(&zebra_conf, zebra_config)?;
        chown_frr(&zebra_conf)?;
        frr.daemon(ZEBRA, "zebra", &zebra_conf)?;
        frr.wait_for(&frr.dir.join("zserv.api"))?;
        frr.daemon(BGPD, "bgpd", &conf)?;
        frr.wait_for(&frr.dir.join("bgpd.vty"))?;
        Ok(frr)
    }

    fn daemon(&self, program: &str, name: &str, config: &Path) -> Result<()> {
        let dir = self.dir.display().to_string();
        let pid = format!("{dir}/{name}.pid");
        let zserv = format!("{dir}/zserv.api");
        let config = config.display().to_string();
        let mut args: Vec<&str> = vec!["netns", "exec", &self.netns, program, "-d", "-N", &self.netns];
        args.extend(["-i", &pid, "-z", &zserv, "--vty_socket", &dir, "-u", "frr", "-g", "frr", "-f", &config]);
        if program == ZEBRA {
            args.push(ZEBRA_V6_REPLACE);
        }
        let out = Command::new("ip").args(&args).output().context("cannot start FRR")?;
        if !out.status.success() {
            bail!(
                "{name} in {} failed to start: {}{}",
                self.netns,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn wait_for(&self, path: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !path.exists() {
            if Instant::now() > deadline {
                bail!("FRR in {} did not create {} within 10 s", self.netns, path.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The frr.conf this instance was started with.
    pub fn config(&self) -> String {
        std::fs::read_to_string(self.dir.join("frr.conf")).unwrap_or_default()
    }

    /// Runs vtysh commands (`-c` each) against this instance.
    pub fn vtysh(&self, commands: &[&str]) -> Result<String> {
        let dir = self.dir.display().to_string();
        let mut args: Vec<&str> = vec!["netns", "exec", &self.netns, "vtysh", "--vty_socket", &dir];
        for c in commands {
            args.extend(["-c", c]);
        }
        let out = Command::new("ip").args(&args).output().context("cannot run vtysh")?;
        if !out.status.success() {
            bail!("vtysh {commands:?} in {} failed: {}", self.netns, String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until `ip route show PREFIX` in the namespace satisfies `ok`.
    pub fn wait_route(&self, prefix: &str, what: &str, ok: impl Fn(&str) -> bool, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let family = if prefix.contains(':') { "-6" } else { "-4" };
            let out = Command::new("ip").args(["-n", &self.netns, family, "route", "show", prefix]).output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if ok(&text) {
                return Ok(text);
            }
            if Instant::now() > deadline {
                let bgp = self.vtysh(&["show bgp summary"]).unwrap_or_default();
                bail!("{}: route {prefix} did not become {what} within {timeout:?}: {text}\n{bgp}", self.netns);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&self) {
        for name in ["bgpd", "zebra"] {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join(format!("{name}.pid"))) {
                if let Ok(pid) = pid.trim().parse::<u32>() {
                    let _ = crate::sys::signal_process(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    }

    /// Kills bgpd and zebra now, as a crash would (routes stay in the
    /// kernel until zebra's successor cleans them up).
    pub fn kill(&self) {
        self.stop();
    }

    /// A handle on the daemons a lab started in `netns` with state
    /// directory `dir` (they keep running when it goes).
    pub fn running_in(netns: &str, dir: &Path) -> Self {
        Self { netns: netns.to_string(), dir: dir.to_path_buf(), owned: false }
    }

    /// Kills them as a crash would and starts them again with the same
    /// config (routes learned again from scratch); returns the new handle,
    /// detached like the old one.
    pub fn restart_after(self, down: Duration) -> Result<Self> {
        let config = self.config();
        let zebra_config = std::fs::read_to_string(self.dir.join("zebra.conf")).unwrap_or_default();
        self.kill();
        std::thread::sleep(down);
        let frr = Self::start_with(&self.netns, &self.dir, &config, &zebra_config)?;
        let detached = Self { netns: frr.netns.clone(), dir: frr.dir.clone(), owned: false };
        frr.detach();
        Ok(detached)
    }
}

impl Frr {
    /// Leaves the daemons running after this handle goes (a lab's).
    pub fn detach(mut self) {
        self.owned = false;
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        if self.owned {
            self.stop();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn chown_frr(path: &Path) -> Result<()> {
    let out = Command::new("chown").args(["frr:frr"]).arg(path).output()?;
    if !out.status.success() {
        bail!("chown frr:frr {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// One BGP speaker's frr.conf: eBGP sessions to `neighbours` (address or,
/// for BGP unnumbered, interface name, with the peer's ASN or "external"),
/// `networks` to advertise, and up to 8 equal paths installed (RFC 7938:
/// one private ASN per switch, multipath across ASNs).
pub fn bgp_config(asn: u32, router_id: &str, neighbours: &[(String, String)], networks: &[&str]) -> String {
    let mut out = format!(
        "frr defaults datacenter\nhostname as{asn}\n!\nrouter bgp {asn}\n bgp router-id {router_id}\n no bgp default ipv4-unicast\n no bgp ebgp-requires-policy\n no bgp network import-check\n bgp bestpath as-path multipath-relax\n"
    );
    for (peer, remote) in neighbours {
        // An interface name means BGP unnumbered (IPv6 link-local session).
        let interface = if peer.parse::<std::net::IpAddr>().is_err() { " interface" } else { "" };
        out.push_str(&format!(
            " neighbor {peer}{interface} remote-as {remote}\n neighbor {peer} timers 1 3\n neighbor {peer} timers connect 1\n"
        ));
    }
    for (family, v6) in [("ipv4", false), ("ipv6", true)] {
        out.push_str(&format!(" !\n address-family {family} unicast\n"));
        for (peer, _) in neighbours {
            let ip = peer.parse::<std::net::IpAddr>().ok();
            // Unnumbered sessions carry both families (IPv4 over IPv6 next
            // hops, RFC 5549); addressed sessions carry their own family.
            let carries = match ip {
                Some(ip) => ip.is_ipv6() == v6,
                None => true,
            };
            if carries {
                out.push_str(&format!("  neighbor {peer} activate\n"));
            }
        }
        for n in networks.iter().filter(|n| n.contains(':') == v6) {
            out.push_str(&format!("  network {n}\n"));
        }
        // Every session may be an equal path (a fabric leaf with many uplinks).
        let paths = neighbours.len().clamp(8, 64);
        out.push_str(&format!("  maximum-paths {paths}\n exit-address-family\n"));
    }
    out.push_str("!\n");
    out
}
