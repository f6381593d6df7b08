//! Flowlet switching (LetFlow-style, with an optional congestion-aware
//! choice): a flow may move to another member only after it has been idle
//! longer than the gap, so packets of one flowlet never reorder.
//!
//! The decision is a pure function so the XDP program, the entropy
//! simulator and the tests run the same code.

use crate::{
    buckets::{member_for, BucketTable},
    hash::{flow_hash, FlowKey, MixedKey},
};

/// How a new flowlet picks its member. Its text form ([`FlowletChoice::name`],
/// `flowlet_choice` in configs) serves configs, JSON, `stats` and metrics.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(clap::ValueEnum, serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "user", serde(rename_all = "kebab-case"))]
pub enum FlowletChoice {
    /// Re-hash the flow with its flowlet number (LetFlow).
    Rehash = 0,
    /// Congestion-aware: of two candidate members (power of two choices),
    /// the one whose egress virtual queue is shorter.
    LeastLoaded = 1,
}

impl FlowletChoice {
    pub const ALL: [FlowletChoice; 2] = [Self::Rehash, Self::LeastLoaded];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Rehash => "rehash",
            Self::LeastLoaded => "least-loaded",
        }
    }

    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        if v == 1 {
            Self::LeastLoaded
        } else {
            Self::Rehash
        }
    }
}

crate::text_form!(
    FlowletChoice,
    UnknownFlowletChoice,
    "use \"rehash\" (LetFlow: re-hash with the flowlet number) or \"least-loaded\" (the less loaded of two members by egress virtual queue)"
);

/// Where a group keeps flowlet state (`flowlet_table` in configs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "user", serde(rename_all = "kebab-case"))]
pub enum FlowletTable {
    /// An LRU hash map keyed by the flow: no two flows share state.
    #[default]
    Keyed,
    /// A hash-indexed slot array with no key compare (as switch ASICs do):
    /// flows that land in one slot share its flowlet (a collision).
    Keyless,
}

impl FlowletTable {
    pub const ALL: [FlowletTable; 2] = [Self::Keyed, Self::Keyless];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Keyed => "keyed",
            Self::Keyless => "keyless",
        }
    }
}

crate::text_form!(
    FlowletTable,
    UnknownFlowletTable,
    "use \"keyed\" (an LRU table keyed by the flow, no sharing) or \"keyless\" (a hash-indexed slot array as in switch ASICs; flows in one slot share its flowlet)"
);

/// Per-flow state kept in the flowlet LRU map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowletEntry {
    /// Time of the flow's last packet (bpf_ktime_get_ns clock).
    pub last_seen_ns: u64,
    /// Counts the flow's flowlets; mixed into the hash of a re-hashed flowlet.
    pub flowlet_id: u32,
    /// Member position the current flowlet uses.
    pub position: u32,
    /// Group generation the position belongs to; a membership change
    /// invalidates it (the position may now name another member).
    pub generation: u32,
    /// 1 if the flow's last packet ended an RDMA message.
    pub at_boundary: u32,
}

const _: () = assert!(core::mem::size_of::<FlowletEntry>() == 24);

impl FlowletEntry {
    /// What a packet leaves in its flow's state, in the keyed table or a
    /// keyless slot: its time, flowlet, member, the group generation that
    /// member belongs to, and whether it ended a message.
    #[inline(always)]
    pub fn new(now_ns: u64, flowlet_id: u32, position: u32, generation: u32, at_boundary: bool) -> Self {
        Self { last_seen_ns: now_ns, flowlet_id, position, generation, at_boundary: at_boundary as u32 }
    }
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for FlowletEntry {}

/// What to do with a packet of a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowletDecision {
    /// Stay on the flow's current member.
    Keep { position: u32 },
    /// Start flowlet `flowlet_id`: choose a member afresh.
    NewFlowlet { flowlet_id: u32 },
}

/// Decides whether a packet continues its flow's flowlet or starts a new one.
///
/// A new flowlet starts when there is no state yet, when the group changed
/// since the flow's member was chosen, or when the flow was idle longer than
/// `gap_ns` (and, with `require_boundary`, its last packet ended a message, so
/// no RDMA message is split across paths even when the gap is short).
#[inline(always)]
pub fn decide(
    entry: Option<&FlowletEntry>,
    now_ns: u64,
    gap_ns: u64,
    generation: u32,
    member_count: u32,
    require_boundary: bool,
) -> FlowletDecision {
    let Some(e) = entry else {
        return FlowletDecision::NewFlowlet { flowlet_id: 0 };
    };
    let next = e.flowlet_id.wrapping_add(1);
    if e.generation != generation || e.position >= member_count {
        return FlowletDecision::NewFlowlet { flowlet_id: next };
    }
    let idle = now_ns.saturating_sub(e.last_seen_ns) > gap_ns;
    if idle && (!require_boundary || e.at_boundary != 0) {
        FlowletDecision::NewFlowlet { flowlet_id: next }
    } else {
        FlowletDecision::Keep { position: e.position }
    }
}

/// The flowlet settings of a group, as a packet's decision reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowletRules {
    pub gap_ns: u64,
    pub generation: u32,
    pub member_count: u32,
    pub require_boundary: bool,
}

/// A packet of a flow in a keyed flowlet table: [`decide`] on the flow's
/// entry (`existing`, None when the table holds none), the position (the
/// entry's, for a kept flowlet; `new_position(entry, flowlet_id)` for a
/// new one), and the entry's update: in place, field by field, when the
/// table holds it, else handed to `insert`. The pipeline's
/// `flowlet_position` and the bench's primitive of it share it.
///
/// # Safety
/// `existing`, when given, is a valid entry for the call (a map value).
#[inline(always)]
pub unsafe fn keyed_step(
    existing: Option<*mut FlowletEntry>,
    now_ns: u64,
    rules: FlowletRules,
    ends_message: bool,
    new_position: impl FnOnce(Option<&FlowletEntry>, u32) -> u32,
    insert: impl FnOnce(FlowletEntry),
) -> u32 {
    // SAFETY: the caller's. Another CPU may update the same flow at the
    // same time; the worst case is that this packet sees a neighbouring
    // flowlet decision, never a torn member position (each field is one
    // aligned store).
    let existing_ref = existing.map(|e| unsafe { &*e });
    let decision =
        decide(existing_ref, now_ns, rules.gap_ns, rules.generation, rules.member_count, rules.require_boundary);
    let (position, flowlet_id) = match decision {
        FlowletDecision::Keep { position } => (position, existing_ref.map_or(0, |e| e.flowlet_id)),
        FlowletDecision::NewFlowlet { flowlet_id } => (new_position(existing_ref, flowlet_id), flowlet_id),
    };
    let entry = FlowletEntry::new(now_ns, flowlet_id, position, rules.generation, ends_message);
    match existing {
        // SAFETY: as above; plain stores into the flow's own entry.
        Some(e) => unsafe { *e = entry },
        None => insert(entry),
    }
    position
}

/// One slot of a keyless flowlet table (what switch ASICs keep, e.g. SAI's
/// ARS flow table): flowlet state indexed by a hash of the flow, with no key
/// compare, so flows that hash to one slot share it. `tag` remembers which
/// flow used the slot last, only to count collisions.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowletSlot {
    pub entry: FlowletEntry,
    /// A 32-bit fingerprint of the flow that last used the slot ([`slot_of`]).
    pub tag: u32,
    /// 1 once the slot has been used (a fresh array slot is all zeros).
    pub used: u32,
}

const _: () = assert!(core::mem::size_of::<FlowletSlot>() == 32);

#[cfg(feature = "user")]
unsafe impl aya::Pod for FlowletSlot {}

impl FlowletSlot {
    /// What a packet of the flow tagged `tag` leaves in the slot after
    /// [`keyless_step`]: its time, flowlet, member and boundary, and its tag.
    #[inline(always)]
    pub fn record(
        &mut self,
        tag: u32,
        now_ns: u64,
        flowlet_id: u32,
        position: u32,
        generation: u32,
        at_boundary: bool,
    ) {
        self.entry = FlowletEntry::new(now_ns, flowlet_id, position, generation, at_boundary);
        self.tag = tag;
        self.used = 1;
    }
}

/// Seed mixed into the slot hash so the slot index is independent of the
/// member choice (which reads the top byte of the flow hash under the
/// configured seed).
const SLOT_SEED: u32 = 0x6b43_a9b5;

/// Where a flow's state lives in a keyless table: its slot, and the tag
/// that tells the flows sharing the slot apart (for the collision count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotOf {
    /// The slot, below the table's `mask + 1` slots.
    pub index: u32,
    /// The flow's fingerprint, kept in the slot as [`FlowletSlot::tag`].
    pub tag: u32,
}

/// The slot and tag of a flow in a keyless table of `mask + 1` slots (a
/// power of two), from one pass of the flow hash over the key: the index is
/// the state's first finalization, the tag its second, so flows that share
/// a slot almost never share a tag (they would have to share the whole
/// 32-bit state). The group is folded into the seed so two groups' flows do
/// not share slots by accident.
#[inline(always)]
pub fn slot_of(key: &FlowKey, group: u32, mask: u32) -> SlotOf {
    let mixed = MixedKey::new(key, SLOT_SEED ^ group.wrapping_mul(0x85eb_ca6b));
    SlotOf { index: mixed.first() & mask, tag: mixed.second() }
}

/// What one packet does to its keyless slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeylessStep {
    pub decision: FlowletDecision,
    /// The slot was live (within the gap) for another flow: this packet
    /// follows, or ends, that flow's flowlet.
    pub collided: bool,
}

/// The keyless flowlet step: the decision for a packet of the flow tagged
/// `tag` whose slot holds `slot` (its `used` flag says whether there is
/// state), by the same [`decide`] the keyed table uses. The caller then
/// writes the slot with [`FlowletSlot::record`].
#[inline(always)]
pub fn keyless_step(slot: &FlowletSlot, tag: u32, now_ns: u64, rules: FlowletRules) -> KeylessStep {
    let state = if slot.used != 0 { Some(&slot.entry) } else { None };
    let live = slot.used != 0 && now_ns.saturating_sub(slot.entry.last_seen_ns) <= rules.gap_ns;
    KeylessStep {
        decision: decide(state, now_ns, rules.gap_ns, rules.generation, rules.member_count, rules.require_boundary),
        collided: live && slot.tag != tag,
    }
}

/// The member a re-hashed flowlet takes: the flow hash with the flowlet
/// number folded into the seed, so successive flowlets of one flow land on
/// independent members.
#[inline(always)]
pub fn rehash_position(key: &FlowKey, seed: u32, flowlet_id: u32, table: &BucketTable) -> u32 {
    member_for(table, rehash_hash(key, seed, flowlet_id))
}

/// The hash a new flowlet is placed with: the flow hash under a seed that
/// changes with the flowlet number.
#[inline(always)]
pub fn rehash_hash(key: &FlowKey, seed: u32, flowlet_id: u32) -> u32 {
    flow_hash(key, seed ^ flowlet_id.wrapping_mul(0x9E37_79B9))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: u64 = 50_000;

    fn entry(last_seen_ns: u64, boundary: bool) -> FlowletEntry {
        FlowletEntry { last_seen_ns, flowlet_id: 7, position: 2, generation: 1, at_boundary: boundary as u32 }
    }

    #[test]
    fn keyed_step_keeps_or_starts_a_flowlet_and_writes_the_entry() {
        let rules = FlowletRules { gap_ns: 100, generation: 3, member_count: 4, require_boundary: false };
        let mut e = FlowletEntry::new(1_000, 7, 2, 3, false);
        // Inside the gap: kept, the entry updated in place.
        let p = unsafe { keyed_step(Some(&raw mut e), 1_050, rules, true, |_, _| unreachable!(), |_| unreachable!()) };
        assert_eq!((p, e), (2, FlowletEntry::new(1_050, 7, 2, 3, true)));
        // Past it: flowlet 8 on the position the caller chose.
        let new = |old: Option<&FlowletEntry>, id| {
            assert_eq!((old.map(|o| o.position), id), (Some(2), 8));
            1
        };
        let p = unsafe { keyed_step(Some(&raw mut e), 2_000, rules, false, new, |_| unreachable!()) };
        assert_eq!((p, e), (1, FlowletEntry::new(2_000, 8, 1, 3, false)));
        // A flow the table does not hold: flowlet 0, inserted.
        let mut inserted = None;
        let new = |old: Option<&FlowletEntry>, id| {
            assert!(old.is_none() && id == 0);
            3
        };
        let p = unsafe { keyed_step(None, 5, rules, true, new, |n| inserted = Some(n)) };
        assert_eq!((p, inserted), (3, Some(FlowletEntry::new(5, 0, 3, 3, true))));
    }

    #[test]
    fn first_packet_starts_flowlet_zero() {
        assert_eq!(decide(None, 10, GAP, 1, 4, false), FlowletDecision::NewFlowlet { flowlet_id: 0 });
    }

    #[test]
    fn packets_within_the_gap_keep_their_member() {
        let e = entry(1_000, true);
        assert_eq!(decide(Some(&e), 1_000 + GAP, GAP, 1, 4, false), FlowletDecision::Keep { position: 2 });
    }

    #[test]
    fn idle_longer_than_the_gap_starts_a_new_flowlet() {
        let e = entry(1_000, false);
        assert_eq!(decide(Some(&e), 1_001 + GAP, GAP, 1, 4, false), FlowletDecision::NewFlowlet { flowlet_id: 8 });
    }

    #[test]
    fn boundary_rule_waits_for_the_end_of_a_message() {
        let mid_message = entry(1_000, false);
        assert_eq!(decide(Some(&mid_message), 10 * GAP, GAP, 1, 4, true), FlowletDecision::Keep { position: 2 });
        let ended = entry(1_000, true);
        assert_eq!(decide(Some(&ended), 10 * GAP, GAP, 1, 4, true), FlowletDecision::NewFlowlet { flowlet_id: 8 });
    }

    #[test]
    fn a_group_change_forces_a_new_choice() {
        let e = entry(1_000, false);
        assert_eq!(decide(Some(&e), 1_001, GAP, 2, 4, true), FlowletDecision::NewFlowlet { flowlet_id: 8 });
        assert_eq!(decide(Some(&e), 1_001, GAP, 1, 2, true), FlowletDecision::NewFlowlet { flowlet_id: 8 });
    }

    #[test]
    fn successive_flowlets_spread_over_members() {
        let key = FlowKey::v4([10, 0, 0, 1], [10, 1, 0, 1], 17, 0xC000, 4791).with_dest_qp(5);
        let mut seen = [0u32; 4];
        for id in 0..400 {
            seen[rehash_position(&key, 1, id, &crate::buckets::even_table(4)) as usize] += 1;
        }
        assert!(seen.iter().all(|n| *n > 60), "{seen:?}");
    }
    /// The keyless tests' group: GAP, 4 members, no boundary rule.
    fn keyless_rules(generation: u32) -> FlowletRules {
        FlowletRules { gap_ns: GAP, generation, member_count: 4, require_boundary: false }
    }

    fn slot(last_seen_ns: u64, tag: u32) -> FlowletSlot {
        FlowletSlot { entry: entry(last_seen_ns, true), tag, used: 1 }
    }

    #[test]
    fn keyless_empty_slot_starts_flowlet_zero_without_collision() {
        let step = keyless_step(&FlowletSlot::default(), 9, 10, keyless_rules(1));
        assert_eq!(step, KeylessStep { decision: FlowletDecision::NewFlowlet { flowlet_id: 0 }, collided: false });
    }

    #[test]
    fn keyless_own_live_slot_keeps_the_member() {
        let step = keyless_step(&slot(1_000, 9), 9, 1_000 + GAP, keyless_rules(1));
        assert_eq!(step, KeylessStep { decision: FlowletDecision::Keep { position: 2 }, collided: false });
    }

    #[test]
    fn keyless_another_flows_live_slot_is_a_collision_and_shares_its_member() {
        let step = keyless_step(&slot(1_000, 9), 10, 1_000 + GAP, keyless_rules(1));
        assert_eq!(step, KeylessStep { decision: FlowletDecision::Keep { position: 2 }, collided: true });
    }

    #[test]
    fn keyless_idle_slot_of_another_flow_is_a_new_flowlet_not_a_collision() {
        let step = keyless_step(&slot(1_000, 9), 10, 1_001 + GAP, keyless_rules(1));
        assert_eq!(step, KeylessStep { decision: FlowletDecision::NewFlowlet { flowlet_id: 8 }, collided: false });
    }

    #[test]
    fn keyless_generation_change_forces_a_new_choice() {
        let step = keyless_step(&slot(1_000, 9), 9, 1_001, keyless_rules(2));
        assert_eq!(step.decision, FlowletDecision::NewFlowlet { flowlet_id: 8 });
    }

    fn qp_key(src: u8, qp: u32) -> FlowKey {
        FlowKey::v4([10, 0, 0, src], [10, 1, 0, 1], 17, 0xC000, 4791).with_dest_qp(qp)
    }

    #[test]
    fn slot_stays_in_the_table_and_depends_on_the_group() {
        let key = qp_key(1, 5);
        let differs = (0..64).filter(|g| slot_of(&key, *g, 4095).index != slot_of(&key, 0, 4095).index).count();
        assert!(differs > 50, "{differs}");
        for qp in 0..800 {
            assert!(slot_of(&qp_key(1, qp), 3, 7).index < 8);
        }
        assert_ne!(slot_of(&qp_key(1, 1), 3, 7).tag, slot_of(&qp_key(1, 2), 3, 7).tag);
    }

    #[test]
    fn slot_index_spreads_evenly_over_the_slots() {
        // 64,000 flows (4 hosts x 16,000 QPs) over 64 slots: 1,000 expected
        // per slot, one standard deviation about 31; allow 5 (+-160).
        let mut load = [0u32; 64];
        for src in 1..=4 {
            for qp in 0..16_000 {
                load[slot_of(&qp_key(src, qp), 3, 63).index as usize] += 1;
            }
        }
        let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
        assert!(*min > 840 && *max < 1160, "min {min} max {max}");
    }

    #[test]
    fn flows_sharing_a_slot_almost_never_share_a_tag() {
        // 20,000 flows in 256 slots: about 780,000 pairs share a slot. Two
        // flows share the tag only if they share the whole 32-bit state,
        // so the chance per pair of a slot is 1 in 2^24: about 0.05 pairs
        // expected in all.
        let mut by_slot: std::vec::Vec<std::vec::Vec<u32>> = std::vec![std::vec::Vec::new(); 256];
        for qp in 0..20_000 {
            let s = slot_of(&qp_key(9, qp), 1, 255);
            by_slot[s.index as usize].push(s.tag);
        }
        let (mut pairs, mut same_tag) = (0u64, 0u64);
        for tags in &mut by_slot {
            let n = tags.len() as u64;
            pairs += n * (n - 1) / 2;
            tags.sort_unstable();
            same_tag += tags.windows(2).filter(|w| w[0] == w[1]).count() as u64;
        }
        assert!(pairs > 700_000, "{pairs}");
        assert_eq!(same_tag, 0);
        // The tag is not the index again: in each slot its low byte (what
        // a slot index of the same size would be) spreads over all values,
        // 78 flows a slot over 256 values: at least 60 distinct on average.
        let distinct: usize = by_slot
            .iter()
            .map(|tags| {
                let mut low: std::vec::Vec<u32> = tags.iter().map(|t| t & 255).collect();
                low.sort_unstable();
                low.dedup();
                low.len()
            })
            .sum();
        assert!(distinct > 256 * 60, "{distinct}");
    }
}
