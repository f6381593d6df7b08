//! Where each QP's packets go under each mode: the switches' member
//! choices ([`Router::walk`] with the dataplane's hash, flowlet re-hash and
//! bucket tables), the slice pins, and the flowlet state (keyed per QP,
//! keyless per slot) and transport-aware demotions that change them over
//! time. Both engines ([`super::events`], [`super::rounds`]) place through
//! here.

use std::collections::HashMap;

use rocev2_common::{
    buckets::{even_table, member_for, rebalance, BucketTable, Rebalance},
    flowlet::{rehash_position, slot_of},
    hash::member_hash,
};

use super::{slice_position, Mode, Model, QpFlow};
use crate::tools::fabric::{Choice, Fabric, Hop, Switch, Tier};

/// A switch's group: the switch, the tier it chooses for and the
/// destination rack or zone the group is for ([`group_of`]).
pub(super) type Group = (Switch, Tier, u32);

/// The group a switch chooses from for a packet to host `dst`: a leaf's
/// or spine's one group upwards, an aggregation switch's group of the
/// destination zone, a spine's parallel links to the destination rack.
pub(super) fn group_of(f: &Fabric, c: &Choice, dst: (u32, u32)) -> Group {
    let target = match c.tier {
        Tier::AggDown => f.zone_of_rack(dst.0),
        Tier::SpineDown => dst.0,
        _ => 0,
    };
    (c.switch, c.tier, target)
}

/// The group, position and member count of the member a link is.
pub(super) fn member_of(f: &Fabric, hop: Hop) -> Option<(Group, u32, u32)> {
    match hop {
        Hop::LeafUp { rack, spine, link } => {
            let ups = f.uplinks(rack);
            let p = ups.iter().position(|&u| u == (spine, link))? as u32;
            Some(((Switch::Leaf(rack), Tier::LeafUp, 0), p, ups.len() as u32))
        }
        Hop::SpineUp { spine, agg } => Some(((Switch::Spine(spine), Tier::SpineUp, 0), agg - 1, f.aggs)),
        Hop::AggDown { agg, spine } => {
            let zone = f.zone_of_spine(spine);
            let p = spine - f.spines_of_zone(zone).start();
            Some(((Switch::Agg(agg), Tier::AggDown, zone), p, f.zone_spines()))
        }
        Hop::SpineDown { spine, rack, link } => {
            Some(((Switch::Spine(spine), Tier::SpineDown, rack), link - 1, f.links))
        }
        Hop::HostUp { .. } | Hop::LeafDown { .. } => None,
    }
}

/// Transport-aware demotions: members in trouble leave their group's
/// bucket table (their buckets go to the others, the dataplane's
/// [`rebalance`]) until `hold` after the trouble was last seen.
#[derive(Default)]
pub(super) struct Demotions {
    /// Per group: the member count, and until when each member is demoted.
    until: HashMap<Group, (u32, Vec<f64>)>,
    /// Per group: the table with the members demoted at its last use.
    tables: HashMap<Group, (Vec<bool>, BucketTable)>,
    pub count: usize,
}

impl Demotions {
    /// Demotes the member at `position` of `group` (of `members`) until
    /// `until`, unless that leaves the group no member in service.
    pub fn demote(&mut self, group: Group, position: u32, members: u32, now: f64, until: f64) {
        let (_, ends) = self.until.entry(group).or_insert_with(|| (members, vec![f64::NEG_INFINITY; members as usize]));
        let in_service = ends.iter().filter(|&&e| e <= now).count();
        let demoted = ends[position as usize] > now;
        if !demoted && in_service <= 1 {
            return;
        }
        if !demoted {
            self.count += 1;
        }
        ends[position as usize] = ends[position as usize].max(until);
    }

    /// The bucket table `group` uses at `now` (`even` when nothing is demoted).
    fn table<'t>(&'t mut self, group: Group, now: f64, even: &'t BucketTable) -> &'t BucketTable {
        let Some((members, ends)) = self.until.get(&group) else { return even };
        let out: Vec<bool> = ends.iter().map(|&e| e > now).collect();
        if !out.contains(&true) {
            return even;
        }
        let members = *members;
        let entry = self.tables.entry(group).or_insert_with(|| (Vec::new(), even_table(members)));
        if entry.0 != out {
            let weights: Vec<u32> = out.iter().map(|&o| u32::from(!o)).collect();
            let mut table = even_table(members);
            rebalance(&mut table, &weights, Rebalance::Immediate);
            *entry = (out, table);
        }
        &entry.1
    }
}

/// One keyless flowlet slot (per group).
struct Slot {
    position: u32,
    flowlet: u32,
    /// The QP whose packets last started the slot's flowlet.
    owner: usize,
    /// QPs sending through it now, and when the last one stopped.
    active: u32,
    last_end: f64,
}

/// The keyless tables of every switch: slot state per (group, slot).
#[derive(Default)]
pub(super) struct Slots {
    slots: HashMap<(Group, u32), Slot>,
    pub collisions: u64,
}

impl Slots {
    /// A QP that held `held` slots stopped sending at `now`.
    pub fn release(&mut self, held: &[(Group, u32)], now: f64) {
        for key in held {
            if let Some(s) = self.slots.get_mut(key) {
                s.active = s.active.saturating_sub(1);
                s.last_end = now;
            }
        }
    }
}

/// How a QP starts a message: what it knows about its own flowlet.
pub(super) struct Start {
    pub now: f64,
    /// How long the QP was idle before this message (infinite for its first).
    pub idle: f64,
}

/// What placing a message decided.
pub(super) struct Placed {
    pub path: Vec<u32>,
    /// The message started a new flowlet (somewhere on its path).
    pub new_flowlet: bool,
    /// Keyless: the slots the QP holds while it sends.
    pub held: Vec<(Group, u32)>,
}

/// The model's time-varying placement state.
#[derive(Default)]
pub(super) struct State {
    /// Per QP: its flowlet number (keyed and transport-aware modes).
    pub flowlet: Vec<u32>,
    pub slots: Slots,
    pub demotions: Demotions,
}

/// A QP that acknowledged everything idles at least this long before its
/// next message: the lab responder's ACK coalescing time (transport-aware
/// groups start a new flowlet then, `repick = "idle-or-acked"`).
pub(super) const ACKED_AFTER: f64 = 1e-3;

impl Model<'_> {
    /// The edges of the walk from `q`'s source to its destination with `choose`.
    pub(super) fn walk(&self, q: &QpFlow, choose: impl FnMut(Choice) -> u32) -> Vec<u32> {
        self.router.walk(q.src, q.dst, choose).into_iter().map(|h| self.hops.of(h) as u32).collect()
    }

    /// The path every packet of `q` takes when nothing changes over time
    /// (hashing, slices).
    pub(super) fn fixed_path(&self, q: &QpFlow) -> Vec<u32> {
        let (hash, version) = (self.router.fabric.hash, self.router.fabric.hash_version);
        match self.s.mode {
            Mode::Pinned => self.walk(q, |c| slice_position(q.dst.1, c.members)),
            _ => self.walk(q, |c| member_for(c.table, member_hash(&q.key, hash, c.seed, version))),
        }
    }

    /// Places message of QP `k` starting as `start` says, in a flowlet mode.
    pub(super) fn place_flowlet(&self, k: usize, start: &Start, state: &mut State) -> Placed {
        let q = &self.qps[k];
        let gap = self.s.flowlet_gap_ns as f64 / 1e9;
        let f = self.router.fabric;
        if self.s.mode == Mode::FlowletKeyless {
            let mask = self.s.flowlet_slots.max(1) - 1;
            let slot = slot_of(&q.key, 0, mask).index;
            let mut held = Vec::new();
            let mut new_flowlet = false;
            let slots = &mut state.slots;
            let path = self.walk(q, |c| {
                let key = (group_of(f, &c, q.dst), slot);
                let s = slots.slots.entry(key).or_insert(Slot {
                    position: 0,
                    flowlet: u32::MAX,
                    owner: k,
                    active: 0,
                    last_end: f64::NEG_INFINITY,
                });
                let live = s.active > 0 || start.now - s.last_end <= gap;
                if live && s.owner != k {
                    slots.collisions += 1;
                } else if !live {
                    // The slot's next flowlet, placed by this QP's packet.
                    s.flowlet = s.flowlet.wrapping_add(1);
                    s.position = rehash_position(&q.key, c.seed, s.flowlet, c.table);
                    s.owner = k;
                    new_flowlet = true;
                }
                s.active += 1;
                held.push(key);
                s.position
            });
            return Placed { path, new_flowlet, held };
        }
        let acked = self.s.mode == Mode::TransportAware && start.idle > ACKED_AFTER;
        let first = start.idle == f64::INFINITY;
        let new_flowlet = first || start.idle > gap || acked;
        if new_flowlet && !first {
            state.flowlet[k] += 1;
        }
        let id = state.flowlet[k];
        let demotions = &mut state.demotions;
        let path = self.walk(q, |c| {
            let table = demotions.table(group_of(f, &c, q.dst), start.now, c.table);
            rehash_position(&q.key, c.seed, id, table)
        });
        Placed { path, new_flowlet, held: Vec::new() }
    }

    /// Transport-aware: with `paths` sending at `now`, every switch link
    /// that carries more QPs than the busiest host link would queue, mark
    /// ECN and bring its QPs' CNPs: its member is demoted for `hold`.
    pub(super) fn demote_congested(&self, paths: &[&[u32]], now: f64, state: &mut State) {
        let mut count = vec![0u32; self.capacity.len()];
        for p in paths {
            for &l in *p {
                count[l as usize] += 1;
            }
        }
        let host = |e: usize| matches!(self.graph.edges[e].hop, Hop::HostUp { .. } | Hop::LeafDown { .. });
        let per = |e: usize| f64::from(count[e]) / self.capacity[e];
        let host_level = (0..count.len()).filter(|&e| host(e)).map(per).fold(0.0, f64::max);
        for e in (0..count.len()).filter(|&e| count[e] > 0 && !host(e)) {
            if per(e) > host_level * (1.0 + 1e-9) {
                if let Some((group, position, members)) = member_of(self.router.fabric, self.graph.edges[e].hop) {
                    state.demotions.demote(group, position, members, now, now + TRANSPORT_AWARE_HOLD);
                }
            }
        }
    }
}

/// How long a transport-aware member stays demoted after its trouble: its
/// score decays from the demotion threshold to the restore threshold,
/// log2(demote_above / restore_below) half-lives, with the lab's
/// `transport_aware = { demote_above = 20, restore_below = 2,
/// half_life_ms = 500 }`.
pub(super) const TRANSPORT_AWARE_HOLD: f64 = 0.5 * std::f64::consts::LOG2_10;
