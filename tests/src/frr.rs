//! FRR (zebra + bgpd) as a real routing daemon in a test namespace.
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
const BGPD: &str = "/usr/lib/frr/bgpd";

/// zebra and bgpd running in one namespace.
pub struct Frr {
    netns: String,
    dir: PathBuf,
}

impl Frr {
    /// Starts zebra, then bgpd with `bgp_config` (frr.conf syntax), inside
    /// namespace `netns`.
    pub fn start(netns: &str, bgp_config: &str) -> Result<Self> {
        for daemon in [ZEBRA, BGPD] {
            if !Path::new(daemon).exists() {
                bail!("{daemon} is missing: install FRR (`cargo xtask setup` does: Debian package frr)");
            }
        }
        let dir = PathBuf::from(format!("/tmp/rocev2-frr-{netns}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let frr = Self { netns: netns.to_string(), dir };
        // The daemons drop to user frr and must write their sockets here.
        std::fs::set_permissions(&frr.dir, std::fs::Permissions::from_mode(0o777))?;
        chown_frr(&frr.dir)?;
        let conf = frr.dir.join("frr.conf");
        std::fs::write(&conf, bgp_config)?;
        chown_frr(&conf)?;
        frr.daemon(ZEBRA, "zebra", Path::new("/dev/null"))?;
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
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    // SAFETY: kill(2) on the pid our own daemon wrote.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }

    /// Kills bgpd and zebra now, as a crash would (routes stay in the
    /// kernel until zebra's successor cleans them up).
    pub fn kill(&self) {
        self.stop();
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn chown_frr(path: &Path) -> Result<()> {
    let out = Command::new("chown").args(["frr:frr"]).arg(path).output()?;
    if !out.status.success() {
        bail!("chown frr:frr {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The frr.conf of a spine that advertises `prefixes` to the leaf at
/// `leaf_addr` (eBGP, RFC 7938 style: one private ASN per switch).
pub fn spine_config(asn: u32, router_id: &str, leaf_addr: &str, leaf_asn: u32, prefixes: &[&str]) -> String {
    let v6 = leaf_addr.contains(':');
    let family = if v6 { "ipv6" } else { "ipv4" };
    let mut networks = String::new();
    for p in prefixes {
        networks.push_str(&format!("  network {p}\n"));
    }
    let activate = if v6 { format!("  neighbor {leaf_addr} activate\n") } else { String::new() };
    format!(
        "frr defaults datacenter\nhostname s{asn}\n!\nrouter bgp {asn}\n bgp router-id {router_id}\n no bgp ebgp-requires-policy\n no bgp network import-check\n neighbor {leaf_addr} remote-as {leaf_asn}\n neighbor {leaf_addr} timers 1 3\n neighbor {leaf_addr} timers connect 1\n !\n address-family {family} unicast\n{activate}{networks} exit-address-family\n!\n"
    )
}

/// The frr.conf of a leaf with eBGP sessions to `spines` (address, ASN),
/// installing up to 8 equal paths.
pub fn leaf_config(asn: u32, router_id: &str, spines: &[(String, u32)]) -> String {
    let mut neighbours = String::new();
    let mut activate4 = String::new();
    let mut activate6 = String::new();
    for (addr, remote) in spines {
        neighbours.push_str(&format!(
            " neighbor {addr} remote-as {remote}\n neighbor {addr} timers 1 3\n neighbor {addr} timers connect 1\n"
        ));
        if addr.contains(':') {
            activate6.push_str(&format!("  neighbor {addr} activate\n"));
        } else {
            activate4.push_str(&format!("  neighbor {addr} activate\n"));
        }
    }
    format!(
        "frr defaults datacenter\nhostname leaf\n!\nrouter bgp {asn}\n bgp router-id {router_id}\n no bgp ebgp-requires-policy\n bgp bestpath as-path multipath-relax\n{neighbours} !\n address-family ipv4 unicast\n{activate4}  maximum-paths 8\n exit-address-family\n !\n address-family ipv6 unicast\n{activate6}  maximum-paths 8\n exit-address-family\n!\n"
    )
}

/// The frr.conf of a switch with BGP unnumbered sessions (RFC 5549: IPv4
/// routes over IPv6 link-local next hops) on `interfaces`, advertising
/// `prefixes` and installing up to 8 equal paths.
pub fn unnumbered_config(asn: u32, router_id: &str, interfaces: &[&str], prefixes: &[&str]) -> String {
    let mut neighbours = String::new();
    for i in interfaces {
        neighbours.push_str(&format!(" neighbor {i} interface remote-as external\n neighbor {i} timers 1 3\n"));
    }
    let mut networks = String::new();
    for p in prefixes {
        networks.push_str(&format!("  network {p}\n"));
    }
    format!(
        "frr defaults datacenter\nhostname u{asn}\n!\nrouter bgp {asn}\n bgp router-id {router_id}\n no bgp ebgp-requires-policy\n no bgp network import-check\n bgp bestpath as-path multipath-relax\n{neighbours} !\n address-family ipv4 unicast\n{networks}  maximum-paths 8\n exit-address-family\n!\n"
    )
}
