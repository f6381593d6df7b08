//! `rocev2 lab up|down|status`: a persistent lab in network namespaces for
//! trying the dataplane by hand (a class, a demo): the single-rack lab
//! below; a fabric ([`fabric`]); a host bridge ([`hostbridge`]).
//!
//! ```text
//!  [<name>-h1] eth0 --- h1 [<name>-rtsw] s1l1 --- r1 [<name>-s1] dst --- s1 [<name>-dst]
//!  [<name>-h2] eth0 --- h2  (rocev2 XDP) s1l2 --- r2                         lo: 10.1.0.1
//!                                       s2l1 --- r1 [<name>-s2] dst --- s2      fd01::1
//!                                        ...
//! ```
//! Host i has 10.0.i.1/24 and fd00:i::1/64; the RTSW has .254 / ::fe on that
//! link. Uplink k to spine j uses 10.100.(16j+k).0/24 and fd64:j:k::/64 (RTSW
//! .1/::1, spine .2/::2). Spine j reaches the destination rack over
//! 10.200.j.0/24 and fdc8:j::/64 (spine .1, dst .2). Spines forward in the
//! kernel; the RTSW does not: with `rocev2 run` on it, every RTSW link is a
//! `[[port]]`, uplinks form group "spines" (routes 10.1.0.0/16, fd01::/64)
//! and each host link is group `host<i>` (routes 10.0.i.0/24, fd00:i::/64),
//! so both directions go through XDP.
//!
//! Unlike [`crate::sys::netns::Netns`], these namespaces outlive the command:
//! everything made is recorded in `/run/rocev2/lab-<name>.json` and `lab down`
//! removes exactly that.

use std::{
    fmt::Write as _,
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use rocev2_common::hash::{HashMode, HashVersion};
use serde::{Deserialize, Serialize};

use crate::sys::netns::ip;

pub(crate) use crate::sys::paths::RUN_DIR;
const MAX_NAME: usize = 8;
const MAX_HOSTS: u32 = 250;
const MAX_SPINES: u32 = 15;
const MAX_LINKS_PER_SPINE: u32 = 15;
/// Port slots the dataplane has (1..64).
const MAX_PORTS: u32 = 63;
const MAX_MEMBERS: u32 = 128;

pub const DEST_V4: &str = "10.1.0.1";
pub const DEST_V6: &str = "fd01::1";
/// The destination rack's prefixes (routed by the RTSW to the spines).
pub const DEST_PREFIX_V4: &str = "10.1.0.0/16";
pub const DEST_PREFIX_V6: &str = "fd01::/64";

mod bgp;
pub mod drop_counters;
pub mod fabric;
pub mod hostbridge;
pub mod rdma_hosts;
pub mod soak;

use super::topology::{base_sysctls, build_topology, netns_exists, remove_netns, route_args, strs, NamespaceOwner};
pub use super::topology::{NsPlan, VethPlan};

#[derive(clap::Subcommand, Debug, Clone)]
pub enum LabCommand {
    /// Build a lab: without `--racks`, hosts behind one rack switch (RTSW)
    /// and its spines, writing the RTSW's config for you to `rocev2 run`;
    /// with `--racks`, a fabric with rocev2 running on every switch; with
    /// `--host-bridge`, a Linux bridge in front of rack switches, writing
    /// the bridge's config.
    Up(LabUpArgs),
    /// Remove every namespace and file `lab up` made.
    Down(LabDownArgs),
    /// Show the lab's namespaces, links, addresses and whether a dataplane is attached
    /// (a fabric: every switch's dataplane and counters).
    Status(LabNameArgs),
    /// Run a collective's traffic over a fabric (`lab up --racks`): a generator on
    /// every host, a sink checking every packet, per-link loads by tier.
    Traffic(fabric::LabTrafficArgs),
    /// Run a collective (ring AllReduce, all-to-all, incast) over a fabric
    /// with rated links: an RC endpoint on every host, every packet checked;
    /// completion time, algorithm and bus bandwidth, per-step times, the
    /// busiest link, ECN marks, drops and retransmissions.
    Collective(fabric::LabCollectiveArgs),
    /// Set how a fabric's switches spread traffic (five-tuple, qp, slice,
    /// flowlet, transport-aware): rewrites every switch's config and
    /// restarts its dataplane.
    Mode(fabric::balance::LabModeArgs),
    /// Centralized TE: per-QP paths for a collective's traffic matrix from
    /// CSPF, pinned on every switch; recomputed when a link fails (--fail).
    Te(fabric::te::LabTeArgs),
    /// Fail a fabric link (both directions) or bring it back.
    Link(fabric::te::LabLinkArgs),
    /// The collective scorecard: a ring AllReduce under every load-balancing
    /// mode and an incast under every transport, one table (and an SVG chart).
    Scorecard(fabric::scorecard::LabScorecardArgs),
    /// A fabric's per-link loads by tier from every switch's member
    /// counters; a host bridge lab's frames per uplink (what each rack
    /// switch received since the last `lab stats`).
    Stats(fabric::LabStatsArgs),
    /// Minutes of churn on a fabric of its own under load (withdrawals, link
    /// cuts, FRR and `rocev2 run` restarts, reloads, upgrades, a busy CPU)
    /// with a sequence-checked stream between every pair of racks; prints
    /// the loss, reordering and convergence of every event.
    Soak(soak::SoakArgs),
    /// Run a command in a host of the lab: in its virtual machine
    /// (`--rdma-hosts`), else in its namespace. Exits with its status.
    Exec(rdma_hosts::LabExecArgs),
    /// Build the RDMA hosts' Debian tree now (`--rdma-hosts` builds it on
    /// first use), or with `--recipe systemd` the service test's; with
    /// `--check`, say whether it is built.
    Tree(rdma_hosts::LabTreeArgs),
}

impl LabCommand {
    /// The subcommand as typed, for messages: `lab up`, `lab down`, `lab status`.
    pub fn as_typed(&self) -> &'static str {
        match self {
            Self::Up(_) => "lab up",
            Self::Down(_) => "lab down",
            Self::Status(_) => "lab status",
            Self::Traffic(_) => "lab traffic",
            Self::Collective(_) => "lab collective",
            Self::Mode(_) => "lab mode",
            Self::Te(_) => "lab te",
            Self::Link(_) => "lab link",
            Self::Soak(_) => "lab soak",
            Self::Scorecard(_) => "lab scorecard",
            Self::Stats(_) => "lab stats",
            Self::Exec(_) => "lab exec",
            Self::Tree(_) => "lab tree",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct LabUpArgs {
    /// Prefix of every namespace and file the lab makes: 1-8 of [a-z0-9].
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Hosts behind the rack switch (RTSW); with `--racks`, per rack; with
    /// `--host-bridge`, behind the bridge.
    #[arg(long, default_value_t = 2)]
    pub hosts: u32,
    /// Spine namespaces.
    #[arg(long, default_value_t = 2)]
    pub spines: u32,
    /// Parallel links between the RTSW (with `--racks`, each leaf) and each
    /// spine, each one an ECMP member.
    #[arg(long, default_value_t = 1)]
    pub links_per_spine: u32,
    /// Address families to configure.
    #[arg(long, value_enum, default_value = "both")]
    pub family: LabFamily,
    /// Hash mode written into the generated dataplane config.
    #[arg(long, value_enum, default_value_t = HashMode::Qp)]
    pub hash: HashMode,
    /// `hash_version` written into every generated dataplane config (and
    /// used by the lab's predictions): 1 or 2.
    #[arg(long, default_value_t = HashVersion::V1)]
    pub hash_version: HashVersion,
    /// Where to write the RTSW's dataplane config (default
    /// `/run/rocev2/lab-<name>/rtsw.toml`; with `--host-bridge`, the
    /// bridge's, default `bridge.toml` there). A fabric writes one per switch.
    #[arg(long, value_name = "FILE")]
    pub config_out: Option<PathBuf>,
    /// How the RTSW learns the route to the destination: `static` (a
    /// `[[route]]` in its config) or `bgp` (FRR on the RTSW and every
    /// spine, eBGP per link; rocev2 follows the kernel routes zebra
    /// installs). With `--racks`, the same on every switch.
    #[arg(long, value_enum, default_value = "static")]
    pub routing: LabRouting,
    /// Build a fabric of this many racks (each `--hosts` hosts behind a leaf,
    /// `--spines` spines, `--links-per-spine` links per leaf-spine pair) with
    /// rocev2 running on every switch. Without it: the single-rack lab.
    #[arg(long)]
    pub racks: Option<u32>,
    /// Fabric hash seeds: `same` on every switch (shows polarization) or
    /// `auto` (each switch's own, from its port MACs).
    #[arg(long, value_enum, default_value = "auto", requires = "racks")]
    pub seed: crate::tools::fabric::SeedPlan,
    /// With `--routing bgp` in a fabric: BGP unnumbered, one session per
    /// link over IPv6 link-local addresses carrying both families (IPv4
    /// routes get IPv6 next hops, RFC 5549).
    #[arg(long, requires = "racks")]
    pub unnumbered: bool,
    /// Split the fabric's racks and spines into this many zones, joined by
    /// `--aggs` aggregation switches (a third tier).
    #[arg(long, default_value_t = 1, requires = "racks")]
    pub zones: u32,
    /// Aggregation switches joining the zones, each linked to every spine
    /// (default 2 with `--zones` 2 or more).
    #[arg(long, requires = "zones")]
    pub aggs: Option<u32>,
    #[command(flatten)]
    pub rdma: rdma_hosts::RdmaHostArgs,
    /// Rated links: a rate and a buffer on every fabric link.
    #[command(flatten)]
    pub links: fabric::links::LinkArgs,
    /// Build a host bridge lab instead: `--hosts` hosts behind a Linux
    /// bridge (the box rocev2 runs on in bridge mode), whose `--uplinks`
    /// ports lead to as many rack switches sharing one anycast gateway MAC
    /// and address, which route onward to the destination.
    #[arg(long, conflicts_with_all = ["racks", "routing", "spines", "links_per_spine"])]
    pub host_bridge: bool,
    /// With `--racks`: per-QP transport telemetry on every switch
    /// (`telemetry_qps` in its config), for `rocev2 top` and `rocev2 trace`.
    #[arg(long, requires = "racks")]
    pub telemetry: bool,
    /// With `--host-bridge`: rack switches (each one bridge port, one
    /// member of the uplink group).
    #[arg(long, default_value_t = 4, requires = "host_bridge")]
    pub uplinks: u32,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabRouting {
    Static,
    Bgp,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LabNameArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LabDownArgs {
    /// The lab: the `--name` it was built with.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// List every namespace, process, pin and file removed, not just the counts.
    #[arg(long, short)]
    pub verbose: bool,
}

/// The address families of a lab (one type with the fabric simulator's).
pub use crate::tools::fabric::Family as LabFamily;

pub fn run(cmd: &LabCommand) -> Result<()> {
    match cmd {
        LabCommand::Up(args) => {
            let built = up(args)?;
            print!("{built}");
            Ok(())
        }
        LabCommand::Down(args) => {
            let log = down(&args.name)?;
            print!("{}", if args.verbose { log } else { summarize_down(&log) });
            Ok(())
        }
        LabCommand::Status(args) => {
            print!("{}", status(&args.name)?);
            Ok(())
        }
        LabCommand::Traffic(args) => fabric::traffic(args).map(|_| ()),
        LabCommand::Collective(args) => {
            let report = fabric::collective(args)?;
            if !report.complete {
                anyhow::bail!("the collective did not complete");
            }
            Ok(())
        }
        LabCommand::Stats(args) => match LabRecord::read(&args.name)?.host_bridge {
            Some(_) => hostbridge::stats(args),
            None => fabric::stats(args),
        },
        LabCommand::Exec(args) => {
            let status = rdma_hosts::exec(args)?;
            if status != 0 {
                std::process::exit(status);
            }
            Ok(())
        }
        LabCommand::Tree(args) => rdma_hosts::tree_command(args),
        LabCommand::Mode(args) => fabric::balance::mode(args),
        LabCommand::Te(args) => fabric::te::te(args).map(|_| ()),
        LabCommand::Link(args) => fabric::te::link(args),
        LabCommand::Soak(args) => soak::soak(args).map(|_| ()),
        LabCommand::Scorecard(args) => fabric::scorecard::scorecard(args).map(|_| ()),
    }
}

/// What `lab up` made; also what `lab down` removes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LabRecord {
    pub name: String,
    /// In creation order.
    pub namespaces: Vec<String>,
    pub files: Vec<PathBuf>,
    /// Directories made for the files; removed when empty.
    pub dirs: Vec<PathBuf>,
    pub config: Option<PathBuf>,
    pub pin_dir: PathBuf,
    /// FRR state directories (`--routing bgp`), removed with their contents
    /// once the namespaces (and so the daemons) are gone.
    #[serde(default)]
    pub frr_dirs: Vec<PathBuf>,
    /// A fabric lab (`lab up --racks`): its shape, for `lab traffic` and `lab stats`.
    #[serde(default)]
    pub fabric: Option<crate::tools::fabric::Fabric>,
    /// A fabric's dataplanes, one per switch.
    #[serde(default)]
    pub switches: Vec<fabric::SwitchRecord>,
    /// `--rdma-hosts`: the hosts' virtual machines.
    #[serde(default)]
    pub guests: Vec<crate::testbed::guest::Guest>,
    /// A fabric with rated links (`lab up --link-rate`): their settings and queues.
    #[serde(default)]
    pub rated: Option<fabric::links::RatedLinks>,
    /// A host bridge lab (`lab up --host-bridge`): its uplinks, for `lab stats`.
    #[serde(default)]
    pub host_bridge: Option<hostbridge::HostBridgeRecord>,
    /// A fabric's load-balancing mode when `lab mode` or `lab te` set one.
    #[serde(default)]
    pub balance: Option<fabric::balance::Balance>,
}

/// The names of the labs whose records are under /run/rocev2, sorted.
pub fn lab_names() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(RUN_DIR)
        .map(|dir| {
            dir.filter_map(|e| {
                let file = e.ok()?.file_name().into_string().ok()?;
                Some(file.strip_prefix("lab-")?.strip_suffix(".json")?.to_string())
            })
            .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The end of a "no lab named X" message: a close name, the labs there
/// are, or how to start one.
fn labs_hint(name: &str, labs: &[String]) -> String {
    let close = crate::sys::suggest::closest_match(name, labs.iter().map(String::as_str))
        // Two edits turn any short name into another: only one for those.
        .filter(|close| name.len() >= 5 || crate::sys::suggest::edit_distance(name, close) <= 1);
    if let Some(close) = close {
        return format!("; did you mean `--name {close}`?");
    }
    match labs {
        [] => format!("; no lab is up (`rocev2 lab up --name {name}` starts one)"),
        [only] => format!("; the lab that is up is {only:?} (`--name {only}`)"),
        _ => format!(
            "; the labs that are up: {} (pick one with `--name`)",
            labs.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(", ")
        ),
    }
}

pub fn record_path(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("lab-{name}.json"))
}

impl LabRecord {
    pub fn read(name: &str) -> Result<Self> {
        let path = record_path(name);
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                bail!("no lab named {name:?} ({} does not exist){}", path.display(), labs_hint(name, &lab_names()))
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        serde_json::from_slice(&text).with_context(|| format!("{} is not a rocev2 lab record", path.display()))
    }

    pub(crate) fn write(&self) -> Result<()> {
        fs::create_dir_all(RUN_DIR).with_context(|| format!("cannot create {RUN_DIR}"))?;
        let path = record_path(&self.name);
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(self)?).with_context(|| format!("cannot write {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }
}

impl NamespaceOwner for LabRecord {
    fn made(&mut self, name: &str) -> Result<()> {
        self.namespaces.push(name.to_owned());
        self.write()
    }
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

// ---------------------------------------------------------------------------
// The plan: everything `up` will make, computed without touching the system.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct LabPlan {
    pub name: String,
    pub family: LabFamily,
    pub namespaces: Vec<NsPlan>,
    pub links: Vec<VethPlan>,
    pub config_path: PathBuf,
    pub config_text: String,
    pub pin_dir: PathBuf,
    /// With `--routing bgp`: every switch's FRR config, the RTSW first.
    pub bgp: Vec<bgp::BgpSpeaker>,
    /// The single-rack lab or the host bridge lab.
    pub kind: LabKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabKind {
    /// Hosts behind a rack switch running rocev2 (routed), spines, a destination.
    Rack,
    /// Hosts behind a Linux bridge running rocev2 in bridge mode, rack
    /// switches with an anycast gateway, a destination.
    HostBridge,
}

pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        bail!("lab name {name:?} must be 1-{MAX_NAME} characters of a-z and 0-9");
    }
    Ok(())
}

pub fn rtsw_host_mac(i: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x10, 0x00, i as u8]
}
fn host_mac(i: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x20, 0x00, i as u8]
}
fn rtsw_uplink_mac(j: u32, k: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x11, j as u8, k as u8]
}
fn spine_uplink_mac(j: u32, k: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x12, j as u8, k as u8]
}
fn spine_dst_mac(j: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x13, 0x00, j as u8]
}
fn dst_spine_mac(j: u32) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x14, 0x00, j as u8]
}

impl LabPlan {
    pub fn new(args: &LabUpArgs) -> Result<Self> {
        if args.host_bridge {
            return hostbridge::plan(args);
        }
        let name = args.name.as_str();
        validate_name(name)?;
        let (hosts, spines, links) = (args.hosts, args.spines, args.links_per_spine);
        if !(1..=MAX_HOSTS).contains(&hosts) {
            bail!("--hosts must be 1..={MAX_HOSTS}, not {hosts}");
        }
        if !(1..=MAX_SPINES).contains(&spines) {
            bail!("--spines must be 1..={MAX_SPINES}, not {spines}");
        }
        if !(1..=MAX_LINKS_PER_SPINE).contains(&links) {
            bail!("--links-per-spine must be 1..={MAX_LINKS_PER_SPINE}, not {links}");
        }
        if spines * links > MAX_MEMBERS {
            bail!(
                "{spines} spines x {links} links = {} uplinks, more than a group's {MAX_MEMBERS} members",
                spines * links
            );
        }
        if hosts + spines * links > MAX_PORTS {
            bail!(
                "{hosts} hosts + {} uplinks = {} RTSW ports, more than the dataplane's {MAX_PORTS}",
                spines * links,
                hosts + spines * links
            );
        }
        let fam = args.family;
        let ns = |suffix: &str| format!("{name}-{suffix}");

        let rtsw = ns("rtsw");
        let dst = ns("dst");
        let mut namespaces = Vec::new();
        let mut veths = Vec::new();
        let mut ports = Vec::new();
        let mut groups = String::new();
        let mut routes = String::new();

        // Hosts.
        for i in 1..=hosts {
            let h = ns(&format!("h{i}"));
            let mut r = Vec::new();
            if fam.v4() {
                r.push(strs(&["route", "add", "default", "via", &format!("10.0.{i}.254"), "dev", "eth0"]));
            }
            if fam.v6() {
                r.push(strs(&["-6", "route", "add", "default", "via", &format!("fd00:{i}::fe"), "dev", "eth0"]));
            }
            namespaces.push(NsPlan { name: h.clone(), sysctls: base_sysctls(false), lo_addrs: vec![], routes: r });
            veths.push(VethPlan {
                a_ns: rtsw.clone(),
                a_if: format!("h{i}"),
                a_mac: rtsw_host_mac(i),
                a_addrs: fam.pick(vec![format!("10.0.{i}.254/24")], vec![format!("fd00:{i}::fe/64")]),
                b_ns: h,
                b_if: "eth0".into(),
                b_mac: host_mac(i),
                b_addrs: fam.pick(vec![format!("10.0.{i}.1/24")], vec![format!("fd00:{i}::1/64")]),
                gro_b: true,
            });
            ports.push(format!("h{i}"));
            let via = if fam.v4() { format!("10.0.{i}.1") } else { format!("fd00:{i}::1") };
            let _ =
                write!(groups, "\n[[group]]\nname = \"host{i}\"\nmembers = [{{ dev = \"h{i}\", via = \"{via}\" }}]\n");
            if fam.v4() {
                let _ = write!(routes, "\n[[route]]\nprefix = \"10.0.{i}.0/24\"\ngroup = \"host{i}\"\n");
            }
            if fam.v6() {
                let _ = write!(routes, "\n[[route]]\nprefix = \"fd00:{i}::/64\"\ngroup = \"host{i}\"\n");
            }
        }

        // The RTSW: no kernel forwarding, connected routes only.
        namespaces
            .insert(0, NsPlan { name: rtsw.clone(), sysctls: base_sysctls(false), lo_addrs: vec![], routes: vec![] });

        // Spines and their links.
        let mut spine_members = String::new();
        let mut bgp_links = Vec::new();
        let mut dst_hops_v4 = Vec::new();
        let mut dst_hops_v6 = Vec::new();
        for j in 1..=spines {
            let s = ns(&format!("s{j}"));
            let mut back_v4 = Vec::new();
            let mut back_v6 = Vec::new();
            for k in 1..=links {
                let n = j * 16 + k;
                let (rif, sif) = (format!("s{j}l{k}"), format!("r{k}"));
                veths.push(VethPlan {
                    a_ns: rtsw.clone(),
                    a_if: rif.clone(),
                    a_mac: rtsw_uplink_mac(j, k),
                    a_addrs: fam.pick(vec![format!("10.100.{n}.1/24")], vec![format!("fd64:{j}:{k}::1/64")]),
                    b_ns: s.clone(),
                    b_if: sif.clone(),
                    b_mac: spine_uplink_mac(j, k),
                    b_addrs: fam.pick(vec![format!("10.100.{n}.2/24")], vec![format!("fd64:{j}:{k}::2/64")]),
                    gro_b: true,
                });
                ports.push(rif.clone());
                let via = if fam.v4() { format!("10.100.{n}.2") } else { format!("fd64:{j}:{k}::2") };
                let _ = writeln!(spine_members, "  {{ dev = \"{rif}\", via = \"{via}\" }},");
                bgp_links.push(bgp::LinkAddrs {
                    spine: j,
                    rtsw: fam.pick(vec![format!("10.100.{n}.1")], vec![format!("fd64:{j}:{k}::1")]),
                    far: fam.pick(vec![format!("10.100.{n}.2")], vec![format!("fd64:{j}:{k}::2")]),
                });
                back_v4.push((format!("10.100.{n}.1"), sif.clone()));
                back_v6.push((format!("fd64:{j}:{k}::1"), sif));
            }
            veths.push(VethPlan {
                a_ns: s.clone(),
                a_if: "dst".into(),
                a_mac: spine_dst_mac(j),
                a_addrs: fam.pick(vec![format!("10.200.{j}.1/24")], vec![format!("fdc8:{j}::1/64")]),
                b_ns: dst.clone(),
                b_if: format!("s{j}"),
                b_mac: dst_spine_mac(j),
                b_addrs: fam.pick(vec![format!("10.200.{j}.2/24")], vec![format!("fdc8:{j}::2/64")]),
                gro_b: false,
            });
            dst_hops_v4.push((format!("10.200.{j}.1"), format!("s{j}")));
            dst_hops_v6.push((format!("fdc8:{j}::1"), format!("s{j}")));
            let mut r = Vec::new();
            if fam.v4() {
                r.push(route_args(false, "10.1.0.0/16", &[(format!("10.200.{j}.2"), "dst".into())]));
                r.push(route_args(false, "10.0.0.0/8", &back_v4));
            }
            if fam.v6() {
                r.push(route_args(true, "fd01::/64", &[(format!("fdc8:{j}::2"), "dst".into())]));
                r.push(route_args(true, "fd00::/8", &back_v6));
            }
            namespaces.push(NsPlan { name: s, sysctls: base_sysctls(true), lo_addrs: vec![], routes: r });
        }

        // The destination rack: addresses on lo, routes back over every spine.
        let mut r = Vec::new();
        if fam.v4() {
            r.push(route_args(false, "10.0.0.0/8", &dst_hops_v4));
        }
        if fam.v6() {
            r.push(route_args(true, "fd00::/8", &dst_hops_v6));
        }
        namespaces.push(NsPlan {
            name: dst,
            sysctls: base_sysctls(false),
            lo_addrs: fam.pick(vec![format!("{DEST_V4}/32")], vec![format!("{DEST_V6}/128")]),
            routes: r,
        });

        let pin_dir = crate::sys::paths::pin_dir_named(name);
        let config_path =
            args.config_out.clone().unwrap_or_else(|| Path::new(RUN_DIR).join(format!("lab-{name}")).join("rtsw.toml"));
        let mut text = format!(
            "# Written by `rocev2 lab up --name {name}` for namespace {rtsw}.\n\
             # Run it with: rocev2 --netns {rtsw} run --config {cfg}\n\
             [dataplane]\nhash = \"{hash}\"\nhash_seed = 0\nhash_version = {version}\nxdp_mode = \"native\"\npin_dir = \"{pin}\"\nneighbour_refresh_ms = 1000\n",
            cfg = config_path.display(),
            hash = args.hash,
            version = args.hash_version,
            pin = pin_dir.display(),
        );
        for p in &ports {
            let _ = write!(text, "\n[[port]]\nname = \"{p}\"\n");
        }
        let bgp = args.routing == LabRouting::Bgp;
        if bgp {
            // The spines' paths come from BGP; the hosts keep their config
            // routes (config routes and learned routes combine).
            text.push_str("\n# Routes to the destination come from BGP (FRR) through the kernel table.\n[routing]\nsource = \"kernel\"\n");
        } else {
            let _ = write!(text, "\n[[group]]\nname = \"spines\"\nmembers = [\n{spine_members}]\n");
        }
        text.push_str(&groups);
        if !bgp && fam.v4() {
            let _ = write!(text, "\n[[route]]\nprefix = \"{DEST_PREFIX_V4}\"\ngroup = \"spines\"\n");
        }
        if !bgp && fam.v6() {
            let _ = write!(text, "\n[[route]]\nprefix = \"{DEST_PREFIX_V6}\"\ngroup = \"spines\"\n");
        }
        text.push_str(&routes);
        let speakers = if bgp {
            bgp::speakers(&rtsw, |j| ns(&format!("s{j}")), &bgp_links, fam.v4(), fam.v6())
        } else {
            Vec::new()
        };

        Ok(Self {
            name: name.to_owned(),
            family: fam,
            namespaces,
            links: veths,
            config_path,
            config_text: text,
            pin_dir,
            bgp: speakers,
            kind: LabKind::Rack,
        })
    }

    /// The commands to try the lab, one per line.
    pub fn next_commands(&self) -> String {
        if self.kind == LabKind::HostBridge {
            return hostbridge::next_commands(self);
        }
        let name = &self.name;
        let (src, dst) = if self.family.v4() { ("10.0.1.1", DEST_V4) } else { ("fd00:1::1", DEST_V6) };
        let cfg = self.config_path.display();
        format!(
            "  rocev2 --netns {name}-rtsw run --config {cfg}\n\
             \x20 rocev2 --netns {name}-h1 gen --dev eth0 --dst-mac {mac} --src {src} --dst {dst} --qps 64\n\
             \x20 rocev2 stats --config {cfg}\n\
             \x20 rocev2 lab status --name {name}\n\
             \x20 rocev2 lab down --name {name}\n",
            mac = crate::sys::format_mac(&rtsw_host_mac(1)),
        )
    }
}

// ---------------------------------------------------------------------------
// up / down / status
// ---------------------------------------------------------------------------

/// Builds the lab described by `args`; returns the text to print. On
/// failure everything made so far is removed again.
pub fn up(args: &LabUpArgs) -> Result<String> {
    if let Some(racks) = args.racks {
        return fabric::up(args, racks);
    }
    let plan = LabPlan::new(args)?;
    let name = &plan.name;
    if record_path(name).exists() {
        bail!(
            "a lab named {name:?} already exists ({}); remove it first with `rocev2 lab down --name {name}`",
            record_path(name).display()
        );
    }
    if let Some(ns) = plan.namespaces.iter().find(|n| netns_exists(&n.name)) {
        bail!(
            "network namespace {:?} already exists but belongs to no lab record; pick another --name or remove it (`ip netns del {}`)",
            ns.name,
            ns.name
        );
    }
    if plan.config_path.exists() {
        bail!("{} already exists; remove it or choose another --config-out", plan.config_path.display());
    }
    let mut record = LabRecord { name: name.clone(), pin_dir: plan.pin_dir.clone(), ..Default::default() };
    record.write()?;
    let built = build(&plan, &mut record).and_then(|()| match plan.kind {
        LabKind::HostBridge => hostbridge::settle(&plan, &mut record).map(|()| None),
        LabKind::Rack => start_bgp(&plan, args, &mut record),
    });
    let bgp_line = match built {
        Ok(line) => line,
        Err(e) => {
            if let Err(cleanup) = remove(&record) {
                eprintln!("rocev2: warning: cleaning up the half-built lab: {cleanup:#}");
            }
            return Err(e.context(format!("building lab {name:?} failed; removed what was made")));
        }
    };

    let mut out = format!("Lab {name:?} is up ({} namespaces):\n", plan.namespaces.len());
    for ns in &plan.namespaces {
        let mut ifaces = Vec::new();
        for l in &plan.links {
            if l.a_ns == ns.name {
                ifaces.push(describe_end(&l.a_if, &l.a_mac, &l.a_addrs, &l.b_ns, &l.b_if));
            }
            if l.b_ns == ns.name {
                ifaces.push(describe_end(&l.b_if, &l.b_mac, &l.b_addrs, &l.a_ns, &l.a_if));
            }
        }
        if !ns.lo_addrs.is_empty() {
            ifaces.push(format!("lo {}", ns.lo_addrs.join(" ")));
        }
        let _ = writeln!(out, "  {}", ns.name);
        for i in ifaces {
            let _ = writeln!(out, "      {i}");
        }
    }
    match plan.kind {
        LabKind::Rack => {
            let _ = writeln!(out, "{}", rack_note(name, plan.family));
        }
        LabKind::HostBridge => out.push_str(&hostbridge::about(&plan)),
    }
    if let Some(line) = bgp_line {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out, "Dataplane config: {}", plan.config_path.display());
    let _ = writeln!(out, "Next:");
    out.push_str(&plan.next_commands());
    Ok(out)
}

/// What `lab up` says of a rack lab's RTSW: the destinations of the
/// families configured.
fn rack_note(name: &str, family: LabFamily) -> String {
    let destinations = family.pick(vec![DEST_V4], vec![DEST_V6]).join(" / ");
    format!(
        "The RTSW ({name}-rtsw) does not forward in the kernel: traffic from the hosts reaches {destinations} (in {name}-dst) only while rocev2 runs on it."
    )
}

/// One end of a link as `lab up` lists it: `name MAC [addresses] <-> peer`.
fn describe_end(ifname: &str, mac: &[u8; 6], addrs: &[String], peer_ns: &str, peer_if: &str) -> String {
    let mut words = vec![ifname.to_string(), crate::sys::format_mac(mac)];
    words.extend(addrs.iter().cloned());
    format!("{} <-> {peer_ns}/{peer_if}", words.join(" "))
}

fn build(plan: &LabPlan, record: &mut LabRecord) -> Result<()> {
    build_topology(&plan.namespaces, &plan.links, record)?;
    if let Some(dir) = plan.config_path.parent() {
        make_dir(dir, record)?;
    }
    write_file(&plan.config_path, &plan.config_text, record)?;
    record.config = Some(plan.config_path.clone());
    record.write()
}

/// `--routing bgp`: starts FRR on every switch and waits for the RTSW's
/// routes. The state directories go in the record first, so `lab down`
/// (or the cleanup of a failed `up`) removes them.
fn start_bgp(plan: &LabPlan, args: &LabUpArgs, record: &mut LabRecord) -> Result<Option<String>> {
    if plan.bgp.is_empty() {
        return Ok(None);
    }
    let run_dir = plan.config_path.parent().unwrap_or(Path::new(RUN_DIR)).to_path_buf();
    for s in &plan.bgp {
        record.frr_dirs.push(bgp::state_dir(&run_dir, &s.netns));
    }
    record.write()?;
    let paths = (args.spines * args.links_per_spine) as usize;
    bgp::start(&plan.bgp, &run_dir, paths, plan.family.v4(), plan.family.v6()).map(Some)
}

fn remove(record: &LabRecord) -> Result<String> {
    let mut log = String::new();
    let mut errors = Vec::new();
    rdma_hosts::remove_guests(record, &mut log, &mut errors);
    for ns in record.namespaces.iter().rev() {
        match remove_netns(ns, &mut log) {
            Ok(true) => {
                let _ = writeln!(log, "  removed namespace {ns}");
            }
            Ok(false) => {
                let _ = writeln!(log, "  namespace {ns} was already gone");
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    // A dataplane stopped by SIGTERM unpins its maps; one that was killed leaves them.
    for s in &record.switches {
        match fs::remove_dir_all(&s.pin_dir) {
            Ok(()) => {
                let _ = writeln!(log, "  removed {}/ (left pinned)", s.pin_dir.display());
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("cannot remove {}: {e}", s.pin_dir.display())),
        }
    }
    // And its state and lock files under /run/rocev2.
    let pin_dirs = record.switches.iter().map(|s| &s.pin_dir).chain(record.config.as_ref().map(|_| &record.pin_dir));
    for pin_dir in pin_dirs {
        match crate::control::state::remove_leftovers(pin_dir) {
            Ok(removed) => {
                for f in removed {
                    let _ = writeln!(log, "  removed {} (left by a stopped dataplane)", f.display());
                }
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    for d in &record.frr_dirs {
        match fs::remove_dir_all(d) {
            Ok(()) => {
                let _ = writeln!(log, "  removed {}/ (FRR state)", d.display());
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("cannot remove {}: {e}", d.display())),
        }
    }
    for f in &record.files {
        match fs::remove_file(f) {
            Ok(()) => {
                let _ = writeln!(log, "  removed {}", f.display());
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("cannot remove {}: {e}", f.display())),
        }
    }
    for d in record.dirs.iter().rev() {
        match fs::remove_dir(d) {
            Ok(()) => {
                let _ = writeln!(log, "  removed {}/", d.display());
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                let _ = writeln!(log, "  left {} in place: {e}", d.display());
            }
        }
    }
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    match fs::remove_file(record_path(&record.name)) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => bail!("cannot remove {}: {e}", record_path(&record.name).display()),
    }
    Ok(log)
}

/// `lab down` without --verbose: one line of counts from [`down`]'s
/// list, then any line that is not a plain removal (a namespace already
/// gone, a directory left in place).
pub fn summarize_down(log: &str) -> String {
    let mut lines = log.lines();
    let head = lines.next().unwrap_or_default().trim_end_matches(':').to_string();
    let (mut namespaces, mut processes, mut frr, mut pins, mut guests, mut files) = (0, 0, 0, 0, 0, 0);
    let mut other = String::new();
    for line in lines {
        if line.starts_with("  removed namespace ") {
            namespaces += 1;
        } else if let Some(rest) = line.strip_prefix("  stopping processes in ") {
            processes += rest.split_once(": [").map_or(0, |(_, pids)| pids.split(',').count());
        } else if line.ends_with(" (FRR state)") {
            frr += 1;
        } else if line.ends_with(" (left pinned)") {
            pins += 1;
        } else if line.contains(" guest ") && line.starts_with("  ") && !line.starts_with("  removed") {
            guests += 1;
        } else if line.starts_with("  removed ") {
            files += 1;
        } else {
            other.push_str(line);
            other.push('\n');
        }
    }
    let counted = |items: &[(usize, &str, &str)]| -> Vec<String> {
        items
            .iter()
            .filter(|(n, ..)| *n > 0)
            .map(|&(n, one, many)| format!("{n} {}", if n == 1 { one } else { many }))
            .collect()
    };
    let stopped = counted(&[(processes, "process", "processes"), (guests, "guest", "guests")]);
    let removed = counted(&[
        (namespaces, "namespace", "namespaces"),
        (pins, "pinned dataplane", "pinned dataplanes"),
        (frr, "FRR state directory", "FRR state directories"),
        (files, "file or directory", "files and directories"),
    ]);
    let mut what = Vec::new();
    if !stopped.is_empty() {
        what.push(format!("stopped {}", stopped.join(" and ")));
    }
    if !removed.is_empty() {
        what.push(format!("removed {}", removed.join(", ")));
    }
    let what = if what.is_empty() { "nothing was left to remove".to_string() } else { what.join("; ") };
    format!("{head}: {what} (`lab down --verbose` lists them)\n{other}")
}

/// Removes what `lab up --name NAME` made; returns the text to print.
pub fn down(name: &str) -> Result<String> {
    validate_name(name)?;
    let record = LabRecord::read(name)?;
    let log = remove(&record)?;
    Ok(format!("Lab {name:?} is down:\n{log}"))
}

/// The lab's namespaces, links and addresses, and where a dataplane is attached.
pub fn status(name: &str) -> Result<String> {
    validate_name(name)?;
    let record = LabRecord::read(name)?;
    if let Some(f) = &record.fabric {
        let mut out = fabric::status(&record, f)?;
        if !record.guests.is_empty() {
            out.push_str("RDMA hosts:\n");
            out.push_str(&rdma_hosts::guests_table(&record.guests));
        }
        return Ok(out);
    }
    let mut out = format!("Lab {name:?}");
    if let Some(c) = &record.config {
        let _ = write!(out, " (config {}, pin_dir {})", c.display(), record.pin_dir.display());
    }
    out.push('\n');
    for ns in &record.namespaces {
        if !netns_exists(ns) {
            let _ = writeln!(out, "{ns}: missing");
            continue;
        }
        let links = ip(&["-n", ns, "-o", "link", "show"]).unwrap_or_default();
        let xdp: Vec<String> = links
            .lines()
            .filter(|l| l.contains("xdp"))
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or("").to_owned())
            .collect();
        let attached = if xdp.is_empty() {
            "no dataplane".to_owned()
        } else {
            // Attached is not the same as managed: say who keeps it in step.
            let manager = match crate::control::state::RunState::read(&record.pin_dir).map(|s| s.manager()) {
                Ok(crate::control::state::Manager::Running(pid)) => format!(", managed by `rocev2 run` pid {pid}"),
                Ok(nobody) => format!("; WARNING: {}", nobody.warning(&record.pin_dir).unwrap_or_default()),
                Err(_) => String::new(),
            };
            format!("dataplane attached (XDP on {}){manager}", xdp.join(", "))
        };
        let _ = writeln!(out, "{ns}: {attached}");
        let addrs = ip(&["-n", ns, "-br", "addr", "show"]).unwrap_or_default();
        for line in addrs.lines().filter(|l| !l.trim().is_empty()) {
            let mut fields = line.split_whitespace();
            let (Some(ifname), Some(state)) = (fields.next(), fields.next()) else { continue };
            let addrs: Vec<&str> = fields.filter(|a| !a.starts_with("fe80:")).collect();
            let _ = writeln!(out, "    {ifname:<12} {state:<8} {}", addrs.join(" "));
        }
    }
    Ok(out)
}

/// Lab arguments with every default, for unit tests.
#[cfg(test)]
fn tests_args(name: &str) -> LabUpArgs {
    tests::args(name, 2, 2, 1, LabFamily::Both)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_down_sums_up_what_it_removed() {
        let log = "Lab \"lab\" is down:\n  stopping processes in lab-l1: [23401, 23406, 23625]\n  removed namespace lab-l1\n  namespace lab-h1 was already gone\n  removed /run/rocev2/lab-lab/frr-lab-l1/ (FRR state)\n  removed /run/rocev2/lab-lab/l1.toml\n  removed /run/rocev2/lab-lab/\n";
        assert_eq!(
            summarize_down(log),
            "Lab \"lab\" is down: stopped 3 processes; removed 1 namespace, 1 FRR state directory, 2 files and directories (`lab down --verbose` lists them)\n  namespace lab-h1 was already gone\n"
        );
    }

    #[test]
    fn a_missing_lab_names_the_labs_that_are_up() {
        let labs = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(labs_hint("tb", &labs(&["ri", "ta"])), "; did you mean `--name ta`?");
        assert_eq!(
            labs_hint("lab", &labs(&["ri", "ta"])),
            "; the labs that are up: \"ri\", \"ta\" (pick one with `--name`)"
        );
        assert_eq!(labs_hint("lab", &labs(&["rdma"])), "; the lab that is up is \"rdma\" (`--name rdma`)");
        assert_eq!(labs_hint("nosuch", &[]), "; no lab is up (`rocev2 lab up --name nosuch` starts one)");
    }
    use crate::control::config::{Config, NextHop};

    pub(super) fn args(name: &str, hosts: u32, spines: u32, links: u32, family: LabFamily) -> LabUpArgs {
        LabUpArgs {
            name: name.into(),
            hosts,
            spines,
            links_per_spine: links,
            family,
            hash: HashMode::Qp,
            hash_version: HashVersion::V1,
            config_out: Some(PathBuf::from("/tmp/x/rtsw.toml")),
            routing: LabRouting::Static,
            racks: None,
            seed: crate::tools::fabric::SeedPlan::Auto,
            zones: 1,
            aggs: None,
            unnumbered: false,
            rdma: Default::default(),
            links: Default::default(),
            host_bridge: false,
            telemetry: false,
            uplinks: 4,
        }
    }

    #[test]
    fn lab_names_are_checked() {
        for good in ["lab", "a1", "abcdefgh"] {
            validate_name(good).unwrap();
        }
        for bad in ["", "abcdefghi", "Lab", "a-b", "a b", "ä"] {
            let e = validate_name(bad).unwrap_err().to_string();
            assert!(e.contains("a-z and 0-9"), "{e}");
        }
        let e = LabPlan::new(&args("lab", 0, 2, 1, LabFamily::Both)).unwrap_err().to_string();
        assert!(e.contains("--hosts"), "{e}");
        let e = LabPlan::new(&args("lab", 40, 5, 5, LabFamily::Both)).unwrap_err().to_string();
        assert!(e.contains("ports"), "{e}");
    }

    #[test]
    fn lab_plan_config_parses_with_every_uplink_in_spines() {
        let plan = LabPlan::new(&args("lab", 2, 2, 2, LabFamily::Both)).unwrap();
        let names: Vec<&str> = plan.namespaces.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["lab-rtsw", "lab-h1", "lab-h2", "lab-s1", "lab-s2", "lab-dst"]);
        let config =
            Config::parse(&plan.config_text, &plan.config_path).unwrap_or_else(|e| panic!("{e}\n{}", plan.config_text));
        let ports: Vec<&str> = config.ports.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(ports, ["h1", "h2", "s1l1", "s1l2", "s2l1", "s2l2"]);
        let spines = &config.groups[0];
        assert_eq!(spines.name, "spines");
        assert_eq!(spines.members.len(), 4);
        assert_eq!(spines.members[1].dev, "s1l2");
        assert_eq!(spines.members[1].next_hop, NextHop::Via("10.100.18.2".parse().unwrap()));
        assert_eq!(config.groups[1].name, "host1");
        assert_eq!(config.groups[2].members[0].next_hop, NextHop::Via("10.0.2.1".parse().unwrap()));
        // 2 spine routes + 2 per host.
        assert_eq!(config.routes.len(), 6);
        assert_eq!(config.dataplane.pin_dir, PathBuf::from("/sys/fs/bpf/rocev2-lab"));
        assert_eq!(plan.links.len(), 2 + 4 + 2);
        let next = plan.next_commands();
        assert!(next.contains("rocev2 --netns lab-rtsw run --config /tmp/x/rtsw.toml"), "{next}");
        assert!(next.contains("--dst-mac 02:52:32:10:00:01 --src 10.0.1.1 --dst 10.1.0.1"), "{next}");
        assert!(next.contains("rocev2 lab down --name lab"), "{next}");
    }

    #[test]
    fn lab_single_family_plans_use_only_that_family() {
        let plan = LabPlan::new(&args("v6", 1, 1, 3, LabFamily::V6)).unwrap();
        assert!(!plan.config_text.contains("10."), "{}", plan.config_text);
        let config = Config::parse(&plan.config_text, &plan.config_path).unwrap();
        assert_eq!(config.groups[0].members[2].next_hop, NextHop::Via("fd64:1:3::2".parse().unwrap()));
        for l in &plan.links {
            assert!(l.a_addrs.iter().chain(&l.b_addrs).all(|a| a.contains(':')), "{l:?}");
        }
        let plan = LabPlan::new(&args("v4", 1, 1, 1, LabFamily::V4)).unwrap();
        assert!(!plan.config_text.contains("fd0"), "{}", plan.config_text);
        Config::parse(&plan.config_text, &plan.config_path).unwrap();
        assert!(plan.next_commands().contains("--dst 10.1.0.1"));
        assert!(rack_note("ta", LabFamily::V4).contains("reaches 10.1.0.1 (in ta-dst)"));
        assert!(rack_note("ta", LabFamily::V6).contains("reaches fd01::1 (in ta-dst)"));
        assert!(rack_note("ta", LabFamily::Both).contains("reaches 10.1.0.1 / fd01::1 (in ta-dst)"));
    }

    #[test]
    fn lab_multipath_routes() {
        let r = route_args(
            false,
            "10.0.0.0/8",
            &[("10.100.17.1".into(), "r1".into()), ("10.100.18.1".into(), "r2".into())],
        );
        assert_eq!(r.join(" "), "route add 10.0.0.0/8 nexthop via 10.100.17.1 dev r1 nexthop via 10.100.18.1 dev r2");
        let r = route_args(true, "fd01::/64", &[("fdc8:1::2".into(), "dst".into())]);
        assert_eq!(r.join(" "), "-6 route add fd01::/64 via fdc8:1::2 dev dst");
    }
}
