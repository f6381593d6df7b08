//! Transport-aware member choice (a group's `transport_aware` option): a
//! health score per member from the transport trouble of the QPs it
//! carries, and the demotions and restores it decides.
//!
//! Every control-loop step (100 ms) reads each member's transport sums from
//! the telemetry (rocev2_common::telemetry::MemberTransport) and adds what
//! grew since the last step, weighted: sequence-error NAKs, retransmissions
//! (backward PSN jumps) and CNPs. The score decays exponentially with the
//! configured half-life. Above `demote_above` a member is demoted: it keeps
//! its place in the group (its position, counters, pins and the flowlets
//! already on it), but gives its buckets to the other members, so new
//! flowlets and new flows avoid it. Below `restore_below` it gets exactly
//! those buckets back (crate::control::groups::resilient::ResilientTable). The last
//! member in service is never demoted, and when the others go down the
//! healthiest demoted member comes back.
//!
//! A demoted member carries no new traffic, so its score only decays: it is
//! back after about `half_life x log2(score / restore_below)`, and if the
//! fault is still there its first flowlets bring the NAKs that demote it
//! again (the restore is the probe). A member demoted again soon after a
//! restore is held out twice as long as last time (the flap hold), so a
//! link that stays bad is probed less and less often.

use std::{path::Path, time::Duration};

use anyhow::Result;
use rocev2_common::telemetry::MemberTransport;
use serde::{Deserialize, Serialize};

use crate::{control::config::TransportAware, control::qp_telemetry};

/// One member's health, as `stats` and the metrics show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberHealth {
    /// Weighted, decayed transport trouble (0 = healthy).
    pub score: f64,
    /// Its buckets are with the other members.
    pub demoted: bool,
    pub demotions: u64,
    pub restores: u64,
}

/// What a step decided for one member.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// `hold`: it stays demoted at least this long, however fast its score
    /// decays (it was demoted again soon after its last restore).
    Demoted {
        score: f64,
        hold: Duration,
    },
    Restored {
        score: f64,
    },
}

/// A member demoted again within this many half-lives of its restore
/// flaps: it is held at least twice as long as the last time.
const REFLAP_HALF_LIVES: u32 = 10;
/// The hold stops doubling at this many half-lives.
const MAX_HOLD_HALF_LIVES: u32 = 64;

/// When a member was last demoted and restored, on the group's clock (the
/// sum of the steps' elapsed times), for the flap hold.
#[derive(Clone, Copy, Debug, Default)]
struct Flaps {
    demoted_at: Duration,
    restored_at: Option<Duration>,
    /// How long its last demotion lasted.
    last_demotion: Duration,
    hold_until: Duration,
}

/// Per member of one group: its health and the counter values it last saw.
#[derive(Clone, Debug, Default)]
pub struct GroupHealth {
    pub members: Vec<MemberHealth>,
    /// The sums read last step, and the dataplane position they were read
    /// at (a position can name another member after a membership change:
    /// then that step's difference is not this member's and is skipped).
    seen: Vec<Option<(u32, MemberTransport)>>,
    /// The last read of the telemetry failed (said once, not every step).
    read_failed: bool,
    flaps: Vec<Flaps>,
    clock: Duration,
}

impl GroupHealth {
    /// Sized for `members` configured members (kept across steps; a config
    /// reload with another member count starts over).
    pub fn resize(&mut self, members: usize) {
        if self.members.len() != members {
            *self = Self {
                members: vec![MemberHealth::default(); members],
                seen: vec![None; members],
                flaps: vec![Flaps::default(); members],
                ..Self::default()
            };
        }
    }

    /// One step, `elapsed` after the last: `sums[i]` is member i's position
    /// in the dataplane and its transport sums now (`None` = not usable).
    /// Returns what changed, by member index.
    pub fn step(
        &mut self,
        options: &TransportAware,
        sums: &[Option<(u32, MemberTransport)>],
        elapsed: Duration,
    ) -> Vec<(usize, Verdict)> {
        self.resize(sums.len());
        self.clock += elapsed;
        let now = self.clock;
        let decay = 0.5f64.powf(elapsed.as_secs_f64() / options.half_life.as_secs_f64());
        for ((health, seen), read) in self.members.iter_mut().zip(self.seen.iter_mut()).zip(sums) {
            let added = match (&seen, read) {
                (Some((was_at, before)), Some((at, after))) if was_at == at => trouble(options, before, after),
                _ => 0.0,
            };
            health.score = health.score * decay + added;
            // Below a thousandth of the threshold is noise: show a clean 0.
            if health.score < options.restore_below * 1e-3 {
                health.score = 0.0;
            }
            *seen = *read;
        }
        let mut verdicts = Vec::new();
        // Restores first: a member coming back may let a worse one go.
        for (i, (health, flaps)) in self.members.iter_mut().zip(self.flaps.iter_mut()).enumerate() {
            if health.demoted && health.score < options.restore_below && now >= flaps.hold_until {
                health.demoted = false;
                health.restores += 1;
                flaps.last_demotion = now - flaps.demoted_at;
                flaps.restored_at = Some(now);
                verdicts.push((i, Verdict::Restored { score: health.score }));
            }
        }
        // No usable member left in service (the others went down): the
        // healthiest demoted one comes back, as a group with none would
        // send everything to the kernel.
        let in_service = |g: &Self, j: usize| sums[j].is_some() && !g.members[j].demoted;
        if !(0..self.members.len()).any(|j| in_service(self, j)) {
            let best = (0..self.members.len())
                .filter(|&j| sums[j].is_some())
                .min_by(|a, b| self.members[*a].score.total_cmp(&self.members[*b].score));
            if let Some(j) = best {
                let (health, flaps) = (&mut self.members[j], &mut self.flaps[j]);
                health.demoted = false;
                health.restores += 1;
                flaps.last_demotion = now - flaps.demoted_at;
                flaps.restored_at = Some(now);
                verdicts.push((j, Verdict::Restored { score: health.score }));
            }
        }
        // Then the worst first, while another usable member stays.
        let mut candidates: Vec<usize> = (0..self.members.len())
            .filter(|&i| sums[i].is_some() && !self.members[i].demoted && self.members[i].score > options.demote_above)
            .collect();
        candidates.sort_by(|a, b| self.members[*b].score.total_cmp(&self.members[*a].score));
        for i in candidates {
            let others_in_service = (0..self.members.len()).filter(|&j| j != i && in_service(self, j)).count();
            if others_in_service == 0 {
                break;
            }
            let health = &mut self.members[i];
            health.demoted = true;
            health.demotions += 1;
            // Demoted again soon after a restore: the fault is still there
            // (the restore was the probe); wait twice as long as last time.
            let flaps = &mut self.flaps[i];
            let flapping = flaps.restored_at.is_some_and(|r| now - r < options.half_life * REFLAP_HALF_LIVES);
            let hold = if flapping {
                (flaps.last_demotion * 2).min(options.half_life * MAX_HOLD_HALF_LIVES)
            } else {
                Duration::ZERO
            };
            flaps.demoted_at = now;
            flaps.hold_until = now + hold;
            verdicts.push((i, Verdict::Demoted { score: health.score, hold }));
        }
        verdicts
    }

    /// A group's health as a previous run left it (a takeover): the scores,
    /// demotions and counts go on; the next step is a new baseline for the
    /// transport sums (the new run's telemetry starts at zero).
    pub fn restored(members: Vec<MemberHealth>) -> Self {
        let n = members.len();
        Self { members, seen: vec![None; n], flaps: vec![Flaps::default(); n], ..Self::default() }
    }

    /// Members demoted now, and members with a score.
    pub fn summary(&self) -> (usize, usize) {
        (self.members.iter().filter(|m| m.demoted).count(), self.members.iter().filter(|m| m.score > 0.0).count())
    }

    /// Whether member `i` is demoted now.
    pub fn demoted(&self, i: usize) -> bool {
        self.members.get(i).is_some_and(|m| m.demoted)
    }
}

/// A group as the health step sees it: config or learned alike.
pub struct Scored<'a> {
    pub name: &'a str,
    /// The group's slot in the dataplane.
    pub slot: u32,
    pub options: &'a TransportAware,
    /// Member names (the device), in the group's member order.
    pub members: &'a [String],
    /// Each member's position in the dataplane, `None` when not usable.
    pub positions: &'a [Option<u32>],
}

/// One step of a group: reads its members' transport sums from the
/// telemetry under `pin_dir` (through `reader`, which keeps the map open
/// between steps), updates the scores and logs each demotion and restore
/// (and, once, a failure to read). True if any demotion or restore
/// happened.
pub fn step_group(
    health: &mut GroupHealth,
    reader: &mut qp_telemetry::MemberTransportReader,
    pin_dir: &Path,
    group: &Scored,
    elapsed: Duration,
) -> Result<bool> {
    let (options, positions, slot) = (group.options, group.positions, group.slot);
    let count = positions.iter().flatten().map(|p| p + 1).max().unwrap_or(0);
    let read = match reader.read(pin_dir, slot, count) {
        Ok(read) => {
            if std::mem::take(&mut health.read_failed) {
                tracing::info!(group = group.name, "transport health of group {}: reading again", group.name);
            }
            read
        }
        Err(e) if health.read_failed => return Err(e),
        Err(e) => {
            health.read_failed = true;
            tracing::warn!(
                group = group.name,
                "transport health of group {}: {e:#}; scores stand still until the telemetry can be read",
                group.name
            );
            return Err(e);
        }
    };
    let sums: Vec<Option<(u32, MemberTransport)>> =
        positions.iter().map(|p| p.map(|p| (p, read[p as usize]))).collect();
    let verdicts = health.step(options, &sums, elapsed);
    for (i, verdict) in &verdicts {
        let (name, member) = (group.name, group.members.get(*i).map_or("?", String::as_str));
        match verdict {
            Verdict::Demoted { score, hold } => {
                let held = if hold.is_zero() {
                    String::new()
                } else {
                    format!("; demoted again soon after its restore, so it stays out at least {:.1} s", hold.as_secs_f64())
                };
                tracing::warn!(
                    group = name,
                    member,
                    score = round2(*score),
                    "member {member} of group {name} demoted: transport health score {score:.1} above {} (sequence NAKs, retransmissions, CNPs of its QPs); new flowlets avoid it{held}",
                    options.demote_above
                )
            }
            Verdict::Restored { score } => tracing::info!(
                group = name,
                member,
                score = round2(*score),
                "member {member} of group {name} restored: transport health score {score:.2} below {}; it gets its buckets back",
                options.restore_below
            ),
        }
    }
    Ok(!verdicts.is_empty())
}

/// A score for a log field: two decimals, as the message shows it.
fn round2(score: f64) -> f64 {
    (score * 100.0).round() / 100.0
}

/// The weighted trouble between two readings of one member's sums.
fn trouble(options: &TransportAware, before: &MemberTransport, after: &MemberTransport) -> f64 {
    let grew = |a: u64, b: u64| b.saturating_sub(a) as f64;
    options.nak_weight * grew(before.naks_sequence, after.naks_sequence)
        + options.retransmit_weight * grew(before.psn_backward_jumps, after.psn_backward_jumps)
        + options.cnp_weight * grew(before.cnps, after.cnps)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: Duration = Duration::from_millis(100);

    fn options() -> TransportAware {
        TransportAware {
            demote_above: 10.0,
            restore_below: 1.0,
            half_life: Duration::from_secs(1),
            nak_weight: 1.0,
            retransmit_weight: 1.0,
            cnp_weight: 0.1,
            repick_when_acked: false,
        }
    }

    fn sums(naks: u64, retransmits: u64, cnps: u64) -> MemberTransport {
        MemberTransport { naks_sequence: naks, psn_backward_jumps: retransmits, cnps, ..Default::default() }
    }

    #[test]
    fn scores_add_weighted_deltas_and_halve_each_half_life() {
        let mut g = GroupHealth::default();
        let o = options();
        // The first reading is a baseline: counters from before count nothing.
        assert!(g.step(&o, &[Some((0, sums(100, 100, 100))), Some((1, sums(0, 0, 0)))], STEP).is_empty());
        assert_eq!(g.members[0].score, 0.0);
        g.step(&o, &[Some((0, sums(102, 103, 110))), Some((1, sums(0, 0, 0)))], STEP);
        assert!((g.members[0].score - 6.0).abs() < 1e-9, "{:?}", g.members[0]);
        for _ in 0..10 {
            g.step(&o, &[Some((0, sums(102, 103, 110))), Some((1, sums(0, 0, 0)))], STEP);
        }
        assert!((g.members[0].score - 3.0).abs() < 1e-6, "one half-life later: {:?}", g.members[0]);
        assert!(!g.demoted(0));
    }

    #[test]
    fn demotion_and_restore_have_hysteresis_and_are_counted() {
        let mut g = GroupHealth::default();
        let o = options();
        g.step(&o, &[Some((0, sums(0, 0, 0))), Some((1, sums(0, 0, 0)))], STEP);
        let verdicts = g.step(&o, &[Some((0, sums(6, 6, 0))), Some((1, sums(1, 0, 0)))], STEP);
        assert_eq!(verdicts, vec![(0, Verdict::Demoted { score: 12.0, hold: Duration::ZERO })]);
        assert!(g.demoted(0) && !g.demoted(1));
        // Below demote_above but above restore_below: still demoted.
        let mut steps = 0;
        loop {
            steps += 1;
            let v = g.step(&o, &[Some((0, sums(6, 6, 0))), Some((1, sums(1, 0, 0)))], STEP);
            if !v.is_empty() {
                assert!(matches!(v[..], [(0, Verdict::Restored { score }) ] if score < 1.0), "{v:?}");
                break;
            }
            assert!(g.demoted(0), "step {steps}: {:?}", g.members[0]);
        }
        // 12 -> 1 takes log2(12) = 3.6 half-lives: 36 steps of 100 ms.
        assert_eq!(steps, 36);
        assert_eq!((g.members[0].demotions, g.members[0].restores), (1, 1));
    }

    #[test]
    fn a_member_that_flaps_is_held_twice_as_long_each_time() {
        let mut g = GroupHealth::default();
        let o = options();
        let read = |naks| [Some((0, sums(naks, 0, 0))), Some((1, sums(0, 0, 0)))];
        g.step(&o, &read(0), STEP);
        let mut naks = 0;
        let mut demoted_for = Vec::new();
        for _ in 0..3 {
            // The fault is still there: right after each restore, trouble.
            naks += 12;
            let v = g.step(&o, &read(naks), STEP);
            assert!(matches!(v[..], [(0, Verdict::Demoted { .. })]), "{v:?}");
            let mut steps = 0;
            while g.demoted(0) {
                g.step(&o, &read(naks), STEP);
                steps += 1;
            }
            demoted_for.push(steps);
        }
        // 12 -> 1 decays in 36 steps; then held 2x, then 4x the first time.
        assert_eq!(demoted_for, vec![36, 72, 144]);
        // Quiet for more than ten half-lives: the next demotion starts over.
        for _ in 0..101 {
            g.step(&o, &read(naks), STEP);
        }
        naks += 12;
        assert_eq!(g.step(&o, &read(naks), STEP), vec![(0, Verdict::Demoted { score: 12.0, hold: Duration::ZERO })]);
    }

    #[test]
    fn the_last_member_in_service_is_never_demoted() {
        let mut g = GroupHealth::default();
        let o = options();
        let base = [Some((0, sums(0, 0, 0))), Some((1, sums(0, 0, 0))), None];
        g.step(&o, &base, STEP);
        // Both usable members go bad; the worse one is demoted, the other stays.
        let v = g.step(&o, &[Some((0, sums(20, 0, 0))), Some((1, sums(30, 0, 0))), None], STEP);
        assert_eq!(v, vec![(1, Verdict::Demoted { score: 30.0, hold: Duration::ZERO })]);
        assert!(!g.demoted(0) && !g.demoted(2));
        // A member that is not usable is never demoted (nor counted as in service).
        assert_eq!(g.members[2], MemberHealth::default());
        // Member 0 goes down: demoted member 1 is all that is left, and comes back.
        let v = g.step(&o, &[None, Some((1, sums(30, 0, 0))), None], STEP);
        assert!(matches!(v[..], [(1, Verdict::Restored { .. })]), "{v:?}");
        assert!(!g.demoted(1));
    }

    #[test]
    fn a_moved_position_is_a_new_baseline() {
        let mut g = GroupHealth::default();
        let o = options();
        g.step(&o, &[None, Some((1, sums(5, 5, 0)))], STEP);
        // Member 0 came back and member 1 now sits at position 0's slot...
        g.step(&o, &[Some((0, sums(50, 50, 0))), Some((1, sums(5, 5, 0)))], STEP);
        assert_eq!(g.members[0].score, 0.0);
        // ...and when positions shift, the other slot's numbers are not its own.
        g.step(&o, &[Some((1, sums(9, 9, 0))), Some((0, sums(60, 60, 0)))], STEP);
        assert_eq!((g.members[0].score, g.members[1].score), (0.0, 0.0));
    }
}
