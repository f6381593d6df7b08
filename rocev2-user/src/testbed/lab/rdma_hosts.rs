//! `lab up --racks N --rdma-hosts`: every host of the fabric is a small
//! virtual machine running Debian's kernel with Soft-RoCE (rxe) and the
//! RDMA tools (perftest, rping, ibv_rc_pingpong), so a real RDMA stack
//! talks through the switches (see [`crate::testbed::guest`]).
//!
//! A host namespace keeps its link to the leaf (`eth0`, where `rocev2
//! fault --dev eth0` and tcpdump work as on any lab host) but gives its
//! addresses to the guest: `eth0` and the guest's tap `vm0` are the two
//! ports of a bridge `br0`, and qemu runs in that namespace.
//!
//! ```text
//!  [lab-r1h1]                                   [lab-leaf1]
//!   guest eth0 ~~ vm0 (tap) --br0-- eth0 ====== h1  (rocev2 XDP) ...
//!   10.1.1.1, fd00:1:1::1                        10.1.1.254, fd00:1:1::fe
//! ```
//!
//! `lab exec --name NAME r1h1 -- CMD` runs a command in a host: in the
//! guest of an RDMA host, in the namespace of any other.

use std::{
    fmt::Write as _,
    io::Write as _,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{strs, LabRecord};
use crate::{
    render::{Align, Table},
    sys::signals::SigintGuard,
    testbed::{
        debian_tree::{self, RDMA_GUEST},
        guest::{Budget, Guest, GuestSpec, DEFAULT_MEMORY_MIB},
    },
    tools::fabric::Fabric,
};

/// The guest's tap in its host namespace, and the bridge joining it to `eth0`.
pub const GUEST_TAP: &str = "vm0";
pub const HOST_BRIDGE: &str = "br0";
/// Where `lab up --rdma-hosts` keeps the guests' Debian tree unless told.
pub const DEFAULT_TREE_CACHE: &str = "/var/cache/rocev2/trees";
/// A boot takes about 3 s of CPU; this much means it is stuck.
const BOOT_BUDGET: Budget = Budget::secs(90, 600);

#[derive(clap::Args, Debug, Clone)]
pub struct RdmaHostArgs {
    /// Make every host a small virtual machine (qemu, Debian 12's kernel)
    /// with Soft-RoCE (rxe0) and perftest, rping and ibv_rc_pingpong; run
    /// commands in it with `rocev2 lab exec`. Builds the guests' Debian
    /// tree on first use (minutes, from deb.debian.org: 385 s measured on
    /// a loaded 2-core machine; `rocev2 lab tree` builds it ahead).
    #[arg(long = "rdma-hosts", requires = "racks")]
    pub enabled: bool,
    /// Memory of each guest, in MiB.
    #[arg(long, default_value_t = DEFAULT_MEMORY_MIB, value_name = "MIB", requires = "enabled")]
    pub guest_memory: u32,
    /// Where the guests' Debian tree is built and kept.
    #[arg(long, default_value = DEFAULT_TREE_CACHE, value_name = "DIR", requires = "enabled")]
    pub tree_cache: PathBuf,
}

impl Default for RdmaHostArgs {
    fn default() -> Self {
        Self { enabled: false, guest_memory: DEFAULT_MEMORY_MIB, tree_cache: DEFAULT_TREE_CACHE.into() }
    }
}

/// The `ip` commands that make an RDMA host's namespace a bridge between
/// its link to the leaf and the guest's tap (the tap stays when qemu
/// stops, so the leaf's port keeps its place in the bridge).
pub fn host_side_commands() -> Vec<Vec<String>> {
    vec![
        strs(&["tuntap", "add", "dev", GUEST_TAP, "mode", "tap"]),
        strs(&["link", "add", HOST_BRIDGE, "type", "bridge"]),
        strs(&["link", "set", "eth0", "master", HOST_BRIDGE]),
        strs(&["link", "set", GUEST_TAP, "master", HOST_BRIDGE]),
        strs(&["link", "set", GUEST_TAP, "up"]),
        strs(&["link", "set", HOST_BRIDGE, "up"]),
    ]
}

/// The sysctls of an RDMA host's namespace: a bridge, silent itself (no
/// IPv6 of its own, no forwarding).
pub fn host_side_sysctls() -> Vec<String> {
    let mut s = super::base_sysctls(false);
    s.extend(strs(&["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]));
    s
}

/// The guest of host `i` in rack `r`, in namespace `netns`: the addresses
/// and MAC a namespace host would have (its own MAC: the bridge port keeps
/// the host's).
pub fn guest_spec(netns: &str, dir: &std::path::Path, f: &Fabric, r: u32, i: u32, memory_mib: u32) -> GuestSpec {
    let mut addrs = Vec::new();
    if f.v4 {
        addrs.push(format!("{}/24", Fabric::host_v4(r, i)));
    }
    if f.v6 {
        addrs.push(format!("{}/64", Fabric::host_v6(r, i)));
    }
    GuestSpec {
        name: format!("r{r}h{i}"),
        netns: netns.to_owned(),
        tap: GUEST_TAP.into(),
        mac: Fabric::guest_mac(r, i),
        addrs,
        gateway_v4: f.v4.then(|| format!("10.{r}.{i}.254")),
        gateway_v6: f.v6.then(|| format!("fd00:{r}:{i}::fe")),
        memory_mib,
        dir: dir.join(format!("r{r}h{i}")),
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct LabTreeArgs {
    /// Where the guests' Debian tree is built and kept.
    #[arg(long, default_value = DEFAULT_TREE_CACHE, value_name = "DIR")]
    pub tree_cache: PathBuf,
    /// Only say whether the tree of today's recipe is built: exit 1 if not.
    #[arg(long)]
    pub check: bool,
    /// Which tree: "rdma-guest" (the RDMA guests'), or "systemd" (Debian
    /// booting systemd in a container, for the service test).
    #[arg(long, default_value = "rdma-guest", value_name = "NAME")]
    pub recipe: String,
}

/// `lab tree`: builds the tree of `--recipe` (the guests' by default) if
/// today's recipe has none in the cache (needs root and deb.debian.org) and
/// prints where it is.
pub fn tree_command(args: &LabTreeArgs) -> Result<()> {
    let recipe = debian_tree::recipe(&args.recipe)?;
    let what = format!("the {:?} Debian tree (recipe digest {})", recipe.name, recipe.digest());
    if args.check {
        let Some(path) = debian_tree::built(recipe, &args.tree_cache) else {
            let choice =
                if recipe.name == RDMA_GUEST.name { String::new() } else { format!(" --recipe {}", recipe.name) };
            bail!(
                "{what} is not built in {}: run `rocev2 lab tree{choice} --tree-cache {}` (or `cargo xtask setup`)",
                args.tree_cache.display(),
                args.tree_cache.display()
            );
        };
        println!("{what} is built: {}", path.display());
        return Ok(());
    }
    let tree = debian_tree::ensure(recipe, &args.tree_cache)?;
    match tree.built_in {
        Some(took) => println!("{what} built in {:.0} s: {}", took.as_secs_f64(), tree.path.display()),
        None => println!("{what} was already built: {}", tree.path.display()),
    }
    Ok(())
}

/// The guests' tree, built first if this recipe has none in the cache yet.
pub fn tree(args: &RdmaHostArgs) -> Result<PathBuf> {
    Ok(debian_tree::ensure(&RDMA_GUEST, &args.tree_cache)?.path)
}

/// Boots every guest (all at once), records each as soon as qemu runs,
/// and waits until all are ready.
pub fn start_guests(specs: &[GuestSpec], tree: &std::path::Path, record: &mut LabRecord) -> Result<()> {
    for spec in specs {
        std::fs::create_dir_all(&spec.dir).with_context(|| format!("cannot create {}", spec.dir.display()))?;
        record.guests.push(Guest::start(spec, tree)?);
        record.write()?;
    }
    for n in 0..record.guests.len() {
        let boot = record.guests[n].wait_ready(BOOT_BUDGET)?;
        record.guests[n].boot = Some(boot);
    }
    record.write()
}

/// One row per guest: where it is, its boot and its memory.
pub fn guests_table(guests: &[Guest]) -> String {
    let mut table = Table::new(&[
        ("GUEST", Align::Left),
        ("NAMESPACE", Align::Left),
        ("QEMU PID", Align::Right),
        ("STATE", Align::Left),
        ("BOOT", Align::Right),
        ("GUEST MEM", Align::Right),
        ("QEMU RSS", Align::Right),
        ("CPU", Align::Right),
    ])
    .indent(2);
    for g in guests {
        let boot = g.boot.as_ref();
        table.row([
            g.name.clone(),
            g.netns.clone(),
            g.pid.to_string(),
            if g.alive() { "running".into() } else { "stopped".into() },
            boot.map_or("-".into(), |b| format!("{:.1} s ({:.1} s CPU)", b.wall_s, b.cpu_s)),
            boot.map_or("-".into(), |b| format!("{} MiB", b.mem_total_kib / 1024)),
            format!("{} MiB", g.rss_kib() / 1024),
            format!("{:.1} s", g.cpu_time().as_secs_f64()),
        ]);
    }
    table.render()
}

/// Stops the guests of a lab being removed and deletes their directories.
pub fn remove_guests(record: &LabRecord, log: &mut String, errors: &mut Vec<String>) {
    for g in &record.guests {
        let running = g.alive();
        g.stop();
        match std::fs::remove_dir_all(&g.dir) {
            Ok(()) => {
                let _ = writeln!(
                    log,
                    "  {} guest {} and removed {}/",
                    if running { "stopped" } else { "found stopped" },
                    g.name,
                    g.dir.display()
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("cannot remove {}: {e}", g.dir.display())),
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct LabExecArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// The host: rRACKhHOST, e.g. r1h1 (rack 1, host 1).
    pub host: String,
    /// The command and its arguments (after `--`); in a guest it runs under /bin/sh.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs a command in a lab host, printing its output as it comes; returns
/// its exit status. Ctrl-C is passed on to it.
pub fn exec(args: &LabExecArgs) -> Result<i32> {
    super::validate_name(&args.name)?;
    let record = LabRecord::read(&args.name)?;
    if let Some(guest) = record.guests.iter().find(|g| g.name == args.host) {
        return exec_in_guest(guest, &args.command);
    }
    let ns = format!("{}-{}", args.name, args.host);
    let is_host = record.namespaces.contains(&ns) && record.switches.iter().all(|s| s.netns != ns);
    if !is_host {
        let hosts: Vec<String> = record
            .guests
            .iter()
            .map(|g| g.name.clone())
            .chain(
                record.namespaces.iter().filter_map(|n| n.strip_prefix(&format!("{}-", args.name)).map(str::to_owned)),
            )
            .filter(|h| h.starts_with('r') && h.contains('h'))
            .collect();
        bail!("lab {:?} has no host {:?}; its hosts: {}", args.name, args.host, hosts.join(", "));
    }
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .args(&args.command)
        .status()
        .with_context(|| format!("cannot run ip netns exec {ns}"))?;
    Ok(status.code().unwrap_or(128))
}

fn exec_in_guest(guest: &Guest, command: &[String]) -> Result<i32> {
    let script = command.iter().map(|w| shell_quote(w)).collect::<Vec<_>>().join(" ");
    let job = guest.spawn(&format!("exec {script}\n"))?;
    let _sigint = SigintGuard::install();
    let mut interrupted_at: Option<Instant> = None;
    let mut shown = [0, 0];
    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
    // No deadline: the command runs until it ends or Ctrl-C ends it.
    loop {
        let status = job.status();
        let (out, err) = job.new_output(&mut shown);
        stdout.write_all(&out)?;
        stdout.flush()?;
        stderr.write_all(&err)?;
        if let Some(status) = status {
            return Ok(status);
        }
        if !guest.alive() {
            bail!("{}", guest.post_mortem());
        }
        if SigintGuard::interrupted() && interrupted_at.is_none() {
            interrupted_at = Some(Instant::now());
            job.signal("INT")?;
        }
        // A command that ignores SIGINT gets SIGKILL 3 s later.
        if interrupted_at.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
            job.signal("KILL")?;
            interrupted_at = Some(Instant::now() + Duration::from_secs(3600));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `word` as one sh word.
fn shell_quote(word: &str) -> String {
    if !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,+@%".contains(&b)) {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_hosts_guest_spec_and_quoting() {
        let f = Fabric {
            racks: 2,
            hosts: 1,
            spines: 2,
            links: 1,
            zones: 1,
            aggs: 0,
            v4: true,
            v6: true,
            hash: rocev2_common::hash::HashMode::Qp,
            hash_version: rocev2_common::hash::HashVersion::V1,
            seeds: crate::tools::fabric::SeedPlan::Auto,
        };
        let spec = guest_spec("lab-r2h1", std::path::Path::new("/run/rocev2/lab-lab"), &f, 2, 1, 256);
        assert_eq!(spec.name, "r2h1");
        assert_eq!(spec.netns, "lab-r2h1");
        assert_eq!(spec.addrs, ["10.2.1.1/24", "fd00:2:1::1/64"]);
        assert_eq!(spec.gateway_v4.as_deref(), Some("10.2.1.254"));
        assert_eq!(spec.gateway_v6.as_deref(), Some("fd00:2:1::fe"));
        assert_ne!(spec.mac, Fabric::host_mac(2, 1), "the bridge port keeps the host's MAC");
        assert_eq!(spec.dir, PathBuf::from("/run/rocev2/lab-lab/r2h1"));
        assert_eq!(shell_quote("ib_write_bw"), "ib_write_bw");
        assert_eq!(shell_quote("10.1.1.1"), "10.1.1.1");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
