//! `rocev2 entropy --hash flowlet --flowlet-slots N`: the flowlet mode with
//! a keyless flowlet table of N slots, stepped by the dataplane's own
//! [`keyless_step`].
//!
//! The model: messages go in rounds. In round m every QP of every host
//! sends its message m at once (all flows live together), then all go idle
//! longer than the gap. A QP whose slot another QP already claimed in this
//! round collides and follows that QP's member; the first QP of a slot in a
//! round starts the slot's next flowlet and re-hashes. So N slots give at
//! most N independent choices per round.

use rocev2_common::{
    buckets::BucketTable,
    flowlet::{
        keyless_step, rehash_position, slot_of, FlowletDecision, FlowletRules, FlowletSlot, KeylessStep, SlotOf,
    },
};

use super::{qp_flow_key, Scenario};

/// The gap the model uses; rounds are further apart, packets of one round closer.
const GAP_NS: u64 = 1 << 40;
/// The group id mixed into the slot hash (the simulated leaf has one group).
const GROUP: u32 = 0;

/// Adds each message's bytes and flowlet to its uplink; returns the
/// collisions (messages whose slot was live for another QP).
pub(super) fn spread(
    s: &Scenario,
    slots: u32,
    table: &BucketTable,
    per_message: f64,
    bytes: &mut [f64],
    flows: &mut [u32],
) -> u64 {
    let mask = slots.next_power_of_two() - 1;
    let mut array = vec![FlowletSlot::default(); mask as usize + 1];
    // The simulated group: generation 1, the uplinks, no boundary rule.
    let rules = FlowletRules { gap_ns: GAP_NS, generation: 1, member_count: s.uplinks, require_boundary: false };
    let mut collisions = 0;
    for message in 0..s.messages {
        let round_start = u64::from(message) * 2 * GAP_NS + 1;
        let mut offset = 0u64;
        for host in 0..s.hosts {
            for q in 0..s.qps {
                let key = qp_flow_key(s, host, q);
                let now = round_start + offset;
                offset += 1;
                let SlotOf { index, tag } = slot_of(&key, GROUP, mask);
                let slot = &mut array[index as usize];
                let KeylessStep { decision, collided } = keyless_step(slot, tag, now, rules);
                collisions += u64::from(collided);
                let (position, flowlet_id) = match decision {
                    FlowletDecision::Keep { position } => (position, slot.entry.flowlet_id),
                    FlowletDecision::NewFlowlet { flowlet_id } => {
                        (rehash_position(&key, s.seed, flowlet_id, table), flowlet_id)
                    }
                };
                slot.record(tag, now, flowlet_id, position, 1, false);
                bytes[position as usize] += per_message;
                flows[position as usize] += 1;
            }
        }
    }
    collisions
}
