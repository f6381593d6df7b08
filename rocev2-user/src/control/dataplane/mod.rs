//! The loaded dataplane: the eBPF object, its maps, and the operations the
//! control program performs on them (install routes, publish groups,
//! register ports, read counters).
//!
//! Map writes are ordered so a packet in flight never sees a half-written
//! group: members go to the idle bank first, then one group-entry update
//! switches banks.

mod kernel_maps;

use std::{
    collections::BTreeMap,
    mem::size_of,
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{CpuMap, MapData},
    programs::{
        links::{FdLink, PinnedLink},
        tc,
        tc::SchedClassifierLinkId,
        xdp::XdpLink,
        RawTracePoint, SchedClassifier, TcAttachType, Xdp, XdpMode,
    },
    Ebpf, EbpfLoader,
};
use rocev2_common::{
    features::{Features, FEATURES_GLOBAL},
    maps::{self, names, ROUTE_LOCAL},
    telemetry,
};

use crate::{control::config::Prefix, control::errors::DataplaneError, sys::paths::LINK_PIN_PREFIX};

pub use self::kernel_maps::*;

/// Name of the forwarding program in the object.
pub const XDP_PROGRAM: &str = "rocev2_xdp";
/// The spreading stage on ports with `cpu_spread = "qp"`.
pub const XDP_SPREAD_PROGRAM: &str = "rocev2_xdp_spread";
/// The pipeline as each CPUS entry runs it.
pub const XDP_CPU_PROGRAM: &str = "rocev2_xdp_cpu";
/// Frames each CPUS entry queues (the size xdp-tools' cpumap redirect uses).
const CPU_QUEUE_FRAMES: u32 = 2048;
/// The program on every port of the Linux bridge in host bridge mode.
pub const XDP_BRIDGE_PROGRAM: &str = "rocev2_bridge";
/// tc ingress forwarding (`attach = "tc"`).
pub const TC_INGRESS_PROGRAM: &str = "rocev2_tc_ingress";
/// tc egress classes + ECN for locally originated traffic.
pub const TC_EGRESS_PROGRAM: &str = "rocev2_tc_egress";
/// The refused-redirect counters (refused.rs): program and tracepoint.
const REFUSAL_PROGRAMS: [(&str, &str); 2] =
    [("rocev2_devmap_xmit", "xdp_devmap_xmit"), ("rocev2_redirect_err", "xdp_redirect_err")];

/// An XDP attachment held as a bpf link pinned in the pin directory, so
/// it outlives this process on a handover and the next `rocev2 run` can
/// swap its program in atomically.
struct PinnedXdp {
    path: PathBuf,
    link: FdLink,
}

/// The eBPF object loaded into the kernel, with its maps taken out.
pub struct Dataplane {
    ebpf: Ebpf,
    pub maps: Maps,
    /// What ROUTES_V4/V6 hold now, so a sync writes only the differences.
    installed_routes: BTreeMap<Prefix, u32>,
    /// The routes of the last sync that are not learned (config routes and
    /// the box's own addresses): what [`Dataplane::sync_static_routes`]
    /// diffs against, without walking the learned ones.
    static_routes: BTreeMap<Prefix, u32>,
    pin_dir: Option<PathBuf>,
    /// XDP attachments by interface name.
    xdp_links: BTreeMap<String, PinnedXdp>,
    /// tc attachments by (interface, ingress?) for detaching on reload.
    tc_links: BTreeMap<(String, bool), SchedClassifierLinkId>,
    /// Set by [`Dataplane::hand_over`]: leave programs and pins in place.
    handed_over: bool,
    /// Fixed at load time (the FEATURES constant).
    features: Features,
    /// What `attach` puts on a port: the pipeline, or the spreading stage.
    ingress_program: &'static str,
    /// Whether frames an egress device refuses after a redirect are
    /// counted (`Err`: why not).
    refusals: Result<(), String>,
}

/// Whether `pin_dir` holds XDP link pins: a previous `rocev2 run` handed
/// over (or crashed) and its programs still forward.
pub fn has_pinned_links(pin_dir: &Path) -> bool {
    std::fs::read_dir(pin_dir)
        .map(|entries| {
            entries.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().starts_with(LINK_PIN_PREFIX))
        })
        .unwrap_or(false)
}

/// File name of an XDP link pin for `ifname`.
pub fn link_pin_name(ifname: &str) -> String {
    format!("{LINK_PIN_PREFIX}{ifname}")
}

impl Dataplane {
    /// Loads the object and the XDP programs (not attached yet). With a
    /// `pin_dir`, every map is pinned there (bpffs is mounted when needed,
    /// stale pins of a crashed run are replaced) so `rocev2 stats` can read
    /// them.
    pub fn load(pin_dir: Option<&Path>) -> Result<Self> {
        Self::load_with(pin_dir, maps::DEFAULT_FLOWLET_TABLE_SIZE)
    }

    /// Like [`Dataplane::load`] with the flowlet table sized to `flowlet_table_size` flows.
    pub fn load_with(pin_dir: Option<&Path>, flowlet_table_size: u32) -> Result<Self> {
        Self::load_with_features(pin_dir, flowlet_table_size, Features::ALL)
    }

    /// Like [`Dataplane::load_with`] with only `features` in the programs:
    /// the verifier removes the code of the others (see
    /// rocev2_common::features). A group, queue or class that needs a
    /// missing feature is not served until the programs are loaded again.
    /// With the telemetry feature, the QP table holds the default number
    /// of QPs.
    pub fn load_with_features(pin_dir: Option<&Path>, flowlet_table_size: u32, features: Features) -> Result<Self> {
        Self::load_with_telemetry(
            pin_dir,
            flowlet_table_size,
            rocev2_common::maps::DEFAULT_FLOWLET_SLOTS,
            features,
            telemetry::DEFAULT_QP_TABLE_SIZE,
        )
    }

    /// Like [`Dataplane::load_with_features`] with a QP telemetry table of
    /// `telemetry_qps` entries (used only with the telemetry feature; its
    /// maps hold one entry without it) and a keyless flowlet slot array of
    /// `flowlet_slots` slots.
    pub fn load_with_telemetry(
        pin_dir: Option<&Path>,
        flowlet_table_size: u32,
        flowlet_slots: u32,
        features: Features,
        telemetry_qps: u32,
    ) -> Result<Self> {
        if crate::EBPF_OBJECT.is_empty() {
            bail!("this rocev2 binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; rebuild without it (cargo xtask build)");
        }
        crate::sys::privileges::check()?;
        let telemetry_on = features.contains(Features::TELEMETRY);
        let qp_table = if telemetry_on { telemetry_qps.max(1) } else { 1 };
        let qp_slots = telemetry::qp_table_slots(if telemetry_on { telemetry_qps } else { 0 });
        let qp_sets_mask = qp_slots / telemetry::QP_WAYS - 1;
        let kernel_layout = RefusalLayout::find();
        let layout = kernel_layout.as_ref().copied().unwrap_or_default();
        // A takeover keeps the previous run's flowlet state (see Inherited);
        // everything else in the pin directory is the old run's and goes.
        let inherited = match pin_dir {
            Some(dir) if has_pinned_links(dir) => Inherited::read(dir, flowlet_table_size, flowlet_slots, features),
            _ => Inherited::default(),
        };
        if let Some(dir) = pin_dir {
            crate::sys::bpffs::prepare_pin_dir(dir, &inherited.reused)?;
        }
        let mut loader = EbpfLoader::new();
        if let Some(dir) = pin_dir {
            // Pinned as they are created (or reused): the next takeover keeps them.
            for map in kept_by_takeover() {
                loader.map_pin_path(map.name, dir.join(map.name));
            }
        }
        let mut ebpf = loader
            .override_global("NETDEV_IFINDEX_OFFSET", &layout.ifindex, true)
            .override_global("NETDEV_NET_OFFSET", &layout.net, true)
            .override_global("NET_COOKIE_OFFSET", &layout.cookie, true)
            .override_global("NETNS_COOKIE", &layout.netns_cookie, true)
            .map_max_entries(names::FLOWLETS, flowlet_table_size.max(1))
            .map_max_entries(names::FLOWLET_SLOTS, flowlet_slots.max(1))
            .map_max_entries(telemetry::names::QP_TELEMETRY, qp_slots)
            .override_global("QP_SETS_MASK", &qp_sets_mask, true)
            .map_max_entries(telemetry::names::QP_REPLIES, qp_table)
            .override_global(FEATURES_GLOBAL, &features.0, true)
            .load(crate::EBPF_OBJECT)
            .context("cannot load the eBPF object")?;
        // No program is verified yet (verifying costs CPU): each is loaded
        // into the kernel when first needed (`xdp_program`, `tc_program`),
        // or ahead of time with `preload`.
        let mut maps = Maps::take(&mut ebpf, pin_dir)?;
        maps.inherit_groups(inherited.groups);
        for line in &inherited.notes {
            tracing::info!("{line}");
        }
        if let (Some(dir), true) = (pin_dir, telemetry_on) {
            crate::control::qp_telemetry::pin_maps(&mut ebpf, dir)?;
        }
        let refusals = match kernel_layout {
            Ok(_) => attach_refusal_counters(&mut ebpf),
            Err(e) => Err(format!("{e:#}")),
        };
        Ok(Self {
            ebpf,
            maps,
            installed_routes: BTreeMap::new(),
            static_routes: BTreeMap::new(),
            pin_dir: pin_dir.map(Path::to_path_buf),
            xdp_links: BTreeMap::new(),
            tc_links: BTreeMap::new(),
            handed_over: false,
            features,
            ingress_program: XDP_PROGRAM,
            refusals,
        })
    }

    /// Whether refused redirects are counted; the reason when not.
    pub fn refusal_counting(&self) -> Result<(), &str> {
        self.refusals.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// The features the loaded programs carry.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Turns on the spreading stage (`cpu_spread = "qp"`): every online
    /// CPU gets a CPUS entry running the pipeline (XDP_CPU_PROGRAM), and
    /// ports attached from now on get XDP_SPREAD_PROGRAM, which hands each
    /// flow to one of them. Returns the CPUs in use.
    pub fn enable_cpu_spread(&mut self) -> Result<Vec<u32>> {
        self.preload(&[XDP_CPU_PROGRAM, XDP_SPREAD_PROGRAM])?;
        let cpu_program =
            self.xdp_program(XDP_CPU_PROGRAM)?.fd()?.try_clone().context("cannot duplicate a program fd")?;
        let online = aya::util::online_cpus().map_err(|(path, e)| anyhow::anyhow!("cannot read {path}: {e}"))?;
        let map = self.ebpf.map_mut(names::CPUS).context("eBPF object has no map CPUS")?;
        let mut cpus: CpuMap<&mut MapData> = CpuMap::try_from(map).context("CPUS is not a CPU map")?;
        let mut used = Vec::new();
        for cpu in online {
            if cpu >= maps::MAX_SPREAD_CPUS {
                break;
            }
            cpus.set(cpu, CPU_QUEUE_FRAMES, Some(&cpu_program), 0)
                .with_context(|| format!("cannot add CPU {cpu} to CPUS"))?;
            used.push(cpu);
        }
        // Keys are CPU numbers: the stage hashes over 0..=highest, and a
        // flow hashed to an offline CPU is forwarded where it arrived.
        let span = used.iter().max().map_or(0, |m| m + 1);
        self.maps.set_spread_cpus(span)?;
        self.ingress_program = XDP_SPREAD_PROGRAM;
        Ok(used)
    }

    /// An XDP program of the object, loaded into the kernel (verified) on
    /// first use.
    pub fn xdp_program(&mut self, name: &str) -> Result<&mut Xdp> {
        let program: &mut Xdp = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not an XDP program"))?;
        if program.fd().is_err() {
            crate::sys::verifier::load(name, || program.load())?;
        }
        Ok(program)
    }

    /// Loads (verifies) these XDP programs now rather than when first used:
    /// a takeover does it at low priority before anything is attached.
    pub fn preload(&mut self, names: &[&str]) -> Result<()> {
        names.iter().try_for_each(|name| self.xdp_program(name).map(|_| ()))
    }

    /// Attaches the forwarding program to an ingress port. With a pin
    /// directory the attachment is a pinned bpf link; if an earlier `rocev2
    /// run` handed over (or crashed), its link is still there and this
    /// program replaces the old one in it atomically: no packet is lost.
    /// Returns true when it took over an existing attachment.
    pub fn attach(&mut self, ifname: &str, ifindex: u32, mode: XdpMode) -> Result<bool> {
        self.attach_program(self.ingress_program, ifname, ifindex, mode)
    }

    /// Attaches the bridge program to a port of the Linux bridge (host
    /// bridge mode), loading it into the kernel on first use; like
    /// [`Dataplane::attach`] otherwise (a pinned link, taken over if one
    /// is there).
    pub fn attach_bridge_port(&mut self, ifname: &str, ifindex: u32, mode: XdpMode) -> Result<bool> {
        self.attach_program(XDP_BRIDGE_PROGRAM, ifname, ifindex, mode)
    }

    /// The bridge program (loaded on first use: a box without a `[bridge]`
    /// never spends the time).
    pub fn bridge_program(&mut self) -> Result<&mut Xdp> {
        self.xdp_program(XDP_BRIDGE_PROGRAM)
    }

    fn attach_program(&mut self, name: &str, ifname: &str, ifindex: u32, mode: XdpMode) -> Result<bool> {
        let pin_path = self.pin_dir.as_ref().map(|d| d.join(link_pin_name(ifname)));
        if let Some(path) = pin_path.as_ref().filter(|p| p.exists()) {
            let pinned = PinnedLink::from_pin(path)
                .with_context(|| format!("cannot open the pinned XDP link {}", path.display()))?;
            let old = XdpLink::try_from(FdLink::from(pinned))
                .with_context(|| format!("{} is not an XDP link", path.display()))?;
            let program = self.xdp_program(name)?;
            let id =
                program.attach_to_link(old).with_context(|| format!("cannot replace the XDP program on {ifname}"))?;
            let link = FdLink::try_from(program.take_link(id)?).context("XDP link is not a bpf link")?;
            self.xdp_links.insert(ifname.to_string(), PinnedXdp { path: path.clone(), link });
            return Ok(true);
        }
        let program = self.xdp_program(name)?;
        let id = program.attach_to_if_index(ifindex, mode).map_err(|e| attach_error(ifname, ifindex, mode, e))?;
        if let Some(path) = pin_path {
            let link = FdLink::try_from(program.take_link(id)?)
                .context("the kernel attached XDP without a bpf link (needs Linux 5.9+ for handover)")?;
            let pinned = link.pin(&path).with_context(|| format!("cannot pin the XDP link at {}", path.display()))?;
            self.xdp_links.insert(ifname.to_string(), PinnedXdp { path, link: FdLink::from(pinned) });
        }
        Ok(false)
    }

    /// Detaches the forwarding program from a port (a reload removed it).
    pub fn detach(&mut self, ifname: &str) {
        if let Some(att) = self.xdp_links.remove(ifname) {
            let _ = std::fs::remove_file(&att.path);
            drop(att.link);
        }
        for ingress in [true, false] {
            if let Some(id) = self.tc_links.remove(&(ifname.to_string(), ingress)) {
                let name = if ingress { TC_INGRESS_PROGRAM } else { TC_EGRESS_PROGRAM };
                if let Ok(program) = self.tc_program(name) {
                    let _ = program.detach(id);
                }
            }
        }
    }

    /// Detaches only the tc egress program of `ifname` (its local-traffic
    /// marking), leaving its XDP or tc ingress forwarding attached.
    pub fn detach_tc_egress(&mut self, ifname: &str) {
        if let Some(id) = self.tc_links.remove(&(ifname.to_string(), false)) {
            if let Ok(program) = self.tc_program(TC_EGRESS_PROGRAM) {
                let _ = program.detach(id);
            }
        }
    }

    /// Removes XDP link pins of interfaces not in `keep` (a takeover found
    /// a port the new config no longer has): detaches those programs.
    pub fn drop_stale_links(&mut self, keep: &[String]) -> Result<Vec<String>> {
        let Some(dir) = self.pin_dir.clone() else { return Ok(Vec::new()) };
        let mut dropped = Vec::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if let Some(ifname) = name.strip_prefix(LINK_PIN_PREFIX) {
                if !keep.iter().any(|k| k == ifname) && !self.xdp_links.contains_key(ifname) {
                    std::fs::remove_file(dir.join(&name)).ok();
                    dropped.push(ifname.to_string());
                }
            }
        }
        Ok(dropped)
    }

    /// A tc program, loaded into the kernel on first use.
    fn tc_program(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not a tc classifier"))?;
        if program.fd().is_err() {
            crate::sys::verifier::load(name, || program.load())?;
        }
        Ok(program)
    }

    /// Leaves the programs attached and the maps pinned when this value is
    /// dropped, for the next `rocev2 run` to take over.
    pub fn hand_over(&mut self) {
        self.handed_over = true;
    }

    /// Installs the route set `wanted` (prefix -> group index or ROUTE_LOCAL),
    /// then removes routes that are no longer wanted: adding first means a
    /// prefix that moves to another group is never briefly unrouted.
    pub fn sync_routes(&mut self, wanted: &BTreeMap<Prefix, u32>) -> Result<(), DataplaneError> {
        // Only new or retargeted routes are written: `run` syncs on every
        // refresh tick, and rewriting 100,000 unchanged routes each time
        // would cost a fifth of a second of CPU per tick.
        // The generation is bumped after the additions and again after the
        // removals (even when one fails part-way), so the per-CPU route
        // caches never serve a result the tables no longer give.
        let additions: Vec<(Prefix, u32)> =
            wanted.iter().filter(|(p, t)| self.installed_routes.get(p) != Some(t)).map(|(p, t)| (*p, *t)).collect();
        let added: Result<(), DataplaneError> =
            additions.iter().try_for_each(|(prefix, target)| self.install_route(prefix, *target));
        if !additions.is_empty() {
            self.maps.bump_route_generation()?;
        }
        added?;
        let stale: Vec<Prefix> = self.installed_routes.keys().filter(|p| !wanted.contains_key(p)).copied().collect();
        let removed: Result<(), DataplaneError> = stale.iter().try_for_each(|prefix| {
            self.maps.remove_route(prefix)?;
            self.installed_routes.remove(prefix);
            Ok(())
        });
        if !stale.is_empty() {
            self.maps.bump_route_generation()?;
        }
        removed
    }

    /// Writes one route. A full table is reported as
    /// [`DataplaneError::RouteTableFull`], with the numbers (the kernel
    /// says only "no space").
    fn install_route(&mut self, prefix: &Prefix, target: u32) -> Result<(), DataplaneError> {
        if let Err(e) = self.maps.set_route(prefix, target) {
            if !e.is_no_space() {
                return Err(e);
            }
            let (v4, v6) = self.route_counts();
            let (family, installed, capacity) = match prefix {
                Prefix::V4 { .. } => ("IPv4", v4, rocev2_common::maps::MAX_ROUTES_V4),
                Prefix::V6 { .. } => ("IPv6", v6, rocev2_common::maps::MAX_ROUTES_V6),
            };
            let prefix = prefix.to_string();
            return Err(DataplaneError::RouteTableFull { family, installed, capacity, prefix });
        }
        self.installed_routes.insert(*prefix, target);
        Ok(())
    }

    /// [`Dataplane::sync_routes`] of every route, `statics` among them
    /// (remembered for [`Dataplane::sync_static_routes`]).
    pub fn sync_all_routes(
        &mut self,
        wanted: &BTreeMap<Prefix, u32>,
        statics: &BTreeMap<Prefix, u32>,
    ) -> Result<(), DataplaneError> {
        self.static_routes = statics.clone();
        self.sync_routes(wanted)
    }

    /// Installs `statics` (config routes and the box's own addresses,
    /// which win over learned routes for the same prefix) against the last
    /// ones synced: new or retargeted ones are written; a prefix no longer
    /// among them goes back to its learned route (`learned`) or is
    /// removed. Learned routes are left as the incremental updates wrote
    /// them, so a periodic sync costs the statics only, not a walk over
    /// 100,000 learned prefixes.
    pub fn sync_static_routes(
        &mut self,
        statics: &BTreeMap<Prefix, u32>,
        learned: impl Fn(&Prefix) -> Option<u32>,
    ) -> Result<(), DataplaneError> {
        let mut changes: Vec<(Prefix, Option<u32>)> = statics
            .iter()
            .filter(|(p, t)| self.installed_routes.get(p) != Some(t))
            .map(|(p, t)| (*p, Some(*t)))
            .collect();
        changes.extend(self.static_routes.keys().filter(|p| !statics.contains_key(p)).map(|p| (*p, learned(p))));
        self.static_routes = statics.clone();
        self.update_routes(&changes)
    }

    /// The routes of the last sync that are not learned.
    pub fn static_routes(&self) -> &BTreeMap<Prefix, u32> {
        &self.static_routes
    }

    /// Routes installed now: (IPv4, IPv6).
    pub fn route_counts(&self) -> (usize, usize) {
        let v4 = self.installed_routes.keys().filter(|p| matches!(p, Prefix::V4 { .. })).count();
        (v4, self.installed_routes.len() - v4)
    }

    /// Applies route changes (`None` = remove), then bumps the route
    /// generation once: the incremental path for learned routes, where a
    /// full [`Dataplane::sync_routes`] over 100,000 prefixes per change
    /// would cost milliseconds.
    pub fn update_routes(&mut self, changes: &[(Prefix, Option<u32>)]) -> Result<(), DataplaneError> {
        if changes.is_empty() {
            return Ok(());
        }
        let applied: Result<(), DataplaneError> = changes.iter().try_for_each(|(prefix, target)| {
            match target {
                Some(t) if self.installed_routes.get(prefix) != Some(t) => self.install_route(prefix, *t)?,
                Some(_) => {}
                None => {
                    if self.installed_routes.remove(prefix).is_some() {
                        self.maps.remove_route(prefix)?;
                    }
                }
            }
            Ok(())
        });
        self.maps.bump_route_generation()?;
        applied
    }

    /// Attaches a tc program (clsact) to `ifname`: the forwarding program on
    /// ingress (`attach = "tc"`), or the local-traffic marker on egress.
    pub fn attach_tc(&mut self, ifname: &str, attach_type: TcAttachType) -> Result<()> {
        // aya attaches with TCX links where the kernel has them (6.6+) and
        // needs a clsact qdisc only on older kernels; it may exist already,
        // and a real problem shows up in attach() below.
        let _ = tc::qdisc_add_clsact(ifname);
        let ingress = matches!(attach_type, TcAttachType::Ingress);
        let name = if ingress { TC_INGRESS_PROGRAM } else { TC_EGRESS_PROGRAM };
        let program = self.tc_program(name)?;
        let id = program
            .attach(ifname, attach_type)
            .with_context(|| format!("cannot attach {name} to {ifname} (tc {attach_type:?})"))?;
        self.tc_links.insert((ifname.to_string(), ingress), id);
        Ok(())
    }

    /// Detaches the XDP links and removes every pin (the maps go away
    /// with the last reference).
    pub fn unpin(&mut self) {
        for (_, att) in std::mem::take(&mut self.xdp_links) {
            let _ = std::fs::remove_file(&att.path);
        }
        if let Some(dir) = self.pin_dir.take() {
            for map in maps::MAPS.iter().filter(|m| m.pin != maps::Pin::Never) {
                let _ = std::fs::remove_file(dir.join(map.name));
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        if !self.handed_over {
            self.unpin();
        }
        // On a handover the link pins keep the programs attached and the
        // programs keep their maps; dropping our fds changes nothing.
    }
}

/// Why an XDP program could not be attached to a port, with what to do:
/// the port already carries one (another `rocev2 run`'s: which, by pid and
/// pin directory), or the driver lacks native XDP.
fn attach_error(ifname: &str, ifindex: u32, mode: XdpMode, error: aya::programs::ProgramError) -> anyhow::Error {
    let error = anyhow::Error::new(error);
    let errno = error.chain().find_map(|e| e.downcast_ref::<std::io::Error>()).and_then(|io| io.raw_os_error());
    let hint = match errno {
        Some(libc::EBUSY | libc::EEXIST) => match port_owner(ifname, ifindex) {
            Some(owner) => {
                let gone = match owner.manager() {
                    crate::control::state::Manager::Running(_) => String::new(),
                    _ => format!(
                        "; that run is gone, and `rocev2 detach --pin-dir {}` removes what it left",
                        owner.pin_dir.display()
                    ),
                };
                format!(
                    "; {ifname} already carries the dataplane of another `rocev2 run` (pid {}, pin_dir {}, config {}){gone}. A port belongs to one dataplane: stop that run, or remove {ifname} from one of the two configs",
                    owner.pid,
                    owner.pin_dir.display(),
                    owner.config.display()
                )
            }
            None => format!(
                "; {ifname} already has an XDP program attached (`ip link show {ifname}` shows its id; `bpftool net` names it): remove it first"
            ),
        },
        Some(libc::EOPNOTSUPP) if mode == XdpMode::Driver => {
            "; the driver lacks native XDP: set xdp_mode = \"skb\" in [dataplane] to use generic XDP".to_string()
        }
        _ => String::new(),
    };
    anyhow::anyhow!("cannot attach XDP ({}) to {ifname}: {error:#}{hint}", mode_name(mode))
}

/// The `rocev2 run` (live or not) whose state lists port `ifindex` in
/// this network namespace.
fn port_owner(ifname: &str, ifindex: u32) -> Option<crate::control::state::RunState> {
    let here = crate::sys::netns::current_cookie().unwrap_or(0);
    crate::control::state::instances().into_iter().find(|s| {
        s.pid != std::process::id()
            && s.netns_cookie == here
            && s.ports.iter().any(|p| p.ifindex == ifindex && p.name == ifname)
    })
}

/// The maps a takeover keeps (the table's `Takeover::Kept`: the flowlet
/// tables), pinned by the loader itself (map_pin_path) so that a
/// takeover's programs can use the very maps the previous run's use;
/// [`Inherited::read`] checks each one's size.
fn kept_by_takeover() -> impl Iterator<Item = &'static maps::MapSpec> {
    maps::MAPS.iter().filter(|m| m.takeover == maps::Takeover::Kept)
}

/// What a takeover keeps of the previous run: its flowlet tables (the
/// maps themselves, when the new config sizes them the same) and each
/// group's generation and live members, so a group published again with
/// the same members keeps its generation and every running flowlet keeps
/// its member. Without them every flowlet would start over at once, and
/// with `rehash` most would move.
#[derive(Default)]
struct Inherited {
    /// Pins in the directory to reuse (not removed).
    reused: Vec<&'static str>,
    groups: InheritedGroups,
    /// What was kept or not, for the log.
    notes: Vec<String>,
}

impl Inherited {
    /// `features` are the new run's: a table it does not use (kept, at its
    /// one-entry placeholder size) is not worth a line in the log.
    fn read(dir: &Path, flowlet_table_size: u32, flowlet_slots: u32, features: Features) -> Self {
        let mut out = Self::default();
        let expected = [
            (
                names::FLOWLETS,
                "flowlet table",
                size_of::<rocev2_common::maps::FlowletKey>(),
                size_of::<rocev2_common::flowlet::FlowletEntry>(),
                flowlet_table_size.max(1),
                Features::FLOWLET_KEYED,
            ),
            (
                names::FLOWLET_SLOTS,
                "keyless flowlet slots",
                size_of::<u32>(),
                size_of::<rocev2_common::flowlet::FlowletSlot>(),
                flowlet_slots.max(1),
                Features::FLOWLET_KEYLESS,
            ),
        ];
        debug_assert!(
            kept_by_takeover().all(|m| expected.iter().any(|e| e.0 == m.name)),
            "a kept map whose size is not checked"
        );
        for (name, what, key_size, value_size, entries, feature) in expected {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let used = features.contains(feature);
            let info = MapData::from_pin(&path).map_err(anyhow::Error::from).and_then(|m| Ok(m.info()?));
            match info {
                Ok(i) if (i.key_size(), i.value_size(), i.max_entries()) == (key_size as u32, value_size as u32, entries) => {
                    out.reused.push(name);
                    if used {
                        out.notes.push(format!("took over the previous run's {what} ({entries} entries): running flowlets keep their members"));
                    }
                }
                Ok(_) if !used => {}
                Ok(i) => out.notes.push(format!(
                    "the previous run's {what} held {} entries of {} bytes, this config wants {entries} of {value_size}: it starts empty and running flowlets start over",
                    i.max_entries(),
                    i.value_size()
                )),
                Err(e) => out.notes.push(format!("cannot open the previous run's {what}: {e:#}; it starts empty")),
            }
        }
        match Maps::read_groups(dir) {
            Ok(groups) => out.groups = groups,
            Err(e) => out.notes.push(format!(
                "cannot read the previous run's groups ({e:#}): every group starts a new generation, and running flowlets start over"
            )),
        }
        out
    }
}

/// Where the refused-redirect counters find a net_device's ifindex and
/// namespace cookie in this kernel, and our namespace's cookie.
#[derive(Clone, Copy, Debug, Default)]
struct RefusalLayout {
    ifindex: u32,
    /// Of `nd_net.net`, the pointer to the device's namespace.
    net: u32,
    /// Of `net_cookie` in struct net.
    cookie: u32,
    netns_cookie: u64,
}

impl RefusalLayout {
    fn find() -> Result<Self> {
        let btf = crate::sys::btf::Btf::kernel()?;
        if !btf.field_is_pointer("net_device", "nd_net.net") {
            bail!("net_device.nd_net.net is not a pointer in this kernel's BTF");
        }
        Ok(Self {
            ifindex: btf.offset_of("net_device", "ifindex")?,
            net: btf.offset_of("net_device", "nd_net.net")?,
            cookie: btf.offset_of("net", "net_cookie")?,
            netns_cookie: crate::sys::netns::current_cookie().context("cannot read this namespace's cookie")?,
        })
    }
}

/// Loads and attaches the tracepoint programs that count refused redirects.
fn attach_refusal_counters(ebpf: &mut Ebpf) -> Result<(), String> {
    let mut attach = |name: &str, tracepoint: &str| -> Result<()> {
        let program: &mut RawTracePoint = ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not a raw tracepoint program"))?;
        program.load().with_context(|| format!("the kernel rejected program {name}"))?;
        program.attach(tracepoint).with_context(|| format!("cannot attach {name} to tracepoint xdp:{tracepoint}"))?;
        Ok(())
    };
    for (name, tracepoint) in REFUSAL_PROGRAMS {
        attach(name, tracepoint).map_err(|e| format!("{e:#}"))?;
    }
    Ok(())
}

pub fn mode_name(mode: XdpMode) -> &'static str {
    match mode {
        XdpMode::Driver => "native",
        XdpMode::Skb => "skb",
        XdpMode::Hardware => "offload",
        XdpMode::Default => "default",
    }
}

/// Host routes that send traffic for the box's own addresses to the kernel.
pub fn local_routes(addrs: &[IpAddr]) -> impl Iterator<Item = (Prefix, u32)> + '_ {
    addrs.iter().map(|a| (Prefix::host(*a), ROUTE_LOCAL))
}
