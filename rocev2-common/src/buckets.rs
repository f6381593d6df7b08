//! Bucket tables: how a group's hash names a member, for the XDP program,
//! the control program, `explain`, `entropy` and the tests alike.
//!
//! Every group has [`BUCKETS_PER_GROUP`] buckets. The flow hash picks a
//! bucket ([`pick_bucket`]); the bucket holds the index of a member. The
//! control program fills the table in proportion to member weights
//! ([`fill`]) and, when the set of members changes, moves as few buckets as
//! it can ([`rebalance`]): a member that leaves gives up only its own
//! buckets, so the flows (RDMA QPs) of every other member stay where they
//! are. This is what kernel resilient nexthop groups and fine-grained ECMP
//! in switch ASICs do; a plain `hash x members` choice over a compacted
//! list moves a sixth to a third of the healthy members' flows instead.

/// Buckets in every group's table. 256 keeps weights to within 1/256 of
/// their share and makes the bucket the hash's top byte.
pub const BUCKETS_PER_GROUP: u32 = 256;
/// A table entry with no member (a group with no usable member).
pub const NO_MEMBER: u8 = u8::MAX;

/// A group's bucket table: bucket -> member index (NO_MEMBER if none).
pub type BucketTable = [u8; BUCKETS_PER_GROUP as usize];

/// The member a flow hash names in `table`: the one shared member choice
/// (NO_MEMBER as u32 when the table is empty).
#[inline(always)]
pub fn member_for(table: &BucketTable, hash: u32) -> u32 {
    u32::from(table[(pick_bucket(hash) & 0xFF) as usize])
}

/// A table with every member of weight 1, as a group whose members are
/// all usable starts out.
pub fn even_table(members: u32) -> BucketTable {
    let mut table = [NO_MEMBER; BUCKETS_PER_GROUP as usize];
    let weights = [1u32; NO_MEMBER as usize];
    fill(&weights[..(members as usize).min(NO_MEMBER as usize)], &mut table);
    table
}

/// The bucket a flow hash falls in: its top byte (the same multiply-shift
/// as [`crate::hash::pick_member`] with 256 choices).
#[inline(always)]
pub fn pick_bucket(hash: u32) -> u32 {
    hash >> 24
}

/// How a member that (re)joins gets its share of buckets back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rebalance {
    /// At once: the buckets it is owed move to it in one publish.
    #[default]
    Immediate,
    /// At most this many buckets per step (the control program steps a few
    /// times a second), so a returning member's load ramps up and the flows
    /// that move do so a few at a time.
    Gradual(u32),
}

/// How many buckets each member should hold: proportional to `weights`
/// (0 = not usable), by largest remainder, ties to the lower index, so the
/// result is deterministic and sums to BUCKETS_PER_GROUP (or 0 when no
/// member has weight).
pub fn targets(weights: &[u32], out: &mut [u32]) {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    for t in out.iter_mut() {
        *t = 0;
    }
    if total == 0 {
        return;
    }
    let n = weights.len().min(out.len());
    let mut assigned = 0u32;
    for i in 0..n {
        out[i] = (u64::from(weights[i]) * u64::from(BUCKETS_PER_GROUP) / total) as u32;
        assigned += out[i];
    }
    // Hand out the remainder to the largest fractional parts.
    while assigned < BUCKETS_PER_GROUP {
        let mut best: Option<(usize, u64)> = None;
        for i in 0..n {
            if weights[i] == 0 {
                continue;
            }
            let exact_num = u64::from(weights[i]) * u64::from(BUCKETS_PER_GROUP);
            // A member already rounded up gets no second bucket.
            let Some(frac) = exact_num.checked_sub(u64::from(out[i]) * total) else { continue };
            if best.is_none_or(|(_, f)| frac > f) {
                best = Some((i, frac));
            }
        }
        let Some((i, _)) = best else { break };
        out[i] += 1;
        assigned += 1;
    }
}

/// A fresh table for `weights`: smooth weighted round robin, so members
/// interleave (`0 1 2 3 0 1 2 3 ...` for equal weights) and each holds
/// exactly its [`targets`] share.
pub fn fill(weights: &[u32], table: &mut BucketTable) {
    let n = weights.len().min(usize::from(NO_MEMBER));
    let mut want = [0u32; NO_MEMBER as usize];
    targets(&weights[..n], &mut want[..n]);
    let total: i64 = want[..n].iter().map(|w| i64::from(*w)).sum();
    if total == 0 {
        table.fill(NO_MEMBER);
        return;
    }
    let mut current = [0i64; NO_MEMBER as usize];
    for slot in table.iter_mut() {
        let mut best = 0usize;
        for i in 0..n {
            current[i] += i64::from(want[i]);
            if current[i] > current[best] || (want[best] == 0 && want[i] > 0) {
                best = i;
            }
        }
        current[best] -= total;
        *slot = best as u8;
    }
}

/// Brings `table` to the shares of `weights` moving as few buckets as
/// possible. Buckets of members that left (weight 0, or an index past
/// `weights`) always move; buckets a member holds beyond its share move
/// to members below theirs, at most `max_optional_moves` of them (the
/// highest-numbered buckets of the most over-full member first). Returns
/// how many buckets changed.
pub fn rebalance(table: &mut BucketTable, weights: &[u32], rebalance: Rebalance) -> u32 {
    let n = weights.len().min(usize::from(NO_MEMBER));
    let weights = &weights[..n];
    let mut want = [0u32; NO_MEMBER as usize];
    targets(weights, &mut want[..n]);
    if want[..n].iter().all(|w| *w == 0) {
        let changed = table.iter().filter(|m| **m != NO_MEMBER).count() as u32;
        table.fill(NO_MEMBER);
        return changed;
    }
    let mut have = [0u32; NO_MEMBER as usize];
    let mut orphans = 0u32;
    for m in table.iter() {
        match usize::from(*m) {
            i if i < n && weights[i] > 0 => have[i] += 1,
            _ => orphans += 1,
        }
    }
    let mut changed = 0u32;
    // 1. Orphaned buckets (their member left) go to the members furthest
    //    below their share.
    if orphans > 0 {
        for slot in table.iter_mut() {
            let i = usize::from(*slot);
            if i < n && weights[i] > 0 {
                continue;
            }
            let to = most_wanting(&want[..n], &have[..n]);
            have[to] += 1;
            *slot = to as u8;
            changed += 1;
        }
    }
    // 2. Optional moves from over-full to under-full members.
    let mut budget = match rebalance {
        Rebalance::Immediate => u32::MAX,
        Rebalance::Gradual(step) => step,
    };
    while budget > 0 {
        let to = most_wanting(&want[..n], &have[..n]);
        if have[to] >= want[to] {
            break;
        }
        let Some(from) = most_over(&want[..n], &have[..n]) else { break };
        let Some(slot) = table.iter_mut().rev().find(|m| usize::from(**m) == from) else { break };
        *slot = to as u8;
        have[from] -= 1;
        have[to] += 1;
        changed += 1;
        budget -= 1;
    }
    changed
}

/// The member with the largest deficit (want - have), lowest index on ties.
fn most_wanting(want: &[u32], have: &[u32]) -> usize {
    let mut best = 0usize;
    let mut best_deficit = i64::MIN;
    for i in 0..want.len() {
        if want[i] == 0 {
            continue;
        }
        let deficit = i64::from(want[i]) - i64::from(have[i]);
        if deficit > best_deficit {
            best = i;
            best_deficit = deficit;
        }
    }
    best
}

/// The member holding the most buckets beyond its share, if any.
fn most_over(want: &[u32], have: &[u32]) -> Option<usize> {
    let mut best: Option<(usize, u32)> = None;
    for i in 0..want.len() {
        if have[i] > want[i] && best.is_none_or(|(_, excess)| have[i] - want[i] > excess) {
            best = Some((i, have[i] - want[i]));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(table: &[u8; 256], n: usize) -> [u32; 16] {
        let mut c = [0u32; 16];
        for m in table {
            if usize::from(*m) < n {
                c[usize::from(*m)] += 1;
            }
        }
        c
    }

    #[test]
    fn equal_weights_interleave_and_share_exactly() {
        let mut t = [0u8; 256];
        fill(&[1, 1, 1, 1], &mut t);
        assert_eq!(&t[..8], &[0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(&counts(&t, 4)[..4], &[64, 64, 64, 64]);
    }

    #[test]
    fn weights_are_proportional() {
        let mut t = [0u8; 256];
        fill(&[1, 3], &mut t);
        assert_eq!(&counts(&t, 2)[..2], &[64, 192]);
        fill(&[1, 1, 1], &mut t);
        assert_eq!(counts(&t, 3)[..3].iter().sum::<u32>(), 256);
        assert!(counts(&t, 3)[..3].iter().all(|c| *c == 85 || *c == 86));
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_buckets() {
        for gone in 0..8 {
            let mut t = [0u8; 256];
            fill(&[1; 8], &mut t);
            let before = t;
            let mut w = [1u32; 8];
            w[gone] = 0;
            let changed = rebalance(&mut t, &w, Rebalance::Immediate);
            assert_eq!(changed, 32);
            for (b, a) in before.iter().zip(&t) {
                if usize::from(*b) != gone {
                    assert_eq!(b, a, "a healthy member's bucket moved");
                } else {
                    assert_ne!(usize::from(*a), gone);
                }
            }
            let c = counts(&t, 8);
            assert!(c.iter().enumerate().all(|(i, n)| i == gone || i >= 8 || *n == 36 || *n == 37), "{c:?}");
        }
    }

    #[test]
    fn a_returning_member_gets_its_share_back_from_the_others_only() {
        let mut t = [0u8; 256];
        fill(&[1; 8], &mut t);
        let mut w = [1u32; 8];
        w[3] = 0;
        rebalance(&mut t, &w, Rebalance::Immediate);
        let during = t;
        w[3] = 1;
        let changed = rebalance(&mut t, &w, Rebalance::Immediate);
        assert_eq!(changed, 32);
        assert_eq!(&counts(&t, 8)[..8], &[32; 8]);
        // Every bucket that changed went to the returning member.
        for (d, a) in during.iter().zip(&t) {
            assert!(d == a || *a == 3);
        }
    }

    #[test]
    fn gradual_return_moves_at_most_the_step() {
        let mut t = [0u8; 256];
        fill(&[1; 4], &mut t);
        rebalance(&mut t, &[1, 1, 1, 0], Rebalance::Immediate);
        assert_eq!(rebalance(&mut t, &[1, 1, 1, 1], Rebalance::Gradual(5)), 5);
        assert_eq!(counts(&t, 4)[3], 5);
        let mut steps = 1;
        while rebalance(&mut t, &[1, 1, 1, 1], Rebalance::Gradual(5)) > 0 {
            steps += 1;
        }
        assert_eq!(&counts(&t, 4)[..4], &[64; 4]);
        assert_eq!(steps, 13); // 64 buckets, 5 at a time
    }

    #[test]
    fn no_usable_member_empties_the_table() {
        let mut t = [0u8; 256];
        fill(&[1, 1], &mut t);
        rebalance(&mut t, &[0, 0], Rebalance::Immediate);
        assert!(t.iter().all(|m| *m == NO_MEMBER));
        rebalance(&mut t, &[1, 0], Rebalance::Immediate);
        assert!(t.iter().all(|m| *m == 0));
    }

    #[test]
    fn pick_bucket_is_the_top_byte() {
        assert_eq!(pick_bucket(0xAB00_0000), 0xAB);
        assert_eq!(pick_bucket(u32::MAX), 255);
        assert_eq!(pick_bucket(0x00FF_FFFF), 0);
    }
}
