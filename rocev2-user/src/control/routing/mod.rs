//! Routes from the routing daemon: `[routing] source = "kernel"` makes
//! `rocev2 run` mirror a kernel routing table (what FRR's zebra, BIRD or
//! `ip route` fill) into the dataplane and follow every change.
//!
//! - [`fib`]: the mirrored table and what each prefix becomes;
//! - [`kernel`]: the netlink socket, the dumps and message decoding;
//! - [`groups`]: bucket tables by member identity, learned groups.
//!
//! What a kernel route becomes:
//! - a route with next hops (RTA_MULTIPATH, a gateway, or a nexthop
//!   object) -> a learned group `nh:...`; equal sets of next hops (under
//!   the same `[[route_policy]]`) share one group;
//! - a blackhole/unreachable/prohibit route, an encapsulation, a device
//!   XDP cannot send to, a connected subnet -> ROUTE_KERNEL: the packet goes
//!   to the kernel (`pass_kernel_route`), and `stats` counts the prefixes
//!   by reason;
//! - every usable neighbour on a connected subnet -> a host entry (/32,
//!   /128) with a one-member group, so traffic down to the rack's own hosts
//!   is forwarded in XDP too.
//!
//! Config `[[route]]`s win over learned routes for the same prefix, and
//! the box's own addresses win over both.

pub mod fib;
pub mod kernel;
pub mod learned;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use rocev2_common::{
    buckets::Rebalance,
    hash::HashMode,
    maps::{MAX_GROUPS, MAX_ROUTES_V4, MAX_ROUTES_V6, PIN_MEMBER_DOWN, ROUTE_KERNEL},
};

use self::{
    fib::{Fib, Hop, KernelReason, Target},
    kernel::{Change, EventSocket},
    learned::{HopId, LearnedGroup, LearnedGroups},
};
use crate::{
    control::config::{LearnedPin, PinMember, Policy, Prefix, RoutePolicy},
    control::dataplane::{GroupPolicy, MemberSpec},
    control::groups::{self, HealthView, MemberRecord, MemberView, PlannedGroup, WantedPin},
    control::state::{GroupState, LearnedStats},
};

/// What [`KernelRoutes::plan`] worked out.
pub struct Plan {
    /// Route changes to install: target, or `None` to remove.
    pub changes: Vec<(Prefix, Option<u32>)>,
    fresh_groups: BTreeSet<u32>,
    neighbours: bool,
}

/// Work in progress of one [`KernelRoutes::plan`].
struct Planning {
    changes: Vec<(Prefix, Option<u32>)>,
    fresh_groups: BTreeSet<u32>,
    /// Prefixes to plan again: they cover a prefix that became (or stopped
    /// being) unfit.
    recheck: Vec<Prefix>,
    /// Routes (not host entries) that moved from one learned group to
    /// another, for the log: prefix, old group, new group.
    moved: Vec<(Prefix, String, String)>,
}

/// Routes moved individually logged per batch; beyond, one line counts them.
const MOVES_LOGGED: usize = 8;

/// The log lines of a batch's moved routes: one per route up to
/// [`MOVES_LOGGED`], then one that counts the rest.
fn moved_lines(moved: &[(Prefix, String, String)]) -> Vec<String> {
    let mut lines: Vec<String> = moved
        .iter()
        .take(MOVES_LOGGED)
        .map(|(prefix, from, to)| format!("route {prefix} moved to group {to} (was {from})"))
        .collect();
    if moved.len() > MOVES_LOGGED {
        lines.push(format!("and {} more routes moved to other groups", moved.len() - MOVES_LOGGED));
    }
    lines
}

/// 0 for IPv4, 1 for IPv6: the index of per-family counts.
fn family_of(prefix: &Prefix) -> usize {
    usize::from(matches!(prefix, Prefix::V6 { .. }))
}

/// What a learned prefix is installed as.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Installed {
    Group((Vec<Hop>, Option<usize>)),
    Kernel(KernelReason),
    /// Not in the route table: it had no room. The kernel forwards it, and
    /// every prefix covering it is installed as ROUTE_KERNEL.
    Unfit,
}

/// The kernel route mirror of a running `rocev2 run`.
pub struct KernelRoutes {
    table: u32,
    socket: EventSocket,
    pub fib: Fib,
    pub groups: LearnedGroups,
    installed: HashMap<Prefix, Installed>,
    /// Host entries from the neighbour table, as last computed.
    hosts: BTreeMap<Prefix, Hop>,
    /// Prefix -> route target (group slot or ROUTE_KERNEL).
    pub routes: BTreeMap<Prefix, u32>,
    /// Whether the last publish wrote a learned group's member list anew.
    published_in_sync: bool,
    /// Links prepared for redirects (in the device map, veth peer NAPI on).
    prepared: std::collections::HashSet<u32>,
    dirty: BTreeSet<Prefix>,
    /// Apply times of recent batches (µs), for the percentiles in stats.
    apply_times: std::collections::VecDeque<u64>,
    measuring: bool,
    all_dirty: bool,
    neighbours_dirty: bool,
    /// Route table entries learned prefixes may take, and take now, per
    /// family (IPv4, IPv6).
    route_capacity: [usize; 2],
    route_counts: [usize; 2],
    /// Prefixes that found no room in the route table.
    unfit: BTreeSet<Prefix>,
    pub stats: LearnedStats,
    /// Transport health of the members of learned groups under a
    /// `[[route_policy]]` with `transport_aware`, by group name.
    pub health: BTreeMap<String, crate::control::health::GroupHealth>,
    /// A takeover's learned groups as the previous run left them, for
    /// their members' health until each group is first published.
    previous_health: BTreeMap<String, crate::control::state::GroupState>,
    /// A demotion or restore waits to be published.
    health_changed: bool,
}

/// The policy settings for one learned group.
#[derive(Clone, Copy, Debug)]
pub struct LearnedPolicy {
    pub hash: HashMode,
    pub policy: Policy,
    pub rebalance: Rebalance,
    pub transport_aware: Option<crate::control::config::TransportAware>,
}

/// Which learned groups a publish considers.
#[derive(Clone, Copy)]
pub enum Learned<'a> {
    None,
    /// The groups a plan made and, when neighbours or links changed, every
    /// group (those whose members did not change are not written).
    Planned(&'a Plan),
    /// Every group (a gradual rebalance step, a demotion or restore).
    All,
}

impl KernelRoutes {
    /// Subscribes to changes, then reads the whole table (subscribing
    /// first, so nothing that happens during the dump is missed).
    pub fn start(table: u32) -> Result<Self> {
        let socket = EventSocket::open()?;
        let mut me = Self {
            table,
            socket,
            fib: Fib::default(),
            groups: LearnedGroups::default(),
            installed: HashMap::new(),
            hosts: BTreeMap::new(),
            routes: BTreeMap::new(),
            published_in_sync: false,
            prepared: Default::default(),
            dirty: BTreeSet::new(),
            apply_times: std::collections::VecDeque::new(),
            measuring: false,
            all_dirty: false,
            neighbours_dirty: false,
            route_capacity: [MAX_ROUTES_V4 as usize, MAX_ROUTES_V6 as usize],
            route_counts: [0, 0],
            unfit: BTreeSet::new(),
            stats: LearnedStats { table, ..Default::default() },
            health: BTreeMap::new(),
            previous_health: BTreeMap::new(),
            health_changed: false,
        };
        me.resync()?;
        Ok(me)
    }

    /// Reads every table again (at start, and when the socket overflowed
    /// and events were lost; only the latter counts as a resync).
    pub fn resync(&mut self) -> Result<()> {
        kernel::dump_all(&mut self.fib, self.table).context("cannot read the kernel's routing state")?;
        self.all_dirty = true;
        self.neighbours_dirty = true;
        Ok(())
    }

    /// Applies whatever netlink messages are waiting, without waiting.
    pub fn absorb_pending(&mut self) -> Result<()> {
        for datagram in self.socket.ready_now().context("cannot read kernel route events")? {
            for (message_type, message) in kernel::messages(&datagram) {
                self.absorb(message_type, message);
            }
        }
        Ok(())
    }

    /// Waits for the next batch of netlink messages and applies them to
    /// the mirror. Returns when the caller should plan and publish
    /// ([`KernelRoutes::plan`], then the group pipeline's
    /// [`GroupPipeline::publish`](crate::control::groups::GroupPipeline::publish)).
    pub async fn next_batch(&mut self) -> Result<Instant> {
        let batch = self.socket.receive().await;
        let started = Instant::now();
        match batch {
            Ok(datagrams) => {
                for datagram in &datagrams {
                    for (message_type, message) in kernel::messages(datagram) {
                        self.absorb(message_type, message);
                    }
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                tracing::warn!("the kernel's route events overflowed the socket; reading the tables again");
                self.stats.resyncs += 1;
                self.resync()?;
            }
            Err(e) => return Err(e).context("cannot read kernel route events"),
        }
        Ok(started)
    }

    fn absorb(&mut self, message_type: u16, message: &[u8]) {
        self.stats.messages += 1;
        let links_before = self.fib.links.len();
        match kernel::apply(&mut self.fib, self.table, message_type, message) {
            Change::Route { route, .. } => {
                self.dirty.insert(route.prefix);
                // A connected subnet changes which neighbours are hosts.
                if matches!(&route.hops, fib::Hops::Paths(p) if p.iter().any(|p| p.gateway.is_none())) {
                    self.neighbours_dirty = true;
                }
            }
            Change::Nexthop(id) => self.dirty.extend(self.fib.prefixes_using_object(id)),
            Change::Link { flushed, .. } => {
                self.dirty.extend(flushed);
                // A link that appears or goes can make routes servable or not.
                if self.fib.links.len() != links_before {
                    self.all_dirty = true;
                }
                self.neighbours_dirty = true;
            }
            Change::Neighbour | Change::Address => self.neighbours_dirty = true,
            Change::None => {}
        }
    }

    /// Whether the last publish wrote a learned group's member list anew.
    pub fn published_any(&self) -> bool {
        self.published_in_sync
    }

    /// Works out what the changes read so far mean: which prefixes point
    /// where, making the groups they need. Then the caller prepares the
    /// egress links ([`KernelRoutes::links_to_prepare`]), publishes
    /// ([`GroupPipeline::publish`](crate::control::groups::GroupPipeline::publish)), installs `plan.changes` (`None` =
    /// remove) and calls [`KernelRoutes::release_unused`].
    pub fn plan(&mut self, policies: &[RoutePolicy], reserved_slots: &BTreeSet<u32>) -> Plan {
        let mut todo: BTreeSet<Prefix> = std::mem::take(&mut self.dirty);
        if std::mem::take(&mut self.all_dirty) {
            todo.extend(self.fib.routes.keys().copied());
            todo.extend(self.installed.keys().copied());
        }
        if self.neighbours_dirty {
            let hosts = self.fib.host_entries();
            for (p, h) in hosts.iter() {
                if self.hosts.get(p) != Some(h) {
                    todo.insert(*p);
                }
            }
            todo.extend(self.hosts.keys().filter(|p| !hosts.contains_key(p)).copied());
            self.hosts = hosts;
        }
        let mut planning =
            Planning { changes: Vec::new(), fresh_groups: BTreeSet::new(), recheck: Vec::new(), moved: Vec::new() };
        loop {
            for prefix in std::mem::take(&mut todo) {
                self.plan_prefix(prefix, policies, reserved_slots, &mut planning);
            }
            // Prefixes covering one that became (or stopped being) unfit.
            while let Some(prefix) = planning.recheck.pop() {
                self.plan_prefix(prefix, policies, reserved_slots, &mut planning);
            }
            // Prefixes that found no room are tried again as soon as this
            // batch has freed some (withdrawals), not at some later batch.
            todo = self.unfit_that_fit_now();
            if todo.is_empty() {
                break;
            }
        }
        for line in moved_lines(&planning.moved) {
            tracing::info!("{line}");
        }
        let neighbours = std::mem::take(&mut self.neighbours_dirty);
        Plan { changes: planning.changes, fresh_groups: planning.fresh_groups, neighbours }
    }

    /// What one prefix becomes now, against what it was.
    fn plan_prefix(
        &mut self,
        prefix: Prefix,
        policies: &[RoutePolicy],
        reserved_slots: &BTreeSet<u32>,
        planning: &mut Planning,
    ) {
        let target =
            self.fib.target(&prefix).or_else(|| self.hosts.get(&prefix).map(|h| Target::Hops(vec![h.clone()])));
        let old = self.installed.get(&prefix).cloned();
        let mut new = match target {
            None => None,
            Some(Target::Kernel(reason)) => Some(Installed::Kernel(reason)),
            Some(Target::Hops(hops)) => Some(Installed::Group((hops, policy_index(policies, &prefix)))),
        };
        // A prefix with a missing more-specific inside goes to the kernel
        // whole: forwarding it in XDP would send the missing prefix's
        // traffic over this prefix's next hops.
        if matches!(new, Some(Installed::Group(_))) && self.covers_unfit(&prefix) {
            new = Some(Installed::Kernel(KernelReason::RouteTableFull));
        }
        // Every installed prefix takes an entry in the route table, those
        // left to the kernel too (as ROUTE_KERNEL, so they win over a
        // shorter prefix forwarded in XDP).
        let family = family_of(&prefix);
        if new.is_some()
            && !self.routes.contains_key(&prefix)
            && self.route_counts[family] >= self.route_capacity[family]
        {
            new = Some(Installed::Unfit);
        }
        if new == old {
            return;
        }
        let old_group = match &old {
            Some(Installed::Group(k)) => self.groups.by_key.get(k).map(|g| g.name.clone()),
            _ => None,
        };
        let new = match new {
            Some(Installed::Group(key)) => {
                let inherit = match &old {
                    Some(Installed::Group(k)) => Some(k.clone()),
                    _ => None,
                };
                let used: BTreeSet<u32> = self.groups.by_key.values().map(|g| g.slot).collect();
                let links = &self.fib.links;
                let made = self.groups.get_or_make(
                    &key.0,
                    key.1,
                    inherit.as_ref(),
                    |h| links.get(&h.oif).map_or_else(|| format!("if{}", h.oif), |l| l.name.clone()),
                    || (0..MAX_GROUPS).find(|s| !reserved_slots.contains(s) && !used.contains(s)),
                );
                match made {
                    Some(group) => {
                        if let Some(from) = old_group.filter(|from| *from != group.name) {
                            if !self.hosts.contains_key(&prefix) {
                                planning.moved.push((prefix, from, group.name.clone()));
                            }
                        }
                        group.prefixes += 1;
                        if group.prefixes == 1 {
                            planning.fresh_groups.insert(group.slot);
                        }
                        Some(Installed::Group(key))
                    }
                    None => Some(Installed::Kernel(KernelReason::GroupTableFull)),
                }
            }
            other => other,
        };
        if let Some(Installed::Group(k)) = &old {
            if let Some(g) = self.groups.by_key.get_mut(k) {
                g.prefixes = g.prefixes.saturating_sub(1);
            }
        }
        let was_unfit = matches!(old, Some(Installed::Unfit));
        let is_unfit = matches!(new, Some(Installed::Unfit));
        if was_unfit != is_unfit {
            self.recheck_covering(prefix, planning);
        }
        let route = match &new {
            Some(Installed::Group(k)) => Some(self.groups.by_key[k].slot),
            Some(Installed::Kernel(_)) => Some(ROUTE_KERNEL),
            Some(Installed::Unfit) | None => None,
        };
        if let Some(o) = &old {
            tally(&mut self.stats, o, false);
        }
        match &new {
            Some(n) => {
                tally(&mut self.stats, n, true);
                self.installed.insert(prefix, n.clone());
            }
            None => {
                self.installed.remove(&prefix);
            }
        }
        let was_in_table = match route {
            Some(target) => self.routes.insert(prefix, target).is_some(),
            None => self.routes.remove(&prefix).is_some(),
        };
        match (was_in_table, route.is_some()) {
            (false, true) => self.route_counts[family] += 1,
            (true, false) => self.route_counts[family] -= 1,
            _ => {}
        }
        if is_unfit {
            self.unfit.insert(prefix);
        } else {
            self.unfit.remove(&prefix);
        }
        if was_in_table || route.is_some() {
            planning.changes.push((prefix, route));
        }
    }

    /// Unfit prefixes for which the route table has room now, per family.
    fn unfit_that_fit_now(&self) -> BTreeSet<Prefix> {
        let mut out = BTreeSet::new();
        for family in [0, 1] {
            let room = self.route_capacity[family].saturating_sub(self.route_counts[family]);
            out.extend(self.unfit.iter().filter(|p| family_of(p) == family).take(room).copied());
        }
        out
    }

    /// Plans again every learned prefix covering `prefix`, which became
    /// (or stopped being) unfit: whether they may be forwarded in XDP
    /// depends on it.
    fn recheck_covering(&self, prefix: Prefix, planning: &mut Planning) {
        planning.recheck.extend(prefix.ancestors().filter(|a| self.installed.contains_key(a)));
    }

    /// Whether an unfit prefix lies strictly inside `prefix`.
    fn covers_unfit(&self, prefix: &Prefix) -> bool {
        let (first, last) = match *prefix {
            Prefix::V4 { addr, len } => {
                let last = u32::from(addr) | u32::MAX.checked_shr(u32::from(len)).unwrap_or(0);
                (Prefix::V4 { addr, len: 0 }, Prefix::V4 { addr: last.into(), len: 32 })
            }
            Prefix::V6 { addr, len } => {
                let last = u128::from(addr) | u128::MAX.checked_shr(u32::from(len)).unwrap_or(0);
                (Prefix::V6 { addr, len: 0 }, Prefix::V6 { addr: last.into(), len: 128 })
            }
        };
        // Prefixes sort by address, then length: all that lie inside are in
        // this range, beside at most a few shorter ones at the same address.
        self.unfit.range(first..=last).any(|p| p != prefix && prefix.covers(p))
    }

    /// Caps the learned prefixes per family (IPv4, IPv6) at what the
    /// dataplane's route tables have room for beside the config's routes
    /// and the box's own addresses; prefixes beyond go to the kernel
    /// (`route_table_full`).
    pub fn set_route_capacity(&mut self, v4: usize, v6: usize) {
        if self.route_capacity != [v4, v6] {
            self.route_capacity = [v4, v6];
            self.all_dirty = true;
        }
    }

    /// Egress links of learned next hops that have not been prepared for
    /// XDP redirects yet (device map, veth peer NAPI): (ifindex, name).
    pub fn links_to_prepare(&self) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = self
            .groups
            .by_key
            .values()
            .filter(|g| g.prefixes > 0)
            .flat_map(|g| g.hops.iter())
            .filter(|h| !self.prepared.contains(&h.oif))
            .filter_map(|h| self.fib.links.get(&h.oif).map(|l| (h.oif, l.name.clone())))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// `ifindex` can now take redirects; its members become usable.
    pub fn mark_prepared(&mut self, ifindex: u32) {
        self.prepared.insert(ifindex);
    }

    /// A takeover: the previous run's learned groups (its state file), whose
    /// members' transport health goes on when each group is first planned.
    pub fn inherit_health(&mut self, groups: &[crate::control::state::GroupState]) {
        self.previous_health =
            groups.iter().filter(|g| g.transport_aware.is_some()).map(|g| (g.name.clone(), g.clone())).collect();
    }

    /// The learned groups to publish (see crate::control::groups): those
    /// `which` names, each with its policy, usable members and bucket table.
    pub fn planned_groups(
        &mut self,
        policies: &[RoutePolicy],
        default: LearnedPolicy,
        which: Learned,
    ) -> Vec<PlannedGroup> {
        let consider = |slot: u32| match which {
            Learned::None => false,
            Learned::Planned(plan) => plan.neighbours || plan.fresh_groups.contains(&slot),
            Learned::All => true,
        };
        if matches!(which, Learned::All) {
            self.health_changed = false;
        }
        let mut out = Vec::new();
        for group in self.groups.by_key.values_mut().filter(|g| g.prefixes > 0 && consider(g.slot)) {
            let settings = settings_of(group.policy, policies, default);
            // A takeover: the members' health as the previous run left it,
            // before the first bucket table (a demoted member stays out).
            if let Some(previous) = self.previous_health.remove(&group.name) {
                if settings.transport_aware.is_some() && !self.health.contains_key(&group.name) {
                    let links = &self.fib.links;
                    let name = |oif: u32| links.get(&oif).map_or_else(|| format!("if{oif}"), |l| l.name.clone());
                    let members = group.hops.iter().map(|h| (name(h.oif), format!("via {}", h.neighbour)));
                    let health = groups::health_from_previous(&previous, members);
                    log_inherited_health(&group.name, &health);
                    self.health.insert(group.name.clone(), health);
                }
            }
            let members: Vec<MemberView<HopId>> = group
                .hops
                .iter()
                .map(|h| MemberView {
                    identity: (h.oif, h.neighbour),
                    weight: h.weight,
                    spec: member_spec(&self.fib, &self.prepared, h),
                })
                .collect();
            let buckets =
                groups::bucket_table(&mut group.table, &members, self.health.get(&group.name), settings.rebalance);
            out.push(PlannedGroup {
                slot: group.slot,
                name: group.name.clone(),
                policy: GroupPolicy::new(settings.hash, &settings.policy, settings.transport_aware.as_ref()),
                members: groups::usable_members(&members),
                buckets,
            });
        }
        out
    }

    /// After a publish: which slots got a new member list (`published_any`),
    /// and the counts for `stats`.
    pub fn note_published(&mut self, renewed: &BTreeSet<u32>) {
        self.published_in_sync = self.groups.by_key.values().any(|g| renewed.contains(&g.slot));
        self.count();
    }

    /// Frees learned groups no prefix uses any more (after the routes that
    /// pointed at them were changed); returns their slots.
    pub fn release_unused(&mut self) -> Vec<u32> {
        let mut freed = Vec::new();
        self.groups.by_key.retain(|_, g| {
            if g.prefixes == 0 {
                freed.push(g.slot);
            }
            g.prefixes > 0
        });
        freed
    }

    /// Whether a gradual rebalance is still moving buckets, or a
    /// transport demotion or restore waits to be published.
    pub fn settling(&self) -> bool {
        self.health_changed || self.groups.by_key.values().any(|g| g.table.settling())
    }

    /// One transport health step for the learned groups whose
    /// `[[route_policy]]` has `transport_aware` (see crate::control::health); true
    /// if a member was demoted or restored (`republish` then applies it).
    pub fn step_health(
        &mut self,
        reader: &mut crate::control::qp_telemetry::MemberTransportReader,
        pin_dir: &std::path::Path,
        policies: &[RoutePolicy],
        default: LearnedPolicy,
        elapsed: Duration,
    ) -> bool {
        let aware: Vec<(&LearnedGroup, crate::control::config::TransportAware)> = self
            .groups
            .by_key
            .values()
            .filter(|g| g.prefixes > 0)
            .filter_map(|g| settings_of(g.policy, policies, default).transport_aware.map(|t| (g, t)))
            .collect();
        let views: Vec<HealthView> = aware
            .iter()
            .map(|(g, options)| HealthView {
                name: &g.name,
                slot: g.slot,
                options,
                members: g.hops.iter().map(|h| link_name(&self.fib, h.oif)).collect(),
                positions: groups::positions(
                    g.hops.iter().map(|h| member_spec(&self.fib, &self.prepared, h).is_some()),
                ),
            })
            .collect();
        let changed = groups::step_health(&mut self.health, reader, pin_dir, &views, elapsed);
        self.health_changed |= changed;
        changed
    }

    /// Next hops whose neighbour is not resolved (for the caller to ask
    /// the kernel to resolve).
    pub fn unresolved(&self) -> Vec<(u32, std::net::IpAddr)> {
        let mut out: Vec<(u32, std::net::IpAddr)> = self
            .groups
            .by_key
            .values()
            .flat_map(|g| g.hops.iter())
            .filter(|h| self.fib.links.get(&h.oif).is_some_and(|l| l.up))
            .filter(|h| !self.fib.neighbours.contains_key(&(h.oif, h.neighbour)))
            .map(|h| (h.oif, h.neighbour))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Host entries and groups in use (routes and prefixes left to the
    /// kernel are tallied as they change, in `plan`).
    fn count(&mut self) {
        self.stats.hosts =
            self.hosts.keys().filter(|p| self.fib.target(p).is_none() && self.installed.contains_key(p)).count();
        self.stats.groups = self.groups.by_key.values().filter(|g| g.prefixes > 0).count();
    }

    /// Records how long a batch that changed the dataplane took (first
    /// message read to dataplane updated).
    pub fn finished_batch(&mut self, started: Instant) {
        if !self.measuring {
            return;
        }
        let us = started.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
        self.stats.last_apply_us = us;
        self.stats.apply_samples += 1;
        if self.apply_times.len() == 1000 {
            self.apply_times.pop_front();
        }
        self.apply_times.push_back(us);
        let mut sorted: Vec<u64> = self.apply_times.iter().copied().collect();
        sorted.sort_unstable();
        // Nearest rank: the smallest sample with at least q of them at or below it.
        let at = |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
        self.stats.apply_us_p50 = at(0.5);
        self.stats.apply_us_p99 = at(0.99);
    }

    /// Starts measuring batches (after the start-up read, which is no event).
    pub fn start_measuring(&mut self) {
        self.measuring = true;
    }

    /// Makes the next sync look at every prefix again (the policies changed).
    pub fn mark_all_dirty(&mut self) {
        self.all_dirty = true;
    }

    /// Next hops whose neighbour entries `run` keeps fresh: all of them
    /// (XDP-forwarded traffic does not refresh the kernel's entries), the
    /// unresolved ones first.
    pub fn next_hops_to_refresh(&self) -> Vec<(u32, std::net::IpAddr)> {
        let mut out = self.unresolved();
        let mut rest: Vec<(u32, std::net::IpAddr)> = self
            .groups
            .by_key
            .values()
            .filter(|g| g.prefixes > 0)
            .flat_map(|g| g.hops.iter().map(|h| (h.oif, h.neighbour)))
            .filter(|k| !out.contains(k))
            .collect();
        rest.sort();
        rest.dedup();
        out.extend(rest);
        out
    }

    /// The learned groups as `rocev2 stats` lists them, live members in
    /// position order.
    pub fn group_states(&self, policies: &[RoutePolicy], default: LearnedPolicy) -> Vec<GroupState> {
        let mut out: Vec<GroupState> = self
            .groups
            .by_key
            .values()
            .filter(|g| g.prefixes > 0)
            .map(|g| {
                let settings = settings_of(g.policy, policies, default);
                let members = g.hops.iter().map(|h| {
                    member_spec(&self.fib, &self.prepared, h).map(|m| MemberRecord {
                        dev: link_name(&self.fib, h.oif),
                        next_hop: format!("via {}", h.neighbour),
                        mac: Some(m.dst_mac),
                    })
                });
                groups::group_state(
                    &g.name,
                    g.slot,
                    settings.hash,
                    &settings.policy,
                    settings.transport_aware.as_ref(),
                    members,
                    self.health.get(&g.name),
                )
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The pins of learned routes (`[[pin]]` without a group) for the
    /// groups as they are now: a pin names a position, which changes with
    /// membership. A pin whose route is not learned (yet) is not written;
    /// one whose member is down takes PIN_MEMBER_DOWN (hashing).
    pub fn wanted_pins(&self, pins: &[LearnedPin]) -> Vec<WantedPin> {
        let mut wanted = Vec::new();
        for pin in pins {
            // The most specific learned route covering the pin's prefix.
            let max = if pin.prefix.addr().is_ipv4() { 32 } else { 128 };
            let key = (0..=pin.prefix.prefix_len().min(max)).rev().find_map(|len| {
                let p = Prefix::of(pin.prefix.addr(), len)?;
                match self.installed.get(&p)? {
                    Installed::Group(k) => Some(k),
                    Installed::Kernel(_) | Installed::Unfit => None,
                }
            });
            let Some(group) = key.and_then(|k| self.groups.by_key.get(k)) else { continue };
            let named = |h: &Hop| match &pin.member {
                PinMember::Via(ip) => h.neighbour == *ip,
                PinMember::Dev(name) => self.fib.links.get(&h.oif).is_some_and(|l| &l.name == name),
            };
            let positions =
                groups::positions(group.hops.iter().map(|h| member_spec(&self.fib, &self.prepared, h).is_some()));
            let position =
                group.hops.iter().zip(&positions).find_map(|(h, p)| p.filter(|_| named(h))).unwrap_or(PIN_MEMBER_DOWN);
            wanted.push(WantedPin { prefix: pin.prefix, qp: pin.qp, slot: group.slot, position });
        }
        wanted
    }

    /// Slots in use by learned groups.
    pub fn slots(&self) -> BTreeSet<u32> {
        self.groups.by_key.values().map(|g| g.slot).collect()
    }
}

/// A link's name, or `if<index>` for one the mirror does not know.
fn link_name(fib: &Fib, oif: u32) -> String {
    fib.links.get(&oif).map_or_else(|| format!("if{oif}"), |l| l.name.clone())
}

/// The dataplane member for a learned next hop, if it is usable now: its
/// link is up with an Ethernet address and its neighbour is resolved.
fn member_spec(fib: &Fib, prepared: &std::collections::HashSet<u32>, hop: &Hop) -> Option<MemberSpec> {
    if !prepared.contains(&hop.oif) {
        return None;
    }
    let link = fib.links.get(&hop.oif).filter(|l| l.up)?;
    let dst_mac = *fib.neighbours.get(&(hop.oif, hop.neighbour))?;
    Some(MemberSpec { ifindex: hop.oif, src_mac: link.mac?, dst_mac })
}

/// Counts a prefix in (`add`) or out of the stats: forwarded, or left to
/// the kernel by reason.
fn tally(stats: &mut LearnedStats, installed: &Installed, add: bool) {
    match installed {
        Installed::Group(_) if add => stats.routes += 1,
        Installed::Group(_) => stats.routes = stats.routes.saturating_sub(1),
        Installed::Kernel(_) | Installed::Unfit => {
            let reason = match installed {
                Installed::Kernel(reason) => *reason,
                _ => KernelReason::RouteTableFull,
            };
            let n = stats.to_kernel.entry(reason.name().to_string()).or_default();
            *n = if add { *n + 1 } else { n.saturating_sub(1) };
            if *n == 0 {
                stats.to_kernel.remove(reason.name());
            }
        }
    }
}

/// The settings of a learned group: its `[[route_policy]]`'s, or the default.
fn settings_of(policy: Option<usize>, policies: &[RoutePolicy], default: LearnedPolicy) -> LearnedPolicy {
    policy.and_then(|i| policies.get(i)).map_or(default, |p| LearnedPolicy {
        hash: p.hash,
        policy: p.policy,
        rebalance: p.rebalance,
        transport_aware: p.transport_aware,
    })
}

/// The most specific `[[route_policy]]` covering `prefix`.
fn policy_index(policies: &[RoutePolicy], prefix: &Prefix) -> Option<usize> {
    policies
        .iter()
        .enumerate()
        .filter(|(_, p)| p.prefix.covers(prefix))
        .max_by_key(|(_, p)| p.prefix.prefix_len())
        .map(|(i, _)| i)
}

/// How long to wait between gradual rebalance steps.
pub const REBALANCE_STEP: Duration = Duration::from_millis(100);

/// One log line for a group whose transport health a takeover kept.
pub(crate) fn log_inherited_health(group: &str, health: &crate::control::health::GroupHealth) {
    let (demoted, scored) = health.summary();
    tracing::info!(
        group,
        "kept the transport health of group {group} from the previous run: {demoted} member(s) demoted, {scored} with a score"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_routes_get_a_line_each_up_to_a_count() {
        let prefix = Prefix::V4 { addr: "10.1.0.0".parse().unwrap(), len: 16 };
        let one = vec![(prefix, "nh:s1l1+s2l1".to_string(), "nh:s2l1".to_string())];
        assert_eq!(moved_lines(&one), ["route 10.1.0.0/16 moved to group nh:s2l1 (was nh:s1l1+s2l1)"]);
        let many: Vec<_> = std::iter::repeat_n(one[0].clone(), MOVES_LOGGED + 3).collect();
        let lines = moved_lines(&many);
        assert_eq!(lines.len(), MOVES_LOGGED + 1);
        assert_eq!(lines[MOVES_LOGGED], "and 3 more routes moved to other groups");
    }
}
