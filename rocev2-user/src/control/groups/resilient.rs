//! Bucket tables kept by member identity, for config and learned groups.
//!
//! The dataplane's bucket table names members by position in the group's
//! list of usable members, and those positions shift whenever a member
//! comes or goes. [`ResilientTable`] keeps the table by member identity
//! (a config member, or an interface + neighbour) so that a change moves
//! only the buckets it must (rocev2_common::buckets::rebalance), and
//! translates it to positions when the group is published.

use rocev2_common::buckets::{fill, rebalance, targets, BucketTable, Rebalance, BUCKETS_PER_GROUP, NO_MEMBER};

/// A bucket table by member identity `K`.
#[derive(Clone, Debug)]
pub struct ResilientTable<K> {
    /// The members the table's entries index, as of the last update.
    members: Vec<K>,
    table: BucketTable,
    /// The buckets members held when they left, most recent last, so a
    /// returning member gets its own buckets back: only the flows that
    /// moved away move back, and no other flow moves.
    departed: Vec<(K, Vec<u8>)>,
    /// The last update left some member off its share (a gradual return
    /// still under way): another update with the same weights moves buckets.
    settling: bool,
}

/// Departures remembered per group.
const DEPARTED_KEPT: usize = 16;

impl<K> Default for ResilientTable<K> {
    fn default() -> Self {
        Self {
            members: Vec::new(),
            table: [NO_MEMBER; BUCKETS_PER_GROUP as usize],
            departed: Vec::new(),
            settling: false,
        }
    }
}

impl<K: Clone + PartialEq> ResilientTable<K> {
    /// Brings the table to `wanted` (identity, weight; weight 0 = not
    /// usable now). Buckets of members that left or became unusable move;
    /// a member that is (again) usable gets its share per `mode`. Returns
    /// how many buckets changed.
    pub fn update(&mut self, wanted: &[(K, u32)], mode: Rebalance) -> u32 {
        let weights: Vec<u32> = wanted.iter().map(|(_, w)| *w).collect();
        let was_empty = self.table.iter().all(|m| *m == NO_MEMBER);
        // Re-index the old table by identity into `wanted`'s order.
        let index_of: Vec<u8> = self
            .members
            .iter()
            .map(|k| wanted.iter().position(|(w, _)| w == k).map_or(NO_MEMBER, |i| i as u8))
            .collect();
        // Remember the buckets of members that leave now.
        for (old, k) in self.members.iter().enumerate() {
            let stays = wanted.iter().any(|(w, weight)| w == k && *weight > 0);
            let held: Vec<u8> = (0..=255u8).filter(|b| usize::from(self.table[usize::from(*b)]) == old).collect();
            if !stays && !held.is_empty() {
                self.departed.retain(|(d, _)| d != k);
                self.departed.push((k.clone(), held));
            }
        }
        if self.departed.len() > DEPARTED_KEPT {
            self.departed.drain(..self.departed.len() - DEPARTED_KEPT);
        }
        let mut table = self.table;
        for entry in table.iter_mut() {
            *entry = index_of.get(usize::from(*entry)).copied().unwrap_or(NO_MEMBER);
        }
        let changed = if was_empty {
            fill(&weights, &mut table);
            table.iter().filter(|m| **m != NO_MEMBER).count() as u32
        } else {
            let restored = self.restore_returning(&mut table, wanted, &weights, mode);
            let rest = match mode {
                Rebalance::Immediate => Rebalance::Immediate,
                Rebalance::Gradual(step) => Rebalance::Gradual(step.saturating_sub(restored)),
            };
            restored + rebalance(&mut table, &weights, rest)
        };
        self.members = wanted.iter().map(|(k, _)| k.clone()).collect();
        self.table = table;
        let mut want = vec![0u32; weights.len()];
        targets(&weights, &mut want);
        let mut have = vec![0u32; weights.len()];
        for m in table.iter() {
            if let Some(h) = have.get_mut(usize::from(*m)) {
                *h += 1;
            }
        }
        self.settling = want != have;
        changed
    }

    /// Gives members that are back their former buckets, where the
    /// bucket's holder has more than its share (within `mode`'s budget).
    fn restore_returning(
        &mut self,
        table: &mut BucketTable,
        wanted: &[(K, u32)],
        weights: &[u32],
        mode: Rebalance,
    ) -> u32 {
        let mut want = vec![0u32; weights.len()];
        targets(weights, &mut want);
        let mut have = vec![0u32; weights.len()];
        for m in table.iter() {
            if let Some(h) = have.get_mut(usize::from(*m)) {
                *h += 1;
            }
        }
        let mut budget = match mode {
            Rebalance::Immediate => u32::MAX,
            Rebalance::Gradual(step) => step,
        };
        let mut moved = 0;
        let mut done = Vec::new();
        for (k, buckets) in &self.departed {
            let Some(j) = wanted.iter().position(|(w, weight)| w == k && *weight > 0) else { continue };
            for b in buckets {
                if budget == 0 || have[j] >= want[j] {
                    break;
                }
                let owner = usize::from(table[usize::from(*b)]);
                if owner != j && owner < have.len() && have[owner] > want[owner] {
                    table[usize::from(*b)] = j as u8;
                    have[owner] -= 1;
                    have[j] += 1;
                    moved += 1;
                    budget -= 1;
                }
            }
            if have[j] >= want[j] {
                done.push(k.clone());
            }
        }
        self.departed.retain(|(k, _)| !done.contains(k));
        moved
    }

    /// Whether another update with the same weights would move buckets
    /// (a gradual return still under way).
    pub fn settling(&self) -> bool {
        self.settling
    }

    /// The table by position among the usable members, in `wanted` order
    /// (what the dataplane stores), given which members are usable.
    pub fn positions(&self, usable: &[bool]) -> BucketTable {
        let mut position_of = vec![NO_MEMBER; self.members.len()];
        let mut next = 0u8;
        for (i, up) in usable.iter().enumerate().take(self.members.len()) {
            if *up {
                position_of[i] = next;
                next += 1;
            }
        }
        let mut out = self.table;
        for entry in out.iter_mut() {
            *entry = position_of.get(usize::from(*entry)).copied().unwrap_or(NO_MEMBER);
        }
        out
    }

    /// The raw table (indexes into the members of the last update).
    pub fn table(&self) -> &BucketTable {
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(n: u32, down: &[u32]) -> Vec<(u32, u32)> {
        (0..n).map(|i| (i, if down.contains(&i) { 0 } else { 1 })).collect()
    }

    #[test]
    fn members_down_and_back_move_only_their_buckets() {
        let mut t = ResilientTable::default();
        t.update(&wanted(8, &[]), Rebalance::Immediate);
        let before = *t.table();
        t.update(&wanted(8, &[5]), Rebalance::Immediate);
        let during = *t.table();
        for (b, d) in before.iter().zip(&during) {
            assert!(b == d || *b == 5);
        }
        t.update(&wanted(8, &[]), Rebalance::Immediate);
        for (d, a) in during.iter().zip(t.table()) {
            assert!(d == a || *a == 5);
        }
    }

    #[test]
    fn a_returning_member_gets_exactly_its_own_buckets_back() {
        let mut t = ResilientTable::default();
        t.update(&wanted(8, &[]), Rebalance::Immediate);
        let before = *t.table();
        t.update(&wanted(8, &[2]), Rebalance::Immediate);
        t.update(&wanted(8, &[]), Rebalance::Immediate);
        assert_eq!(*t.table(), before, "every bucket back where it was");
        // Gradually: the same end state, a bucket at a time.
        t.update(&wanted(8, &[6]), Rebalance::Immediate);
        assert!(!t.settling(), "member 6 is gone: every share is met");
        let mut steps = 0;
        while t.update(&wanted(8, &[]), Rebalance::Gradual(1)) > 0 {
            steps += 1;
            assert_eq!(t.settling(), steps < 32, "step {steps}");
        }
        assert_eq!((steps, *t.table()), (32, before));
    }

    #[test]
    fn identity_survives_a_reordered_or_shorter_list() {
        let mut t = ResilientTable::default();
        t.update(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)], Rebalance::Immediate);
        let owner_before: Vec<&str> = t.table().iter().map(|i| ["a", "b", "c", "d"][*i as usize]).collect();
        // "c" is gone and the list comes in another order.
        t.update(&[("d", 1), ("a", 1), ("b", 1)], Rebalance::Immediate);
        let owner_after: Vec<&str> = t.table().iter().map(|i| ["d", "a", "b"][*i as usize]).collect();
        for (b, a) in owner_before.iter().zip(&owner_after) {
            assert!(b == a || *b == "c", "{b} -> {a}");
        }
    }

    #[test]
    fn positions_skip_unusable_members() {
        let mut t = ResilientTable::default();
        t.update(&[(0, 1), (1, 0), (2, 1)], Rebalance::Immediate);
        let pos = t.positions(&[true, false, true]);
        assert!(pos.iter().all(|p| *p == 0 || *p == 1));
        assert_eq!(pos.iter().filter(|p| **p == 1).count(), 128);
    }
}
