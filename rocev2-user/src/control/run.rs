//! `rocev2 run`: bring the dataplane up from a config, keep it in step with
//! the kernel (link state, neighbour MACs, local addresses), apply new
//! configs live, and take it down cleanly or hand it over.
//!
//! Signals: SIGINT/SIGTERM stop (detach, print final counters); SIGHUP
//! reloads the config file; SIGUSR1 stops but leaves the programs attached
//! and the maps pinned, for the next `rocev2 run` to take over without
//! losing a packet.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    net::IpAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use aya::programs::{TcAttachType, XdpMode as AyaXdpMode};
use rocev2_common::{
    buckets::Rebalance,
    features::Features,
    maps::{MAX_GROUPS, MAX_ROUTES_V4, MAX_ROUTES_V6, PIN_MEMBER_DOWN},
};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    control::bridge::BridgeMirror,
    control::config::{Attach, Config, CpuSpread, Group, HashSeed, KernelTable, NextHop, Policy, Prefix, XdpMode},
    control::dataplane::{local_routes, Dataplane, GroupPolicy},
    control::errors::{ReloadError, ReloadRefused},
    control::groups::{
        self, resilient::ResilientTable, GroupPipeline, HealthView, MemberRecord, MemberView, PlannedGroup, RouteStep,
        WantedPin,
    },
    control::health::GroupHealth,
    control::members::{
        live_positions, log_member_change, next_hop_text, resolve_new_neighbours, MemberLive, FIRST_RESOLVE_TIMEOUT,
    },
    control::routing::{KernelRoutes, Learned, LearnedPolicy, Plan},
    control::state::{EgressState, PortState, ReloadOutcome, RunLock, RunState},
    control::stats::Snapshot,
    sys::netlink::{ensure_veth_peer_napi, LinkInfo, Netlink, PeerNapi},
};

/// How often link state (up, carrier) is checked: a failed uplink leaves
/// its group within about this long.
const LINK_POLL: Duration = Duration::from_millis(100);

/// The line `run` prints once the programs are attached and the maps are
/// filled; scripts and tests wait for it.
pub const READY_LINE: &str = "rocev2: ready";

/// How often the summary systemd shows (`STATUS=`) is refreshed.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);

pub struct RunOptions {
    /// Overrides `[dataplane] xdp_mode`.
    pub xdp_mode: Option<XdpMode>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// How `run` ended.
pub enum Ending {
    /// Detached and unpinned.
    Stopped(Snapshot),
    /// Left attached and pinned for the next `rocev2 run` (SIGUSR1).
    HandedOver(Snapshot),
}

/// A running dataplane and everything the control loop knows about it.
struct Runner {
    config: Config,
    netns: Option<String>,
    netlink: Netlink,
    dataplane: Dataplane,
    /// Map slot of each group by name: stable across reloads, so a route
    /// never points at a slot being rewritten for another group.
    slots: BTreeMap<String, u32>,
    /// Members per group name, in config order.
    members: BTreeMap<String, Vec<MemberLive>>,
    ports: Vec<PortState>,
    egress: Vec<(String, u32)>,
    /// The `local` egress ports whose tc egress marking is attached.
    local_egress: Vec<String>,
    local: Vec<IpAddr>,
    /// The one publish path of config and learned groups, routes and pins.
    pipeline: GroupPipeline,
    /// Bucket tables of the config groups by member identity, so a member
    /// that fails moves only its own flows.
    tables: BTreeMap<String, ResilientTable<(String, NextHop)>>,
    /// Transport health of the members of `transport_aware` groups, and
    /// when it was last updated.
    health: BTreeMap<String, GroupHealth>,
    health_at: Instant,
    /// The telemetry's per-member sums, which the health step reads.
    member_transport: crate::control::qp_telemetry::MemberTransportReader,
    /// The kernel route mirror, with `[routing] source = "kernel"`.
    kernel: Option<KernelRoutes>,
    /// The bridge mirror, with `[bridge]`, and the bridge's ports with
    /// their counter slots (taken from the top down, so the `[[port]]`s'
    /// slots, from 1 up, never move them).
    bridge: Option<BridgeMirror>,
    bridge_ports: Vec<PortState>,
    /// Names of the devices redirects go to, by ifindex (for `stats`).
    egress_names: BTreeMap<u32, String>,
    /// Refused redirects per egress ifindex at the last status tick.
    refused_seen: BTreeMap<u32, u64>,
    /// The hash seed in use (resolved from `hash_seed = "auto"`).
    seed: u32,
    /// The class list installed, so an unchanged one is not rewritten
    /// (rewriting empties the live list for a moment).
    classes: Option<Vec<rocev2_common::class::ClassEntry>>,
    mode: AyaXdpMode,
    state: RunState,
    /// Map sizes fixed when the programs were loaded: a reload may use
    /// less of them, not more.
    loaded: LoadedSizes,
}

/// Sizes of the maps as loaded (see [`Runner::check_live_changeable`]).
#[derive(Clone, Copy, Debug)]
struct LoadedSizes {
    flowlet_table_size: u32,
    flowlet_slots: u32,
    telemetry_qps: u32,
}

pub async fn run(config: Config, options: RunOptions, netns: Option<String>) -> Result<Ending> {
    let pin_dir = config.dataplane.pin_dir.clone();
    // Say which capability is missing before anything else fails with EPERM.
    crate::sys::privileges::require("run", crate::sys::privileges::Need::LoadXdp)?;
    // Handlers first: a signal that arrives while starting up (or right
    // after `ready`) must still detach and unpin, not kill the process.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut sigusr1 = signal(SignalKind::user_defined1())?;
    if pin_dir.starts_with(crate::sys::paths::BPFFS) && crate::sys::bpffs::private_view() {
        bail!(
            "refusing to pin the dataplane into {}: {}; nothing else could see, reload, upgrade or detach what it pins there. Start it as `rocev2 --netns NAME run --config FILE`, which enters only the network namespace",
            pin_dir.display(),
            crate::sys::bpffs::PRIVATE_VIEW
        );
    }
    let _lock = RunLock::acquire(&pin_dir)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let mut runner = Runner::start(config, &options, netns).await?;

    let metrics = match options.metrics_addr {
        Some(addr) => {
            let server = crate::control::metrics::MetricsServer::start(addr, pin_dir.clone())
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            let place = runner
                .netns
                .as_deref()
                .map(|n| format!(" inside network namespace {n} (e.g. `ip netns exec {n} curl ...`)"))
                .unwrap_or_default();
            tracing::info!("metrics at http://{}/metrics{place}", server.local_addr());
            Some(server)
        }
        None => None,
    };
    println!("{READY_LINE}");
    std::io::stdout().flush().ok();
    crate::control::notify::ready(&runner.status_line());
    let mut status_tick = tokio::time::interval(STATUS_INTERVAL);

    let mut link_tick = tokio::time::interval(LINK_POLL);
    let mut neighbour_tick = tokio::time::interval(runner.config.dataplane.neighbour_refresh);
    // Under `WatchdogSec=`: ping at half the period, but only while the
    // link check (every LINK_POLL) keeps completing.
    let watchdog = crate::control::notify::watchdog_period();
    let mut watchdog_tick = tokio::time::interval(watchdog.map_or(Duration::from_secs(3600), |p| p / 2));
    let mut last_refresh = Instant::now();
    let handover = loop {
        tokio::select! {
            _ = sigint.recv() => break false,
            _ = sigterm.recv() => break false,
            _ = sigusr1.recv() => break true,
            _ = sighup.recv() => {
                crate::control::notify::reloading();
                runner.reload_from_file().await;
                crate::control::notify::ready(&runner.status_line());
            }
            _ = status_tick.tick() => {
                crate::control::notify::status(&runner.status_line());
                runner.check_fill();
                runner.check_refusals();
                RunState::touch(&pin_dir);
            }
            _ = link_tick.tick() => {
                runner.refresh(false).await?;
                last_refresh = Instant::now();
            }
            _ = watchdog_tick.tick(), if watchdog.is_some() => {
                if last_refresh.elapsed() < watchdog.unwrap_or_default() / 2 {
                    crate::control::notify::watchdog();
                }
            }
            started = async { runner.kernel.as_mut().expect("guarded").next_batch().await }, if runner.kernel.is_some() => {
                runner.apply_kernel_changes(started?).await?;
            }
            changed = async { runner.bridge.as_mut().expect("guarded").next_batch().await }, if runner.bridge.is_some() => {
                if changed? {
                    runner.sync_bridge().await?;
                }
            }
            _ = neighbour_tick.tick() => runner.refresh(true).await?,
        }
        std::io::stdout().flush().ok();
    };
    crate::control::notify::stopping(if handover { "handing over to the next rocev2 run" } else { "stopping" });

    if let Some(server) = metrics {
        server.stop().ok();
    }
    let snapshot = Snapshot::collect(&runner.dataplane.maps, &runner.state)?;
    if handover {
        runner.state.handed_over_at = Some(crate::control::state::now_epoch());
        if let Err(e) = runner.state.write(&pin_dir) {
            tracing::warn!("cannot record the handover in the state file: {e:#}");
        }
        runner.dataplane.hand_over();
        drop(runner);
        Ok(Ending::HandedOver(snapshot))
    } else {
        drop(runner); // detaches the programs and removes the pins
        RunState::remove(&pin_dir);
        Ok(Ending::Stopped(snapshot))
    }
}

impl Runner {
    async fn start(config: Config, options: &RunOptions, netns: Option<String>) -> Result<Self> {
        let netlink = Netlink::new().context("cannot open a netlink socket")?;
        let pin_dir = config.dataplane.pin_dir.clone();
        let mode = match options.xdp_mode.unwrap_or(config.dataplane.xdp_mode) {
            XdpMode::Native => AyaXdpMode::Driver,
            XdpMode::Skb => AyaXdpMode::Skb,
        };
        // Everything the config names must exist before anything loads.
        let links = resolve_links(&netlink, &config).await?;
        // The programs this config attaches, verified before anything else.
        let mut programs = Vec::new();
        if !config.ports.is_empty() && config.dataplane.attach == Attach::Xdp {
            programs.push(crate::control::dataplane::XDP_PROGRAM);
        }
        if config.bridge.is_some() {
            programs.push(crate::control::dataplane::XDP_BRIDGE_PROGRAM);
        }
        let takeover = crate::control::dataplane::has_pinned_links(&pin_dir);
        // What the previous run published about itself: the members'
        // transport health goes on (a demoted member stays demoted).
        let previous = takeover.then(|| RunState::read(&pin_dir).ok()).flatten();
        let dataplane = if takeover {
            // A previous run's programs are attached and forwarding: this is
            // a takeover, and nothing waits for the new programs. Loading
            // them (the verifier: a few hundred ms of CPU, far more on a
            // busy box) then runs at the lowest priority, so it takes no
            // CPU from the forwarding (ksoftirqd) or the applications.
            load_in_background(
                &pin_dir,
                config.flowlet_table_size(),
                config.flowlet_slots(),
                config.features(),
                config.dataplane.telemetry_qps,
                &programs,
            )?
        } else {
            let mut dataplane = Dataplane::load_with_telemetry(
                Some(&pin_dir),
                config.flowlet_table_size(),
                config.flowlet_slots(),
                config.features(),
                config.dataplane.telemetry_qps,
            )?;
            dataplane.preload(&programs)?;
            dataplane
        };
        let mut dataplane = dataplane;
        let features = dataplane.features().names().collect::<Vec<_>>().join(", ");
        tracing::info!(features = features.as_str(), "programs loaded with features: {features}");
        if let Err(why) = dataplane.refusal_counting() {
            tracing::warn!(
                "frames an egress device refuses after a redirect are not counted (they show as forwarded): {why}"
            );
        }
        if config.dataplane.cpu_spread == CpuSpread::Qp {
            if config.dataplane.attach == Attach::Tc {
                bail!("dataplane.cpu_spread = \"qp\" needs attach = \"xdp\" (the CPU map is an XDP redirect); set one of them back");
            }
            let cpus = dataplane.enable_cpu_spread()?;
            let list = cpus.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
            tracing::info!(cpus = list.as_str(), "cpu_spread = qp: flows spread over CPUs {list} by their qp hash");
        }
        let state = RunState {
            pid: std::process::id(),
            config: config.path.clone(),
            netns: netns.clone(),
            pin_dir: pin_dir.clone(),
            started_at: crate::control::state::now_epoch(),
            config_loaded_at: crate::control::state::now_epoch(),
            netns_cookie: crate::sys::netns::current_cookie().unwrap_or(0),
            features: dataplane.features().0,
            ..Default::default()
        };
        let mut runner = Runner {
            config: config.clone(),
            netns,
            netlink,
            dataplane,
            slots: BTreeMap::new(),
            members: BTreeMap::new(),
            ports: Vec::new(),
            egress: Vec::new(),
            local_egress: Vec::new(),
            local: Vec::new(),
            pipeline: GroupPipeline::default(),
            tables: BTreeMap::new(),
            health: BTreeMap::new(),
            health_at: Instant::now(),
            member_transport: Default::default(),
            kernel: None,
            bridge: None,
            bridge_ports: Vec::new(),
            egress_names: BTreeMap::new(),
            refused_seen: BTreeMap::new(),
            seed: 0,
            classes: None,
            mode,
            state,
            loaded: LoadedSizes {
                flowlet_table_size: config.flowlet_table_size(),
                flowlet_slots: config.flowlet_slots(),
                telemetry_qps: config.dataplane.telemetry_qps,
            },
        };
        if let Some(table) = &config.routing.kernel_table {
            let id = match table {
                KernelTable::Id(id) => *id,
                KernelTable::Vrf(name) => runner.netlink.vrf_table(name).await?,
            };
            runner.kernel = Some(KernelRoutes::start(id)?);
        }
        if let Some(previous) = &previous {
            runner.inherit_health(previous);
        }
        if let Some(bridge) = &config.bridge {
            let mirror = BridgeMirror::start(&bridge.name)?;
            mirror.check_bridge().map_err(|e| config.error_at(&bridge.loc, "", format!("{e:#}")))?;
            runner.bridge = Some(mirror);
        }
        runner.apply(config, links).await?;
        runner.resolve_learned_next_hops().await?;
        if let Some(kernel) = &mut runner.kernel {
            kernel.start_measuring();
        }
        let keep: Vec<String> = runner.ports.iter().chain(&runner.bridge_ports).map(|p| p.name.clone()).collect();
        for ifname in runner.dataplane.drop_stale_links(&keep)? {
            tracing::info!("detached the previous run's program from {ifname} (no longer a [[port]])");
        }
        let c = &runner.config;
        if let Some(k) = &runner.kernel {
            let s = &k.stats;
            tracing::info!(
                "following kernel table {}: {} prefixes forwarded ({} host entries) over {} learned groups, {} left to the kernel",
                s.table,
                s.routes,
                s.hosts,
                s.groups,
                s.to_kernel.values().sum::<usize>()
            );
        }
        if let Some(b) = &runner.bridge {
            let s = &b.stats;
            tracing::info!(
                "following bridge {}: {} ports ({} forwarding), FDB {} entries ({} to a port, {} to an uplink group, {} local, {} left to the kernel), ageing {} s",
                s.bridge,
                s.ports,
                s.forwarding,
                s.fdb_port + s.fdb_uplink + s.fdb_local + s.fdb_kernel,
                s.fdb_port,
                s.fdb_uplink,
                s.fdb_local,
                s.fdb_kernel,
                s.ageing_s
            );
        }
        let ports =
            runner.ports.iter().chain(&runner.bridge_ports).map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
        let attach = match c.dataplane.attach {
            Attach::Xdp => format!("{} XDP", crate::control::dataplane::mode_name(mode)),
            Attach::Tc => "tc ingress".to_string(),
        };
        tracing::info!(
            ports = ports.as_str(),
            attach = attach.as_str(),
            groups = c.groups.len(),
            routes = c.routes.len(),
            pin_dir = %pin_dir.display(),
            "forwarding on {ports} ({attach}), {} groups, {} routes, maps pinned in {}",
            c.groups.len(),
            c.routes.len(),
            pin_dir.display()
        );
        Ok(runner)
    }

    /// One-line summary for systemd's `STATUS=`.
    fn status_line(&self) -> String {
        match Snapshot::collect(&self.dataplane.maps, &self.state) {
            Ok(snapshot) => crate::control::notify::summary(&snapshot, self.config.routes.len()),
            Err(e) => format!("cannot read the counters: {e:#}"),
        }
    }

    /// Reports a route or flowlet table that is filling up (see capacity).
    fn check_fill(&self) {
        use crate::control::capacity::Fill;
        let (v4, v6) = self.dataplane.route_counts();
        let route_hint = "further learned prefixes (and those covering them) go to the kernel (route_table_full); aggregate prefixes";
        let mut fills = vec![
            Fill { table: "IPv4 route table", used: v4 as u64, capacity: MAX_ROUTES_V4.into(), hint: route_hint },
            Fill { table: "IPv6 route table", used: v6 as u64, capacity: MAX_ROUTES_V6.into(), hint: route_hint },
        ];
        if self.config.groups.iter().any(|g| matches!(g.policy, Policy::Flowlet(_))) {
            fills.push(Fill {
                table: "flowlet table",
                used: self.dataplane.maps.flowlet_entries() as u64,
                capacity: self.loaded.flowlet_table_size.into(),
                hint: "the least recently used flows are evicted and may change path mid-flowlet; raise flowlet_table_size",
            });
        }
        crate::control::capacity::check(&fills);
    }

    /// A takeover: the members' transport health as the previous run left
    /// it, before anything is published, so no demoted member gets its
    /// buckets back for a moment.
    fn inherit_health(&mut self, previous: &RunState) {
        for group in self.config.groups.iter().filter(|g| g.transport_aware.is_some()) {
            let Some(old) = previous.groups.iter().find(|g| g.name == group.name) else { continue };
            let members = group.members.iter().map(|m| (m.dev.clone(), next_hop_text(&m.next_hop)));
            let health = groups::health_from_previous(old, members);
            crate::control::routing::log_inherited_health(&group.name, &health);
            self.health.insert(group.name.clone(), health);
        }
        if let Some(kernel) = &mut self.kernel {
            kernel.inherit_health(&previous.groups);
        }
    }

    /// Warns (once per status interval) when egress devices refused
    /// redirected frames since the last check: lost frames `forwarded`
    /// does not count.
    fn check_refusals(&mut self) {
        let Ok(now) = self.dataplane.maps.egress_refused() else { return };
        let grown: Vec<String> = now
            .iter()
            .filter_map(|(ifindex, n)| {
                let new = n.saturating_sub(self.refused_seen.get(ifindex).copied().unwrap_or(0));
                let name = self.egress_names.get(ifindex).cloned().unwrap_or_else(|| format!("ifindex {ifindex}"));
                (new > 0).then(|| format!("{name} {new}"))
            })
            .collect();
        if !grown.is_empty() {
            tracing::warn!(
                "egress devices refused redirected frames (lost, counted as drop_egress_refused) in the last {}s: {}; a full ring, a device down, or a veth peer without NAPI",
                STATUS_INTERVAL.as_secs(),
                grown.join(", ")
            );
        }
        self.refused_seen = now;
    }

    /// SIGHUP: read the config file again and apply it. A bad file or a
    /// change that needs a restart is reported and the running config stays.
    async fn reload_from_file(&mut self) {
        let path = self.config.path.clone();
        let result: Result<(), ReloadError> = async {
            let new = Config::load(&path)?;
            for warning in &new.warnings {
                tracing::warn!("{warning}");
            }
            self.check_live_changeable(&new)?;
            let links = resolve_links(&self.netlink, &new).await.map_err(ReloadError::from_apply)?;
            self.apply(new, links).await.map_err(ReloadError::from_apply)
        }
        .await;
        self.state.reloads += 1;
        match &result {
            Ok(()) => {
                self.state.last_reload = ReloadOutcome::Applied;
                self.state.config_loaded_at = crate::control::state::now_epoch();
                tracing::info!(config = %path.display(), "reloaded {}", path.display());
                self.report_unused_features();
            }
            Err(e) => {
                let message = e.to_string();
                tracing::error!(config = %path.display(), "reload of {} failed, the running config stays: {message}", path.display());
                self.state.last_reload = ReloadOutcome::Refused { reason: e.reason(), message };
                self.state.reload_failures += 1;
            }
        }
        if let Err(e) = self.state.write(&self.config.dataplane.pin_dir) {
            tracing::warn!("cannot update the state file: {e:#}");
        }
    }

    /// Settings fixed when the programs were loaded and attached. A
    /// reload may turn a feature off or use less of a table (the loaded
    /// programs and maps hold the smaller config), not turn one on or grow
    /// a table; a refusal names what in the new file asks for it.
    fn check_live_changeable(&self, new: &Config) -> Result<(), ReloadError> {
        let (old, newd) = (&self.config.dataplane, &new.dataplane);
        let mut fixed = Vec::new();
        if old.pin_dir != newd.pin_dir {
            fixed.push(format!("dataplane.pin_dir changed to {}", newd.pin_dir.display()));
        }
        if old.attach != newd.attach {
            fixed.push("dataplane.attach changed".to_string());
        }
        if old.xdp_mode != newd.xdp_mode {
            fixed.push("dataplane.xdp_mode changed".to_string());
        }
        if old.cpu_spread != newd.cpu_spread {
            fixed.push("dataplane.cpu_spread changed".to_string());
        }
        if self.config.routing != new.routing {
            fixed.push("[routing] changed".to_string());
        }
        if self.config.bridge.as_ref().map(|b| &b.name) != new.bridge.as_ref().map(|b| &b.name) {
            fixed.push("[bridge] name changed (which bridge rocev2 follows)".to_string());
        }
        let loaded = self.loaded;
        if new.flowlet_table_size() > loaded.flowlet_table_size {
            let groups = new.feature_sources(Features::FLOWLET_KEYED).join(", ");
            fixed.push(format!(
                "the keyed flowlet groups ({groups}) need a table of {} flows in all (their flowlet_table_size, 65536 each unless set), and the running one was sized for {} when `rocev2 run` loaded it",
                new.flowlet_table_size(),
                loaded.flowlet_table_size
            ));
        }
        if new.flowlet_slots() > loaded.flowlet_slots {
            fixed.push(format!(
                "a keyless flowlet group needs {} slots (its flowlet_table_size), and the running slot array was sized for {} when `rocev2 run` loaded it",
                new.flowlet_slots(),
                loaded.flowlet_slots
            ));
        }
        if newd.telemetry_qps > loaded.telemetry_qps && loaded.telemetry_qps != 0 {
            fixed.push(format!(
                "telemetry_qps = {} in [dataplane]: the QP table holds {} QPs, sized when `rocev2 run` loaded it",
                newd.telemetry_qps, loaded.telemetry_qps
            ));
        }
        // Features are load-time constants: code for a feature the loaded
        // programs were built without is not there to run.
        let missing = new.features().without(self.dataplane.features());
        if missing != Features::NONE {
            let features: Vec<String> = Features::NAMED
                .iter()
                .filter(|(f, _)| missing.contains(*f))
                .map(|(f, name)| format!("{name} ({})", new.feature_sources(*f).join(", ")))
                .collect();
            return Err(ReloadError::FeaturesNotLoaded { features });
        }
        if !fixed.is_empty() {
            return Err(ReloadError::NeedsRestart { settings: fixed });
        }
        Ok(())
    }

    /// After a reload: features the loaded programs carry that the config
    /// no longer uses (they cost a little per packet until a restart).
    fn report_unused_features(&self) {
        let unused = self.dataplane.features().without(self.config.features());
        if unused != Features::NONE {
            let names = unused.names().collect::<Vec<_>>().join(", ");
            tracing::info!(
                features = names.as_str(),
                "the config no longer uses {names}; the running programs keep that code until `rocev2 run` restarts (a new run takes over without dropping traffic)"
            );
        }
    }

    /// Makes the dataplane match `config`. Order matters for packets in
    /// flight: settings, egress and classes first, then groups (each
    /// published atomically), then routes (new ones added before stale
    /// ones go), then ports attach or detach.
    async fn apply(&mut self, config: Config, links: Links) -> Result<()> {
        self.seed = match config.dataplane.hash_seed {
            HashSeed::Fixed(seed) => seed,
            HashSeed::Auto => rocev2_common::hash::auto_seed(links.ports.iter().map(|l| l.mac)),
        };
        let maps = &mut self.dataplane.maps;
        maps.set_hash(self.seed, config.dataplane.hash_version)?;
        for (i, profile) in config.ecn_profiles.iter().enumerate() {
            maps.set_ecn_profile(i as u32, profile.to_map_entry())?;
        }
        let new_egress: Vec<(String, u32)> =
            config.egress.iter().zip(&links.egress).map(|(e, l)| (e.dev.clone(), l.ifindex)).collect();
        for (_, ifindex) in self.egress.iter().filter(|old| !new_egress.contains(old)) {
            maps.remove_egress(*ifindex);
        }
        for (slot, (e, link)) in config.egress.iter().zip(&links.egress).enumerate() {
            let profile = e.ecn_profile.map_or(rocev2_common::ecn::NO_PROFILE, |p| p as u32);
            maps.set_egress(link.ifindex, slot as u32, e.rate_bytes_per_sec, profile)?;
        }
        let classes = config.class_entries();
        if self.classes.as_ref() != Some(&classes) {
            maps.set_classes(&classes)?;
            self.classes = Some(classes);
        }

        // Members: keep what is known about unchanged ones, resolve new ones.
        let mut members: BTreeMap<String, Vec<MemberLive>> = BTreeMap::new();
        for (group, group_links) in config.groups.iter().zip(&links.members) {
            let old = self.members.get(&group.name);
            let list = group
                .members
                .iter()
                .zip(group_links)
                .map(|(m, link)| {
                    old.and_then(|o| {
                        o.iter()
                            .find(|x| x.dev == m.dev && x.next_hop == m.next_hop && x.ifindex == link.ifindex)
                            .cloned()
                    })
                    .unwrap_or_else(|| {
                        let place = format!("{}:{}: {}", config.path.display(), m.loc.line, m.loc.key);
                        MemberLive::from_link(place, &m.dev, m.next_hop, link)
                    })
                })
                .collect();
            members.insert(group.name.clone(), list);
        }
        // A new uplink group member starts as the bridge says (no log line:
        // nothing changed).
        if let Some(mirror) = &self.bridge {
            let known =
                |g: &String, m: &MemberLive| self.members.get(g).is_some_and(|o| o.iter().any(|x| x.dev == m.dev));
            for (g, list) in members.iter_mut() {
                for m in list.iter_mut().filter(|m| m.next_hop == NextHop::BridgePort) {
                    if !known(g, m) {
                        m.forwarding = mirror.view.port_named(&m.dev).is_some_and(|i| mirror.view.forwarding(i));
                    }
                }
            }
        }
        resolve_new_neighbours(&self.netlink, &mut members).await;
        for link in links.members.iter().flatten() {
            prepare_egress(&mut self.dataplane, link, &mut self.egress_names)?;
        }

        // Group slots by name; new groups take free slots (not those of
        // learned groups).
        let learned_slots = self.kernel.as_ref().map(KernelRoutes::slots).unwrap_or_default();
        let mut slots: BTreeMap<String, u32> =
            config.groups.iter().filter_map(|g| self.slots.get(&g.name).map(|s| (g.name.clone(), *s))).collect();
        for g in &config.groups {
            if !slots.contains_key(&g.name) {
                let free = (0..MAX_GROUPS)
                    .find(|s| !slots.values().any(|t| t == s) && !learned_slots.contains(s))
                    .context("no free group slot")?;
                slots.insert(g.name.clone(), free);
            }
        }
        let policies_changed =
            self.config.route_policies != config.route_policies || self.config.dataplane.hash != config.dataplane.hash;
        self.config = config;
        self.slots = slots;
        self.members = members;
        self.update_bridge_members();
        self.local = self.netlink.local_addresses().await.context("cannot list local addresses")?;
        if let Some(kernel) = &mut self.kernel {
            if policies_changed {
                kernel.mark_all_dirty();
            }
        }
        let plan = self.plan_kernel().await?;
        let statics = self.static_routes();
        let routes = RouteStep::Sync { all: self.wanted_routes(&statics), statics };
        self.publish(true, plan.as_ref().map_or(Learned::None, Learned::Planned), routes)?;

        // Ports: register new ones, then attach; detach removed ones.
        let new_ports: Vec<PortState> = self
            .config
            .ports
            .iter()
            .zip(&links.ports)
            .enumerate()
            .map(|(i, (p, l))| PortState { name: p.name.clone(), ifindex: l.ifindex, slot: i as u32 + 1 })
            .collect();
        for port in &new_ports {
            self.dataplane.maps.set_port(port.ifindex, port.slot)?;
        }
        for old in self.ports.iter().filter(|o| !new_ports.iter().any(|n| n.name == o.name && n.ifindex == o.ifindex)) {
            self.dataplane.detach(&old.name);
            if !new_ports.iter().any(|n| n.ifindex == old.ifindex) {
                self.dataplane.maps.remove_port(old.ifindex);
            }
            tracing::info!(port = %old.name, "stopped forwarding on {}", old.name);
        }
        for port in new_ports.iter().filter(|n| !self.ports.iter().any(|o| o.name == n.name && o.ifindex == n.ifindex))
        {
            match self.config.dataplane.attach {
                Attach::Xdp => {
                    if self.dataplane.attach(&port.name, port.ifindex, self.mode)? {
                        tracing::info!(port = %port.name, "took over {} from the previous run without interruption", port.name);
                    }
                }
                Attach::Tc => self.dataplane.attach_tc(&port.name, TcAttachType::Ingress)?,
            }
        }
        self.ports = new_ports;
        self.sync_bridge().await?;

        // Local-traffic marking (tc egress): only on the `local` egress
        // ports, and detaching it leaves a port's forwarding attached.
        let new_local: Vec<String> = self.config.egress.iter().filter(|e| e.local).map(|e| e.dev.clone()).collect();
        for old in self.local_egress.iter().filter(|d| !new_local.contains(d)) {
            self.dataplane.detach_tc_egress(old);
        }
        for dev in new_local.iter().filter(|d| !self.local_egress.contains(d)) {
            self.dataplane.attach_tc(dev, TcAttachType::Egress)?;
            tracing::info!("classes and ECN marking for traffic this box sends on {dev}");
        }
        self.local_egress = new_local;
        self.egress = new_egress;
        self.write_state()
    }

    /// The one publish (see crate::control::groups): the config groups when
    /// `config_groups`, the learned groups `learned` names, then `routes`,
    /// then every pin (config and learned) for the groups as published.
    fn publish(&mut self, config_groups: bool, learned: Learned, routes: RouteStep) -> Result<()> {
        let mut groups = if config_groups { self.config_groups() } else { Vec::new() };
        let mut pins = self.config_pins();
        let (policies, default) = learned_policies(&self.config);
        if let Some(kernel) = &mut self.kernel {
            groups.extend(kernel.planned_groups(policies, default, learned));
            pins.extend(kernel.wanted_pins(&self.config.learned_pins));
        }
        let renewed = self.pipeline.publish(&mut self.dataplane, groups, routes, Some(pins))?;
        if let Some(kernel) = &mut self.kernel {
            // Learned groups no route points at any more are free.
            for slot in kernel.release_unused() {
                self.pipeline.forget(slot);
            }
            kernel.note_published(&renewed);
        }
        Ok(())
    }

    /// Every config group as it should be: its usable members at its slot,
    /// and its bucket table by member identity (only a failed or demoted
    /// member's buckets move, and a returning one's come back per
    /// `rebalance`; a demoted member keeps its position).
    fn config_groups(&mut self) -> Vec<PlannedGroup> {
        let mut planned = Vec::new();
        for group in &self.config.groups {
            let members: Vec<MemberView<(String, NextHop)>> = self.members[&group.name]
                .iter()
                .zip(&group.members)
                .map(|(m, c)| MemberView { identity: (m.dev.clone(), m.next_hop), weight: c.weight, spec: m.usable() })
                .collect();
            let table = self.tables.entry(group.name.clone()).or_default();
            let buckets = groups::bucket_table(table, &members, self.health.get(&group.name), group.rebalance);
            planned.push(PlannedGroup {
                slot: self.slots[&group.name],
                name: group.name.clone(),
                policy: group_policy(group),
                members: groups::usable_members(&members),
                buckets,
            });
        }
        self.tables.retain(|name, _| self.config.groups.iter().any(|g| &g.name == name));
        planned
    }

    /// The config's `[[pin]]`s at their members' positions now (a pin to
    /// an unusable member falls back to hashing).
    fn config_pins(&self) -> Vec<WantedPin> {
        let mut pins = Vec::new();
        for (index, group) in self.config.groups.iter().enumerate() {
            let live_position = live_positions(&self.members[&group.name]);
            for pin in self.config.pins.iter().filter(|p| p.group_index as usize == index) {
                let position = live_position.get(pin.member_index).copied().flatten().unwrap_or(PIN_MEMBER_DOWN);
                pins.push(WantedPin { prefix: pin.prefix, qp: pin.qp, slot: self.slots[&group.name], position });
            }
        }
        pins
    }

    /// Updates the transport health of every `transport_aware` group's
    /// members; true if one was demoted or restored (to publish).
    fn update_health(&mut self) -> bool {
        let elapsed = self.health_at.elapsed();
        self.health_at = Instant::now();
        let pin_dir = &self.config.dataplane.pin_dir;
        let views: Vec<HealthView> = self
            .config
            .groups
            .iter()
            .filter_map(|group| {
                let options = group.transport_aware.as_ref()?;
                Some(HealthView {
                    name: &group.name,
                    slot: self.slots[&group.name],
                    options,
                    members: group.members.iter().map(|m| m.dev.clone()).collect(),
                    positions: live_positions(&self.members[&group.name]),
                })
            })
            .collect();
        let mut changed = groups::step_health(&mut self.health, &mut self.member_transport, pin_dir, &views, elapsed);
        if let Some(kernel) = &mut self.kernel {
            let (policies, default) = learned_policies(&self.config);
            changed |= kernel.step_health(&mut self.member_transport, pin_dir, policies, default, elapsed);
        }
        changed
    }

    /// At start: asks the kernel to resolve every learned next hop it has
    /// no neighbour entry for (concurrently, up to FIRST_RESOLVE_TIMEOUT),
    /// then applies what that changed, so `ready` means forwarding.
    async fn resolve_learned_next_hops(&mut self) -> Result<()> {
        let Some(kernel) = &self.kernel else { return Ok(()) };
        let todo = kernel.unresolved();
        if todo.is_empty() {
            return Ok(());
        }
        let netlink = &self.netlink;
        let results = futures::future::join_all(
            todo.iter().map(|(ifindex, addr)| netlink.resolve_neighbour(*ifindex, *addr, FIRST_RESOLVE_TIMEOUT)),
        )
        .await;
        for ((_, addr), result) in todo.iter().zip(results) {
            if let Err(e) = result {
                tracing::warn!(next_hop = %addr, "learned next hop {addr}: {e:#}; its members stay out of their groups until it answers");
            }
        }
        if let Some(kernel) = &mut self.kernel {
            kernel.absorb_pending()?;
        }
        self.apply_kernel_changes(Instant::now()).await
    }

    /// Plans the learned routes and prepares new egress links (publishing
    /// is `publish`'s); `None` without `[routing] source = "kernel"`.
    async fn plan_kernel(&mut self) -> Result<Option<Plan>> {
        let (v4, v6) = self.learned_route_capacity();
        let Some(kernel) = &mut self.kernel else { return Ok(None) };
        kernel.set_route_capacity(v4, v6);
        let reserved: BTreeSet<u32> = self.slots.values().copied().collect();
        let (policies, _) = learned_policies(&self.config);
        let plan = kernel.plan(policies, &reserved);
        for (ifindex, name) in kernel.links_to_prepare() {
            match self.netlink.link(&name).await {
                Ok(link) => {
                    prepare_egress(&mut self.dataplane, &link, &mut self.egress_names)?;
                    kernel.mark_prepared(ifindex);
                }
                Err(e) => tracing::warn!(link = name.as_str(), "learned next hop on {name}: {e:#}"),
            }
        }
        Ok(Some(plan))
    }

    /// Route table entries left for learned prefixes, per family: the
    /// tables' size less the config's routes, the box's own addresses and
    /// some room for addresses added before the next refresh.
    fn learned_route_capacity(&self) -> (usize, usize) {
        const ADDRESS_HEADROOM: usize = 64;
        let configured_v4 = self.config.routes.iter().filter(|r| matches!(r.prefix, Prefix::V4 { .. })).count();
        let configured_v6 = self.config.routes.len() - configured_v4;
        let local_v4 = self.local.iter().filter(|a| a.is_ipv4()).count();
        let local_v6 = self.local.len() - local_v4;
        let left = |size: u32, taken: usize| (size as usize).saturating_sub(taken + ADDRESS_HEADROOM);
        (left(MAX_ROUTES_V4, configured_v4 + local_v4), left(MAX_ROUTES_V6, configured_v6 + local_v6))
    }

    /// A batch of kernel route, nexthop, link, neighbour or address
    /// changes has been read into the mirror: publish what changed and
    /// install the route changes. Config routes and the box's own addresses
    /// keep precedence over learned routes for the same prefix.
    async fn apply_kernel_changes(&mut self, started: Instant) -> Result<()> {
        let Some(plan) = self.plan_kernel().await? else { return Ok(()) };
        let local: BTreeSet<Prefix> = self.local.iter().map(|a| Prefix::host(*a)).collect();
        let configured: BTreeSet<Prefix> = self.config.routes.iter().map(|r| r.prefix).collect();
        let changes: Vec<(Prefix, Option<u32>)> =
            plan.changes.iter().filter(|(p, _)| !local.contains(p) && !configured.contains(p)).copied().collect();
        let routes_changed = !changes.is_empty();
        self.publish(false, Learned::Planned(&plan), RouteStep::Update(changes))?;
        let Some(kernel) = &mut self.kernel else { return Ok(()) };
        if routes_changed || kernel.published_any() {
            kernel.finished_batch(started);
            self.write_state()?;
        }
        Ok(())
    }

    /// Re-reads link state (every LINK_POLL) and, with `neighbours`, the
    /// neighbour MACs and local addresses; republishes what changed.
    async fn refresh(&mut self, neighbours: bool) -> Result<()> {
        let mut changed = false;
        for (group, member) in self.members.iter_mut().flat_map(|(g, list)| list.iter_mut().map(move |m| (g, m))) {
            let before = (member.link_up, member.dst_mac);
            let was_usable = member.usable().is_some();
            let link_down = if let Ok(link) = self.netlink.link(&member.dev).await {
                member.link_up = link.up && link.carrier;
                member.ifindex = link.ifindex;
                member.src_mac = link.mac;
                (!link.up).then_some("link administratively down").or((!link.carrier).then_some("no carrier"))
            } else {
                member.link_up = false;
                Some("interface not found")
            };
            // A member whose link is up but whose neighbour is unknown (e.g.
            // it just came back) retries on every link tick, not only on
            // the slower neighbour refresh.
            if neighbours || (member.link_up && member.dst_mac.is_none()) {
                if let NextHop::Via(ip) = member.next_hop {
                    match self.netlink.refresh_neighbour(member.ifindex, ip).await {
                        Ok(Some(mac)) => member.dst_mac = Some(mac),
                        Ok(None) => member.dst_mac = None,
                        Err(_) => {}
                    }
                }
            }
            if before != (member.link_up, member.dst_mac) {
                log_member_change(group, member, was_usable, link_down);
                changed = true;
            }
        }
        changed |= self.update_bridge_members();
        changed |= self.update_health();
        // A gradual rebalance moves a few buckets per tick until done.
        let settling = self.tables.values().any(ResilientTable::settling);
        let learned =
            if self.kernel.as_ref().is_some_and(KernelRoutes::settling) { Learned::All } else { Learned::None };
        if neighbours {
            if let Ok(local) = self.netlink.local_addresses().await {
                self.local = local;
            }
        }
        // Only the statics: learned routes are installed as they change
        // (apply_kernel_changes); a walk over a full table every second
        // cost far more than the statics ever do.
        let routes = if neighbours { self.static_route_step() } else { RouteStep::Keep };
        if changed || settling || !matches!(learned, Learned::None) || !matches!(routes, RouteStep::Keep) {
            self.publish(changed || settling, learned, routes)?;
        }
        // The health scores move every step: `stats` reads them from the state.
        let scoring = !self.health.is_empty() || self.kernel.as_ref().is_some_and(|k| !k.health.is_empty());
        if changed || settling || scoring {
            self.write_state()?;
        }
        if let Some(kernel) = &mut self.kernel {
            if neighbours {
                // XDP-forwarded traffic bypasses the kernel's neighbour code:
                // keep the learned next hops' entries fresh, and ask for the
                // ones not resolved yet (their answer arrives as an event).
                for (ifindex, addr) in kernel.next_hops_to_refresh() {
                    let _ = self.netlink.refresh_neighbour(ifindex, addr).await;
                }
            }
        }
        if let Some(mirror) = &mut self.bridge {
            // What the kernel has announced meanwhile first: an entry it aged
            // out must not be refreshed (which would make it again).
            if mirror.absorb_pending()? {
                self.sync_bridge().await?;
            }
        }
        if let Some(mirror) = &mut self.bridge {
            if mirror.refresh_ageing(&self.netlink, &mut self.dataplane.maps).await? {
                self.write_state()?;
            }
        }
        Ok(())
    }

    /// Configured routes plus host routes for every local address (which
    /// win: traffic for the box itself is never forwarded): the routes
    /// that are not learned.
    fn static_routes(&self) -> BTreeMap<Prefix, u32> {
        let mut routes: BTreeMap<Prefix, u32> = self
            .config
            .routes
            .iter()
            .map(|r| (r.prefix, self.slots[&self.config.groups[r.group_index as usize].name]))
            .collect();
        routes.extend(local_routes(&self.local));
        routes
    }

    /// Brings the bridge's ports, the uplink groups' members and the FDB
    /// in line with the bridge mirror: new ports get a counter slot, a
    /// redirect entry and (once the FDB is written) the bridge program;
    /// ports that left are detached.
    async fn sync_bridge(&mut self) -> Result<()> {
        let Some(mirror) = &self.bridge else { return Ok(()) };
        let now = mirror.view.port_list();
        let mut changed = false;
        let gone: Vec<PortState> = self
            .bridge_ports
            .iter()
            .filter(|p| !now.iter().any(|(i, n)| *i == p.ifindex && *n == p.name))
            .cloned()
            .collect();
        for old in &gone {
            self.dataplane.detach(&old.name);
            self.dataplane.maps.remove_port(old.ifindex);
            tracing::info!(port = %old.name, "{} left bridge {}: no longer served", old.name, mirror.view.name);
            changed = true;
        }
        self.bridge_ports.retain(|p| !gone.contains(p));
        let mut fresh = Vec::new();
        for (ifindex, name) in now {
            if self.bridge_ports.iter().any(|p| p.ifindex == ifindex) {
                continue;
            }
            let used: BTreeSet<u32> = self.ports.iter().chain(&self.bridge_ports).map(|p| p.slot).collect();
            let Some(slot) = (1..rocev2_common::maps::MAX_PORTS).rev().find(|s| !used.contains(s)) else {
                tracing::warn!(port = %name, "no port slot left for bridge port {name} (at most {} ports in all): the kernel bridge serves it alone", rocev2_common::maps::MAX_PORTS - 1);
                continue;
            };
            let link = self.netlink.link(&name).await?;
            self.dataplane.maps.set_port(ifindex, slot)?;
            prepare_egress(&mut self.dataplane, &link, &mut self.egress_names)?;
            let port = PortState { name, ifindex, slot };
            self.bridge_ports.push(port.clone());
            fresh.push(port);
            changed = true;
        }
        if self.update_bridge_members() {
            self.publish(true, Learned::None, RouteStep::Keep)?;
            changed = true;
        }
        let slots: BTreeMap<u32, u32> = self.bridge_ports.iter().map(|p| (p.ifindex, p.slot)).collect();
        let Some(mirror) = &mut self.bridge else { return Ok(()) };
        let uplinks: Vec<(u32, Vec<u32>, &crate::control::config::UplinkMacs)> = self
            .config
            .bridge
            .iter()
            .flat_map(|b| &b.uplinks)
            .map(|u| {
                let group = &self.config.groups[u.group_index];
                let names: Vec<String> = group.members.iter().map(|m| m.dev.clone()).collect();
                (self.slots[&group.name], mirror.port_ifindexes(&names), &u.macs)
            })
            .collect();
        let specs: Vec<crate::control::bridge::view::UplinkSpec> = uplinks
            .into_iter()
            .map(|(slot, ports, macs)| crate::control::bridge::view::UplinkSpec { slot, ports, macs })
            .collect();
        mirror.sync(&mut self.dataplane.maps, &slots, &specs)?;
        changed |= self.state.bridge.as_ref() != Some(&mirror.stats);
        for port in fresh {
            if self.dataplane.attach_bridge_port(&port.name, port.ifindex, self.mode)? {
                tracing::info!(port = %port.name, "took over {} from the previous run without interruption", port.name);
            }
        }
        if changed {
            self.write_state()?;
        }
        Ok(())
    }

    /// Sets each uplink group member's `forwarding` from the bridge
    /// mirror (a port of the bridge in STP forwarding state), logging
    /// every change of usability; true if one changed.
    fn update_bridge_members(&mut self) -> bool {
        let Some(mirror) = &self.bridge else { return false };
        let mut changed = false;
        for (group, member) in self.members.iter_mut().flat_map(|(g, list)| list.iter_mut().map(move |m| (g, m))) {
            if member.next_hop != NextHop::BridgePort {
                continue;
            }
            let ifindex = mirror.view.port_named(&member.dev);
            let forwarding = ifindex.is_some_and(|i| mirror.view.forwarding(i));
            if forwarding != member.forwarding {
                let was_usable = member.usable().is_some();
                member.forwarding = forwarding;
                if let Some(i) = ifindex {
                    member.ifindex = i;
                }
                let why = ifindex.map_or_else(
                    || Some(format!("not a port of bridge {}", mirror.view.name)),
                    |i| mirror.view.why_not_forwarding(i),
                );
                log_member_change(group, member, was_usable, why.as_deref());
                changed = true;
            }
        }
        changed
    }

    /// Every route: the learned ones, with `statics` over them.
    fn wanted_routes(&self, statics: &BTreeMap<Prefix, u32>) -> BTreeMap<Prefix, u32> {
        let mut routes: BTreeMap<Prefix, u32> = self.kernel.as_ref().map(|k| k.routes.clone()).unwrap_or_default();
        routes.extend(statics.iter().map(|(p, t)| (*p, *t)));
        routes
    }

    /// The periodic refresh's route step: the statics against the last
    /// ones synced, with the learned route of each prefix that leaves them.
    fn static_route_step(&self) -> RouteStep {
        let statics = self.static_routes();
        let learned = self
            .dataplane
            .static_routes()
            .keys()
            .filter(|p| !statics.contains_key(p))
            .filter_map(|p| Some((*p, *self.kernel.as_ref()?.routes.get(p)?)))
            .collect();
        RouteStep::Statics { statics, learned }
    }

    fn write_state(&mut self) -> Result<()> {
        let c = &self.config;
        self.state.config = c.path.clone();
        self.state.ports = self.ports.iter().chain(&self.bridge_ports).cloned().collect();
        self.state.bridge = self.bridge.as_ref().map(|b| b.stats.clone());
        self.state.groups = c
            .groups
            .iter()
            .map(|group| {
                let members = self.members[&group.name].iter().map(|m| {
                    m.usable().map(|_| MemberRecord {
                        dev: m.dev.clone(),
                        next_hop: next_hop_text(&m.next_hop),
                        mac: m.dst_mac,
                    })
                });
                let mut state = groups::group_state(
                    &group.name,
                    self.slots[&group.name],
                    group.hash,
                    &group.policy,
                    group.transport_aware.as_ref(),
                    members,
                    self.health.get(&group.name),
                );
                state.configured = self.members[&group.name]
                    .iter()
                    .map(|m| crate::control::state::ConfiguredMember {
                        dev: m.dev.clone(),
                        next_hop: next_hop_text(&m.next_hop),
                        up: m.usable().is_some(),
                    })
                    .collect();
                state
            })
            .collect();
        if let Some(kernel) = &self.kernel {
            let (policies, default) = learned_policies(c);
            self.state.groups.extend(kernel.group_states(policies, default));
            self.state.learned = Some(kernel.stats.clone());
        }
        self.state.seed = self.seed;
        self.state.seed_auto = c.dataplane.hash_seed == HashSeed::Auto;
        self.state.egress_devices = self.egress_names.clone();
        self.state.refusals_uncounted = self.dataplane.refusal_counting().err().unwrap_or_default().to_string();
        self.state.egress = c
            .egress
            .iter()
            .enumerate()
            .map(|(slot, e)| EgressState {
                name: e.dev.clone(),
                slot: slot as u32,
                rate_bytes_per_sec: e.rate_bytes_per_sec,
            })
            .collect();
        self.state.classes = c.classes.iter().map(|c| c.name.clone()).collect();
        self.state.write(&c.dataplane.pin_dir)
    }
}

/// Makes `link` a redirect target: in the device map, and for a veth, NAPI
/// on its peer (XDP redirects into a veth are dropped without it); notes
/// its name in `names`.
fn prepare_egress(dataplane: &mut Dataplane, link: &LinkInfo, names: &mut BTreeMap<u32, String>) -> Result<()> {
    dataplane.maps.add_egress_dev(link.ifindex)?;
    names.insert(link.ifindex, link.name.clone());
    match ensure_veth_peer_napi(link) {
        Ok(PeerNapi::EnabledGro { peer_name, netns }) => tracing::info!(
            "enabled GRO on {peer_name} (netns {netns}), the veth peer of {}, so XDP redirects into {} are delivered",
            link.name,
            link.name
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(
            "egress {} is a veth whose peer may lack NAPI; redirected frames may be dropped: {e:#}",
            link.name
        ),
    }
    Ok(())
}

/// Nice level of a takeover's program load. 19 kept the most CPU for the
/// traffic but made a takeover take 16 s next to one busy process (nice 19
/// gets ~1.5 % of a CPU against a nice-0 task); 10 gets ~10 %.
const TAKEOVER_LOAD_NICE: libc::c_int = 10;

/// Loads the dataplane on a helper thread at nice TAKEOVER_LOAD_NICE (per-thread on
/// Linux), which ends with the load: the control loop keeps its normal
/// priority and nothing needs the privilege to raise it back.
fn load_in_background(
    pin_dir: &std::path::Path,
    flowlet_table_size: u32,
    flowlet_slots: u32,
    features: Features,
    telemetry_qps: u32,
    programs: &[&str],
) -> Result<Dataplane> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setpriority on this thread's own id.
            if unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, TAKEOVER_LOAD_NICE) } != 0 {
                tracing::warn!("cannot lower the priority of the program load: {}", std::io::Error::last_os_error());
            }
            let mut dataplane = Dataplane::load_with_telemetry(
                Some(pin_dir),
                flowlet_table_size,
                flowlet_slots,
                features,
                telemetry_qps,
            )?;
            dataplane.preload(programs)?;
            Ok(dataplane)
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The links a config names, looked up in config order.
pub struct Links {
    pub ports: Vec<LinkInfo>,
    pub members: Vec<Vec<LinkInfo>>,
    pub egress: Vec<LinkInfo>,
}

/// One interface the config names that is not there.
struct MissingLink {
    name: String,
    loc: crate::control::config::Location,
    field: &'static str,
    /// The lookup's error.
    error: String,
    /// What kind of device the name suggests (a bond, a VLAN) or how to
    /// make it (the bridge), if anything.
    kind: String,
}

/// Looks up every interface the config names. Every missing one is
/// reported, one line each at its place in the file, with a close name
/// ("did you mean") when only that one is close to it, the namespace it
/// looked in and, when they all exist in one named namespace, the
/// `--netns` to give.
pub async fn resolve_links(netlink: &Netlink, config: &Config) -> Result<Links> {
    let mut absent: Vec<MissingLink> = Vec::new();
    let mut lookup = async |name: &str, loc: &crate::control::config::Location, field: &'static str| match netlink
        .link(name)
        .await
    {
        Ok(link) => Some(link),
        Err(e) => {
            let kind = match &config.bridge {
                Some(bridge) if bridge.loc.key == loc.key => {
                    format!("; make it with `ip link add {} type bridge`", bridge.name)
                }
                _ => crate::control::bridge::missing_device_hint(name).to_string(),
            };
            absent.push(MissingLink { name: name.to_string(), loc: loc.clone(), field, error: format!("{e:#}"), kind });
            None
        }
    };
    let mut links = Links { ports: Vec::new(), members: Vec::new(), egress: Vec::new() };
    // The bridge too, so that a box without it (or a namespace) hears of
    // the bridge with its ports, not only once they are all there.
    if let Some(bridge) = &config.bridge {
        let _ = lookup(&bridge.name, &bridge.loc, "").await;
    }
    for port in &config.ports {
        links.ports.extend(lookup(&port.name, &port.loc, "name").await);
    }
    for group in &config.groups {
        let mut list = Vec::new();
        for member in &group.members {
            // An uplink group's member is a port name (its place is the name).
            let field = if member.next_hop == NextHop::BridgePort { "" } else { "dev" };
            list.extend(lookup(&member.dev, &member.loc, field).await);
        }
        links.members.push(list);
    }
    for e in &config.egress {
        links.egress.extend(lookup(&e.dev, &e.loc, "dev").await);
    }
    if absent.is_empty() {
        crate::control::bridge::check_links(netlink, config, &links.ports, &links.members).await?;
        return Ok(links);
    }
    // Interface names are short: only a close name that starts alike is a
    // likely typo (s1l9 for s1l1, not lo for h1).
    let names = interface_names();
    let closes: Vec<Option<&str>> = absent
        .iter()
        .map(|m| {
            let alike = names.iter().map(String::as_str).filter(|c| c.chars().next() == m.name.chars().next());
            crate::sys::suggest::closest_match(&m.name, alike)
        })
        .collect();
    // A name close to several missing ones (eth0 for eth1, eth2 and eth3)
    // is no typo: the interfaces are not here at all. Then the lines say
    // no "did you mean", and the end lists what is here, once.
    let suggested = |c: &str| closes.iter().filter(|close| **close == Some(c)).count();
    let mut not_typos = false;
    let errors: Vec<String> = absent
        .iter()
        .zip(&closes)
        .map(|(m, close)| {
            let close = match close {
                Some(c) if suggested(c) == 1 => format!(" (did you mean {c}?)"),
                Some(_) => {
                    not_typos = true;
                    String::new()
                }
                None => String::new(),
            };
            config.error_at(&m.loc, m.field, format!("{}{close}{}", m.error, m.kind)).to_string()
        })
        .collect();
    let here = if not_typos {
        const LISTED: usize = 8;
        let mut listed: Vec<&str> = names.iter().map(String::as_str).take(LISTED).collect();
        if names.len() > LISTED {
            listed.push("…");
        }
        format!("; the interfaces here are {}", listed.join(", "))
    } else {
        String::new()
    };
    let missing: Vec<String> = absent.into_iter().map(|m| m.name).collect();
    let found = namespaces_with(&missing);
    let elsewhere = match found.as_slice() {
        [] => String::new(),
        [ns] => format!("; they exist in network namespace {ns:?}: give `rocev2 --netns {ns} ...`"),
        several => {
            let listed: Vec<String> = several.iter().take(4).map(|n| format!("{n:?}")).collect();
            let more = if several.len() > 4 { format!(" and {} more", several.len() - 4) } else { String::new() };
            format!("; they exist in network namespaces {}{more}: give `rocev2 --netns NAME ...`", listed.join(", "))
        }
    };
    // An interface can be named in several places (a port that is also a
    // member): the count is of interfaces, the lines are of places.
    let distinct = missing.iter().collect::<std::collections::BTreeSet<_>>().len();
    let count = match (errors.len(), distinct) {
        (1, _) => String::new(),
        (places, 1) => format!("\n1 interface is missing (named in {places} places)"),
        (places, n) if places == n => format!("\n{n} interfaces are missing"),
        (places, n) => format!("\n{n} interfaces are missing (named in {places} places)"),
    };
    bail!("{}{count}{}{here}{elsewhere}", errors.join("\n"), crate::sys::netns::interface_hint())
}

/// The interface names of this thread's network namespace.
fn interface_names() -> Vec<String> {
    nix::net::if_::if_nameindex()
        .map(|list| list.iter().map(|i| i.name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// The named network namespaces (`ip netns list`), other than this one, in
/// which every one of `names` exists: where a config was meant to run.
fn namespaces_with(names: &[String]) -> Vec<String> {
    let here = crate::sys::netns::current_cookie().unwrap_or(0);
    crate::sys::netns::names()
        .into_iter()
        .filter(|ns| {
            crate::sys::netns::in_netns_scoped(ns, || {
                let found = interface_names();
                Ok(crate::sys::netns::current_cookie().unwrap_or(0) != here && names.iter().all(|n| found.contains(n)))
            })
            .unwrap_or(false)
        })
        .collect()
}

/// The dataplane's encoding of a configured group's policy.
pub fn group_policy(group: &Group) -> GroupPolicy {
    GroupPolicy::new(group.hash, &group.policy, group.transport_aware.as_ref())
}

/// The `[[route_policy]]`s and the default for learned groups no policy
/// covers: `[dataplane] hash`, plain hashing, immediate rebalance.
fn learned_policies(config: &Config) -> (&[crate::control::config::RoutePolicy], LearnedPolicy) {
    let default = LearnedPolicy {
        hash: config.dataplane.hash,
        policy: Policy::Hash,
        rebalance: Rebalance::Immediate,
        transport_aware: None,
    };
    (&config.route_policies, default)
}

/// `rocev2 reload`: sends SIGHUP to the `rocev2 run` using `pin_dir` and
/// waits until it reports the result. Returns the config file it reloaded;
/// a refused reload is a [`ReloadRefused`] (downcast it to match on its
/// reason): the old config stays.
pub fn request_reload(pin_dir: &std::path::Path, timeout: Duration) -> Result<PathBuf> {
    let before = RunState::read(pin_dir)?;
    if let Some(warning) = before.manager().warning(pin_dir) {
        bail!("nothing to reload: {warning}");
    }
    if let Err(e) = crate::sys::signal_process(before.pid, nix::sys::signal::Signal::SIGHUP) {
        bail!("cannot signal rocev2 run (pid {}): {e}", before.pid);
    }
    let deadline = Instant::now() + timeout;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = RunState::read(pin_dir)?;
        if now.reloads > before.reloads {
            return match now.last_reload {
                ReloadOutcome::Applied => Ok(now.config),
                ReloadOutcome::Refused { reason, message } => Err(ReloadRefused { reason, message }.into()),
                // A count that grew with no outcome: a run that records none.
                ReloadOutcome::None => bail!("rocev2 run (pid {}) counted a reload but recorded no outcome", now.pid),
            };
        }
        if Instant::now() > deadline {
            bail!("rocev2 run (pid {}) did not report the reload within {} s", before.pid, timeout.as_secs());
        }
    }
}
