//! One path for every group the dataplane holds, configured (`[[group]]`)
//! or learned from the kernel's routes (`control::routing`):
//!
//! - the policy it is published with is [`GroupPolicy::new`], the one
//!   encoding (hash mode, policy, flowlet settings, what `transport_aware`
//!   adds);
//! - its bucket table ([`bucket_table`]): a member out of service (down,
//!   or demoted for its transport health) holds no buckets but keeps its
//!   position;
//! - its transport health step ([`step_health`]) and its record in the
//!   state file ([`group_state`]);
//! - and one publish ([`GroupPipeline::publish`]) that writes the groups,
//!   then the routes, then the pins, in that order. A route is written only
//!   once the group it points at is published, and a pin names a group's
//!   generation and position as they are live: written before its group,
//!   it would name the old ones and be ignored until the next publish.
//!
//! Each source only says what it wants (a [`PlannedGroup`] per group, a
//! [`WantedPin`] per pin); the map writes happen here.

pub mod resilient;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::Duration,
};

use anyhow::{Context as _, Result};
use rocev2_common::{
    buckets::{BucketTable, Rebalance},
    hash::HashMode,
    maps::PinEntry,
};

use self::resilient::ResilientTable;
use crate::{
    control::config::{Policy, Prefix, TransportAware},
    control::dataplane::{Dataplane, GroupPolicy, Maps, MemberSpec},
    control::health::{self, GroupHealth},
    control::qp_telemetry::MemberTransportReader,
    control::state::{GroupState, MemberState, TransportAwareKnobs},
};

/// One group as it should be in the dataplane.
#[derive(Clone, Debug)]
pub struct PlannedGroup {
    pub slot: u32,
    pub name: String,
    pub policy: GroupPolicy,
    /// The usable members, in position order.
    pub members: Vec<MemberSpec>,
    /// Bucket -> position in `members`.
    pub buckets: BucketTable,
}

/// A pin as it should be: the packets of (destination prefix, DestQP) take
/// this position of the group in `slot` (PIN_MEMBER_DOWN: hashed). The
/// generation is the group's as published, read when the pin is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WantedPin {
    pub prefix: Prefix,
    pub qp: u32,
    pub slot: u32,
    pub position: u32,
}

/// The route writes of a publish, between its groups and its pins.
pub enum RouteStep {
    /// The routes stay as they are.
    Keep,
    /// The route tables become exactly `all` (new routes are added before
    /// stale ones go); `statics` are those of them that are not learned.
    Sync { all: BTreeMap<Prefix, u32>, statics: BTreeMap<Prefix, u32> },
    /// Only the routes that are not learned (config routes, the box's
    /// addresses) against those of the last sync; a prefix that leaves
    /// them goes back to its entry in `learned`, or is removed.
    Statics { statics: BTreeMap<Prefix, u32>, learned: BTreeMap<Prefix, u32> },
    /// These changes: a target, or `None` to remove the prefix.
    Update(Vec<(Prefix, Option<u32>)>),
}

/// What the dataplane holds now, so that an unchanged group is not
/// published again (a publish switches banks and bumps the generation,
/// which makes every flowlet of the group start over) and an unchanged pin
/// is not rewritten.
#[derive(Default)]
pub struct GroupPipeline {
    published: BTreeMap<u32, (GroupPolicy, Vec<MemberSpec>, BucketTable)>,
    pins: BTreeMap<(Prefix, u32), PinEntry>,
}

impl GroupPipeline {
    /// The one publish: `groups` (each atomically, see
    /// [`Maps::publish_group_buckets`]), then `routes`, then the pins,
    /// which become exactly `pins` (`None`: left as they are). Returns the
    /// slots whose member lists were published anew (a new generation).
    pub fn publish(
        &mut self,
        dataplane: &mut Dataplane,
        groups: Vec<PlannedGroup>,
        routes: RouteStep,
        pins: Option<Vec<WantedPin>>,
    ) -> Result<BTreeSet<u32>> {
        let mut renewed = BTreeSet::new();
        for group in groups {
            let slot = group.slot;
            if self.publish_group(&mut dataplane.maps, group)? {
                renewed.insert(slot);
            }
        }
        match routes {
            RouteStep::Keep => {}
            RouteStep::Sync { all, statics } => dataplane.sync_all_routes(&all, &statics)?,
            RouteStep::Statics { statics, learned } => {
                dataplane.sync_static_routes(&statics, |p| learned.get(p).copied())?
            }
            RouteStep::Update(changes) => dataplane.update_routes(&changes)?,
        }
        if let Some(pins) = pins {
            self.write_pins(&mut dataplane.maps, pins)?;
        }
        Ok(renewed)
    }

    /// True if the group's member list was published anew.
    fn publish_group(&mut self, maps: &mut Maps, group: PlannedGroup) -> Result<bool> {
        let state = (group.policy, group.members, group.buckets);
        match self.published.get(&group.slot) {
            Some(old) if *old == state => Ok(false),
            // Only bucket owners changed: in place, flowlets keep their member.
            Some(old) if (&old.0, &old.1) == (&state.0, &state.1) => {
                maps.set_live_buckets(group.slot, &state.2)?;
                self.published.insert(group.slot, state);
                Ok(false)
            }
            _ => {
                maps.publish_group_buckets(group.slot, &state.0, &state.1, &state.2)
                    .with_context(|| format!("cannot publish group {}", group.name))?;
                self.published.insert(group.slot, state);
                Ok(true)
            }
        }
    }

    /// Writes the pins that changed (a new position or generation) and
    /// removes the ones no longer wanted.
    fn write_pins(&mut self, maps: &mut Maps, wanted: Vec<WantedPin>) -> Result<()> {
        let mut pins = BTreeMap::new();
        for pin in wanted {
            let generation = maps.group(pin.slot)?.generation;
            let entry = PinEntry { group: pin.slot, position: pin.position, generation, _reserved: 0 };
            pins.insert((pin.prefix, pin.qp), entry);
        }
        for (key, entry) in &pins {
            if self.pins.get(key) != Some(entry) {
                maps.set_pin(&key.0, key.1, *entry)?;
            }
        }
        for key in self.pins.keys().filter(|k| !pins.contains_key(k)) {
            maps.remove_pin(&key.0, key.1)?;
        }
        self.pins = pins;
        Ok(())
    }

    /// A slot no group uses any more: whatever comes there next is
    /// published whole.
    pub fn forget(&mut self, slot: u32) {
        self.published.remove(&slot);
    }
}

/// One member of a group as the shared steps see it, in the group's order.
pub struct MemberView<K> {
    /// What the bucket table follows the member by.
    pub identity: K,
    pub weight: u32,
    /// Its dataplane entry, when it is usable (link up, neighbour known).
    pub spec: Option<MemberSpec>,
}

/// A group's bucket table: members in service get buckets by weight; one
/// out of service (not usable, or demoted for its transport health) gets
/// none but keeps its position. `table` keeps the buckets by member
/// identity, so only a failed member's flows move, and a returning one's
/// come back per `rebalance`.
pub fn bucket_table<K: Clone + PartialEq>(
    table: &mut ResilientTable<K>,
    members: &[MemberView<K>],
    health: Option<&GroupHealth>,
    rebalance: Rebalance,
) -> BucketTable {
    let wanted: Vec<(K, u32)> = members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let in_service = m.spec.is_some() && !health.is_some_and(|h| h.demoted(i));
            (m.identity.clone(), if in_service { m.weight } else { 0 })
        })
        .collect();
    table.update(&wanted, rebalance);
    let usable: Vec<bool> = members.iter().map(|m| m.spec.is_some()).collect();
    table.positions(&usable)
}

/// The usable members' entries, in position order.
pub fn usable_members<K>(members: &[MemberView<K>]) -> Vec<MemberSpec> {
    members.iter().filter_map(|m| m.spec.clone()).collect()
}

/// Each member's position in the dataplane (its place among the usable
/// ones), `None` when it is not usable.
pub fn positions(usable: impl IntoIterator<Item = bool>) -> Vec<Option<u32>> {
    let mut next = 0u32;
    usable
        .into_iter()
        .map(|u| {
            u.then(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// A `transport_aware` group as the health step sees it.
pub struct HealthView<'a> {
    pub name: &'a str,
    pub slot: u32,
    pub options: &'a TransportAware,
    /// Member names (the device), in the group's order.
    pub members: Vec<String>,
    /// Each member's position, `None` when not usable.
    pub positions: Vec<Option<u32>>,
}

/// One transport health step of `groups` (see crate::control::health),
/// whose scores `health` keeps by group name; groups no longer listed are
/// forgotten. True if a member was demoted or restored (to publish).
pub fn step_health(
    health: &mut BTreeMap<String, GroupHealth>,
    reader: &mut MemberTransportReader,
    pin_dir: &Path,
    groups: &[HealthView],
    elapsed: Duration,
) -> bool {
    health.retain(|name, _| groups.iter().any(|g| g.name == name));
    let mut changed = false;
    for group in groups {
        let scored = health::Scored {
            name: group.name,
            slot: group.slot,
            options: group.options,
            members: &group.members,
            positions: &group.positions,
        };
        let scores = health.entry(group.name.to_string()).or_default();
        // A failed read is logged once by step_group; the scores wait.
        changed |= health::step_group(scores, reader, pin_dir, &scored, elapsed).unwrap_or(false);
    }
    changed
}

/// A group's transport health as a previous run's state file left it (a
/// takeover): each of `members` (device, next hop as the state file writes
/// it) gets the health found there, a default one when none.
pub fn health_from_previous(previous: &GroupState, members: impl IntoIterator<Item = (String, String)>) -> GroupHealth {
    let found = |dev: &str, next_hop: &str| {
        previous.members.iter().find(|m| m.dev == dev && m.next_hop == next_hop).and_then(|m| m.health)
    };
    GroupHealth::restored(members.into_iter().map(|(dev, hop)| found(&dev, &hop).unwrap_or_default()).collect())
}

/// A member's record in the state file: its device, next hop (as text) and
/// neighbour MAC.
pub struct MemberRecord {
    pub dev: String,
    pub next_hop: String,
    pub mac: Option<[u8; 6]>,
}

/// A group's record in the state file (for `stats`, `explain`, `top` and
/// the metrics): its policy and its usable members, in position order,
/// with their transport health. `members` lists every member in the
/// group's order, `None` for one that is not usable.
pub fn group_state(
    name: &str,
    slot: u32,
    hash: HashMode,
    policy: &Policy,
    transport_aware: Option<&TransportAware>,
    members: impl IntoIterator<Item = Option<MemberRecord>>,
    health: Option<&GroupHealth>,
) -> GroupState {
    GroupState {
        name: name.to_string(),
        index: slot,
        hash: hash.name().to_string(),
        policy: GroupState::policy_name(policy),
        flowlet: GroupState::flowlet_knobs(policy),
        transport_aware: transport_aware.map(TransportAwareKnobs::of),
        members: members
            .into_iter()
            .enumerate()
            .filter_map(|(i, m)| m.map(|m| (i, m)))
            .map(|(i, m)| MemberState {
                dev: m.dev,
                next_hop: m.next_hop,
                mac: m.mac.map(|mac| crate::sys::format_mac(&mac)).unwrap_or_default(),
                health: health.and_then(|h| h.members.get(i).copied()),
            })
            .collect(),
        // Filled in by the caller for a config group (a learned group is
        // what the kernel's route says now: a next hop that left it is not
        // configured anywhere).
        configured: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_usable_members_only() {
        assert_eq!(positions([true, false, true, true]), [Some(0), None, Some(1), Some(2)]);
        assert_eq!(positions([false, false]), [None, None]);
    }
}
