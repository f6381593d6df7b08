//! Member choice by group policy: hash, flowlet, or pinned path.

use rocev2_common::{
    buckets::{member_for, NO_MEMBER},
    counters::PortCounter,
    features::Features,
    flowlet::{self, FlowletChoice, FlowletDecision, FlowletEntry, KeylessStep, SlotOf},
    hash::{member_hash_of_family, FlowKey, HashMode, HashVersion},
    maps::{bucket_table_index, member_index, FlowletKey, GroupEntry, FLOWLET_KEYLESS, POLICY_FLOWLET, POLICY_PINNED},
};

use crate::{
    args::{BoundaryPin, BoundarySeed, SlotGroup},
    counters,
    features::enabled,
    maps::{egress_entry, BUCKETS, CONFIG, FLOWLETS, FLOWLET_SCRATCH, FLOWLET_SLOTS, MEMBERS, VQUEUES},
    pin::NO_PIN,
};

/// The chosen member's position, plus the counters the choice moved. `V4`:
/// an IPv4 key (its family's hash code only). A group whose policy needs a feature
/// the program was loaded without is hashed (a flowlet group whose table
/// kind, keyed or keyless, was not loaded too). Inlined into the pipeline:
/// the flowlet tables and the bucket lookup are BPF functions of their own,
/// so the deepest call chain (pipeline, flowlet table, bucket lookup) stays
/// within the verifier's 512 bytes of stack.
#[inline(always)]
pub fn choose_position<const V4: bool>(
    at: SlotGroup,
    group: &GroupEntry,
    key: &FlowKey,
    boundary_pin: BoundaryPin,
    now: u64,
) -> u32 {
    let (seed, version) = CONFIG.get(0).map_or((0, 0), |c| (c.hash_seed, c.hash_version));
    let version = HashVersion::from_config(version);
    let hash = |mode| member_hash_of_family::<V4>(key, mode, seed, version);
    let (slot, group_id) = (at.slot(), at.group());
    let count = group.member_count;
    let mode = HashMode::from_u32(group.hash_mode).unwrap_or(HashMode::FiveTuple);
    match group.policy {
        POLICY_FLOWLET if enabled(Features::FLOWLET_KEYLESS) && group.flowlet_flags & FLOWLET_KEYLESS != 0 => {
            keyless_position(at, group, key, BoundarySeed::new(boundary_pin.ends_message(), seed), now)
        }
        POLICY_FLOWLET if enabled(Features::FLOWLET_KEYED) && group.flowlet_flags & FLOWLET_KEYLESS == 0 => {
            flowlet_position(at, group, key, BoundarySeed::new(boundary_pin.ends_message(), seed), now)
        }
        POLICY_PINNED if enabled(Features::PINNED) => match boundary_pin.pin() {
            position if position != NO_PIN && position < count => {
                counters::add(slot, PortCounter::PinHit, 1);
                position
            }
            _ => {
                counters::add(slot, PortCounter::PinFallback, 1);
                member_of(group_id, group, hash(HashMode::Qp))
            }
        },
        _ => member_at(group_id, group, hash(mode)),
    }
}

/// The member position a hash names through the group's live bucket
/// table; NO_MEMBER (past every position) when there is none. Inlined on
/// the hashed path, the one every `hash` group's packet takes, so that
/// path makes one BPF-to-BPF call (the family function) and no more.
#[inline(always)]
fn member_at(group_id: u32, group: &GroupEntry, hash: u32) -> u32 {
    match BUCKETS.get(bucket_table_index(group_id, group.bank & 1)) {
        Some(table) => member_for(table, hash),
        None => u32::from(NO_MEMBER),
    }
}

/// [`member_at`] as a BPF function of its own, for the flowlet, keyless
/// and pinned-fallback paths: inlined at each of those call sites too, the
/// map keys' stack slots pushed the flowlet call chain past the
/// verifier's 512 bytes.
#[inline(never)]
fn member_of(group_id: u32, group: &GroupEntry, hash: u32) -> u32 {
    member_at(group_id, group, hash)
}

/// Flowlet state lookup, decision and update. The table key and a new
/// flow's entry live in a per-CPU scratch map. A known flow's entry is
/// updated in place: a map update (bucket lock, LRU free-list pop and
/// push) costs more than the whole rest of the pipeline, so only a flow's
/// first packet, or one whose entry was evicted, pays for an insert.
/// Its own BPF function, as is keyless_position: inlined, their live
/// values took choose_position's frame to 200 bytes of spills, which every
/// hashed packet's call chain then had to fit within 512 bytes.
#[inline(never)]
fn flowlet_position(at: SlotGroup, group: &GroupEntry, key: &FlowKey, boundary_seed: BoundarySeed, now: u64) -> u32 {
    let (slot, group_id) = (at.slot(), at.group());
    let (seed, ends_message) = (boundary_seed.seed(), boundary_seed.ends_message() != 0);
    let rules = group.flowlet_rules();
    let Some(scratch) = FLOWLET_SCRATCH.get_ptr_mut(0) else {
        return member_of(group_id, group, flowlet::rehash_hash(key, seed, 0));
    };
    // SAFETY: per-CPU scratch value, ours for this program run.
    let scratch = unsafe { &mut *scratch };
    scratch.key = FlowletKey::new(key, group_id);
    #[allow(clippy::needless_borrows_for_generic_args, reason = "by value would copy the key onto the stack")]
    let existing = FLOWLETS.get_ptr_mut(&scratch.key);
    let new_position = move |existing: Option<&FlowletEntry>, flowlet_id| {
        counters::add(slot, PortCounter::FlowletNew, 1);
        let position = new_flowlet_position(group_id, group, key, seed, flowlet_id, now);
        match existing {
            None => counters::add(slot, PortCounter::FlowletInserted, 1),
            Some(e) if e.position != position || e.generation != group.generation => {
                counters::add(slot, PortCounter::FlowletMoved, 1)
            }
            Some(_) => {}
        }
        position
    };
    let insert = move |entry| {
        scratch.entry = entry;
        // By reference: the key and entry stay in the scratch map, off the stack.
        #[allow(clippy::needless_borrows_for_generic_args, reason = "by value would copy them onto the stack")]
        let _ = FLOWLETS.insert(&scratch.key, &scratch.entry, 0);
    };
    // SAFETY: a valid map value (see keyed_step on races).
    unsafe { flowlet::keyed_step(existing, now, rules, ends_message, new_position, insert) }
}

/// The member of a new flowlet by the group's flowlet choice.
#[inline(always)]
fn new_flowlet_position(group_id: u32, group: &GroupEntry, key: &FlowKey, seed: u32, flowlet_id: u32, now: u64) -> u32 {
    match FlowletChoice::from_u32(group.flowlet_choice) {
        FlowletChoice::LeastLoaded => less_loaded_of_two(group_id, group, key, seed, flowlet_id, now),
        FlowletChoice::Rehash => member_of(group_id, group, flowlet::rehash_hash(key, seed, flowlet_id)),
    }
}

/// The keyless table: the flow's slot in FLOWLET_SLOTS (no key compare,
/// so flows in one slot share its flowlet), decided by the shared pure
/// step and updated in place; the array never grows, so there is no
/// insert and no eviction.
#[inline(never)]
fn keyless_position(at: SlotGroup, group: &GroupEntry, key: &FlowKey, boundary_seed: BoundarySeed, now: u64) -> u32 {
    let (slot, group_id) = (at.slot(), at.group());
    let (seed, ends_message) = (boundary_seed.seed(), boundary_seed.ends_message() != 0);
    let SlotOf { index, tag } = flowlet::slot_of(key, group_id, group.flowlet_slot_mask);
    // The key as LLVM cannot see through: otherwise it keeps the key's
    // pre-mixed words (which the re-hash of a new flowlet shares with the
    // slot hash) in stack slots across the slot lookup, stored for every
    // packet (168 bytes of stack instead of 128). A new flowlet mixes the
    // key again instead.
    let key = core::hint::black_box(key);
    let Some(state) = FLOWLET_SLOTS.get_ptr_mut(index) else {
        return member_of(group_id, group, flowlet::rehash_hash(key, seed, 0));
    };
    // SAFETY: a valid array value. Another CPU may write the same slot at
    // the same time; each field is one aligned store, so the worst case is
    // a neighbouring decision, never a torn position.
    let state = unsafe { &mut *state };
    let KeylessStep { decision, collided } = flowlet::keyless_step(state, tag, now, group.flowlet_rules());
    if collided {
        counters::add(slot, PortCounter::FlowletCollisions, 1);
    }
    let (position, flowlet_id) = match decision {
        FlowletDecision::Keep { position } => (position, state.entry.flowlet_id),
        FlowletDecision::NewFlowlet { flowlet_id } => {
            counters::add(slot, PortCounter::FlowletNew, 1);
            let position = new_flowlet_position(group_id, group, key, seed, flowlet_id, now);
            if state.used != 0 && (state.entry.position != position || state.entry.generation != group.generation) {
                counters::add(slot, PortCounter::FlowletMoved, 1);
            }
            (position, flowlet_id)
        }
    };
    state.record(tag, now, flowlet_id, position, group.generation, ends_message);
    position
}

/// Congestion-aware choice by the power of two choices: two candidate
/// members drawn from the flow's hash and flowlet number, the one whose
/// egress virtual queue is shorter wins. Constant work per new flowlet
/// (a scan of all members would be a loop the verifier cannot afford).
#[inline(always)]
fn less_loaded_of_two(group_id: u32, group: &GroupEntry, key: &FlowKey, seed: u32, flowlet_id: u32, now: u64) -> u32 {
    let a = member_of(group_id, group, flowlet::rehash_hash(key, seed, flowlet_id));
    let b = member_of(group_id, group, flowlet::rehash_hash(key, seed ^ 0x5bd1_e995, flowlet_id));
    if a == b {
        return a;
    }
    let depth_a = queue_depth(group_id, group.bank & 1, a, now);
    let depth_b = queue_depth(group_id, group.bank & 1, b, now);
    if depth_b < depth_a {
        b
    } else {
        a
    }
}

/// Current virtual-queue depth of a member's egress port (drained to
/// `now`); u64::MAX when the port has no queue configured.
#[inline(always)]
fn queue_depth(group_id: u32, bank: u32, position: u32, now: u64) -> u64 {
    let Some(member) = MEMBERS.get(member_index(group_id, bank, position)) else { return u64::MAX };
    let Some(egress) = egress_entry(member.ifindex) else { return u64::MAX };
    let Some(q) = VQUEUES.get(egress.slot) else { return u64::MAX };
    let elapsed = now.saturating_sub(q.last_update_ns);
    q.depth_bytes.saturating_sub(egress.drain.drained(elapsed))
}
