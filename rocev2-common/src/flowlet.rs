//! Flowlet switching (LetFlow-style, with an optional congestion-aware
//! choice): a flow may move to another member only after it has been idle
//! longer than the gap, so packets of one flowlet never reorder.
//!
//! The decision is a pure function so the XDP program, the entropy
//! simulator and the tests run the same code.

use crate::{
    buckets::{member_for, BucketTable},
    hash::{flow_hash, FlowKey},
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
}
